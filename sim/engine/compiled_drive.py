"""A compiled replica driven from outside: ``sim.engine.drive``'s API over ``CompiledReplica``.

A router (``sim.cluster.routed``) drives each replica through ``advance_until(t)``,
``admit(request)``, ``close()`` and reads its load. ``DrivenCompiled`` gives the compiled
interpreter (``sim.engine.compiled``) that API with the general engine's semantics, exactly:

- the interpreter plans only at scheduling points strictly before ``t`` (it is run to the
  float just below ``t``), so a request admitted at ``t`` is seen by the plan made at ``t``;
- it commits a step as it launches it, whereas the general engine keeps a step that straddles
  ``t`` in flight until its end. The load read while a step straddles ``t`` is therefore the
  state *before* that step's commit, rebuilt from the step's plan (still in the plan arrays)
  and its logged row (``load_now``): tokens it computes are still uncomputed, requests it
  finishes still running, the blocks it held still in use;
- a replica is run only when something can have changed: its step in flight has ended, or it
  was idle and a request admitted before ``t`` can start. Admitted requests wait in a Python
  buffer until then (the load counts them as queued, as the general engine's arrival buffer
  does), so most arrivals touch no array.

A run with routing latency, a horizon or a wall-clock budget stays on the general engine
(``blocker``).
"""
from __future__ import annotations

import gc
import math
from collections.abc import Callable, Sequence
from typing import Any, overload

import numpy as np
from numba import njit

from sim.core.routing import ReplicaLoad
from sim.core.scheduling import SchedulingSpec
from sim.core.types import Request
from sim.engine import compiled_loop as loop
from sim.engine import compiled_plan as cp
from sim.engine.compiled import CompiledReplica, Outcomes
from sim.engine.compiled_cost import KERNEL
from sim.engine.compiled_state import ReplicaArrays, pack
from sim.engine.validate import EngineError
from sim.kv.config import KVConfig
from sim.metrics.steplog import StepLog

_BIG = 1 << 62  # no step allowance
#: ``advance_and_count`` compiles ``compiled_loop.run`` into itself, and numba's cache of it
#: notices changes to this file only: the sources it compiles in are pinned here
#: (``compiled_loop.LOOP_SOURCES``; tests/test_scheduling.py recomputes it).
LOOP_SHA256 = "6f4adcf6d25f6c7f5c55ab857fd7ccae1ce564e6cbd292bbf631bf0cab6295dc"
#: Slots of ``load_now``'s output.
Q_QUEUED, Q_RUNNING, Q_PREFILL, Q_DECODING, Q_USED = range(5)


@njit(**KERNEL)
def _add(req_i: np.ndarray, i: int, computed: int, generated: int, running: bool,
         out: np.ndarray, sign: int) -> None:
    """``sim.engine.drive.outstanding``'s count of one request (``sign`` -1 takes it back)."""
    left = req_i[i, cp.RI_PROMPT] + generated - computed
    if left > 1 or generated == 0:
        out[Q_PREFILL] += sign * left
    elif running:
        out[Q_DECODING] += sign


@njit(**KERNEL)
def load_now(req_i, req_f, running, hitems, pending, plan_idx, plan_n, log_i, st_i, st_f,  # noqa: ANN001, ANN201
             t, out):
    """The replica's load at ``t`` as the general engine counts it (see the module doc)
    into ``out`` (``Q_*`` slots): O(queued + running)."""
    out[:] = 0
    n_heap, n_pending = st_i[loop.S_N_HEAP], st_i[loop.S_N_PENDING]
    nxt, known = st_i[loop.S_NXT], st_i[loop.S_KNOWN]
    out[Q_QUEUED] = n_heap + n_pending + (known - nxt)
    for h in range(n_heap):
        i = hitems[h]
        _add(req_i, i, req_i[i, cp.RI_COMPUTED], req_i[i, cp.RI_GENERATED], False, out, 1)
    for h in range(n_pending):
        i = pending[h]
        _add(req_i, i, req_i[i, cp.RI_COMPUTED], req_i[i, cp.RI_GENERATED], False, out, 1)
    for i in range(nxt, known):  # a row that brought its KV has computed its prompt
        _add(req_i, i, req_i[i, cp.RI_COMPUTED], req_i[i, cp.RI_GENERATED], False, out, 1)
    n_run = st_i[loop.S_N_RUN]
    out[Q_RUNNING] = n_run
    for r in range(n_run):
        i = running[r]
        _add(req_i, i, req_i[i, cp.RI_COMPUTED], req_i[i, cp.RI_GENERATED], True, out, 1)
    out[Q_USED] = st_i[loop.S_USED]
    end = st_f[loop.SF_NOW]
    n_log = st_i[loop.S_N_LOG]
    if end > t and n_log > 0:  # the last step straddles t: count its requests as before it
        out[Q_USED] = log_i[n_log - 1, loop.L_USED]
        for k in range(log_i[n_log - 1, loop.L_SEQS]):
            i, n = plan_idx[k], plan_n[k]
            gen = req_i[i, cp.RI_GENERATED]
            status = req_i[i, cp.RI_STATUS]
            c = req_i[i, cp.RI_COMPUTED]
            if status == loop.RUNNING:
                _add(req_i, i, c, gen, True, out, -1)
            else:  # finished, or outgrew the cache, at the step's end: still running
                out[Q_RUNNING] += 1
                if status == loop.REJECTED:
                    c = req_i[i, cp.RI_PROMPT] + gen - 1  # its KV was dropped
            sampled = 1 if req_f[i, cp.RF_LAST_TOKEN] == end else 0
            _add(req_i, i, c - n, gen - sampled, True, out, 1)


