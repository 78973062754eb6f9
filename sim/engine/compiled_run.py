"""One replica of ``sim.simulate`` on the compiled interpreter: run it, hand its steps over.

``run_compiled`` builds a ``CompiledReplica`` with the replica's round-robin share, runs it to
the end and fills the replica's ``StepLog`` with the packed step rows (the arrays themselves,
not copies), or folds them into the log's time buckets as the run goes when the step table is
bucketed (``sim.metrics.stream``), so a long run's memory stays flat.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from sim.core.batching import BatchSpec
from sim.core.scheduling import SchedulingSpec
from sim.engine import compiled_slots as slots
from sim.engine.compiled import (
    FLOAT_COLUMNS,
    INT_COLUMNS,
    ZERO_COLUMNS,
    CompiledReplica,
    Outcomes,
)
from sim.kv.config import KVConfig
from sim.metrics.live import LiveLogs
from sim.metrics.steplog import FLOAT_COLUMNS as STEP_FLOATS
from sim.metrics.steplog import StepLog
from sim.metrics.stream import AUTO_MAX_STEPS, FOLD_ROWS


def run_compiled(arrival: np.ndarray, prompt: np.ndarray, out: np.ndarray,
                 priority: np.ndarray | None, spec: SchedulingSpec | BatchSpec, cost: Any,
                 kv: KVConfig, log: StepLog, *, max_model_len: int | None,
                 horizon_s: float | None,
                 deadline: float | None, replica: int = 0, name: str = "scheduler",
                 progress: Progress | None = None) -> Outcomes:
    """Simulate one replica's requests (arrival order) under ``spec``; fill ``log`` and
    return the outcomes in that order (``progress``: what a display reads meanwhile)."""
    rep = CompiledReplica(spec, cost, kv, max_model_len=max_model_len, horizon_s=horizon_s,
                          name=name)
    rep.append(arrival, prompt, out, priority)
    rep.close()
    rep.on_log_full = fold_when_full(log, replica)
    if progress is not None:
        progress.current = rep
    rep.advance_until(math.inf, deadline, watched=progress is not None)
    outcomes = hand_over(rep, log, replica)
    if progress is not None:
        progress.ended(rep, log)
    return outcomes


class Progress:
    """A run's progress over compiled replicas run one after the other, read by a display
    from another thread (``live_logs``): the replica running now is counted from its arrays,
    each one that ended by the counts it ended with (its arrays are let go)."""

    def __init__(self) -> None:
        self.current: CompiledReplica | None = None
        self.settled = self.steps = 0
        self.reached_s = 0.0

    def ended(self, rep: CompiledReplica, log: StepLog) -> None:
        """``rep`` ran to its end and handed its steps to ``log``."""
        self.settled += rep.num_settled()
        self.steps += len(log) + (log.stream.num_rows if log.stream is not None else 0)
        self.reached_s = max(self.reached_s, rep.now)
        self.current = None

    def live_logs(self, logs: list[StepLog]) -> LiveLogs:
        """``logs`` with these counts (``sim.metrics.live``)."""
        def done() -> int:
            rep = self.current
            return self.settled + (rep.num_settled() if rep is not None else 0)

        def steps() -> int:
            rep = self.current
            return self.steps + (rep.num_steps if rep is not None else 0)

        def reached_s() -> float:
            rep = self.current
            return max(self.reached_s, rep.now if rep is not None else 0.0)

        return LiveLogs(logs, done, steps, reached_s)


def fold_when_full(log: StepLog, replica: int) -> Callable[[CompiledReplica], bool]:
    """A ``CompiledReplica.on_log_full`` for ``log``: a full buffer of a bucketed step table
    (or of an ``"auto"`` one past ``AUTO_MAX_STEPS`` rows) is folded into its buckets and
    emptied (True), else left to grow (False). An ``"auto"`` buffer that grew to
    ``AUTO_MAX_STEPS`` rows before its first fold is then cut to ``FOLD_ROWS`` and folded
    whenever full, as a bucketed one is: the stream folds chunks of that size about twice as
    fast a row (their temporaries stay in the caches)."""
    settled_before = 0  # requests before this row had all settled at the last fold

    def fold(r: CompiledReplica) -> bool:
        nonlocal settled_before
        stream = log.stream
        if stream is None or not (log.always_fold or stream.num_rows
                                  or len(r.log_i) >= AUTO_MAX_STEPS):
            return False
        settled_before = _fold_rows(log, r, r.num_steps, replica, settled_before)
        r.st_i[slots.S_N_LOG] = 0
        if len(r.log_i) > 4 * FOLD_ROWS:
            r.resize_log(FOLD_ROWS)
        return True
    return fold


def hand_over(rep: CompiledReplica, log: StepLog, replica: int) -> Outcomes:
    """Fill ``log`` with the steps of ``rep`` (run to its end) and return its outcomes."""
    steps = rep.num_steps
    irregular = int(rep.st_i[slots.S_N_IRR])
    if log.bucketed:
        _fold_rows(log, rep, steps, replica)
        steps = 0
    rep.log_i.resize((steps, len(INT_COLUMNS)), refcheck=False)  # trim in place
    rep.log_f.resize((steps, len(FLOAT_COLUMNS)), refcheck=False)
    log.zero_columns = ZERO_COLUMNS
    log.packed_int_columns, log.packed_float_columns = INT_COLUMNS, FLOAT_COLUMNS
    log.packed_ints, log.packed_floats = rep.log_i.ravel(), rep.log_f.ravel()
    log.cols["bound"] = rep.bounds(steps)  # an object array: the table takes it uncopied
    log.replica = replica
    if irregular:
        irr, counts = rep.irr[:irregular], rep.irr_count[:irregular]
        log.irregular_itl_at.frombytes(np.ascontiguousarray(irr[:, 0]).tobytes())
        log.irregular_itl.frombytes(np.ascontiguousarray(irr[:, 1]).tobytes())
        log.irregular_itl_count.frombytes(np.ascontiguousarray(counts).tobytes())
        log.irregular_itl_replica.frombytes(np.full(irregular, replica,
                                                    dtype=np.int64).tobytes())
    return rep.outcomes()


def _fold_rows(log: StepLog, rep: CompiledReplica, n: int, replica: int, first: int = 0
               ) -> int:
    """Fold the replica's first ``n`` step rows into the log's ``StepStream`` (which also
    learns how far the measurement window reaches from the requests finished, from row
    ``first`` on: those before it had all settled by the last fold, and were counted then).
    Returns the first request row not settled yet (every one before it is final)."""
    stream = log.stream
    assert stream is not None
    k = int(rep.st_i[slots.S_NXT])  # the requests that arrived: only they can have settled
    from sim.engine import compiled_plan as cp
    status = rep.req_i[first:k, cp.RI_STATUS]
    stream.finished_all(rep.req_f[first:k, cp.RF_ARRIVAL], rep.req_f[first:k, cp.RF_FINISH],
                        status == slots.FINISHED)
    open_ = np.flatnonzero(status < slots.FINISHED)
    data: dict[str, Any] = {name: rep.log_i[:n, i] for i, name in enumerate(INT_COLUMNS)}
    data.update({name: rep.log_f[:n, i] for i, name in enumerate(FLOAT_COLUMNS)})
    for name in ZERO_COLUMNS:
        data[name] = np.zeros(n, dtype=np.float64 if name in STEP_FLOATS else np.int64)
    data["replica"] = np.full(n, replica, dtype=np.int64)
    stream.fold(data)
    return first + int(open_[0]) if len(open_) else k
