"""``sim.simulate``: run requests through a policy and cost model, return tables and a summary.

Builds the replicas (requests are routed round-robin by arrival order, a deterministic rule
fixed before the run), starts one SimPy process per replica and turns the final state into a
``SimResult``.
"""
from __future__ import annotations

import copy
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from operator import attrgetter
from typing import Any

import numpy as np
import pandas as pd
import simpy

from policies import make_policy
from policies.registry import Policy
from sim.core.arrays import TraceArrays
from sim.core.batching import BatchSpec
from sim.core.bulk import paused_gc
from sim.core.errors import InputError
from sim.core.scheduling import SchedulingSpec
from sim.core.state import Seq
from sim.core.types import Request
from sim.cost.base import CostModel
from sim.cost.checked import checked_cost
from sim.cost.defaults import DEFAULT_HARDWARE, DEFAULT_MODEL
from sim.cost.roofline import build_cost_model
from sim.cost.validity import VALIDITY_COLUMNS, validity_counts
from sim.engine.compiled import (
    COMPILED_BATCH_COLD_MIN_REQUESTS,
    COMPILED_BATCH_MIN_REQUESTS,
    COMPILED_COLD_MIN_REQUESTS,
    COMPILED_MIN_REQUESTS,
    Outcomes,
)
from sim.engine.coverage import (
    NotCovered,
    cost_kind,
    fast_path_blocker,
    planned_blocker,
    spec_of,
)
from sim.engine.inputs import check_run_args, check_run_limits, model_len_limit, request_columns
from sim.engine.replica import EngineError, Replica
from sim.kv.config import AUTO, KVConfig, resolve_kv
from sim.metrics.fields import check_metric_args
from sim.metrics.steplog import make_step_log
from sim.metrics.stream import STEP_TABLE_CHOICES, StepStream, merge_streams
from sim.metrics.summary import (
    StepLog,
    canonical_irregular,
    check_measurement_window,
    request_frame,
    request_table,
    summarize,
)

_ARRIVAL_ORDER = attrgetter("arrival_s", "id")

#: Feeds requests (in arrival order) to replicas that own no arrivals (``simulate(driver=)``).
ReplicaDriver = Callable[[list[Request], list[Replica]], None]


@dataclass
class SimResult:
    """What one simulation produced.

    ``irregular_itl_runs`` are the inter-token gaps that are not one step's duration (the
    per-step ones are the steps table's ``duration_s`` × ``num_regular_itl``), run-length
    encoded as ``(gaps, counts)``; ``irregular_itl`` lists them one per token.
    """

    requests: pd.DataFrame
    steps: pd.DataFrame
    summary: dict[str, Any]
    irregular_itl_runs: tuple[np.ndarray, np.ndarray] = field(
        default_factory=lambda: (np.empty(0), np.empty(0, dtype=np.int64)))
    kv: KVConfig | None = None
    #: The engine overhead profile the cost model applied (``"none"``: an analytic model).
    engine_profile: str = "none"
    #: ``"full"`` (``steps`` has one row per step) or ``"buckets"`` (``sim.metrics.stream``).
    step_table: str = "full"
    #: Which simulator engine ran: ``"compiled"`` (the compiled interpreter of the scheduling
    #: specification, ``sim.engine.compiled``) or ``"general"`` (``sim.engine.replica``).
    engine: str = "general"
    #: Why no faster engine ran ('' for the compiled interpreter): the setting that sent the
    #: run to the general engine (``sim.engine.coverage``), or its size.
    engine_reason: str = ""
    #: What carried out the plans: ``"compiled"`` (the compiled interpreter's arrays; on the
    #: general engine, ``sim.engine.planned``: the policy's own Python plans, checked and
    #: carried out in compiled code) or ``"python"`` (``sim.engine.replica``, the reference).
    step_engine: str = "python"
    #: Why a general-engine run's plans were carried out in Python ('' when they were not).
    step_engine_reason: str = ""
    #: Per-replica summary of a routed run (``sim.cluster``), else ``None``.
    replicas: pd.DataFrame | None = None
    #: The routing decisions of a routed run (``sim.cluster.routed.RoutingLog``), else ``None``.
    routing: Any = None
    #: One summary row per group of a heterogeneous cluster (``sim.cluster``), else ``None``.
    groups: pd.DataFrame | None = None
    #: Per link of a disaggregated cluster: bytes carried, busy seconds, utilization.
    links: pd.DataFrame | None = None

    @property
    def irregular_itl(self) -> list[float]:
        """The irregular inter-token gaps, one entry per token, in the order they came."""
        gaps, counts = self.irregular_itl_runs
        return np.repeat(gaps, counts).tolist()


