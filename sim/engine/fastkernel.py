"""Compiled fast path: ``sim.engine.fastpath``'s vLLM-mode loop as one numba kernel, for large runs.

``sim.engine.fastpath`` made every step O(1) but still pays a few microseconds of interpreter
time per step, which is most of a million-request run. This module runs the same algorithm — the
same aggregates (sum of keys, residues modulo the block size, lazily invalidated heaps, a monotonic
stack of decode gaps), the same order of floating-point operations — compiled with numba, so a step
costs well under a microsecond. Results are bit-identical to ``sim.engine.fastpath`` and therefore
to the general engine (tests/test_fastkernel.py).

Scope: vLLM mode (prefill-only steps and pure-decode steps) on ``RooflineCost`` without a
sliding window, ``ConstantCost`` or ``LinearCost`` (closed forms in the kernel). Roofline
decode steps are costed inside the kernel from ``RooflineCost``'s per-batch-size constants
(``decode_constants``, fetched once per batch size), prefill steps of up to
``DENSE_MAX_PROMPTS`` prompts from ``dense_constants`` (fetched once per token count and prompt
count) and the prompts' attention operator; the rare rest (a one-token prompt, a bigger batch)
calls ``RooflineCost.prefill_cost`` in Python through ``numba.objmode``.

numba is imported only when this path runs (``simulate`` picks it for runs of at least
``COMPILED_MIN_REQUESTS`` requests). The first such run on a machine compiles the kernel (about
17 s on a 2-core machine) into numba's on-disk cache beside the module; every later process
loads it in about a second. Small runs, the quickstart and most tests never pay for either.
"""
from __future__ import annotations

import math
import threading
import time
from typing import Any

import numpy as np

from sim.cost.base import ConstantCost, LinearCost
from sim.cost.roofline import RooflineCost
from sim.engine.fastpath import (
    FLOAT_COLUMNS,
    INT_COLUMNS,
    ZERO_COLUMNS,
    FastResult,
    StepCosts,
    arrival_rejections,
)
from sim.engine.validate import EngineError
from sim.metrics.steplog import FLOAT_COLUMNS as STEP_FLOATS
from sim.metrics.steplog import StepLog
from sim.metrics.stream import AUTO_MAX_STEPS

#: Runs with fewer requests stay on the interpreted fast path: importing numba and loading the
#: cached kernel costs about a second, more than such a run takes.
COMPILED_MIN_REQUESTS = 50_000
#: Rows the step log and the irregular-gap log start with (each doubles when full, in place).
INITIAL_LOG_ROWS, INITIAL_IRREGULAR_ROWS = 1 << 18, 4096
#: Decode batch sizes the kernel keeps constants for; larger ``max_num_seqs`` runs interpreted.
MAX_TABLE_ROWS = 1 << 16
#: Prefill steps the kernel costs itself (others call ``RooflineCost.prefill_cost``): up to
#: this many prompts and tokens, none of one token.
DENSE_MAX_PROMPTS, DENSE_MAX_TOKENS = 8, 1 << 16

#: Names of the kernel's status and bound codes (``sim.engine.kernel_loop``), by code.
_STATUS = np.array(["waiting", "running", "finished", "rejected"], dtype=object)
_BOUNDS = np.array(["compute", "memory", "comm", "overhead", "constant", "linear"],
                   dtype=object)
_BOUND_CODE = {"compute": 0, "memory": 1, "comm": 2, "overhead": 3}

#: The kernel's cost-model codes (``params_i[12]``).
ROOFLINE, CONSTANT, LINEAR = 0, 1, 2

_active = threading.local()  # the run's Python-side cost callbacks (objmode sees globals only)


def _cost_kind(cost: Any) -> int:
    """The kernel's code for a cost model (``ROOFLINE``, ``CONSTANT``, ``LINEAR``; -1: none)."""
    if isinstance(cost, RooflineCost):
        return ROOFLINE
    return {ConstantCost: CONSTANT, LinearCost: LINEAR}.get(type(cost), -1)


