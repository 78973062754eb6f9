"""The compiled interpreter of the scheduling specification: one replica's state in arrays.

``CompiledReplica`` holds what ``sim.engine.compiled_loop.run`` works on — per-request
counters and times, the running list, the waiting heap, the step log buffers — and drives it:
``advance_until(t)`` runs scheduling points up to time ``t`` (``math.inf``: to the end),
``append`` hands over more requests, ``close`` says no more will come. ``simulate`` builds one
per replica with all of its requests at once; the cluster layer can drive it from outside.
Every specification (``sim.core.scheduling.SchedulingSpec``) runs on it, on paged KV with
recompute preemption, costed by ``RooflineCost`` (no sliding window), ``ConstantCost`` or
``LinearCost`` (``sim.engine.coverage`` decides), bit-identical to the general engine.

numba is imported only when this runs. The first run on a machine compiles the loop into
numba's on-disk cache beside the module (tens of seconds); later processes load it in about a
second, which is why ``simulate`` keeps runs under ``COMPILED_MIN_REQUESTS`` requests a replica
on the general engine, and runs under ``COMPILED_COLD_MIN_REQUESTS`` while the loop is not in
the cache yet (``sim.engine.compiled_cache``).
"""
from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from sim.core.batching import BatchSpec
from sim.core.rules import NO_LIMIT, blocks_for, watermark_blocks
from sim.core.scheduling import COMPOSITIONS, ORDERS, VICTIMS, SchedulingSpec
from sim.engine import compiled_slots as slots
from sim.engine.coverage import cost_kind
from sim.engine.replica import never_fits
from sim.engine.validate import EngineError
from sim.kv.config import KVConfig

#: Step columns the interpreter writes, packed row by row (``StepLog.packed_*``), in the
#: order of ``compiled_slots.L_*``.
INT_COLUMNS = ("num_seqs", "num_prefill_tokens", "num_decode_tokens", "num_recomputed_tokens",
               "num_waiting", "kv_used_blocks", "num_regular_itl", "kv_live_tokens",
               "num_padding_tokens", "num_padding_rows")
FLOAT_COLUMNS = ("start_s", "duration_s", "flops", "bytes")
#: Step columns that are constant here (``replica``: ``StepLog.replica``; the others 0: no
#: prefix cache or swapping).
ZERO_COLUMNS = frozenset({"replica", "kv_cached_blocks", "swap_s", "swapped_bytes"})
#: Rows the step log and the irregular-gap log start with (each doubles when full).
INITIAL_LOG_ROWS, INITIAL_IRREGULAR_ROWS = 1 << 16, 4096
#: Requests per replica from which ``simulate`` takes the interpreter (``fast_path=True``):
#: below it, loading numba and the cached loop (about half a second) costs more than the
#: general engine spends (measured: docs/performance.md).
COMPILED_MIN_REQUESTS = 1000
#: The same while numba's cache does not hold the loop yet (``compiled_cache``): the first
#: compile (about 15 s) repays itself only on runs the general engine needs longer for
#: (about 0.5 ms a request for the iteration-level presets: docs/performance.md).
COMPILED_COLD_MIN_REQUESTS = 20000
#: The two thresholds for run-to-completion batches (``static``, ``dynamic``), whose general
#: engine runs a batch to its end in one event, some 30-60 µs a request: loading the cached
#: loop repays itself from about 10,000 requests, compiling it (about 22 s) from about half a
#: million (measured: docs/performance.md).
COMPILED_BATCH_MIN_REQUESTS = 10_000
COMPILED_BATCH_COLD_MIN_REQUESTS = 500_000
#: Steps between two looks at the wall clock when the run has a wall-clock budget (or
#: between two returns to Python when a progress display reads the run).
DEADLINE_STEPS = 4096

_STATUS = np.array(["waiting", "running", "finished", "rejected"], dtype=object)
_BIG = 1 << 62