def simulate(requests: Sequence[Request] | TraceArrays, policy: Mapping[str, Any] | str | Policy,
             cost: CostModel | None, kv: Mapping[str, Any] | KVConfig | str | None = AUTO,
             seed: int = 0,
             *, num_replicas: int = 1, warmup_s: float = 0.0, cooldown_s: float = 0.0,
             slos: Mapping[str, float] | None = None, horizon_s: float | None = None,
             checks: bool = False, event_skipping: bool = True,
             wall_clock_s: float | None = None,
             max_model_len: int | None | str = "model", fast_path: bool | str = True,
             step_table: str = "auto",
             monitor: Callable[[Sequence[StepLog], np.ndarray], None] | None = None,
             driver: ReplicaDriver | None = None) -> SimResult:
    """Simulate ``requests`` (any order; ids must be unique) and return a ``SimResult``.

    ``requests`` may also be columnar (``TraceArrays``, what ``sim.workload.build`` builds; ids are
    the row numbers), which spares a million-request run its ``Request`` objects.

    ``policy`` is a registry spec such as ``{"name": "continuous", "max_num_seqs": 64}``;
    each replica gets its own instance. ``kv`` is a ``kv`` block as in the YAML (same keys,
    checks and defaults); ``None`` means unlimited KV; the default, ``"auto"``, is what a YAML
    without ``kv:`` gets (capacity from the hardware profile; unlimited for an analytic cost
    model). ``cost`` ``None`` is what a YAML without ``model``, ``hardware``, ``engine`` and
    ``cost`` simulates: ``build_cost_model(DEFAULT_MODEL, DEFAULT_HARDWARE)`` (Llama-3-8B on
    one H100 SXM, the default engine profile). ``seed`` is recorded
    and reserved for stochastic policies (the engine itself draws nothing at random).
    ``checks`` turns on deep per-step invariant checks (used by the tests).
    ``event_skipping`` lets steady decode stretches advance in one event (exact; off for
    comparison and debugging). ``horizon_s`` (simulated) and ``wall_clock_s`` (real seconds)
    end a run early; its summary then says ``partial: True``. ``max_model_len`` rejects
    requests whose prompt + output exceed it (vLLM's context limit); ``"model"`` takes the cost
    model's ``model.max_position_embeddings`` when it has one, ``None`` means no limit.
    ``fast_path`` lets a run the compiled interpreter covers (``sim.engine.compiled``; the
    allow-list of ``sim.engine.coverage``: every specification of the built-in presets, paged
    KV with recompute, roofline, constant or linear cost) use it; ``False`` forces the general
    engine. ``SimResult.engine`` and ``engine_reason`` say which engine ran and why no faster
    one did. ``True`` takes it when a replica has at least ``COMPILED_MIN_REQUESTS`` requests
    (``COMPILED_BATCH_MIN_REQUESTS`` for the run-to-completion ``static`` and ``dynamic``;
    below that, loading it costs more than it saves); ``"compiled"`` takes it whatever the
    size and ``"interpreted"`` keeps the general engine. On the general engine a policy that
    is not a padding one (static, dynamic) has its plans carried out on compiled steps
    (``sim.engine.planned``) on the same terms of coverage and size (``False`` counts as
    ``True`` there, ``"interpreted"`` keeps them in Python, ``checks=True`` too);
    ``SimResult.step_engine`` and ``step_engine_reason`` say which. All give the same
    results, bit for bit. ``step_table`` keeps one row per step (``"full"``), or
    folds the rows into fixed time buckets as the run goes (``"buckets"``:
    ``sim.metrics.stream``, memory flat in the number of steps; every summary metric still
    computed from every step), or keeps them whole up to ``AUTO_MAX_STEPS`` steps and
    buckets beyond (``"auto"``). ``monitor`` is handed the step logs (one per replica on
    the fast path, one shared otherwise) and the arrival times in order just before the run
    starts, for a progress display that reads them from another thread: nothing is added to
    the loops (a compiled replica's log fills when it ends; a run on compiled steps hands over
    ``sim.metrics.live.LiveLogs``, which count from the replicas' arrays when asked).

    Every argument a YAML key also sets is checked by that key's rule, with its words:
    ``horizon_s``, ``wall_clock_s`` and ``max_model_len`` as ``limits.*`` (``None``, not
    ``inf``, is no limit), ``warmup_s`` and ``cooldown_s`` as ``metrics.*``, ``slos`` as
    ``slos.*``, ``kv`` as ``kv.*``. A cost model that is not a built-in one has every step
    time it returns checked (``sim.cost.checked``); all problems raise ``InputError``.

    ``driver`` (for layers above the engine, e.g. ``sim.cluster``) takes over the replicas: it is
    called with the requests in arrival order and replicas that own no arrivals, and feeds
    them through ``Replica.advance_until`` / ``admit`` / ``close``. Such a run always takes the
    general engine.
    """
    if step_table not in STEP_TABLE_CHOICES:
        raise InputError(f"must be one of {', '.join(STEP_TABLE_CHOICES)}; got {step_table!r}",
                         field="step_table")
    for name, flag in (("checks", checks), ("event_skipping", event_skipping)):
        if not isinstance(flag, bool):  # a string such as "no" would read as true
            raise InputError(f"expected true or false, got {flag!r}", field=name)
    if fast_path not in _FAST_PATH_CHOICES:
        raise InputError(f"fast_path must be one of True, False, 'compiled', 'interpreted'; "
                         f"got {fast_path!r}")
    check_run_args(seed, num_replicas)
    check_run_limits(horizon_s, wall_clock_s,
                     None if max_model_len == "model" else max_model_len)
    slo_limits = check_metric_args(warmup_s, cooldown_s, slos)
    cols = request_columns(requests)  # every request checked before anything runs
    check_measurement_window(cols["arrival_s"], warmup_s, cooldown_s)
    if cost is None:  # what a YAML without model/hardware/engine/cost: simulates
        cost = build_cost_model(DEFAULT_MODEL, DEFAULT_HARDWARE)
    cost = checked_cost(cost)  # a user's model: every step time it returns is checked
    kv_config = resolve_kv(kv, cost)
    limit = model_len_limit(cost, max_model_len)
    # Policies keep per-replica state (a static batch in flight): one instance per replica.
    policies = [make_policy(policy if k == 0 or not isinstance(policy, Policy)
                            else copy.deepcopy(policy)) for k in range(num_replicas)]
    deadline = None if wall_clock_s is None else time.perf_counter() + wall_clock_s

    def new_log() -> StepLog:
        log = make_step_log(step_table, cols["arrival_s"], warmup_s, cooldown_s,
                            policies[0].slot_capacity, kv_config.block_size)
        if log.stream is not None:  # the validity flags, counted as rows fold
            log.stream.count_rows = partial(validity_counts, cost=cost)
        return log
    reason = (_driven_blocker(driver, horizon_s, wall_clock_s, cols) if driver is not None
              else "")
    if not reason:
        reason = (fast_path_blocker(policies[0], kv_config, cost, checks=checks,
                                    event_skipping=event_skipping, driven=driver is not None)
                  if fast_path else "fast_path=False")
    if not reason:
        reason = size_blocker(len(cols["arrival_s"]), num_replicas, fast_path,
                              routed=driver is not None,
                              batches=isinstance(spec_of(policies[0]), BatchSpec))
    engine = "general"
    steps_reason = ""
    if not reason and driver is not None:  # compiled replicas behind the driver (a router)
        from sim.engine.compiled_drive import Arrivals, run_driven

        cols["priority"] = _priorities(requests)
        cols = _arrival_order(cols)
        logs = [new_log() for _ in policies]
        if monitor is not None:
            monitor(logs, cols["arrival_s"])
        arrivals = Arrivals(cols, partial(_sorted_requests, requests))
        runs, assign = run_driven(arrivals, cols["id"], driver, policies, cost, kv_config,
                                  logs, max_model_len=limit)
        engine = "compiled"
        table = _fast_request_table(cols, runs, assign)
    elif not reason:
        # replicas never interact: each runs alone on its round-robin share
        if cols["id"].dtype == object:
            raise InputError("must all be integers on the fast path", field="requests[].id")
        if _needs_priority(policies[0]):
            cols["priority"] = _priorities(requests)
        cols = _arrival_order(cols)
        logs = [new_log() for _ in policies]
        progress = None
        if monitor is not None:  # the logs fill only as each replica ends: counted meanwhile
            from sim.engine.compiled_run import Progress

            progress = Progress()
            monitor(progress.live_logs(logs), cols["arrival_s"])
        runs = [_run_compiled(cols, k, num_replicas, policies[k], cost, kv_config, logs[k],
                              max_model_len=limit, horizon_s=horizon_s, deadline=deadline,
                              progress=progress)
                for k in range(num_replicas)]
        engine = "compiled"
        table = _fast_request_table(cols, runs)
    else:
        steps_reason = (_steps_blocker(policies[0], kv_config, cost, checks, driver, cols,
                                       num_replicas, fast_path))
        planned_table: pd.DataFrame | None = None
        if not steps_reason:
            planned_table, logs, policies, steps_reason = _on_compiled_steps(
                requests, cols, policies, cost, kv_config, new_log, monitor, max_model_len=limit,
                horizon_s=horizon_s, deadline=deadline, skip=event_skipping)
        if planned_table is not None:
            table = planned_table
        else:
            reqs = _sorted_requests(requests)
            logs = [new_log()]
            if monitor is not None:
                monitor(logs, np.fromiter((r.arrival_s for r in reqs), float, len(reqs)))
            table = _run_engine(reqs, policies, cost, kv_config, logs[0], checks=checks,
                                horizon_s=horizon_s, event_skipping=event_skipping,
                                max_model_len=limit, deadline=deadline, driver=driver,
                                series=_compiled_series(cost, len(reqs), num_replicas,
                                                        fast_path, event_skipping))
    stream = _bucketed(logs, table)
    if stream is not None:
        steps = stream.table()
    elif len(logs) == 1:
        steps = logs[0].table()
    else:  # an idle replica's empty table would turn the integer columns into floats
        tables = [log.table() for log in logs if len(log)]
        steps = pd.concat(tables, ignore_index=True) if tables else logs[0].table()
    if num_replicas > 1 and len(steps) and stream is None:
        steps = steps.sort_values(["start_s", "replica"], kind="stable").reset_index(drop=True)
    gaps, at, counts = canonical_irregular([log.irregular_runs() for log in logs])
    summary = summarize(
        table, steps, (gaps, at, counts),
        peak_flops=getattr(cost, "peak_flops", None),
        peak_bytes_per_s=getattr(cost, "peak_bytes_per_s", None),
        slot_capacity=policies[0].slot_capacity, num_replicas=num_replicas,
        kv_total_blocks=None if kv_config.unlimited else kv_config.num_blocks,
        warmup_s=warmup_s, cooldown_s=cooldown_s, slos=slo_limits,
        kv_block_size=kv_config.block_size, stream=stream)
    # steps inside the cost model's fitted range (a bucketed run counted them as rows folded)
    summary.update(validity_counts(steps, cost) if stream is None else
                   {k: sum(log.stream.counts.get(k, 0) for log in logs if log.stream)
                    for k in VALIDITY_COLUMNS})
    summary["seed"] = seed
    summary["partial"] = bool(summary["num_unfinished"] > 0)
    step_engine = "compiled" if engine == "compiled" or not steps_reason else "python"
    return SimResult(table, steps, summary, (gaps, counts), kv_config, engine_profile(cost),
                     "buckets" if stream is not None else "full", engine, reason,
                     step_engine, "" if step_engine == "compiled" else steps_reason)