def compiled_blocker(policy: Any, cost: Any, n: int) -> str:
    """Why a run the interpreted fast path takes cannot use the kernel ('' when it can)."""
    if policy.mode != "vllm":
        return "Orca mode"
    if _cost_kind(cost) < 0:
        return "the cost model is not a RooflineCost, ConstantCost or LinearCost"
    if min(policy.max_num_seqs, n) >= MAX_TABLE_ROWS:
        return "max_num_seqs too large for the kernel's tables"
    try:  # numba, and a place for its on-disk cache (next to the module, or the user's)
        import sim.engine.kernel_loop  # noqa: F401
    except (ImportError, RuntimeError, OSError) as err:  # pragma: no cover - broken install
        return f"the compiled kernel is unavailable ({err})"
    return ""


def prefill_cost(sizes: np.ndarray) -> tuple[float, float, float, int]:
    """objmode callback: ``(seconds, flops, bytes, bound code)`` of a prefill of ``sizes``."""
    secs, flops, nbytes, bound = _active.costs.prefill(tuple(sizes.tolist()))
    return secs, flops, nbytes, _BOUND_CODE[bound]


def fill_decode_row(table: np.ndarray, rows: int) -> None:
    """objmode callback: the decode constants of batch size ``rows`` into ``table[rows, 0]``."""
    table[rows, 0, :] = _active.cost.decode_constants(rows)


def fill_dense_row(table: np.ndarray, known: np.ndarray, tokens: int, rows: int) -> None:
    """objmode callback: ``dense_constants(tokens, rows)`` into ``table[tokens, rows]``."""
    table[tokens, rows, :] = _active.cost.dense_constants(float(tokens), rows)
    known[tokens, rows] = True


def past_deadline() -> bool:
    """objmode callback: has the run's wall-clock budget run out?"""
    return time.perf_counter() > _active.deadline