def must_run(idle: bool, first_buffered_s: float, now_s: float, straddle: bool, t: float
             ) -> bool:
    """Whether a replica must run to be up to date at ``t`` (module docstring): idle, a
    request handed to it (the earliest at ``first_buffered_s``, ``inf`` if none) can start
    before ``t``; busy, its step in flight ended before ``t`` (or at ``t`` while the step
    read last straddled an earlier instant)."""
    if idle:
        return first_buffered_s < t
    return now_s < t or (now_s == t and straddle)


@njit(**KERNEL)
def advance_and_count(s, until_s, t):  # noqa: ANN001, ANN201
    """``compiled_loop.run`` to ``until_s``, then ``load_now`` at ``t`` into ``s.out`` when
    the run paused or went idle (one call from Python per routing instant a replica has work
    at; ``s`` the replica's arrays, ``compiled_state.ReplicaArrays``: one argument for numba
    to unbox, not two dozen); returns the loop's code (any other code: the caller grows a
    buffer or reports, and counts)."""
    code = loop.run(s.req_i, s.req_f, s.running, s.hkeys, s.hranks, s.hitems, s.pending,
                    s.plan_idx, s.plan_n, s.pre_idx, s.params_i, s.params_f, s.analytic,
                    s.terms, s.dense, s.log_i, s.log_f, s.log_b, s.irr, s.irr_count, s.st_i,
                    s.st_f, until_s, _BIG, s.residues, s.batch)
    if code == loop.PAUSED or code == loop.IDLE:
        load_now(s.req_i, s.req_f, s.running, s.hitems, s.pending, s.plan_idx, s.plan_n,
                 s.log_i, s.st_i, s.st_f, t, s.out)
    return code


@njit(**KERNEL)
def count_now(s, t):  # noqa: ANN001, ANN201
    """``load_now`` at ``t`` of the packed arrays ``s``, into ``s.out``."""
    load_now(s.req_i, s.req_f, s.running, s.hitems, s.pending, s.plan_idx, s.plan_n, s.log_i,
             s.st_i, s.st_f, t, s.out)


@njit(**KERNEL)
def any_preempted(s):  # noqa: ANN001, ANN201
    """Whether a preempted request waits to be recomputed (pending, or in the waiting heap
    with a preempted rank) in the packed arrays ``s``."""
    if s.st_i[loop.S_N_PENDING]:
        return True
    for h in range(s.st_i[loop.S_N_HEAP]):
        if s.hranks[h] < 0:
            return True
    return False


