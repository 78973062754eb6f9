"""Running a heterogeneous cluster: every group's replicas behind one router, one clock.

Replicas are numbered group by group, in the order the groups are listed. Each replica has its
group's cost model, KV cache and its own policy instance; the router process
(``sim.cluster.routed``) feeds them. The result's summary covers the whole cluster; the
utilization metrics use the replicas' mean peak FLOP/s and bandwidth (so ``mfu`` is FLOPs done
over FLOPs the whole fleet could have done), ``slot_utilization`` counts each step's rows
against its own replica's batch slots, and the KV metrics are left out when the groups'
caches differ in size (one cache size is needed to read usage as a share);
``SimResult.groups`` has one exact summary per group.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from policies import make_policy
from routers import Router
from sim.cluster.disagg import DisaggDriver
from sim.cluster.disagg_run import disagg_summary, link_table, per_gpu, run_disagg
from sim.cluster.groups import Group, is_disaggregated, replica_weights
from sim.cluster.metrics import imbalance, per_replica
from sim.cluster.routed import run_routed
from sim.core.arrays import TraceArrays
from sim.core.errors import InputError
from sim.core.state import Seq
from sim.core.types import Request
from sim.cost.validity import VALIDITY_COLUMNS, VALIDITY_INPUTS, validity_counts
from sim.engine.inputs import check_run_limits, model_len_limit, request_columns
from sim.engine.replica import Replica
from sim.engine.simulate import SimResult, engine_profile
from sim.kv.config import resolve_kv
from sim.metrics.steplog import merged_table
from sim.metrics.summary import StepLog, canonical_irregular, request_table, summarize


def check_step_table(step_table: str) -> None:
    """A cluster keeps its whole step table: ``step_table="buckets"`` is refused (the experiment
    runner checks it before any run, as it checks every other key)."""
    if step_table == "buckets":
        raise InputError("a cluster keeps one row per step; bucketed step tables are not "
                         "supported for clusters yet", field="metrics.step_table")


def simulate_groups(requests: Sequence[Request] | TraceArrays, groups: list[Group],
                    router: Router, seed: int, *, warmup_s: float = 0.0,
                    cooldown_s: float = 0.0, slos: dict[str, float] | None = None,
                    horizon_s: float | None = None, checks: bool = False,
                    event_skipping: bool = True, wall_clock_s: float | None = None,
                    max_model_len: int | None | str = "model", rng: np.random.Generator,
                    step_table: str = "auto",
                    monitor: Callable[[Sequence[StepLog], np.ndarray], None] | None = None,
                    disagg: Mapping[str, Any] | None = None) -> SimResult:
    """Simulate ``requests`` on the groups' replicas behind ``router`` (a cluster keeps its
    whole step table: ``step_table="buckets"`` is refused; ``monitor`` as ``simulate``).

    Groups with prefill and decode roles run disaggregated (``sim.cluster.disagg``);
    ``disagg`` then holds ``decode_router`` (a ``Router``), ``network`` (the block) and
    ``decode_rng``."""
    check_step_table(step_table)
    check_run_limits(horizon_s, wall_clock_s)
    request_columns(requests)  # every request checked before anything runs
    reqs = requests.to_requests() if isinstance(requests, TraceArrays) else list(requests)
    reqs.sort(key=lambda r: (r.arrival_s, r.id))
    deadline = None if wall_clock_s is None else time.perf_counter() + wall_clock_s
    log = StepLog()
    if monitor is not None and not is_disaggregated(groups):  # ``run_disagg`` calls its own
        monitor([log], np.fromiter((r.arrival_s for r in reqs), float, len(reqs)))
    options = {"checks": checks, "horizon_s": horizon_s, "event_skipping": event_skipping,
               "deadline": deadline, "max_model_len": max_model_len}
    if is_disaggregated(groups):
        assert disagg is not None
        options["fast_path"] = disagg.get("fast_path", True)
        run = _Run(*run_disagg(reqs, groups, router, disagg["decode_router"], disagg["network"],
                               (rng, disagg["decode_rng"]), log, options, monitor))
    else:
        run = _run_mixed(reqs, groups, router, rng, log, options)
    return _result(run, groups, router, seed, warmup_s, cooldown_s, slos)


@dataclass
class _Run:
    """What a cluster run leaves for its result: the requests table, the replicas (general
    ones, or hand-off sides) with their groups, the driver of a disaggregated run (``None``
    for one router over mixed groups), the step logs, and the routing log and each
    replica's weight of a mixed run (a disaggregated one's are the driver's)."""

    table: pd.DataFrame
    replicas: list[Any]
    owner: list[Group]
    driver: DisaggDriver | None
    logs: list[StepLog]
    routing: Any = None
    weights: list[float] | None = None


