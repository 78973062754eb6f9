"""The compiled interpreter's step loop: the general engine's scheduling points, in arrays.

``run`` is ``sim.engine.replica.Replica.begin`` and ``land`` (with ``sim.engine.steps``'
``_launch``, ``_commit`` and ``settle``) over explicit per-request arrays: take the arrivals,
reject what can never run, plan (``sim.engine.compiled_plan``), preempt, grow the KV, cost the
step (``sim.engine.compiled_cost``), commit tokens, release finished requests and record the
step. Every step is one O(running) pass; nothing is aggregated, so the code reads as the
general engine does. The whole state lives in the arrays ``sim.engine.compiled`` owns, so a run
can stop at any scheduling point (a full log buffer, a time to advance to, a step allowance)
and resume exactly where it stopped, with requests appended in between.

A scheduling point opens (``open_point``), idles (``idle_until``) and carries out its plan
(``carry_out``) the same way whoever planned it: ``run`` for the iteration-level
compositions, ``sim.engine.compiled_batch.run_batches`` for run-to-completion batches (each
its own entry, so neither compiles the other's plans: numba's first compile of a loop grows
with all the code it reaches).
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
from numba import njit

from sim.engine.compiled_cost import (
    KERNEL,
    blocks_fit,
    blocks_for,
    blocks_needed,
    tokens_allowed,
    uncomputed_tokens,
    within_limit,
)
from sim.engine.compiled_plan import (
    DECODE_FIRST,
    RF_ARRIVAL,
    RF_DEADLINE,
    RF_FINISH,
    RF_FIRST_SCHED,
    RF_FIRST_TOKEN,
    RF_LAST_TOKEN,
    RF_MAX_ITL,
    RI_BLOCKS,
    RI_COMPUTED,
    RI_DONE,
    RI_GENERATED,
    RI_ID,
    RI_MAX_HELD,
    RI_NPRE,
    RI_OUT,
    RI_PAD_CTX,
    RI_PRIORITY,
    RI_PROMPT,
    RI_REASON,
    RI_STATUS,
    plan_decode_first,
    plan_whole,
)
from sim.engine.compiled_queue import order_key, push
from sim.engine.compiled_requests import (
    drop_kv,
    keep_running,
    mark_requeued,
    settled,
    take_arrivals,
)
from sim.engine.compiled_skip import shape_step, steady_stretch
from sim.engine.compiled_slots import (
    B_PAD_CTX,
    B_PAD_N,
    BY_POLICY,
    DONE,
    FINISHED,
    IDLE,
    INVALID,
    IRR_FULL,
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
    LOG_FULL,
    OUTGREW,
    OVER_BUDGET,
    P_BS,
    P_CAPACITY,
    P_CHUNK,
    P_COMPOSITION,
    P_COST,
    P_HAS_HORIZON,
    P_HOLD,
    P_LAYERS,
    P_MARK,
    P_MAX_SEQS,
    P_MAX_TOKENS,
    P_NUM_BLOCKS,
    P_ORDER,
    P_TP,
    P_VICTIM,
    P_WHOLE,
    PAUSED,
    PF_HORIZON,
    REJECTED,
    RUNNING,
    S_ACCEPTING,
    S_KNOWN,
    S_LIVE,
    S_N_HEAP,
    S_N_IRR,
    S_N_LOG,
    S_N_PENDING,
    S_N_REJOIN,
    S_N_RUN,
    S_NXT,
    S_PRE_SEQ,
    S_QUEUED,
    S_STAMP,
    S_USED,
    SF_NOW,
    STALLED,
    WAITING,
)

# numba's on-disk cache of a function notices changes to its own file only: the sources of
# the rules compiled into this loop are pinned here (tests/test_scheduling.py recomputes it), and
# updating the pin is what invalidates the cached loop.
RULES_SHA256 = "6a7c4d16771c00009bbe693d3da75e170ed993b91374175905ea278e83b0fc5c"
RULE_SOURCES = ("sim/core/rules.py", "sim/cost/roofline_terms.py", "sim/cost/base.py",
                "sim/engine/compiled_cost.py", "sim/engine/compiled_plan.py",
                "sim/engine/compiled_queue.py", "sim/engine/compiled_skip.py",
                "sim/engine/compiled_slots.py", "sim/engine/compiled_requests.py")


def rules_sha256(sources: tuple[str, ...] = RULE_SOURCES) -> str:
    """The hash of ``sources`` as they are now (of ``RULE_SOURCES``: what ``RULES_SHA256``
    must equal)."""
    root = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256()
    for name in sources:
        digest.update((root / name).read_bytes())
    return digest.hexdigest()


_BIG = 1 << 62  # steps: no allowance

#: What a compiled function of another module that calls ``run`` compiles in (its own cache
#: does not notice a change here either: ``compiled_drive.LOOP_SHA256`` pins them).
LOOP_SOURCES = (*RULE_SOURCES, "sim/engine/compiled_loop.py")




@njit(**KERNEL)
def _irregular(irr: np.ndarray, irr_count: np.ndarray, n_irr: int, at: float, gap: float
               ) -> int:
    """``StepLog.add_irregular_itl`` of one token: merged with the last entry when time and
    gap match (the caller keeps room for a step's rows); returns the new row count."""
    if n_irr and irr[n_irr - 1, 0] == at and irr[n_irr - 1, 1] == gap:
        irr_count[n_irr - 1] += 1
        return n_irr
    irr[n_irr, 0], irr[n_irr, 1], irr_count[n_irr] = at, gap, 1
    return n_irr + 1


@njit(**KERNEL)
def _requeue(req_i: np.ndarray, req_f: np.ndarray, v: int, st_i: np.ndarray,
             params_i: np.ndarray, hkeys: np.ndarray, hranks: np.ndarray, hitems: np.ndarray,
             pending: np.ndarray, now: float) -> None:
    """``_preempt`` (recompute): drop ``v``'s KV and queue it first (the newest preempted
    leads), or reject it past ``kv.max_preemptions``."""
    if drop_kv(req_i, req_f, v, st_i, params_i, now):
        requeue(req_i, req_f, v, st_i, params_i, hkeys, hranks, hitems, pending)


@njit(**KERNEL)
def requeue(req_i: np.ndarray, req_f: np.ndarray, v: int, st_i: np.ndarray,
            params_i: np.ndarray, hkeys: np.ndarray, hranks: np.ndarray, hitems: np.ndarray,
            pending: np.ndarray) -> None:
    """Queue ``v``, whose KV was just dropped, as the newest preempted request (first in the
    queue); a recompute over a whole-prompt budget is rejected by the next plan, as the
    reference does."""
    mark_requeued(req_i, v)
    unc = req_i[v, RI_PROMPT] + req_i[v, RI_GENERATED]
    if params_i[P_WHOLE] and unc > params_i[P_MAX_TOKENS]:
        pending[st_i[S_N_PENDING]] = v
        st_i[S_N_PENDING] += 1
        return
    st_i[S_PRE_SEQ] += 1
    st_i[S_N_HEAP] = push(hkeys, hranks, hitems, st_i[S_N_HEAP],
                          order_key(params_i[P_ORDER], unc, req_i[v, RI_PRIORITY],
                                    req_f[v, RF_DEADLINE]), -st_i[S_PRE_SEQ], v)


@njit(**KERNEL)
def carry_out(req_i, req_f, running, n_run, plan_idx, plan_n, n_plan, batch, n_pad, ctx,  # noqa: ANN001, ANN201, C901
              new, params_i, analytic, terms, dense, log_i, log_f, log_b, irr, irr_count, st_i,
              st_f):
    """Carry out the plan of ``n_plan`` rows in ``plan_idx``/``plan_n`` and ``n_pad`` padding
    rows in ``batch`` at the clock, its preemptions done: ``_launch`` (admit, grow the KV, each
    row's context after the step into the scratch ``ctx``; with padding, the step's tokens a
    row into the scratch ``new``), the step's cost (``shape_step``), ``_commit`` and
    ``settle``, and ``StepLog.record`` (the queue it logs is ``S_N_HEAP`` + ``S_N_PENDING`` +
    ``S_N_REJOIN``, as the plan left them); the clock moves to the step's end. A request that
    leaves keeps the context it had as ``RI_PAD_CTX`` (a run-to-completion batch pads its row
    from there). Returns the running count, and whether the step admitted a request, saw one
    leave and computed prefill tokens."""
    bs, num_blocks, capacity = params_i[P_BS], params_i[P_NUM_BLOCKS], params_i[P_CAPACITY]
    kind, layers, tp = params_i[P_COST], params_i[P_LAYERS], params_i[P_TP]
    hold = params_i[P_HOLD] != 0  # finished requests keep their KV (``settled``)
    n_log, n_irr = st_i[S_N_LOG], st_i[S_N_IRR]
    now = st_f[SF_NOW]
    used = st_i[S_USED]
    num_prefill = num_decode = recomputed = tokens = 0
    admitted = False
    brought = 0  # computed tokens the admitted requests bring (their KV was sent here)
    for k in range(n_plan):
        i, n = plan_idx[k], plan_n[k]
        if req_i[i, RI_STATUS] != RUNNING:  # admitted: joins the batch
            admitted = True
            brought += req_i[i, RI_COMPUTED]
            req_i[i, RI_STATUS] = RUNNING
            if req_f[i, RF_FIRST_SCHED] != req_f[i, RF_FIRST_SCHED]:
                req_f[i, RF_FIRST_SCHED] = now
            running[n_run] = i
            n_run += 1
        c = req_i[i, RI_COMPUTED]
        target = c + n
        ctx[k] = target
        tokens += n
        if req_i[i, RI_MAX_HELD] > c:
            recomputed += min(target, req_i[i, RI_MAX_HELD]) - c
        need = blocks_needed(target, 0, req_i[i, RI_BLOCKS], bs)
        req_i[i, RI_BLOCKS] += need
        used += need
        gen = req_i[i, RI_GENERATED]
        if gen and req_i[i, RI_PROMPT] + gen - c == 1:
            num_decode += 1
        else:
            num_prefill += n
    st_i[S_USED] = used
    pad = 0
    if n_pad:  # the padding rows after the plan's, as ``BatchShape`` has them
        for k in range(n_plan):
            new[k] = plan_n[k]
        for k in range(n_pad):
            new[n_plan + k], ctx[n_plan + k] = batch[B_PAD_N, k], batch[B_PAD_CTX, k]
            pad += batch[B_PAD_N, k]
        secs, flops, nbytes, bound = shape_step(kind, analytic, terms, dense, layers, tp,
                                                new[:n_plan + n_pad], ctx[:n_plan + n_pad])
    else:
        secs, flops, nbytes, bound = shape_step(kind, analytic, terms, dense, layers, tp,
                                                plan_n[:n_plan], ctx[:n_plan])
    end = now + secs
    # -- ``_commit``: computed tokens catch up, tokens sampled; then ``settle``: finished
    # requests leave, a context that outgrew the cache too (what the step held and the
    # live tokens are logged as they were before anyone left) -------------------------
    regular = 0
    live = st_i[S_LIVE] + brought + tokens  # tokens whose KV the running requests hold
    logged_live = live
    left = False
    for k in range(n_plan):
        i, n = plan_idx[k], plan_n[k]
        c = req_i[i, RI_COMPUTED] + n
        req_i[i, RI_COMPUTED] = c
        if c > req_i[i, RI_MAX_HELD]:
            req_i[i, RI_MAX_HELD] = c
        gen = req_i[i, RI_GENERATED]
        if c >= req_i[i, RI_PROMPT] + gen:  # caught up: a token is sampled
            gen += 1
            req_i[i, RI_GENERATED] = gen
            last = req_f[i, RF_LAST_TOKEN]
            req_f[i, RF_LAST_TOKEN] = end
            if gen >= req_i[i, RI_OUT]:
                req_i[i, RI_STATUS] = FINISHED
                req_f[i, RF_FINISH] = end
            if gen == 1:
                req_f[i, RF_FIRST_TOKEN] = end
            else:
                gap = end - last
                if gap > req_f[i, RF_MAX_ITL]:
                    req_f[i, RF_MAX_ITL] = gap
                if last == now:
                    regular += 1
                else:
                    n_irr = _irregular(irr, irr_count, n_irr, end, gap)
        if req_i[i, RI_STATUS] == FINISHED:
            if not hold:  # else held until its KV has been sent
                used -= req_i[i, RI_BLOCKS]
                req_i[i, RI_BLOCKS] = 0
            live -= c
            left = True
            req_i[i, RI_PAD_CTX] = c
            settled(req_i, st_i, params_i, i)
        elif c >= capacity and (req_i[i, RI_PROMPT] + gen - c == 1
                                and blocks_for(c + 1, bs) > num_blocks):
            req_i[i, RI_PAD_CTX] = c
            used -= req_i[i, RI_BLOCKS]
            req_i[i, RI_BLOCKS] = 0
            req_i[i, RI_COMPUTED] = 0
            live -= c
            req_i[i, RI_STATUS], req_i[i, RI_REASON] = REJECTED, OUTGREW
            req_f[i, RF_FINISH] = end
            left = True
            settled(req_i, st_i, params_i, i)
    if left:
        n_run = keep_running(req_i, running, n_run)
    # -- ``StepLog.record`` --------------------------------------------------------------
    log_i[n_log, L_SEQS], log_i[n_log, L_PREFILL] = n_plan, num_prefill
    log_i[n_log, L_DECODE], log_i[n_log, L_RECOMPUTED] = num_decode, recomputed
    log_i[n_log, L_WAITING] = st_i[S_N_HEAP] + st_i[S_N_PENDING] + st_i[S_N_REJOIN]
    log_i[n_log, L_USED], log_i[n_log, L_REGULAR] = st_i[S_USED], regular
    log_i[n_log, L_LIVE] = logged_live
    log_i[n_log, L_PAD_TOKENS], log_i[n_log, L_PAD_ROWS] = pad, n_pad
    log_f[n_log, L_START], log_f[n_log, L_DURATION] = now, end - now
    log_f[n_log, L_FLOPS], log_f[n_log, L_BYTES] = flops, nbytes
    log_b[n_log] = bound
    st_i[S_N_LOG], st_i[S_N_IRR] = n_log + 1, n_irr
    st_i[S_USED], st_i[S_N_RUN], st_i[S_LIVE] = used, n_run, live
    st_f[SF_NOW] = end
    return n_run, admitted, left, num_prefill


@njit(**KERNEL)
def open_point(req_i, req_f, pending, hkeys, hranks, hitems, params_i, params_f, log_i, irr,  # noqa: ANN001, ANN201
               st_i, st_f, headroom, until_s, steps, max_steps):
    """The start of a scheduling point at the clock, the first half of ``Replica.begin``:
    -1 when a plan is to be made, after taking the arrivals (``take_arrivals``) and
    rejecting the recomputes over a whole-prompt budget that the last step queued; else the
    code the loop returns with — a full log buffer (``LOG_FULL``, ``IRR_FULL``: ``headroom``
    irregular rows one step can write), the horizon (``DONE``), the time to advance to or the
    step allowance reached (``PAUSED``)."""
    if st_i[S_N_LOG] >= log_i.shape[0]:
        return LOG_FULL
    if st_i[S_N_IRR] + headroom > irr.shape[0]:
        return IRR_FULL
    now = st_f[SF_NOW]
    if params_i[P_HAS_HORIZON] != 0 and now >= params_f[PF_HORIZON]:
        return DONE
    if now > until_s or steps >= max_steps:
        return PAUSED
    take_arrivals(req_i, req_f, st_i, params_i, hkeys, hranks, hitems, now)
    for j in range(st_i[S_N_PENDING]):  # recomputes over the budget, from the last step
        v = pending[j]
        req_i[v, RI_STATUS], req_i[v, RI_REASON] = REJECTED, OVER_BUDGET
        req_f[v, RF_FINISH] = now
        settled(req_i, st_i, params_i, v)
    st_i[S_N_PENDING] = 0
    return -1


@njit(**KERNEL)
def idle_until(req_f: np.ndarray, st_i: np.ndarray, st_f: np.ndarray, n_run: int,
               n_queued: int, wake: float) -> int:
    """An empty plan (``Replica._idle_until``): the clock moves to the plan's ``wake`` or the
    next arrival, whichever comes first (-1: plan again there); with neither, the replica
    waits for requests not handed over yet (``IDLE``), or the run ends (``DONE``; ``STALLED``
    with ``n_run`` running and ``n_queued`` queued requests left)."""
    st_i[S_QUEUED] = n_queued
    nxt = st_i[S_NXT]
    if nxt < st_i[S_KNOWN] and req_f[nxt, RF_ARRIVAL] < wake:
        wake = req_f[nxt, RF_ARRIVAL]
    if wake < np.inf:
        st_f[SF_NOW] = wake
        return -1
    if st_i[S_ACCEPTING]:
        return IDLE
    return STALLED if n_run or n_queued else DONE


@njit(**KERNEL)
def run(req_i, req_f, running, hkeys, hranks, hitems, pending, plan_idx, plan_n, pre_idx,  # noqa: ANN001, ANN201
        params_i, params_f, analytic, terms, dense, log_i, log_f, log_b, irr, irr_count, st_i,
        st_f, until_s, max_steps, residues, batch):
    """Run scheduling points of an iteration-level specification from the state in
    ``st_i``/``st_f`` until the run ends (``DONE``; ``STALLED``: an empty plan with requests
    left and none to come), the clock passes ``until_s`` or ``max_steps`` steps are done
    (``PAUSED``), the replica waits for requests not yet handed over (``IDLE``) or a log
    buffer fills (``LOG_FULL``, ``IRR_FULL``: grow it and call again). Returns the code.
    (``batch`` is run-to-completion batches' array, unread here: ``compiled_batch.run_batches``
    takes the same arguments.)"""
    bs, num_blocks = params_i[P_BS], params_i[P_NUM_BLOCKS]
    max_seqs, max_tokens, mark = params_i[P_MAX_SEQS], params_i[P_MAX_TOKENS], params_i[P_MARK]
    composition, whole, chunk = params_i[P_COMPOSITION], params_i[P_WHOLE] != 0, \
        params_i[P_CHUNK]
    victim = params_i[P_VICTIM]
    hold = params_i[P_HOLD] != 0  # finished requests keep their KV (``settled``)
    headroom = plan_idx.shape[0] + 1  # irregular rows one step can write, at most
    ctx = np.empty(plan_idx.shape[0], dtype=np.int64)  # carry_out's scratch, once a call
    steps = 0
    while True:
        code = open_point(req_i, req_f, pending, hkeys, hranks, hitems, params_i, params_f,
                          log_i, irr, st_i, st_f, headroom, until_s, steps, max_steps)
        if code >= 0:
            return code
        now = st_f[SF_NOW]
        n_run, n_heap = st_i[S_N_RUN], st_i[S_N_HEAP]
        n_plan = n_pre = 0
        if n_run or n_heap:
            st_i[S_STAMP] += 1
            free = num_blocks - st_i[S_USED]
            if composition == DECODE_FIRST:
                n_plan, n_pre, n_heap = plan_decode_first(
                    req_i, req_f, running, n_run, hkeys, hranks, hitems, n_heap, plan_idx,
                    plan_n, pre_idx, st_i[S_STAMP], max_seqs, max_tokens, free, mark, bs,
                    whole, chunk, victim)
            else:
                n_plan, n_pre, n_heap = plan_whole(
                    req_i, req_f, running, n_run, hkeys, hranks, hitems, n_heap, plan_idx,
                    plan_n, pre_idx, st_i[S_STAMP], max_seqs, max_tokens, free, mark, bs,
                    composition, victim)
            st_i[S_N_HEAP] = n_heap
        if n_plan == 0 and n_pre:  # preemptions only: room for requests that brought their
            for j in range(n_pre):  # KV (``Replica.begin``); plan again at the same instant
                _requeue(req_i, req_f, pre_idx[j], st_i, params_i, hkeys, hranks, hitems,
                         pending, now)
            st_i[S_N_RUN] = keep_running(req_i, running, n_run)
            continue
        if n_plan == 0:  # idle: until the next arrival, or for good
            code = idle_until(req_f, st_i, st_f, n_run, n_heap, np.inf)
            if code >= 0:
                return code
            continue
        # -- preemptions, then ``_launch`` ------------------------------------------------
        for j in range(n_pre):
            _requeue(req_i, req_f, pre_idx[j], st_i, params_i, hkeys, hranks, hitems, pending,
                     now)
        if n_pre:
            n_run = keep_running(req_i, running, n_run)
        n_run, admitted, left, num_prefill = carry_out(
            req_i, req_f, running, n_run, plan_idx, plan_n, n_plan, batch, 0, ctx, plan_n,
            params_i, analytic, terms, dense, log_i, log_f, log_b, irr, irr_count, st_i, st_f)
        steps += 1
        # (a holding replica serves one-token requests, the prefill side: it never decodes)
        if (n_pre == 0 and not admitted and not left and num_prefill == 0 and not hold
                and st_i[S_N_PENDING] == 0 and st_i[S_N_LOG] < log_i.shape[0]):
            steps += steady_stretch(req_i, req_f, plan_idx, n_plan, residues, params_i,
                                     params_f, analytic, terms, dense, log_i, log_f, log_b,
                                     st_i, st_f, until_s, max_steps - steps)


@njit(**KERNEL)
def apply_plan(s, run, id_base, id_step, pre_rows, rej_rows, max_seqs, max_tokens,  # noqa: ANN001, ANN201, C901
               queue_len, steady, admitted):
    """One scheduling point of a Python policy's plan (``sim.engine.planned``), on the packed
    arrays ``s`` (``compiled_state.ReplicaArrays``): ``Replica.begin`` after the policy
    answered. ``run`` holds ``Plan.run``'s requests, then their tokens, in its order; a
    request is named by its id, the row ``(id - id_base) // id_step`` (whose ``RI_ID`` must
    match), or by its row when ``id_step`` is 0. ``pre_rows`` / ``rej_rows``: the preemptions and
    rejections, by row, in the plan's order.

    ``validate_plan``'s rules come first: a plan that breaks any returns ``INVALID``, and the
    caller runs the reference instead, which names the rule (``max_seqs`` / ``max_tokens``:
    the policy's limits, ``rules.NO_LIMIT`` for none). Then the rejections, the preemptions
    (recompute), and ``carry_out`` of the step; a ``steady`` plan's repeats follow in one
    ``steady_stretch``, up to the next arrival (the caller's ``S_NXT``). ``queue_len`` is the
    queue the policy was shown; the requests the step admitted from it are written to
    ``admitted``. Returns the code (``IDLE``: nothing to run, the rejections made;
    ``PAUSED``: a step taken; ``LOG_FULL`` / ``IRR_FULL``: nothing done, grow the buffer), the
    number admitted, and the running count, KV blocks used and clock after it; ``s.out``
    then holds the running requests' view columns (``view_columns``)."""
    req_i, req_f, st_i, params_i = s.req_i, s.req_f, s.st_i, s.params_i
    n_plan, n_pre, n_rej = run.shape[0] // 2, pre_rows.shape[0], rej_rows.shape[0]
    now = s.st_f[SF_NOW]
    if st_i[S_N_LOG] >= s.log_i.shape[0]:
        return LOG_FULL, 0, st_i[S_N_RUN], st_i[S_USED], now
    if st_i[S_N_IRR] + n_plan + 1 > s.irr.shape[0]:
        return IRR_FULL, 0, st_i[S_N_RUN], st_i[S_USED], now
    plan_idx, plan_n = s.plan_idx, s.plan_n
    if n_plan > plan_idx.shape[0]:
        return INVALID, 0, 0, 0, now
    bs, num_blocks, nxt = params_i[P_BS], params_i[P_NUM_BLOCKS], st_i[S_NXT]
    # -- ``validate_plan`` (a broken rule may leave marks behind: the run starts over) ------
    for k in range(n_plan):  # the rows the plan names
        i = run[k]
        if id_step:
            i -= id_base
            if i < 0 or i % id_step:
                return INVALID, 0, 0, 0, now
            i //= id_step
            if i >= st_i[S_KNOWN] or req_i[i, RI_ID] != run[k]:
                return INVALID, 0, 0, 0, now
        plan_idx[k], plan_n[k] = i, run[n_plan + k]
    st_i[S_STAMP] += 2
    mark_pre, mark_rej = st_i[S_STAMP] - 1, st_i[S_STAMP]
    for j in range(n_rej):  # waiting: arrived, not rejected, not running
        v = rej_rows[j]
        if v >= nxt or req_i[v, RI_STATUS] != WAITING or req_i[v, RI_DONE] == mark_rej:
            return INVALID, 0, 0, 0, now
        req_i[v, RI_DONE] = mark_rej
    freed = 0
    for j in range(n_pre):
        v = pre_rows[j]
        if req_i[v, RI_STATUS] != RUNNING or req_i[v, RI_DONE] == mark_pre:
            return INVALID, 0, 0, 0, now
        req_i[v, RI_DONE] = mark_pre
        freed += req_i[v, RI_BLOCKS]
    if n_plan == 0 and n_pre:  # preempting to make room needs KV that came from elsewhere
        return INVALID, 0, 0, 0, now
    if not within_limit(n_plan, max_seqs):
        return INVALID, 0, 0, 0, now
    total = blocks = n_adm = 0
    for k in range(n_plan):
        i, n = plan_idx[k], plan_n[k]
        status, mark = req_i[i, RI_STATUS], req_i[i, RI_DONE]
        if status == RUNNING:
            if mark == mark_pre:  # both preempted and scheduled
                return INVALID, 0, 0, 0, now
        elif status != WAITING or i >= nxt or mark == mark_rej:
            return INVALID, 0, 0, 0, now
        else:
            admitted[n_adm] = i
            n_adm += 1
        c = req_i[i, RI_COMPUTED]
        if not tokens_allowed(n, uncomputed_tokens(req_i[i, RI_PROMPT], req_i[i, RI_GENERATED],
                                                   c)):
            return INVALID, 0, 0, 0, now
        total += n
        blocks += blocks_needed(c + n, 0, req_i[i, RI_BLOCKS], bs)
    if not within_limit(total, max_tokens):
        return INVALID, 0, 0, 0, now
    if not blocks_fit(blocks, num_blocks - st_i[S_USED], freed):
        return INVALID, 0, 0, 0, now
    # -- the rejections and preemptions, then the step --------------------------------------
    for j in range(n_rej):
        v = rej_rows[j]
        req_i[v, RI_STATUS], req_i[v, RI_REASON] = REJECTED, BY_POLICY
        req_f[v, RF_FINISH] = now
        settled(req_i, st_i, params_i, v)
    requeued = 0
    for j in range(n_pre):
        v = pre_rows[j]
        if drop_kv(req_i, req_f, v, st_i, params_i, now):
            mark_requeued(req_i, v)
            requeued += 1
    n_run = st_i[S_N_RUN]
    if n_pre:
        n_run = keep_running(req_i, s.running, n_run)
    st_i[S_N_RUN] = n_run
    st_i[S_N_HEAP] = queue_len - n_rej + requeued - n_adm  # the queue the step logs
    if n_plan == 0:
        view_columns(req_i, req_f, s.running, n_run, s.out)
        return IDLE, 0, n_run, st_i[S_USED], now
    n_run, joined, left, num_prefill = carry_out(
        req_i, req_f, s.running, n_run, plan_idx, plan_n, n_plan, s.batch, 0,
        np.empty(n_plan, dtype=np.int64), plan_n, params_i, s.analytic, s.terms, s.dense,
        s.log_i, s.log_f, s.log_b, s.irr, s.irr_count, st_i, s.st_f)
    if (steady and n_pre == 0 and not joined and not left and num_prefill == 0
            and params_i[P_HOLD] == 0 and st_i[S_N_LOG] < s.log_i.shape[0]):
        steady_stretch(req_i, req_f, plan_idx, n_plan, s.residues, params_i, s.params_f,
                       s.analytic, s.terms, s.dense, s.log_i, s.log_f, s.log_b, st_i, s.st_f,
                       np.inf, _BIG)
    view_columns(req_i, req_f, s.running, st_i[S_N_RUN], s.out)
    return PAUSED, n_adm, st_i[S_N_RUN], st_i[S_USED], s.st_f[SF_NOW]


#: The integer columns of a ``SeqView`` after its id, in its fields' order; its derived
#: ``num_uncomputed`` follows them.
VIEW_COLUMNS = (RI_PROMPT, RI_GENERATED, RI_COMPUTED, RI_NPRE, RI_BLOCKS, RI_PRIORITY)
#: Every ``SeqView`` field: the id, ``VIEW_COLUMNS``, ``num_uncomputed`` and the arrival time.
VIEW_FIELDS = 3 + len(VIEW_COLUMNS)


@njit(**KERNEL)
def view_columns(req_i: np.ndarray, req_f: np.ndarray, running: np.ndarray, n_run: int,
                 out: np.ndarray) -> None:
    """The running requests' ``SeqView`` fields, column after column into ``out`` (one
    column a block of ``running``'s length): the integers first — the id (``RI_ID``),
    ``VIEW_COLUMNS`` and the tokens left to compute (``rules.uncomputed_tokens``) — then the
    arrival time (its float64 bits, last, so that a driver reads the integers in one call)."""
    rows = running.shape[0]
    out_f = out.view(np.float64)
    last = (len(VIEW_COLUMNS) + 1) * rows
    for r in range(n_run):
        i = running[r]
        out[r] = req_i[i, RI_ID]
        for j in range(len(VIEW_COLUMNS)):
            out[(j + 1) * rows + r] = req_i[i, VIEW_COLUMNS[j]]
        out[last + r] = uncomputed_tokens(req_i[i, RI_PROMPT], req_i[i, RI_GENERATED],
                                          req_i[i, RI_COMPUTED])
        out_f[last + rows + r] = req_f[i, RF_ARRIVAL]