class DrivenCompiled:
    """One replica on the compiled interpreter behind the drive API (module docstring)."""

    #: A router with no latency may route over such replicas in one compiled loop
    #: (``sim.engine.compiled_route``) instead of calling them per arrival.
    routes_compiled = True

    def __init__(self, index: int, spec: SchedulingSpec, cost: Any, kv: KVConfig, *,
                 max_model_len: int | None, name: str, order: list[int]) -> None:
        self.index = index
        self.rep = CompiledReplica(spec, cost, kv, max_model_len=max_model_len, name=name)
        self.block_size = kv.block_size
        self.kv_total_blocks = 0 if kv.unlimited else kv.num_blocks
        self.order = order  # shared by a run's replicas: where each admission went, in turn
        self.ids: list[int] = []
        self.advanced_s = -math.inf
        self._buf: list[tuple[float, int, int, int]] = []
        self._buf_prompt = 0
        self._idle = True  # nothing to run until a request comes
        self._now = 0.0
        self._straddle = False
        self._closed = False
        self._args: ReplicaArrays | None = None  # the arrays, packed (``_run``)
        self._layout = -1  # ``CompiledReplica.layout`` when they were packed
        self._load = np.zeros(5, dtype=np.int64)
        self._cached: list[int] = [0] * 5

    def advance_until(self, t: float) -> None:
        """``sim.engine.drive.advance_until`` (run the interpreter only when it has work)."""
        if t < self.advanced_s:
            raise ValueError(f"replica {self.index}: cannot go back from "
                             f"t={self.advanced_s} to {t}")
        self.advanced_s = t
        if self._closed or must_run(self._idle, self._buf[0][0] if self._buf else math.inf,
                                    self._now, self._straddle, t):
            self._run(t)

    def _run(self, t: float) -> None:
        """Hand the buffered requests over, run to just before ``t``, read the load."""
        self._flush()
        rep = self.rep
        until = math.nextafter(t, -math.inf) if t < math.inf else t
        code = advance_and_count(self._packed(), until, t)
        if code != loop.PAUSED and code != loop.IDLE:  # a full buffer, the end, a stall
            code = rep.advance_until(until)
            load_now(rep.req_i, rep.req_f, rep.running, rep.hitems, rep.pending, rep.plan_idx,
                     rep.plan_n, rep.log_i, rep.st_i, rep.st_f, t, self._load)
        self._idle = code == loop.IDLE
        self._now = rep.st_f.item(0)
        self._straddle = self._now > t
        self._cached = self._load.tolist()

    def _packed(self) -> ReplicaArrays:
        """The replica's arrays and the load buffer, packed (again when one was replaced or
        resized since)."""
        rep = self.rep
        if self._args is None or self._layout != rep.layout:
            self._args, self._layout = pack(rep, self._load), rep.layout
        return self._args

    def _flush(self) -> None:
        """Append the buffered requests to the interpreter's arrays."""
        buf = self._buf
        if not buf:
            return
        if len(buf) == 1:  # the usual case: one arrival since the last run
            self.rep.append_one(*buf[0])
        else:
            arrival, prompt, out, pri = zip(*buf, strict=True)
            self.rep.append(np.array(arrival), np.array(prompt, dtype=np.int64),
                            np.array(out, dtype=np.int64), np.array(pri, dtype=np.int64))
        buf.clear()
        self._buf_prompt = 0

    def admit(self, request: Request) -> None:
        """``sim.engine.drive.admit``: the request joins at the time advanced to."""
        self._buf.append((request.arrival_s, request.num_prompt_tokens,
                          request.num_output_tokens, request.priority))
        self._buf_prompt += request.num_prompt_tokens
        self.ids.append(request.id)
        self.order.append(self.index)

    def close(self) -> None:
        """No more requests will come: the next ``advance_until`` runs whatever is left."""
        self._closed = True
        self.rep.close()

    def router_load(self, now_s: float, weight: float = 1.0, group: str = "") -> ReplicaLoad:
        """The ``ReplicaLoad`` a router reads now (``sim.cluster.loads.replica_load``)."""
        queued, running, prefill, decoding, used = self._cached
        return ReplicaLoad(self.index, queued + len(self._buf), running,
                           prefill + self._buf_prompt, decoding, used, self.kv_total_blocks,
                           weight, group, now_s)

    def outcomes(self) -> Outcomes:
        """The per-request outcome columns, in this replica's admission order."""
        return self.rep.outcomes()


class Arrivals(Sequence[Request]):
    """A run's requests in arrival order: their columns at once (``columns``: ``id``,
    ``arrival_s``, ``num_prompt_tokens``, ``num_output_tokens``, ``priority``), the
    ``Request`` objects only when something reads one (``build`` makes them all, in that
    order), so a router that reads only the columns spares a million-request run them."""

    def __init__(self, columns: dict[str, np.ndarray], build: Callable[[], list[Request]]
                 ) -> None:
        self.columns = columns
        self._build: Callable[[], list[Request]] | None = build
        self._reqs: list[Request] = []

    def __len__(self) -> int:
        return len(self.columns["id"])

    @overload
    def __getitem__(self, i: int) -> Request: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Request]: ...

    def __getitem__(self, i: Any) -> Any:
        if self._build is not None:
            self._reqs, self._build = self._build(), None
        return self._reqs[i]


def run_driven(reqs: Sequence[Request], ids: np.ndarray, driver: Any, policies: list[Any],
               cost: Any, kv: KVConfig, logs: list[StepLog], *, max_model_len: int | None
               ) -> tuple[list[Outcomes], np.ndarray]:
    """Hand ``reqs`` (arrival order; ``ids`` theirs) and one ``DrivenCompiled`` per policy to
    ``driver``; fill each replica's log; return the outcomes of each replica (its admission
    order) and the replica of each request (arrival order)."""
    from sim.engine.compiled_run import hand_over
    from sim.engine.coverage import iteration_spec_of

    order: list[int] = []
    reps = []
    for k, policy in enumerate(policies):
        spec = iteration_spec_of(policy)
        assert spec is not None  # the allow-list admitted only presets of the specification
        reps.append(DrivenCompiled(k, spec, cost, kv, max_model_len=max_model_len,
                                   name=policy.name, order=order))
    # The routing loop allocates a few small objects per arrival (loads, log rows) that are
    # never cyclic garbage; the collector's passes over a million live requests would make
    # it superlinear (measured: 100k requests 5.8 s, 1M 83 s with it on).
    collecting = gc.isenabled()
    gc.disable()
    try:
        driver(reqs, reps)
    finally:
        if collecting:
            gc.enable()
    assign = np.array(order, dtype=np.int64)
    if len(assign) != len(reqs):
        raise EngineError(f"the replica driver admitted {len(assign)} of {len(reqs)} requests")
    for k, rep in enumerate(reps):  # admitted in arrival order, each request once
        if not np.array_equal(np.array(rep.ids, dtype=ids.dtype), ids[assign == k]):
            raise EngineError(f"replica {k} was not given its requests in arrival order")
    return [hand_over(rep.rep, logs[k], k) for k, rep in enumerate(reps)], assign