def _sorted_requests(requests: Sequence[Request] | TraceArrays) -> list[Request]:
    """The requests as ``Request`` objects in arrival order, ties by id."""
    if isinstance(requests, TraceArrays):
        requests = requests.to_requests()
    with paused_gc():  # the key tuples: a million of them
        return sorted(requests, key=_ARRIVAL_ORDER)


def _driven_blocker(driver: ReplicaDriver, horizon_s: float | None,
                    wall_clock_s: float | None, cols: dict[str, np.ndarray]) -> str:
    """Why replicas driven from outside cannot be compiled ones ('' when they can: the
    driver says it can drive them, and the run has no horizon or wall-clock budget)."""
    why = getattr(driver, "compiled_blocker", "replicas driven from outside (a router)")
    if why:
        return str(why)
    if horizon_s is not None or wall_clock_s is not None:
        return "a routed run with a horizon or wall-clock budget"
    if cols["id"].dtype == object:
        return "request ids that are not all integers"
    return ""


def _needs_priority(policy: Policy) -> bool:
    """Whether the specification reads the requests' priorities (its order or victim)."""
    spec = spec_of(policy)
    if spec is None:
        return False
    victim = spec.victim if isinstance(spec, SchedulingSpec) else "newest"  # batches: newest
    return spec.order in ("priority", "edf") or victim in ("priority", "deadline")