class Outcomes:
    """Per-request outcome columns of a run, in the replica's arrival order."""

    def __init__(self, n: int) -> None:
        self.first_scheduled_s = np.full(n, math.nan)
        self.first_token_s = np.full(n, math.nan)
        self.finish_s = np.full(n, math.nan)
        self.max_itl_s = np.zeros(n)
        self.num_preemptions = np.zeros(n, dtype=np.int64)
        self.num_generated = np.zeros(n, dtype=np.int64)
        self.status: list[str] = ["waiting"] * n
        self.reason: list[str] = [""] * n


class CompiledReplica:
    """One replica run by the compiled interpreter (see the module docstring)."""

    def __init__(self, spec: SchedulingSpec | BatchSpec, cost: Any, kv: KVConfig, *,
                 max_model_len: int | None = None, horizon_s: float | None = None,
                 name: str = "scheduler", hold: bool = False) -> None:
        from sim.engine import compiled_loop as loop  # numba compiles or loads the loop here
        from sim.engine.compiled_cost import cost_inputs

        self.spec, self.cost, self.kv, self.name = spec, cost, kv, name
        #: The loop of the specification's kind: ``compiled_loop.run``, or
        #: ``compiled_batch.run_batches`` for run-to-completion batches (the same arguments).
        self.run = run_loop(spec)
        self.max_model_len = max_model_len
        kind = cost_kind(cost)
        bounds = spec.bucket_upper_bounds if isinstance(spec, BatchSpec) else ()
        p = np.zeros(slots.NUM_PARAMS_I + len(bounds), dtype=np.int64)
        p[slots.NUM_PARAMS_I:] = bounds  # a batch's prompt buckets, after the slots
        p[slots.P_BS], p[slots.P_NUM_BLOCKS] = kv.block_size, min(kv.num_blocks, _BIG)
        p[slots.P_CAPACITY] = min(kv.capacity_tokens, _BIG)
        p[slots.P_LIMIT] = -1 if kv.max_preemptions is None else kv.max_preemptions
        wait_s = _spec_params(spec, p, kv)
        #: A whole-prompt budget rejects longer prompts on arrival (``None``: none).
        self.budget = (spec.max_num_batched_tokens if isinstance(spec, SchedulingSpec)
                       and spec.admission == "whole" else None)
        #: The most rows a step has: the batch rows the arrays are sized by.
        self.max_rows = int(p[slots.P_MAX_SEQS])
        _, self.analytic, self.terms, self.dense, layers, tp = cost_inputs(cost, kind)
        p[slots.P_COST], p[slots.P_LAYERS], p[slots.P_TP] = kind, layers, tp
        p[slots.P_HAS_HORIZON] = int(horizon_s is not None)
        p[slots.P_HOLD] = int(hold)  # finished requests keep their KV (compiled_handoff)
        self.params_i = p
        self.params_f = np.zeros(slots.NUM_PARAMS_F)
        self.params_f[slots.PF_HORIZON] = math.inf if horizon_s is None else horizon_s
        self.params_f[slots.PF_WAIT] = wait_s
        # the batch's rows (running list, plan, victims): sized by ``append``, at most
        # ``max_num_seqs`` (or the requests handed over) plus room for the checks; a
        # run-to-completion batch's members and padding rows beside them (``batch``)
        self.running = np.empty(0, dtype=np.int64)
        self.plan_idx = self.plan_n = self.pre_idx = self.running
        self.batch = np.empty((slots.NUM_BATCH_ROWS, 0), dtype=np.int64)
        # one row per request (its fields side by side: one cache line per request a step)
        self.req_i = np.zeros((0, loop_rows(loop)[0]), dtype=np.int64)
        self.req_f = np.zeros((0, loop_rows(loop)[1]))
        self.hkeys, self.hranks = np.empty(0), np.empty(0, dtype=np.int64)
        self.hitems, self.pending = np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
        self.log_i = np.empty((INITIAL_LOG_ROWS, len(INT_COLUMNS)), dtype=np.int64)
        self.log_f = np.empty((INITIAL_LOG_ROWS, len(FLOAT_COLUMNS)))
        self.log_b = np.empty(INITIAL_LOG_ROWS, dtype=np.int8)
        self.irr = np.empty((INITIAL_IRREGULAR_ROWS, 2))
        self.irr_count = np.empty(INITIAL_IRREGULAR_ROWS, dtype=np.int64)
        self.st_i = np.zeros(slots.NUM_STATE_I, dtype=np.int64)
        self.st_i[slots.S_ACCEPTING] = 1
        self.st_f = np.zeros(1)
        self.residues = np.zeros(kv.block_size, dtype=np.int64)  # a stretch's block counts
        self.entry_reason: dict[int, str] = {}
        from sim.engine import compiled_plan as cp
        self._cp = cp  # the column numbers ``_fill`` writes (numba loads with the loop)
        #: A request's TTFT target by its priority, when requests carry a deadline (``edf``
        #: order or ``deadline`` victims: arrival + target); else ``None``.
        self.target_s = (spec.target_s if isinstance(spec, SchedulingSpec) and (
            spec.order == "edf" or spec.victim == "deadline") else None)
        self._room_for = 0  # requests the arrays hold without growing (``_make_room``)
        #: Counts the times an array was replaced or resized (a caller that keeps references
        #: to them takes them again when it changed).
        self.layout = 0

    @property
    def num_requests(self) -> int:
        """Requests handed over so far."""
        return int(self.st_i[slots.S_KNOWN])

    def append(self, arrival_s: np.ndarray, prompt: np.ndarray, out: np.ndarray,
               priority: np.ndarray | None = None) -> None:
        """Hand over more requests (arrival times sorted, none before the last one's)."""
        m, k = len(arrival_s), self.num_requests
        if m == 0:
            return
        n = k + m
        self._make_room(n)
        prompt = np.asarray(prompt, dtype=np.int64)
        out = np.asarray(out, dtype=np.int64)
        pri = np.zeros(m, dtype=np.int64) if priority is None else np.asarray(priority,
                                                                                 np.int64)
        arrival = np.asarray(arrival_s, dtype=np.float64)
        target = self.target_s
        deadline = ([a + target(int(q)) for a, q in
                     zip(arrival.tolist(), pri.tolist(), strict=True)]
                    if target is not None else None)
        self._fill(slice(k, n), arrival, prompt, out, pri, deadline)
        self._reject_on_entry(k, prompt, out)
        self.st_i[slots.S_KNOWN] = n

    def append_one(self, arrival_s: float, prompt: int, out: int, priority: int = 0) -> int:
        """``append`` of one request (a router hands them over one at a time), with scalar
        writes instead of arrays of one element; returns its row."""
        k = int(self.st_i[slots.S_KNOWN])
        self._make_room(k + 1)
        target = self.target_s
        deadline = arrival_s + target(priority) if target is not None else None
        self._fill(k, arrival_s, prompt, out, priority, deadline)
        self._reject_on_entry(k, (prompt,), (out,))
        self.st_i[slots.S_KNOWN] = k + 1
        return k

    def _fill(self, rows: int | slice, arrival: Any, prompt: Any, out: Any, priority: Any,
              deadline: Any) -> None:
        """A new request's fields in its row: ``rows`` one row (the values scalars) or a
        slice of rows (the values arrays), the same writes either way."""
        cp = self._cp
        ri, rf = self.req_i, self.req_f
        ri[rows, cp.RI_PROMPT] = prompt
        ri[rows, cp.RI_OUT] = out
        ri[rows, cp.RI_PRIORITY] = priority
        ri[rows, cp.RI_STATUS] = slots.WAITING
        rf[rows, cp.RF_ARRIVAL] = arrival
        if deadline is not None:  # edf order or deadline victims: from the arrival
            rf[rows, cp.RF_DEADLINE] = deadline
        rf[rows, cp.RF_FIRST_SCHED:cp.RF_FINISH + 1] = math.nan  # first scheduled .. finish

    def _reject_on_entry(self, k: int, prompt: Any, out: Any) -> None:
        """Mark the new requests from row ``k`` on that can never run (``entry_rejections``)."""
        for j, why in entry_rejections(prompt, out, self.kv, self.budget,
                                       self.max_model_len).items():
            self.req_i[k + j, self._cp.RI_ENTRY] = slots.ON_ARRIVAL
            self.entry_reason[k + j] = why

    def _make_room(self, n: int) -> None:
        """Room in every per-request and per-batch array for ``n`` requests."""
        if n <= self._room_for:
            return  # the common case of a router's appends: nothing to grow
        # capacity doubles (rows past ``S_KNOWN`` are never read): appending one request at
        # a time, as a router does, costs amortized O(1), not a copy of every row
        self.req_i = _grow(self.req_i, n)
        self.req_f = _grow(self.req_f, n)
        for name in ("hkeys", "hranks", "hitems", "pending"):
            arr = getattr(self, name)
            if len(arr) < n:
                setattr(self, name, np.resize(arr, _room(len(arr), n)) if len(arr)
                        else np.empty(n, arr.dtype))
        most = self.max_rows
        rows = min(most, n) + 2
        if len(self.running) < rows:
            # kept, not cleared: the last step's plan is read by a driver (compiled_drive)
            rows = min(most + 2, _room(len(self.running), rows))
            for name in ("running", "plan_idx", "plan_n", "pre_idx"):
                arr = getattr(self, name)
                setattr(self, name, np.resize(arr, rows) if len(arr) else np.empty(
                    rows, dtype=np.int64))
            if self.params_i[slots.P_COMPOSITION] == slots.RUN_TO_COMPLETION:
                grown = np.zeros((slots.NUM_BATCH_ROWS, rows), dtype=np.int64)
                grown[:, :self.batch.shape[1]] = self.batch  # the members in flight kept
                self.batch = grown
        self.layout += 1
        # the most requests the arrays now hold without growing (the batch rows are enough
        # for any count once they reach ``max_num_seqs + 2``)
        batch = (_BIG if len(self.running) >= most + 2
                 else len(self.running) - 2)
        self._room_for = min(len(self.req_i), len(self.req_f), len(self.hkeys),
                             len(self.hranks), len(self.hitems), len(self.pending), batch)

    def close(self) -> None:
        """No more requests will come: the run ends once everything handed over is done."""
        self.st_i[slots.S_ACCEPTING] = 0

    def advance_until(self, t: float = math.inf, deadline: float | None = None,
                      watched: bool = False) -> int:
        """Run scheduling points up to time ``t`` (or the run's end, or the wall-clock
        ``deadline``, a ``time.perf_counter`` value); returns the loop's code
        (``compiled_slots.DONE``, ``PAUSED``, ``IDLE``). ``watched``: another thread reads
        the progress, so the loop returns to Python every ``DEADLINE_STEPS`` steps (a compiled
        call holds the GIL)."""
        run = self.run
        steps = DEADLINE_STEPS if deadline is not None or watched else _BIG
        while True:
            code = run(self.req_i, self.req_f, self.running, self.hkeys, self.hranks,
                       self.hitems, self.pending, self.plan_idx, self.plan_n, self.pre_idx,
                       self.params_i, self.params_f, self.analytic, self.terms, self.dense,
                       self.log_i, self.log_f, self.log_b, self.irr, self.irr_count,
                       self.st_i, self.st_f, float(t), steps, self.residues, self.batch)
            if code == slots.LOG_FULL or code == slots.IRR_FULL:
                self.make_room(code)
            elif code == slots.PAUSED and steps != _BIG and self.now <= t:  # an allowance
                if deadline is not None and time.perf_counter() > deadline:
                    return slots.DONE  # wall-clock budget spent: the run ends here
            else:
                break
        if code == slots.STALLED:
            raise EngineError(
                f"policy {self.name!r} stalled at t={self.now:.6f}s: empty plan, no "
                f"wake_at_s, no arrivals left, {int(self.st_i[slots.S_QUEUED])} waiting and "
                f"{int(self.st_i[slots.S_N_RUN])} running")
        return int(code)

    #: Called when the step log is full (``StepLog`` folding); True when it made room.
    on_log_full: Any = None

    def make_room(self, code: int) -> None:
        """Room for the loop to go on after it returned ``LOG_FULL`` (the step log folded by
        ``on_log_full``, or doubled) or ``IRR_FULL`` (the irregular-gap log doubled)."""
        if code == slots.IRR_FULL:
            self.irr.resize((2 * len(self.irr), 2), refcheck=False)
            self.irr_count.resize(len(self.irr), refcheck=False)
            self.layout += 1
        elif self.on_log_full is None or not self.on_log_full(self):  # else folded, emptied
            self.resize_log(2 * len(self.log_i))

    def resize_log(self, rows: int) -> None:
        """Give the step log buffers room for ``rows`` steps, the steps held kept (as many
        as fit)."""
        self.log_i.resize((rows, len(INT_COLUMNS)), refcheck=False)
        self.log_f.resize((rows, len(FLOAT_COLUMNS)), refcheck=False)
        self.log_b.resize(rows, refcheck=False)
        self.layout += 1

    @property
    def now(self) -> float:
        """The replica's clock: the time of its next scheduling point."""
        return float(self.st_f[0])

    @property
    def num_steps(self) -> int:
        """Steps logged so far (and still in the buffer)."""
        return int(self.st_i[slots.S_N_LOG])

    def num_settled(self) -> int:
        """Requests finished or rejected so far (an O(requests) count, for progress)."""
        from sim.engine.compiled_plan import RI_STATUS
        return int(np.count_nonzero(self.req_i[:self.num_requests, RI_STATUS]
                                    >= slots.FINISHED))

    def outcomes(self) -> Outcomes:
        """The per-request outcome columns now (rejection messages spelled out)."""
        from sim.engine import compiled_plan as cp

        n = self.num_requests
        ri, rf = self.req_i[:n].T, self.req_f[:n].T  # one row per field
        res = Outcomes(0)
        res.first_scheduled_s = np.ascontiguousarray(rf[cp.RF_FIRST_SCHED])
        res.first_token_s = np.ascontiguousarray(rf[cp.RF_FIRST_TOKEN])
        res.finish_s = np.ascontiguousarray(rf[cp.RF_FINISH])
        res.max_itl_s = np.ascontiguousarray(rf[cp.RF_MAX_ITL])
        res.num_preemptions = np.ascontiguousarray(ri[cp.RI_NPRE])
        res.num_generated = np.ascontiguousarray(ri[cp.RI_GENERATED])
        res.status = _STATUS[ri[cp.RI_STATUS]].tolist()
        reason = [""] * n
        limit = self.kv.max_preemptions
        for i in np.flatnonzero(ri[cp.RI_REASON]).tolist():
            code = ri[cp.RI_REASON, i]
            if code == slots.ON_ARRIVAL:
                reason[i] = self.entry_reason[i]
            elif code == slots.OVER_BUDGET:  # whole-prompt admission only
                reason[i] = (f"prompt of {ri[cp.RI_PROMPT, i] + ri[cp.RI_GENERATED, i]} tokens "
                             f"exceeds max_num_batched_tokens={self.budget}")
            elif code == slots.PREEMPTED_TOO_OFTEN:
                k = ri[cp.RI_NPRE, i]
                reason[i] = (f"preempted {k} time{'s' if k > 1 else ''} "
                             f"(kv.max_preemptions={limit})")
            else:
                reason[i] = "context outgrew the KV cache"
        res.reason = reason
        return res

    def bounds(self, rows: int) -> np.ndarray:
        """The bound names of the first ``rows`` logged steps (an object array)."""
        from sim.engine.compiled_cost import BOUND_NAMES
        return np.array(BOUND_NAMES, dtype=object)[self.log_b[:rows]]