def _run_mixed(reqs: list[Request], groups: list[Group], router: Router,
               rng: np.random.Generator, log: StepLog, options: dict[str, Any]) -> _Run:
    """Serve ``reqs`` (arrival order) on the groups' replicas behind ``router``."""
    seqs: dict[int, Seq] = {}
    replicas: list[Replica] = []
    owner: list[Group] = []
    for g in groups:
        kv = resolve_kv(g.kv, g.cost)
        limit = model_len_limit(g.cost, options["max_model_len"])
        for _ in range(g.replicas):
            replicas.append(Replica(len(replicas), (), make_policy(g.policy), g.cost, kv, log,
                                    seqs, checks=options["checks"],
                                    horizon_s=options["horizon_s"],
                                    skip=options["event_skipping"], deadline=options["deadline"],
                                    max_model_len=limit))
            owner.append(g)
    weights = replica_weights(owner)
    block = min(rep.pool.config.block_size for rep in replicas)
    routing = run_routed(reqs, replicas, router, rng, block, weights)
    table = request_table(sorted(seqs.values(), key=lambda s: s.req.id))
    return _Run(table, list(replicas), owner, None, [log], routing, weights)


def _result(run: _Run, groups: list[Group], router: Router, seed: int, warmup_s: float,
            cooldown_s: float, slos: dict[str, float] | None) -> SimResult:
    """The result of a cluster run: tables with ``group``, summaries, per group and replica."""
    table, logs, replicas, owner, driver = run.table, run.logs, run.replicas, run.owner, \
        run.driver
    routing = run.routing if driver is None else driver.log
    names = np.array([g.name for g in owner], dtype=object)
    table.insert(list(table.columns).index("replica") + 1, "group", names[table["replica"]])
    steps = merged_table(logs)
    steps["group"] = names[steps["replica"].to_numpy()] if len(steps) else pd.Series(
        dtype=object)
    runs = tuple(np.concatenate(parts) for parts in
                 zip(*(log.irregular_runs() for log in logs), strict=True))
    window = {"warmup_s": warmup_s, "cooldown_s": cooldown_s, "slos": slos}
    summary = _summary(table, steps, runs, replicas, owner, window)
    if driver is None:
        summary.update(imbalance(routing, steps, len(replicas)))
    else:  # each side over its own replicas
        n_p = len(driver.prefill)
        side = steps["replica"].to_numpy() < n_p if len(steps) else np.zeros(0, bool)
        # what ``imbalance`` reads of the steps: not a copy of every column for each side
        busy = steps[["replica", "duration_s"]] if len(steps) else steps
        summary.update(imbalance(routing, busy[side], n_p))
        decode_steps = busy[~side].assign(replica=busy["replica"][~side] - n_p)
        summary.update({f"decode_{k}": v for k, v in imbalance(
            driver.decode_log, decode_steps, len(driver.decode)).items()})
    summary.update(router=router.name, seed=seed)
    summary["partial"] = bool(summary["num_unfinished"] > 0)
    gaps, _, counts = canonical_irregular([runs])
    result = SimResult(table, steps, summary, (gaps, counts), None,
                       "+".join(sorted({engine_profile(g.cost) for g in groups})))
    result.engine = "general"  # groups are driven through the general replica
    result.engine_reason = "a cluster of groups runs on the general engine"
    if driver is not None:  # each group on the compiled interpreter where it covers it
        result.engine, result.engine_reason = engines(groups, driver.reasons)
    if result.engine != "compiled":  # general replicas driven by the cluster: plans in Python
        result.step_engine_reason = "replicas driven from outside (the cluster's groups)"
    else:
        result.step_engine = "compiled"
    result.replicas = per_replica(table, steps, len(replicas))
    result.replicas.insert(1, "group", names)
    if run.weights is not None:
        result.replicas.insert(2, "weight", run.weights)
    result.routing = routing
    result.groups = _group_table(table, steps, runs, replicas, owner, groups, window)
    summary.update(per_gpu(summary, sum(g.replicas * g.tp for g in groups)))
    if driver is not None:
        summary.update(disagg_summary(table, driver, float(summary["duration"])))
        summary["decode_router"] = driver.decode_router.name
        result.links = link_table(driver, float(summary["duration"]))
        result.groups.insert(1, "role", [g.role for g in groups])
    return result