def _priorities(requests: Sequence[Request] | TraceArrays) -> np.ndarray:
    """The requests' priorities, in input order (0 where a trace has none)."""
    if isinstance(requests, TraceArrays):
        n = len(requests.arrival_s)
        return (np.zeros(n, dtype=np.int64) if requests.priority is None
                else np.asarray(requests.priority, dtype=np.int64))
    return np.fromiter((r.priority for r in requests), np.int64, len(requests))


def _bucketed(logs: list[StepLog], table: pd.DataFrame) -> StepStream | None:
    """The merged stream of the logs when the run's step table is bucketed (``None``: full).
    If one replica's log crossed the ``"auto"`` size, every log is bucketed."""
    if not any(log.bucketed for log in logs):
        return None
    done = table["status"].to_numpy() == "finished"
    arrival, finish = table["arrival_s"].to_numpy(float), table["finish_s"].to_numpy(float)
    streams = []
    for log in logs:
        assert log.stream is not None
        log.stream.finished_all(arrival, finish, done)  # the window's last finish, exactly
        log.always_fold = True
        log.fold()
        streams.append(log.stream)
    return merge_streams(streams)


def engine_profile(cost: CostModel) -> str:
    """The engine overhead profile a cost model applies (``"none"`` for analytic models)."""
    engine = getattr(cost, "engine", None)
    return str(getattr(engine, "name", engine)) if engine is not None else "none"