def run_continuous_compiled(arrival: np.ndarray, prompt: np.ndarray, out: np.ndarray,
                            policy: Any, cost: Any, kv: Any, log: StepLog, *,
                            max_model_len: int | None, horizon_s: float | None,
                            deadline: float | None, replica: int = 0) -> FastResult:
    """``sim.engine.fastpath.run_continuous`` (vLLM mode) compiled: same arguments, same results."""
    from sim.engine import kernel_loop as loop  # numba compiles or loads the kernel here

    n = len(arrival)
    arrival = np.ascontiguousarray(arrival, dtype=np.float64)
    prompt = np.ascontiguousarray(prompt, dtype=np.int64)
    out = np.ascontiguousarray(out, dtype=np.int64)
    bs, num_blocks = kv.block_size, kv.num_blocks
    max_tokens = policy.max_num_batched_tokens
    arrival_reason = arrival_rejections(prompt, out, kv, max_tokens, max_model_len)
    rejected_on_arrival = np.zeros(n, dtype=np.bool_)
    rejected_on_arrival[list(arrival_reason)] = True

    big = 1 << 62
    kind, roofline = _cost_kind(cost), isinstance(cost, RooflineCost)
    ints = np.array([bs, min(num_blocks, big), min(kv.capacity_tokens, big), policy.max_num_seqs,
                     max_tokens,
                     int(policy.watermark * num_blocks) if num_blocks < (1 << 40) else 0,
                     -1 if kv.max_preemptions is None else kv.max_preemptions,
                     int(roofline and cost.decode_uses_min_context), int(horizon_s is not None),
                     int(deadline is not None), cost.model.num_layers if roofline else 1,
                     cost.tp if roofline else 1, kind], dtype=np.int64)
    scalars = (*cost.decode_scalars(), *cost.prefill_scalars()) if roofline else (0.0,) * 16
    analytic = ((cost.step_s, 0.0, 0.0) if kind == CONSTANT else
                (cost.base_s, cost.per_token_s, cost.per_seq_s) if kind == LINEAR else (0.0,) * 3)
    floats = np.array([math.inf if horizon_s is None else horizon_s, *scalars, *analytic],
                      dtype=np.float64)
    table_rows = min(policy.max_num_seqs, n) + 1 if roofline else 1
    decode_table = np.full((table_rows, 1, 21), np.nan)  # shaped as the dense table
    # dense constants of prefill steps by (tokens, prompts): np.empty and np.zeros leave the
    # pages untouched until a shape first occurs, so the table costs what the run uses
    dense_table = np.empty((min(max_tokens, kv.capacity_tokens, DENSE_MAX_TOKENS) + 1
                            if roofline else 1, DENSE_MAX_PROMPTS + 1, 21))
    dense_known = np.zeros(dense_table.shape[:2], dtype=np.bool_)
    res_f = np.full((6, n), np.nan)  # first scheduled, first token, finish, max ITL, scratch
    res_f[3] = 0.0
    res_i = np.zeros((4, n), dtype=np.int64)  # preemptions, generated, status, reason
    work = np.zeros((7, n), dtype=np.int64)  # max held, key, base, admitted at, epoch, links
    work[5:] = -1
    queues = np.empty((7, n), dtype=np.int64)
    groups_f, groups_i = np.empty(n + 1), np.empty(n + 1, dtype=np.int64)
    # live heap rows are running requests; twice that leaves room after dropping stale rows
    heaps = np.empty((3, 2 * min(policy.max_num_seqs, n) + 64, 3), dtype=np.int64)
    # the gap stack spans at most the oldest running request's output: twice the longest
    gap_rows = 2 * int(out.max(initial=0)) + 64
    gaps_i, gaps_f = np.empty(gap_rows, dtype=np.int64), np.empty(gap_rows)
    residues = np.zeros(bs, dtype=np.int64)
    log_i = np.empty((INITIAL_LOG_ROWS, len(INT_COLUMNS)), dtype=np.int64)
    log_f = np.empty((INITIAL_LOG_ROWS, len(FLOAT_COLUMNS)))
    log_b = np.empty(INITIAL_LOG_ROWS, dtype=np.int8)
    irr = np.empty((INITIAL_IRREGULAR_ROWS, 2))
    irr_count = np.empty(len(irr), dtype=np.int64)
    state_i = np.zeros(20, dtype=np.int64)
    state_i[0] = state_i[1] = -1  # no running request
    state_f = np.array([0.0, math.nan])  # clock, end of the last decode step

    _active.costs, _active.cost, _active.deadline = StepCosts(cost), cost, deadline
    try:
        while True:
            code, at, queued = loop.run_segment(
                arrival, prompt, out, rejected_on_arrival, ints, floats, decode_table,
                dense_table, dense_known, res_f, res_i, work, queues, groups_f, groups_i, heaps,
                gaps_i, gaps_f, residues, log_i, log_f, log_b, irr, irr_count, state_i, state_f)
            if code == loop.LOG_FULL and log.stream is not None and (
                    log.always_fold or len(log_i) >= AUTO_MAX_STEPS):
                # a bucketed step table: fold the rows and reuse the buffer
                _fold_rows(log, log_i, log_f, int(state_i[13]), replica, arrival, res_f, res_i)
                state_i[13] = 0
            elif code == loop.LOG_FULL:  # grow in place (realloc: no second copy)
                rows = max(2 * len(log_i), 64)
                log_i.resize((rows, log_i.shape[1]), refcheck=False)
                log_f.resize((rows, log_f.shape[1]), refcheck=False)
                log_b.resize(rows, refcheck=False)
            elif code == loop.IRR_FULL:
                irr.resize((max(2 * len(irr), 64), 2), refcheck=False)
                irr_count.resize(len(irr), refcheck=False)
            else:
                break
    finally:
        del _active.costs, _active.cost, _active.deadline
    if code == loop.STALLED:
        raise EngineError(
            f"policy {policy.name!r} stalled at t={at:.6f}s: empty plan, no wake_at_s,"
            f" no arrivals left, {queued} waiting and 0 running")
    if code == loop.EMPTIED:
        raise EngineError(f"fast path: preemption emptied the batch at t={at:.6f}s")

    steps, irregular_rows = int(state_i[13]), int(state_i[14])
    log_i.resize((steps, log_i.shape[1]), refcheck=False)  # trim in place
    log_f.resize((steps, log_f.shape[1]), refcheck=False)
    log_b.resize(steps, refcheck=False)
    irr.resize((irregular_rows, 2), refcheck=False)
    irr_count.resize(irregular_rows, refcheck=False)
    if log.bucketed:
        _fold_rows(log, log_i, log_f, steps, replica, arrival, res_f, res_i)
        log_i, log_f, log_b = log_i[:0], log_f[:0], log_b[:0]  # nothing left to hand over
    _fill_log(log, log_i, log_f, log_b, irr, irr_count, replica)
    result = FastResult(0)
    result.first_scheduled_s, result.first_token_s, result.finish_s, result.max_itl_s = \
        res_f[0], res_f[1], res_f[2], res_f[3]
    result.num_preemptions, result.num_generated = res_i[0], res_i[1]
    result.status = _STATUS[res_i[2]].tolist()
    result.reason = _reasons(loop, res_i, prompt, arrival_reason, max_tokens,
                             kv.max_preemptions)
    return result


