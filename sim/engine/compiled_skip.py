"""Exact event skipping in the compiled interpreter: a steady stretch of decode steps.

The general engine skips a steady decode plan's repeats in one event
(``sim.engine.skipping``); ``steady_stretch`` is the same for the compiled loop
(``sim.engine.compiled_loop``): every step of the stretch is costed and logged as stepping
would, in O(1), and the requests' counters advance once at its end. ``decode_series`` costs
such a stretch for the general engine (``sim.engine.compiled_series``), step by step by the
same rule, and ``shape_step`` one step of any shape (a padded prefill, say).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from sim.engine.compiled_cost import (
    KERNEL,
    ROOFLINE,
    batch_reductions,
    blocks_for,
    decode_roofline_step,
    decode_step_cost,
    dense_constants,
    step_cost,
)
from sim.engine.compiled_plan import (
    RF_ARRIVAL,
    RF_LAST_TOKEN,
    RF_MAX_ITL,
    RI_BLOCKS,
    RI_COMPUTED,
    RI_GENERATED,
    RI_MAX_HELD,
    RI_OUT,
)
from sim.engine.compiled_slots import (
    L_BYTES,
    L_DECODE,
    L_DURATION,
    L_FLOPS,
    L_LIVE,
    L_PAD_ROWS,
    L_PAD_TOKENS,
    L_PREFILL,
    L_RECOMPUTED,
    L_REGULAR,
    L_SEQS,
    L_START,
    L_USED,
    L_WAITING,
    P_BS,
    P_CAPACITY,
    P_COST,
    P_HAS_HORIZON,
    P_LAYERS,
    P_NUM_BLOCKS,
    P_TP,
    PF_HORIZON,
    S_KNOWN,
    S_LIVE,
    S_N_HEAP,
    S_N_LOG,
    S_N_PENDING,
    S_NXT,
    S_USED,
    SF_NOW,
)

# numba's on-disk cache of a function notices changes to its own file only: the rules these
# functions compile in are pinned here (tests/test_scheduling.py recomputes it), so a change
# to one of them invalidates them too, whether they are called from the loop or from Python.
SKIP_SHA256 = "03c106606e2d49a0d421d71b9bef7251a15f202c13aa97aa1adee53f04199775"
SKIP_SOURCES = ("sim/core/rules.py", "sim/cost/roofline_terms.py", "sim/cost/base.py",
                "sim/engine/compiled_cost.py", "sim/engine/compiled_plan.py",
                "sim/engine/compiled_slots.py")


@njit(**KERNEL)
def steady_stretch(req_i, req_f, plan_idx, n_plan, residues, params_i, params_f, analytic,  # noqa: ANN001, ANN201
                    terms, dense, log_i, log_f, log_b, st_i, st_f, until_s, steps_left):
    """Exact event skipping (as ``sim.engine.skipping`` does for the general engine): after a
    step whose plan decoded every scheduled request with no admission, preemption or
    departure, and with no arrival due, every following plan is the same until a request
    would finish or outgrow the cache, the KV growth would need more blocks than are free, a
    request arrives, or the horizon (or ``until_s``) is reached. Those steps are costed and
    logged one by one, but the requests' counters advance once, at the end (each token of the
    stretch comes one step after the previous: its gap is a step's duration). Returns the
    steps taken."""
    bs, num_blocks, capacity = params_i[P_BS], params_i[P_NUM_BLOCKS], params_i[P_CAPACITY]
    kind, layers, tp = params_i[P_COST], params_i[P_LAYERS], params_i[P_TP]
    has_horizon, horizon = params_i[P_HAS_HORIZON] != 0, params_f[PF_HORIZON]
    room = num_blocks - st_i[S_USED]
    # the stretch ends before any request finishes or reaches the cache's capacity
    k_max = steps_left
    kv0 = 0
    c_lo = c_hi = 0
    for k in range(n_plan):
        i = plan_idx[k]
        c = req_i[i, RI_COMPUTED]
        left = req_i[i, RI_OUT] - req_i[i, RI_GENERATED] - 1
        if left < k_max:
            k_max = left
        if capacity - 1 - c < k_max:
            k_max = capacity - 1 - c
        kv0 += c
        if k == 0 or c < c_lo:
            c_lo = c
        if k == 0 or c > c_hi:
            c_hi = c
        residues[c % bs] += 1
    n_log = st_i[S_N_LOG]
    if log_i.shape[0] - n_log < k_max:
        k_max = log_i.shape[0] - n_log
    nxt, known = st_i[S_NXT], st_i[S_KNOWN]
    next_arrival = req_f[nxt, RF_ARRIVAL] if nxt < known else np.inf
    now = st_f[SF_NOW]
    used, live = st_i[S_USED], st_i[S_LIVE]
    waiting = st_i[S_N_HEAP] + st_i[S_N_PENDING]
    worst = 0.0
    j = 0
    while j < k_max:
        need = residues[(bs - j % bs) % bs]  # rows whose next token opens a block
        if need > room:
            break  # the next plan preempts: stepping takes over
        if now >= until_s or (has_horizon and now >= horizon) or now >= next_arrival:
            break
        j += 1
        room -= need
        used += need
        kv = kv0 + n_plan * j
        secs, flops, nbytes, bound = decode_step_cost(
            kind, analytic, terms, dense, layers, tp, n_plan, kv, c_lo + j, c_hi + j)
        end = now + secs
        live += n_plan
        log_i[n_log, L_SEQS], log_i[n_log, L_PREFILL] = n_plan, 0
        log_i[n_log, L_DECODE], log_i[n_log, L_RECOMPUTED] = n_plan, 0
        log_i[n_log, L_WAITING], log_i[n_log, L_USED] = waiting, used
        log_i[n_log, L_REGULAR], log_i[n_log, L_LIVE] = n_plan, live
        log_i[n_log, L_PAD_TOKENS], log_i[n_log, L_PAD_ROWS] = 0, 0
        log_f[n_log, L_START], log_f[n_log, L_DURATION] = now, end - now
        log_f[n_log, L_FLOPS], log_f[n_log, L_BYTES] = flops, nbytes
        log_b[n_log] = bound
        if end - now > worst:
            worst = end - now
        n_log += 1
        now = end
    for k in range(n_plan):  # the requests' counters, once for the stretch
        i = plan_idx[k]
        c = req_i[i, RI_COMPUTED]
        residues[c % bs] -= 1
        if j:
            c += j
            req_i[i, RI_COMPUTED] = c
            req_i[i, RI_MAX_HELD] = c
            req_i[i, RI_GENERATED] += j
            req_i[i, RI_BLOCKS] = blocks_for(c, bs)
            req_f[i, RF_LAST_TOKEN] = now
            if worst > req_f[i, RF_MAX_ITL]:
                req_f[i, RF_MAX_ITL] = worst
    st_i[S_N_LOG], st_i[S_USED], st_i[S_LIVE] = n_log, used, live
    st_f[SF_NOW] = now
    return j


@njit(**KERNEL)
def decode_series(kind, analytic, terms, dense, layers, tp, rows, kv0, c_lo, c_hi,  # noqa: ANN001, ANN201
                  seconds, flops, nbytes, bounds):
    """The costs of ``len(seconds)`` successive pure-decode steps of ``rows`` rows, each a
    token longer than the step before: step ``j`` attends ``kv0 + rows * j`` keys, its rows
    ``c_lo + j`` to ``c_hi + j`` each. Each step is costed as ``steady_stretch`` costs one
    (``decode_step_cost``), into ``seconds``, ``flops``, ``nbytes`` and ``bounds`` (codes of
    ``compiled_cost.BOUND_NAMES``). A roofline's dense constants depend on the rows and tokens
    only, so they are taken once for the stretch."""
    if kind == ROOFLINE:
        d = dense_constants(dense, float(rows), rows)
        for j in range(len(seconds)):
            secs, f, b, bound = decode_roofline_step(terms, d, layers, tp, rows, kv0 + rows * j,
                                                     c_lo + j, c_hi + j)
            seconds[j], flops[j], nbytes[j], bounds[j] = secs, f, b, bound
        return
    for j in range(len(seconds)):
        secs, f, b, bound = decode_step_cost(kind, analytic, terms, dense, layers, tp, rows,
                                             kv0 + rows * j, c_lo + j, c_hi + j)
        seconds[j], flops[j], nbytes[j], bounds[j] = secs, f, b, bound


@njit(**KERNEL)
def shape_step(kind, analytic, terms, dense, layers, tp, new, ctx):  # noqa: ANN001, ANN201
    """``(seconds, flops, bytes, bound code)`` of one step of any shape: ``new`` tokens a row
    at contexts ``ctx`` (padding rows included, as ``BatchShape`` has them), from the batch's
    reductions (``roofline_terms.batch_reductions``, as the roofline's ``step`` takes them)
    and ``step_cost``: the general engine's steps that are not skipped, for large runs."""
    rows = len(new)
    tokens = 0
    for k in range(rows):
        tokens += new[k]
    if kind != ROOFLINE:
        return step_cost(kind, analytic, terms, dense, layers, tp, rows, tokens, 0, 0, 0, 0, 0,
                         0, 0.0, 0.0)
    n_dec, kv_dec, pairs_all, kv_all, c_lo, c_hi, worst, peak_eff = batch_reductions(
        terms, new, ctx, rows, tokens)
    return step_cost(kind, analytic, terms, dense, layers, tp, rows, tokens, n_dec, kv_dec,
                     pairs_all, kv_all, c_lo, c_hi, worst, peak_eff)