_FAST_PATH_CHOICES = (True, False, "compiled", "interpreted")


def _run_compiled(cols: dict[str, np.ndarray], k: int, num_replicas: int, policy: Policy,
                  cost: CostModel, kv: KVConfig, log: StepLog, *, max_model_len: int | None,
                  horizon_s: float | None, deadline: float | None,
                  progress: Any = None) -> Outcomes:
    """Run replica ``k``'s round-robin share on the compiled interpreter; return its
    outcomes (in its arrival order)."""
    from sim.engine.compiled_run import run_compiled  # numba loads here, not at import

    arrival, prompt, out = (cols[name][k::num_replicas] for name in
                            ("arrival_s", "num_prompt_tokens", "num_output_tokens"))
    priority = cols["priority"][k::num_replicas] if "priority" in cols else None
    spec = spec_of(policy)
    assert spec is not None  # fast_path_blocker admitted only presets of the specification
    return run_compiled(arrival, prompt, out, priority, spec, cost, kv, log,
                        max_model_len=max_model_len, horizon_s=horizon_s, deadline=deadline,
                        replica=k, name=policy.name, progress=progress)


def _steps_blocker(policy: Policy, kv: KVConfig, cost: CostModel, checks: bool,
                   driver: ReplicaDriver | None, cols: dict[str, np.ndarray],
                   num_replicas: int, fast_path: bool | str) -> str:
    """Why the general engine carries out this run's plans in Python ('' when it takes the
    compiled steps of ``sim.engine.planned``): a replica driver, a setting they do not cover
    (``coverage.planned_blocker``), ids that are not integers, or the run's size (as for the
    compiled interpreter; ``fast_path=False`` counts as ``True`` here, ``"interpreted"``
    keeps everything in Python)."""
    if driver is not None:
        return "replicas driven from outside (a router)"
    why = planned_blocker(policy, kv, cost, checks=checks)
    if why:
        return why
    if cols["id"].dtype == object:
        return "request ids that are not all integers"
    return size_blocker(len(cols["arrival_s"]), num_replicas,
                        True if fast_path is False else fast_path, planned=True)