def _reasons(loop: Any, res_i: np.ndarray, prompt: np.ndarray, arrival_reason: dict[int, str],
             max_tokens: int, limit: int | None) -> list[str]:
    """The rejection messages ``sim.engine.fastpath`` writes, from the kernel's reason codes."""
    reason = [""] * len(prompt)
    codes = res_i[3]
    for i in np.flatnonzero(codes).tolist():
        c = codes[i]
        if c == loop.ON_ARRIVAL:
            reason[i] = arrival_reason[i]
        elif c == loop.OVER_BUDGET:
            reason[i] = (f"prompt of {prompt[i] + res_i[1, i]} tokens exceeds "
                         f"max_num_batched_tokens={max_tokens}")
        elif c == loop.PREEMPTED_TOO_OFTEN:
            k = res_i[0, i]
            reason[i] = f"preempted {k} time{'s' if k > 1 else ''} (kv.max_preemptions={limit})"
        else:
            reason[i] = "context outgrew the KV cache"
    return reason


def _fold_rows(log: StepLog, log_i: np.ndarray, log_f: np.ndarray, n: int, replica: int,
               arrival: np.ndarray, res_f: np.ndarray, res_i: np.ndarray) -> None:
    """Fold the kernel's first ``n`` step rows into the log's ``StepStream`` (status code 2:
    finished, so the stream knows how far its measurement window reaches)."""
    stream = log.stream
    assert stream is not None
    stream.finished_all(arrival, res_f[2], res_i[2] == 2)
    data = {name: log_i[:n, i] for i, name in enumerate(INT_COLUMNS)}
    data.update({name: log_f[:n, i] for i, name in enumerate(FLOAT_COLUMNS)})
    for name in ZERO_COLUMNS:
        data[name] = np.zeros(n, dtype=np.float64 if name in STEP_FLOATS else np.int64)
    data["replica"] = np.full(n, replica, dtype=np.int64)
    stream.fold(data)


def _fill_log(log: StepLog, step_ints: np.ndarray, step_floats: np.ndarray,
              step_bounds: np.ndarray, irregular: np.ndarray, irregular_counts: np.ndarray,
              replica: int) -> None:
    """Hand the kernel's step rows and irregular gaps to ``log`` as ``sim.engine.fastpath`` writes
    them (packed columns; the arrays themselves, not copies)."""
    log.zero_columns = ZERO_COLUMNS
    log.packed_int_columns, log.packed_float_columns = INT_COLUMNS, FLOAT_COLUMNS
    log.packed_ints, log.packed_floats = step_ints.ravel(), step_floats.ravel()
    log.cols["bound"] = _BOUNDS[step_bounds]  # an object array: the table takes it uncopied
    log.replica = replica
    m = len(irregular_counts)
    if m:
        log.irregular_itl_at.frombytes(np.ascontiguousarray(irregular[:, 0]).tobytes())
        log.irregular_itl.frombytes(np.ascontiguousarray(irregular[:, 1]).tobytes())
        log.irregular_itl_count.frombytes(irregular_counts.tobytes())
        log.irregular_itl_replica.frombytes(np.full(m, replica, dtype=np.int64).tobytes())