def _spec_params(spec: SchedulingSpec | BatchSpec, p: np.ndarray, kv: KVConfig) -> float:
    """Write what the interpreter reads of ``spec`` into the parameters ``p``; returns the
    wait of a run-to-completion batch (``inf``: none, or an iteration-level spec)."""
    if isinstance(spec, BatchSpec):  # one composition of its own, the newest as victim
        p[slots.P_MAX_SEQS], p[slots.P_MAX_TOKENS] = spec.batch_size, NO_LIMIT
        p[slots.P_COMPOSITION] = slots.RUN_TO_COMPLETION
        p[slots.P_ORDER], p[slots.P_VICTIM] = ORDERS.index(spec.order), 0
        p[slots.P_BUCKET_WIDTH] = spec.bucket_width
        p[slots.P_NUM_BOUNDS] = len(spec.bucket_upper_bounds)
        return spec.wait_or_inf_s
    p[slots.P_MAX_SEQS], p[slots.P_MAX_TOKENS] = spec.max_num_seqs, spec.max_num_batched_tokens
    p[slots.P_MARK] = watermark_blocks(spec.watermark, kv.num_blocks)
    p[slots.P_COMPOSITION] = COMPOSITIONS.index(spec.composition)
    p[slots.P_WHOLE] = int(spec.admission == "whole")
    p[slots.P_CHUNK] = spec.chunk_size or 0
    p[slots.P_ORDER], p[slots.P_VICTIM] = ORDERS.index(spec.order), VICTIMS.index(spec.victim)
    return math.inf