def _on_compiled_steps(requests: Sequence[Request] | TraceArrays, cols: dict[str, np.ndarray],
                       policies: list[Policy], cost: CostModel, kv: KVConfig,
                       new_log: Callable[[], StepLog], monitor: Any, *,
                       max_model_len: int | None, horizon_s: float | None,
                       deadline: float | None, skip: bool
                       ) -> tuple[pd.DataFrame | None, list[StepLog], list[Policy], str]:
    """Run the policies' plans on compiled steps (``sim.engine.planned``), one replica after
    the other on its round-robin share. Returns the request table, the step logs, the
    policies and '' — or, when a plan needs the reference (``NotCovered``) or the policies
    cannot be copied for that case, ``None``, no logs, fresh copies of the policies taken
    before the run and the reason."""
    try:  # fresh policies for the reference, should a plan need it
        pristine = copy.deepcopy(policies)
    except Exception as e:  # noqa: BLE001 - any failure to copy means: no copy
        return None, [], policies, (f"the policy cannot be copied ({type(e).__name__}), "
                                    "which carrying its plans out on compiled steps needs")
    from sim.engine import planned  # numba loads here, not at import

    cols = _arrival_order({**cols, "priority": _priorities(requests)})
    n = len(policies)
    logs = [new_log() for _ in policies]
    reps = []
    for k in range(n):  # round robin, as ``_run_compiled``
        c = {name: v[k::n] for name, v in cols.items()}
        reps.append(planned.planned_replica(
            policies[k], cost, kv, c["id"], c["arrival_s"], c["num_prompt_tokens"],
            c["num_output_tokens"], c["priority"], logs[k], max_model_len=max_model_len,
            horizon_s=horizon_s, deadline=deadline, skip=skip, replica=k))
    live = planned.live_logs(logs, reps)
    if monitor is not None:
        monitor(live, cols["arrival_s"])
    try:
        for k in range(n):
            reps[k].run()
    except NotCovered as why:
        reps.clear()  # their arrays go before the reference runs
        return None, [], pristine, f"{why}: the run was carried out again in Python"
    runs = [planned.hand_over(reps[k], logs[k], k) for k in range(n)]
    live.freeze()
    reps.clear()  # the replicas' arrays go before the tables are built
    return _fast_request_table(cols, runs), logs, policies, ""