def _summary(table: pd.DataFrame, steps: pd.DataFrame, runs: tuple[np.ndarray, ...],
             replicas: list[Replica], owner: list[Group], window: dict[str, Any]
             ) -> dict[str, Any]:
    """``summarize`` over some replicas (all of one group, or the whole cluster)."""
    peaks = [getattr(g.cost, "peak_flops", None) for g in owner]
    bandwidths = [getattr(g.cost, "peak_bytes_per_s", None) for g in owner]
    kvs = [_kv_of(rep) for rep in replicas]
    # each replica's batch rows: one number when the policies agree (the single-policy
    # metric), else per replica, so each step counts against its own replica's slots (with no
    # capacity at all, each step's slots were its own rows: 1.0 for every mixed fleet)
    capacities = {rep.index: getattr(rep, "slot_capacity", None) if not hasattr(rep, "policy")
                  else rep.policy.slot_capacity for rep in replicas}
    distinct = set(capacities.values())
    blocks = {None if kv.unlimited else kv.num_blocks for kv in kvs}
    sizes = {kv.block_size for kv in kvs}
    gaps, at, counts = canonical_irregular([runs])
    out = summarize(table, steps, (gaps, at, counts),
                    peak_flops=_mean(peaks), peak_bytes_per_s=_mean(bandwidths),
                    slot_capacity=distinct.pop() if len(distinct) == 1 else capacities,
                    num_replicas=len(replicas),
                    kv_total_blocks=blocks.pop() if len(blocks) == 1 else None,
                    kv_block_size=sizes.pop() if len(sizes) == 1 else None, **window)
    # steps inside each group's fitted range, under that group's cost model
    valid = dict.fromkeys(VALIDITY_COLUMNS, 0)
    # the columns ``validity_counts`` reads, not a copy of every column for each group
    shapes = steps[list(VALIDITY_INPUTS)] if len(steps) else steps
    for g in {id(o): o for o in owner}.values():
        mine = [rep.index for rep, o in zip(replicas, owner, strict=True) if o is g]
        part = validity_counts(shapes[steps["replica"].isin(mine)] if len(steps) else steps,
                               g.cost)
        for key in valid:
            valid[key] += part[key]
    out.update(valid)
    return out


def _kv_of(rep: Any) -> Any:
    """A replica's ``KVConfig`` (a general-engine replica's pool's, or a hand-off side's)."""
    return rep.pool.config if hasattr(rep, "pool") else rep.kv


def engines(groups: list[Group], reasons: list[str]) -> tuple[str, str]:
    """``SimResult.engine`` and ``engine_reason`` of a disaggregated run whose groups (in
    the replicas' order: prefill groups first) ran on the general engine for ``reasons``
    ('' for a group on the compiled interpreter)."""
    ordered = [g for role in ("prefill", "decode") for g in groups if g.role == role]
    general = [f"group {g.name!r}: {why}" for g, why in zip(ordered, reasons, strict=True)
               if why]
    if not general:
        return "compiled", ""
    if len(general) == len(ordered):
        return "general", "; ".join(general)
    return "compiled+general", "; ".join(general)


def _mean(values: list[Any]) -> float | None:
    """The mean of per-replica peaks, ``None`` when some replica has none (analytic cost)."""
    return None if any(v is None for v in values) else float(np.mean(values))


def _group_table(table: pd.DataFrame, steps: pd.DataFrame, runs: tuple[np.ndarray, ...],
                 replicas: list[Replica], owner: list[Group], groups: list[Group],
                 window: dict[str, Any]) -> pd.DataFrame:
    """One row per group: its name, replicas, GPU and its own exact summary."""
    rows = []
    for g in groups:
        idx = [i for i, o in enumerate(owner) if o is g]
        mine = np.isin(runs[3], idx)
        sub_runs = tuple(r[mine] for r in runs)
        sub_steps = steps[steps["replica"].isin(idx)] if len(steps) else steps
        sub = table[table["group"] == g.name]
        row = {"group": g.name, "replicas": g.replicas, "hardware": g.hardware}
        row.update(_summary(sub, sub_steps, sub_runs, [replicas[i] for i in idx],
                            [owner[i] for i in idx], window))
        rows.append(row)
    return pd.DataFrame(rows)