def run_loop(spec: SchedulingSpec | BatchSpec) -> Any:
    """The compiled loop that runs ``spec`` (imports numba)."""
    if isinstance(spec, BatchSpec):
        from sim.engine.compiled_batch import run_batches
        return run_batches
    from sim.engine.compiled_loop import run
    return run


def loop_rows(loop: Any) -> tuple[int, int]:
    """Rows of the per-request integer and float arrays."""
    from sim.engine import compiled_plan as cp
    return cp.NUM_RI, cp.NUM_RF


def _grow(arr: np.ndarray, n: int) -> np.ndarray:
    """``arr`` with room for ``n`` requests (rows), the existing ones kept (itself when it has
    room; otherwise a copy with room for at least twice its rows)."""
    if len(arr) >= n:
        return arr
    out = np.zeros((_room(len(arr), n), arr.shape[1]), dtype=arr.dtype)
    out[:len(arr)] = arr
    return out


def _room(have: int, n: int) -> int:
    """Rows to allocate for ``n`` when ``have`` are there: ``n`` the first time (a whole run
    handed over at once), then at least double."""
    return n if have == 0 else max(n, 2 * have)


def entry_rejections(prompt: np.ndarray, out: np.ndarray, kv: KVConfig, budget: int | None,
                     max_model_len: int | None) -> dict[int, str]:
    """Why each request that can never run is rejected when it arrives (``never_fits``, or a
    prompt over a whole-prompt budget), by index: a vectorized pass finds the few suspects."""
    suspects: Any
    if len(prompt) <= 4:  # a router's appends, one request or a few: no vectorized pass
        suspects = range(len(prompt))
    else:
        risky = blocks_for(prompt + 1, kv.block_size) > kv.num_blocks
        if budget is not None:
            risky |= prompt > budget
        if max_model_len is not None:
            risky |= prompt + out > max_model_len
        suspects = np.flatnonzero(risky).tolist()
    reasons = {}
    for i in suspects:
        p = int(prompt[i])
        why = never_fits(kv, max_model_len, p, int(out[i]))
        if not why and budget is not None and p > budget:
            why = f"prompt of {p} tokens exceeds max_num_batched_tokens={budget}"
        if why:
            reasons[i] = why
    return reasons