def size_blocker(n: int, num_replicas: int, choice: bool | str, routed: bool = False,
                 planned: bool = False, batches: bool = False) -> str:
    """Why a run the compiled interpreter covers stays on the general engine anyway: asked
    to (``fast_path='interpreted'``), or too small to repay loading it ('' when it runs);
    ``batches``: a run-to-completion policy's, which the general engine runs faster a
    request, so it takes the interpreter from larger sizes."""
    if choice == "interpreted":
        return "fast_path='interpreted'"
    per_replica = -(-n // num_replicas)
    warm, cold = ((COMPILED_BATCH_MIN_REQUESTS, COMPILED_BATCH_COLD_MIN_REQUESTS) if batches
                  else (COMPILED_MIN_REQUESTS, COMPILED_COLD_MIN_REQUESTS))
    if choice is not True or per_replica >= cold:
        return ""
    if per_replica < warm:
        return (f"{per_replica} requests on a replica, fewer than the {warm} "
                "that repay loading the compiled interpreter")
    from sim.engine.compiled_cache import loop_is_cached

    if not loop_is_cached(routed, planned=planned, batches=batches):
        return (f"{per_replica} requests on a replica, fewer than the "
                f"{cold} that repay compiling the compiled interpreter "
                "(not in numba's cache on this machine yet; the first larger run, or "
                "fast_path='compiled' from Python, compiles it once)")
    return ""


#: Requests on a replica from which the general engine costs its skipped stretches in
#: compiled code (``CompiledSeries``): a static batch's stretch costs about 100 µs less there
#: (about 6 µs a request), while importing numba and loading the cached function cost about
#: 1.3 s a process (docs/performance.md).
SERIES_MIN_REQUESTS = 250_000
#: The same while numba's cache does not hold it yet (compiling it takes seconds more).
SERIES_COLD_MIN_REQUESTS = 1_000_000


def _compiled_series(cost: CostModel, n: int, num_replicas: int, fast_path: bool | str,
                     event_skipping: bool) -> Any:
    """What costs the general engine's skipped stretches: ``CompiledSeries`` (the same
    numbers in compiled code, ``sim.engine.compiled_series``) when the run skips, its cost
    model is one the compiled interpreter costs itself and it is large enough to repay
    loading numba (``SERIES_MIN_REQUESTS`` a replica; ``SERIES_COLD_MIN_REQUESTS`` while
    numba's cache does not hold it); else ``None`` (``step_series``)."""
    if not event_skipping or fast_path == "interpreted" or cost_kind(cost) < 0:
        return None
    per_replica = -(-n // num_replicas)
    if per_replica < SERIES_MIN_REQUESTS:
        return None
    if per_replica < SERIES_COLD_MIN_REQUESTS:
        from sim.engine.compiled_cache import loop_is_cached

        if not loop_is_cached(series=True):
            return None
    from sim.engine.compiled_series import CompiledSeries  # numba loads here

    return CompiledSeries(cost)


def _run_engine(reqs: list[Request], policies: list[Policy], cost: CostModel, kv: KVConfig,
                log: StepLog, *, checks: bool, horizon_s: float | None, event_skipping: bool,
                max_model_len: int | None, deadline: float | None,
                driver: ReplicaDriver | None = None, series: Any = None) -> pd.DataFrame:
    """Run the general engine (one SimPy process per replica, or the replicas handed to
    ``driver``); return the request table. ``series``: what costs skipped stretches
    (``Replica.series``; ``None``: ``step_series``)."""
    num_replicas = len(policies)
    if driver is not None:
        seqs: dict[int, Seq] = {}
        reps = [Replica(k, (), policies[k], cost, kv, log, seqs, checks=checks,
                        horizon_s=horizon_s, skip=event_skipping, max_model_len=max_model_len,
                        deadline=deadline, series=series) for k in range(num_replicas)]
        driver(reqs, reps)
        missing = len(reqs) - len(seqs)
        if missing:
            raise EngineError(f"the replica driver admitted {len(seqs)} of {len(reqs)} requests")
        return request_table(sorted(seqs.values(), key=lambda s: s.req.id))
    with paused_gc():  # a million of them: see ``sim.core.bulk``
        seqs = {r.id: Seq(r, i % num_replicas) for i, r in enumerate(reqs)}
    reps = [Replica(k, reqs[k::num_replicas], policies[k], cost, kv, log, seqs, checks=checks,
                    horizon_s=horizon_s, skip=event_skipping, max_model_len=max_model_len,
                    deadline=deadline, series=series) for k in range(num_replicas)]
    if num_replicas == 1:  # nothing else on the clock: no SimPy event a step
        reps[0].run_alone()
    else:  # the replicas' steps interleave in the step log in clock order
        env = simpy.Environment()
        for rep in reps:
            env.process(rep.process(env))
        env.run()
    return request_table(sorted(seqs.values(), key=lambda s: s.req.id))


def _arrival_order(cols: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The validated columns of ``request_columns`` (ids, arrival times, lengths) in arrival
    order, ties by id."""
    order = np.lexsort((cols["id"], cols["arrival_s"]))
    if len(order) > 1 and (np.diff(order) > 0).all():  # already in order: no copies
        return cols
    return {k: v[order] for k, v in cols.items()}


def _fast_request_table(cols: dict[str, np.ndarray], outs: list[Any],
                        assign: np.ndarray | None = None) -> pd.DataFrame:
    """The request table of a fast-path run (``cols`` in arrival order, ``outs`` one per
    replica, each over its round-robin share, or over the requests ``assign`` (the replica
    of each, in arrival order) gave it), in id order."""
    ids = cols["id"]
    n = len(ids)
    replicas = len(outs)
    out = outs[0] if replicas == 1 else _interleave(outs, n, assign)
    # ids usually follow arrival order already (trace rows): then nothing moves
    order = slice(None) if n < 2 or (np.diff(ids) > 0).all() else np.argsort(ids, kind="stable")
    zeros = np.zeros(n, dtype=np.int64)

    def col(values: Any, dtype: Any = float) -> np.ndarray:
        return np.asarray(values, dtype=dtype)[order]

    columns = {
        "id": ids[order],
        "num_preemptions": col(out.num_preemptions, np.int64),
        "num_prompt_tokens": col(cols["num_prompt_tokens"], np.int64),
        "num_output_tokens": col(cols["num_output_tokens"], np.int64),
        "num_generated": col(out.num_generated, np.int64),
        "replica": zeros if replicas == 1 else col(
            np.arange(n) % replicas if assign is None else assign, np.int64),
        "num_swaps": zeros, "num_cached_tokens": zeros,
        "arrival_s": col(cols["arrival_s"]),
        "first_scheduled_s": col(out.first_scheduled_s),
        "first_token_s": col(out.first_token_s),
        "finish_s": col(out.finish_s),
        "max_itl_s": col(out.max_itl_s),
    }
    if isinstance(order, slice):
        status, reason = out.status, out.reason
    else:
        status = [out.status[i] for i in order.tolist()]
        reason = [out.reason[i] for i in order.tolist()]
    return request_frame(columns, status, reason)


def _interleave(outs: list[Any], n: int, assign: np.ndarray | None = None) -> Any:
    """One outcome set from per-replica ones: replica ``k`` holds rows ``k, k + R, ...``
    (or the rows where ``assign`` is ``k``)."""
    merged = Outcomes(n)
    rows: list[Any] = ([slice(k, None, len(outs)) for k in range(len(outs))] if assign is None
                       else [np.flatnonzero(assign == k) for k in range(len(outs))])
    for name in vars(merged):
        column = getattr(merged, name)
        for k, out in enumerate(outs):
            if isinstance(column, list) and not isinstance(rows[k], slice):
                for i, v in zip(rows[k].tolist(), getattr(out, name), strict=True):
                    column[i] = v
            else:
                column[rows[k]] = getattr(out, name)
    return merged
