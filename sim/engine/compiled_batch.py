"""Run-to-completion batches in the compiled interpreter: ``policies.batch_run`` over arrays.

``run_batches`` is the loop of a ``BatchSpec`` (``compiled_loop.run``'s scheduling points,
with these plans). Each other function is one part of the reference interpreter, read side by
side with it:
``plan_batch`` is ``RunToCompletion.schedule`` (``pick_batch`` and ``fitting_prefix`` for a
new batch; ``_continue``'s rejoin prefill, or its decode plan with ``grow_running``'s victims
and the finished members as padding rows); ``park`` is ``Replica._preempt`` of a member, which
waits outside the heap to rejoin its batch; ``decode_run`` is the exact event skipping of
``sim.engine.batch_skip``: the batch's steady decode steps one after the other, O(1) a step,
finishes included (a finished member's row turns into padding), arrivals joining the queue at
each step's start, until the batch ends or its KV growth would need a preemption. The rules
(when a batch is ready, the room to rejoin, blocks needed) are ``sim.core.rules``, compiled
from their source.

The batch lives in the ``batch`` array (``compiled_slots.B_*``): its members in the order they
joined, and the plan's padding rows. A member's row in ``req_i`` carries ``RI_PAD_CTX``, the
context its row had in the last step it took part in (as a padding row too, once it left the
running set: finished, or rejected), which is what ``RunToCompletion.context`` holds.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from sim.engine.compiled_cost import (
    KERNEL,
    batch_due_s,
    batch_ready,
    blocks_for,
    blocks_needed,
    prompt_bucket,
    rejoin_free_blocks,
)
from sim.engine.compiled_loop import carry_out, idle_until, open_point
from sim.engine.compiled_plan import (
    RF_ARRIVAL,
    RF_DEADLINE,
    RF_FINISH,
    RF_LAST_TOKEN,
    RF_MAX_ITL,
    RI_BLOCKS,
    RI_COMPUTED,
    RI_GENERATED,
    RI_MAX_HELD,
    RI_OUT,
    RI_PAD_CTX,
    RI_PRIORITY,
    RI_PROMPT,
    RI_RANK,
    RI_STATUS,
    VICTIM_NEWEST,
    grow_running,
)
from sim.engine.compiled_queue import order_key, pop
from sim.engine.compiled_requests import (
    drop_kv,
    keep_running,
    mark_requeued,
    settled,
    take_arrivals,
)
from sim.engine.compiled_skip import decode_series
from sim.engine.compiled_slots import (
    B_MEMBERS,
    B_PAD_CTX,
    B_PAD_N,
    FINISHED,
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
    NUM_PARAMS_I,
    P_BS,
    P_BUCKET_WIDTH,
    P_CAPACITY,
    P_COST,
    P_HAS_HORIZON,
    P_LAYERS,
    P_MAX_SEQS,
    P_NUM_BLOCKS,
    P_NUM_BOUNDS,
    P_ORDER,
    P_TP,
    PF_HORIZON,
    PF_WAIT,
    REJECTED,
    S_ACCEPTING,
    S_KNOWN,
    S_LIVE,
    S_N_HEAP,
    S_N_LOG,
    S_N_MEMBERS,
    S_N_PENDING,
    S_N_REJOIN,
    S_N_RUN,
    S_NXT,
    S_PRE_SEQ,
    S_STAMP,
    S_USED,
    SF_NOW,
    WAITING,
)

# numba's on-disk cache of a function notices changes to its own file only: the loop's sources
# that ``run_batches`` compiles in (``compiled_loop.LOOP_SOURCES``) are pinned here
# (tests/test_scheduling.py recomputes it), and updating the pin invalidates the cached loop.
BATCH_SHA256 = "6f4adcf6d25f6c7f5c55ab857fd7ccae1ce564e6cbd292bbf631bf0cab6295dc"

_INF = np.inf
#: Steps of a decode run costed at a time (``decode_series``): a block of a batch's steps
#: at once, and never more than its last member still needs.
COST_BLOCK = 256


@njit(**KERNEL)
def padded_prefill(plan_n: np.ndarray, n_plan: int, batch: np.ndarray) -> int:
    """``padded_prefill``'s padding rows for the plan's ``n_plan`` rows: every row shorter than
    the longest computes up to it; written into ``batch``'s padding rows, returns how many."""
    longest = 0
    for k in range(n_plan):
        if plan_n[k] > longest:
            longest = plan_n[k]
    n_pad = 0
    for k in range(n_plan):
        if plan_n[k] < longest:
            batch[B_PAD_N, n_pad], batch[B_PAD_CTX, n_pad] = longest - plan_n[k], longest
            n_pad += 1
    return n_pad


@njit(**KERNEL)
def _prompt_blocks(req_i: np.ndarray, i: int, bs: int) -> tuple[int, int]:
    """The tokens request ``i`` would prefill now (its prompt; its prompt and generated
    tokens to recompute) and the blocks their KV needs (``kv.blocks_needed``)."""
    c, held = req_i[i, RI_COMPUTED], req_i[i, RI_BLOCKS]
    unc = req_i[i, RI_PROMPT] + req_i[i, RI_GENERATED] - c
    return unc, blocks_needed(c + unc, 0, held, bs)


@njit(**KERNEL)
def _new_batch(req_i, req_f, hkeys, hranks, hitems, n_heap, plan_idx, plan_n, batch,  # noqa: ANN001, ANN202
               st_i, params_i, free, bs, size, wait_s, more, now):
    """``RunToCompletion.schedule`` with no batch in flight: ``pick_batch`` over the heap (one
    group: the queue; per prompt bucket: ``_new_bucketed_batch``), then the
    ``fitting_prefix`` of the batch, padded. Returns ``(n_plan, n_pad, n_heap, wake)``
    (``wake``: when to look again, ``inf``: at the next arrival)."""
    st_i[S_N_MEMBERS] = 0
    if params_i[P_BUCKET_WIDTH] > 0 or params_i[P_NUM_BOUNDS] > 0:
        return _new_bucketed_batch(req_i, req_f, hkeys, hranks, hitems, n_heap, plan_idx,
                                   plan_n, batch, st_i, params_i, free, bs, size, wait_s, more,
                                   now)
    count = n_heap
    due = _INF
    if count < size and more and wait_s != _INF:  # only a short group is timed
        oldest = req_f[hitems[0], RF_ARRIVAL]
        for h in range(1, n_heap):
            a = req_f[hitems[h], RF_ARRIVAL]
            if a < oldest:
                oldest = a
        due = batch_due_s(oldest, wait_s)
    if not batch_ready(count, size, more, now, due):
        return 0, 0, n_heap, due
    n_plan = 0
    while n_plan < size and n_heap > 0:  # the longest prefix whose blocks fit
        i = hitems[0]
        unc, need = _prompt_blocks(req_i, i, bs)
        if need > free:
            break
        free -= need
        n_heap = pop(hkeys, hranks, hitems, n_heap)
        plan_idx[n_plan], plan_n[n_plan] = i, unc
        batch[B_MEMBERS, n_plan] = i
        n_plan += 1
    st_i[S_N_MEMBERS] = n_plan
    if n_plan == 0:
        return 0, 0, n_heap, _INF
    return n_plan, padded_prefill(plan_n, n_plan, batch), n_heap, _INF


@njit(**KERNEL)
def _new_bucketed_batch(req_i, req_f, hkeys, hranks, hitems, n_heap, plan_idx, plan_n,  # noqa: ANN001, ANN202, C901
                        batch, st_i, params_i, free, bs, size, wait_s, more, now):
    """``pick_batch`` with prompt buckets: the queue in its order (the heap's rows sorted by
    key and rank), grouped by bucket (``rules.prompt_bucket``) in the order of each group's
    first request; the first ready group goes (``rules.batch_ready``), cut to ``size``, its
    longest prefix that fits taken. The rest of the queue is written back sorted (a sorted
    array is a heap). Returns what ``_new_batch`` does."""
    q = n_heap
    width = params_i[P_BUCKET_WIDTH]
    bounds = params_i[NUM_PARAMS_I:NUM_PARAMS_I + params_i[P_NUM_BOUNDS]]
    by_rank = np.argsort(hranks[:q], kind="mergesort")  # the queue's order: key, then rank
    by_key = np.argsort(hkeys[:q][by_rank], kind="mergesort")
    queue = by_rank[by_key]  # heap rows in queue order
    keys, ranks, items = hkeys[queue], hranks[queue], hitems[queue]
    bucket = np.empty(q, dtype=np.int64)
    for k in range(q):
        i = items[k]
        bucket[k] = prompt_bucket(req_i[i, RI_PROMPT] + req_i[i, RI_GENERATED]
                                  - req_i[i, RI_COMPUTED], width, bounds)
    grouped = np.argsort(bucket, kind="mergesort")  # queue positions, bucket by bucket
    starts = np.empty(q + 1, dtype=np.int64)  # each group's run in ``grouped``
    n_groups = 0
    for g in range(q):
        if g == 0 or bucket[grouped[g]] != bucket[grouped[g - 1]]:
            starts[n_groups] = g
            n_groups += 1
    starts[n_groups] = q
    firsts = np.empty(n_groups, dtype=np.int64)  # a group's first position in the queue
    for g in range(n_groups):
        firsts[g] = grouped[starts[g]]
    chosen, wake = -1, _INF
    for g in np.argsort(firsts):  # the groups in the order of their first request
        count = starts[g + 1] - starts[g]
        due = _INF
        if count < size and more and wait_s != _INF:  # only a short group is timed
            oldest = _INF
            for k in range(starts[g], starts[g + 1]):
                a = req_f[items[grouped[k]], RF_ARRIVAL]
                if a < oldest:
                    oldest = a
            due = batch_due_s(oldest, wait_s)
        if batch_ready(count, size, more, now, due):
            chosen = g
            break
        if due < wake:
            wake = due
    if chosen < 0:
        return 0, 0, n_heap, wake
    taken = np.zeros(q, dtype=np.bool_)
    n_plan = 0
    for k in range(starts[chosen], min(starts[chosen + 1], starts[chosen] + size)):
        i = items[grouped[k]]  # the longest prefix whose blocks fit
        unc, need = _prompt_blocks(req_i, i, bs)
        if need > free:
            break
        free -= need
        taken[grouped[k]] = True
        plan_idx[n_plan], plan_n[n_plan] = i, unc
        batch[B_MEMBERS, n_plan] = i
        n_plan += 1
    st_i[S_N_MEMBERS] = n_plan
    n_heap = 0
    for k in range(q):  # the rest of the queue, in order: a heap
        if not taken[k]:
            hkeys[n_heap], hranks[n_heap], hitems[n_heap] = keys[k], ranks[k], items[k]
            n_heap += 1
    if n_plan == 0:
        return 0, 0, n_heap, _INF
    return n_plan, padded_prefill(plan_n, n_plan, batch), n_heap, _INF


@njit(**KERNEL)
def _rejoin(req_i, req_f, n_run, plan_idx, plan_n, pre_idx, batch, st_i, free, bs, order):  # noqa: ANN001, ANN202
    """``_continue``'s rejoin: the members waiting to rejoin in queue order (the order's key,
    the newest preempted first on ties), the longest prefix of them whose blocks fit beside
    a block of headroom per running member. Returns the plan's rows and padding rows."""
    n = 0
    for m in range(st_i[S_N_MEMBERS]):  # the waiting members (``pre_idx`` as scratch)
        i = batch[B_MEMBERS, m]
        if req_i[i, RI_STATUS] != WAITING:
            continue
        key = order_key(order, req_i[i, RI_PROMPT] + req_i[i, RI_GENERATED]
                        - req_i[i, RI_COMPUTED], req_i[i, RI_PRIORITY], req_f[i, RF_DEADLINE])
        pos = n  # insertion: by key, then the later preemption first
        while pos > 0:
            j = pre_idx[pos - 1]
            kj = order_key(order, req_i[j, RI_PROMPT] + req_i[j, RI_GENERATED]
                           - req_i[j, RI_COMPUTED], req_i[j, RI_PRIORITY],
                           req_f[j, RF_DEADLINE])
            if kj < key or (kj == key and req_i[j, RI_RANK] > req_i[i, RI_RANK]):
                break
            pre_idx[pos] = j
            pos -= 1
        pre_idx[pos] = i
        n += 1
    room = rejoin_free_blocks(free, n_run)
    n_plan = 0
    for k in range(n):
        i = pre_idx[k]
        unc, need = _prompt_blocks(req_i, i, bs)
        if need > room:
            break
        room -= need
        plan_idx[n_plan], plan_n[n_plan] = i, unc
        n_plan += 1
    if n_plan == 0:
        return 0, 0
    st_i[S_N_REJOIN] -= n_plan  # a plan that admits always runs
    return n_plan, padded_prefill(plan_n, n_plan, batch)


@njit(**KERNEL)
def plan_batch(req_i, req_f, running, n_run, hkeys, hranks, hitems, n_heap, plan_idx,  # noqa: ANN001, ANN201
               plan_n, pre_idx, batch, st_i, params_i, stamp, free, bs, size, wait_s, order,
               more, now):
    """``RunToCompletion.schedule``: continue the batch in flight (its rejoiners' padded
    recompute, else a decode step of the running members with the others as padding rows,
    preempting the newest while the KV does not fit), or form a new one. Returns ``(n_plan,
    n_pre, n_pad, n_heap, wake, steady)``; an empty plan idles until ``wake`` (``inf``: the
    next arrival)."""
    if n_run == 0 and st_i[S_N_REJOIN] == 0:
        n_plan, n_pad, n_heap, wake = _new_batch(req_i, req_f, hkeys, hranks, hitems, n_heap,
                                                 plan_idx, plan_n, batch, st_i, params_i, free,
                                                 bs, size, wait_s, more, now)
        return n_plan, 0, n_pad, n_heap, wake, False
    rejoining = st_i[S_N_REJOIN] > 0
    if rejoining:
        n_plan, n_pad = _rejoin(req_i, req_f, n_run, plan_idx, plan_n, pre_idx, batch, st_i,
                                free, bs, order)
        if n_plan:
            return n_plan, 0, n_pad, n_heap, _INF, False
    if n_run == 0:
        return 0, 0, 0, n_heap, _INF, False
    # ``grow_running``: every running member's pending tokens, the newest out while short
    n_plan, n_pre, _, _ = grow_running(req_i, req_f, running, n_run, plan_idx, plan_n,
                                       pre_idx, stamp, free, bs, VICTIM_NEWEST)
    if n_plan == 0:  # nothing would run: the reference's plan is empty, victims and all
        return 0, 0, 0, n_heap, _INF, False
    steady = n_pre == 0 and not rejoining
    for k in range(n_plan):
        if plan_n[k] != 1:
            steady = False
    n_pad = 0  # the members that left: one padding token a step, at the context they'd have
    for m in range(st_i[S_N_MEMBERS]):
        i = batch[B_MEMBERS, m]
        status = req_i[i, RI_STATUS]
        if status == FINISHED or status == REJECTED:
            ctx = req_i[i, RI_PAD_CTX] + 1
            req_i[i, RI_PAD_CTX] = ctx
            batch[B_PAD_N, n_pad], batch[B_PAD_CTX, n_pad] = 1, ctx
            n_pad += 1
    return n_plan, n_pre, n_pad, n_heap, _INF, steady


@njit(**KERNEL)
def park(req_i: np.ndarray, req_f: np.ndarray, v: int, st_i: np.ndarray, params_i: np.ndarray,
         now: float) -> None:
    """``Replica._preempt`` (recompute) of member ``v``: its KV dropped, it waits to rejoin
    its batch (outside the heap: only its batch takes it again), or past
    ``kv.max_preemptions`` it is rejected and pads the batch from the context it had."""
    c = req_i[v, RI_COMPUTED]
    if drop_kv(req_i, req_f, v, st_i, params_i, now):
        mark_requeued(req_i, v)
        st_i[S_PRE_SEQ] += 1
        req_i[v, RI_RANK] = st_i[S_PRE_SEQ]
        st_i[S_N_REJOIN] += 1
    else:
        req_i[v, RI_PAD_CTX] = c


@njit(**KERNEL)
def decode_run(req_i, req_f, running, n_run, batch, n_pad, hkeys, hranks, hitems,  # noqa: ANN001, ANN201, C901
               residues, params_i, params_f, analytic, terms, dense, log_i, log_f, log_b,
               st_i, st_f, until_s, steps_left):
    """Carry out a steady decode plan of the batch (``n_run`` running members, each of whose
    last token came at the clock, and the plan's ``n_pad`` padding rows) and the steps that
    repeat it, as ``sim.engine.batch_skip`` does: each step costed and logged as stepping
    would, arrivals joining the queue at each step's start, members finishing at their own
    step (their row turns into padding: the rows, and so the cost's multiset of contexts, do
    not change). Stops before the step whose KV growth the free blocks cannot hold (a
    preemption: the plan decides), after the last member finishes, or at the horizon,
    ``until_s``, the step allowance, a full log or a context about to outgrow the cache.
    Returns the steps taken (0: the plan is to be carried out by ``carry_out``)."""
    now = st_f[SF_NOW]
    for r in range(n_run):  # every token of the run comes one step after the last
        if req_f[running[r], RF_LAST_TOKEN] != now:
            return 0  # a member that sat out a rejoin: its gap is stepping's to record
    bs, num_blocks, capacity = params_i[P_BS], params_i[P_NUM_BLOCKS], params_i[P_CAPACITY]
    kind, layers, tp = params_i[P_COST], params_i[P_LAYERS], params_i[P_TP]
    has_horizon, horizon = params_i[P_HAS_HORIZON] != 0, params_f[PF_HORIZON]
    rows = n_run + n_pad
    kv0 = 0
    lo = hi = -1
    k_cap = steps_left
    longest = 0  # the most tokens a member has left: the run's last step
    order = np.empty(n_run, dtype=np.int64)  # running positions by tokens left, fewest first
    finish_at = np.empty(n_run, dtype=np.int64)  # ... and their tokens left: their last step
    for r in range(n_run):
        i = running[r]
        c = req_i[i, RI_COMPUTED]
        left = req_i[i, RI_OUT] - req_i[i, RI_GENERATED]
        if left > 1 and capacity - 1 - c < left - 1 and capacity - 1 - c < k_cap:
            k_cap = capacity - 1 - c  # it would outgrow the cache unfinished: stepping decides
        residues[c % bs] += 1
        if left > longest:
            longest = left
        kv0 += c + 1
        if lo < 0 or c + 1 < lo:
            lo = c + 1
        if c + 1 > hi:
            hi = c + 1
        pos = r
        while pos > 0 and finish_at[pos - 1] > left:
            order[pos], finish_at[pos] = order[pos - 1], finish_at[pos - 1]
            pos -= 1
        order[pos], finish_at[pos] = r, left
    for k in range(n_pad):
        ctx = batch[B_PAD_CTX, k]
        kv0 += ctx
        if lo < 0 or ctx < lo:
            lo = ctx
        if ctx > hi:
            hi = ctx
    n_log = st_i[S_N_LOG]
    used, live = st_i[S_USED], st_i[S_LIVE]
    # the steps' costs, by the rule a general engine's batch run is costed by (the run's rows
    # never change: each step is the last with every context a token longer)
    seconds, flops, nbytes = np.empty(COST_BLOCK), np.empty(COST_BLOCK), np.empty(COST_BLOCK)
    bounds = np.empty(COST_BLOCK, dtype=np.int8)
    first = costed = 0
    alive = n_run
    done = 0  # members finished in this run: ``order[:done]``
    worst = 0.0
    j = 0
    nxt, known = st_i[S_NXT], st_i[S_KNOWN]
    next_arrival = req_f[nxt, RF_ARRIVAL] if nxt < known else _INF
    waiting = st_i[S_N_HEAP] + st_i[S_N_PENDING] + st_i[S_N_REJOIN]
    opening = 0  # the residue of the rows whose next token opens a block: -j mod bs
    while j < k_cap:
        if j > 0:  # the next scheduling point: the same plan, unless something changed
            if alive == 0 or now > until_s or (has_horizon and now >= horizon):
                break
            if n_log >= log_i.shape[0]:
                break
            if next_arrival <= now:  # ``take_arrivals``: they join the queue here
                take_arrivals(req_i, req_f, st_i, params_i, hkeys, hranks, hitems, now)
                nxt = st_i[S_NXT]
                next_arrival = req_f[nxt, RF_ARRIVAL] if nxt < known else _INF
                waiting = st_i[S_N_HEAP] + st_i[S_N_PENDING] + st_i[S_N_REJOIN]
        need = residues[opening]
        if need > num_blocks - used:
            break  # the plan preempts: stepping takes over
        used += need
        if j - first >= costed:  # the next steps' costs, a block at a time
            first, costed = j, min(COST_BLOCK, longest - j)
            decode_series(kind, analytic, terms, dense, layers, tp, rows, kv0 + rows * j,
                          lo + j, hi + j, seconds[:costed], flops[:costed], nbytes[:costed],
                          bounds[:costed])
        k = j - first
        end = now + seconds[k]
        if end - now > worst:
            worst = end - now
        log_i[n_log, L_SEQS], log_i[n_log, L_PREFILL] = alive, 0
        log_i[n_log, L_DECODE], log_i[n_log, L_RECOMPUTED] = alive, 0
        log_i[n_log, L_WAITING], log_i[n_log, L_USED] = waiting, used
        log_i[n_log, L_REGULAR], log_i[n_log, L_LIVE] = alive, live + alive
        log_i[n_log, L_PAD_TOKENS], log_i[n_log, L_PAD_ROWS] = rows - alive, rows - alive
        log_f[n_log, L_START], log_f[n_log, L_DURATION] = now, end - now
        log_f[n_log, L_FLOPS], log_f[n_log, L_BYTES] = flops[k], nbytes[k]
        log_b[n_log] = bounds[k]
        live += alive
        j += 1
        opening = opening - 1 if opening else bs - 1
        while done < n_run and finish_at[done] == j:  # the members whose last token it was
            i = running[order[done]]
            c0 = req_i[i, RI_COMPUTED]
            c = c0 + j
            req_i[i, RI_COMPUTED] = c
            if c > req_i[i, RI_MAX_HELD]:
                req_i[i, RI_MAX_HELD] = c
            req_i[i, RI_GENERATED] = req_i[i, RI_OUT]
            req_f[i, RF_LAST_TOKEN] = end
            req_f[i, RF_FINISH] = end
            if worst > req_f[i, RF_MAX_ITL]:
                req_f[i, RF_MAX_ITL] = worst
            req_i[i, RI_STATUS] = FINISHED
            req_i[i, RI_PAD_CTX] = c0 + 1  # its row's context in the run's first step
            used -= blocks_for(c, bs)
            req_i[i, RI_BLOCKS] = 0
            live -= c
            residues[c0 % bs] -= 1
            settled(req_i, st_i, params_i, i)
            alive -= 1
            done += 1
        n_log += 1
        now = end
    if j:  # rows that pad (from the first step, or since their finish): a token a step
        for m in range(st_i[S_N_MEMBERS]):
            i = batch[B_MEMBERS, m]
            status = req_i[i, RI_STATUS]
            if status == FINISHED or status == REJECTED:
                req_i[i, RI_PAD_CTX] += j - 1
    for d in range(n_run):
        i = running[order[d]]
        if d < done:  # finished in this run (its row's context moved on above)
            continue
        c0 = req_i[i, RI_COMPUTED]
        residues[c0 % bs] -= 1
        if j:
            c = c0 + j
            req_i[i, RI_COMPUTED] = c
            if c > req_i[i, RI_MAX_HELD]:
                req_i[i, RI_MAX_HELD] = c
            req_i[i, RI_GENERATED] += j
            req_i[i, RI_BLOCKS] = blocks_for(c, bs)
            req_f[i, RF_LAST_TOKEN] = now
            if worst > req_f[i, RF_MAX_ITL]:
                req_f[i, RF_MAX_ITL] = worst
    if done:
        st_i[S_N_RUN] = keep_running(req_i, running, n_run)
    st_i[S_N_LOG], st_i[S_USED], st_i[S_LIVE] = n_log, used, live
    st_f[SF_NOW] = now
    return j


@njit(**KERNEL)
def run_batches(req_i, req_f, running, hkeys, hranks, hitems, pending, plan_idx, plan_n,  # noqa: ANN001, ANN201
                pre_idx, params_i, params_f, analytic, terms, dense, log_i, log_f, log_b, irr,
                irr_count, st_i, st_f, until_s, max_steps, residues, batch):
    """``compiled_loop.run`` for a run-to-completion specification (the same arguments and
    codes): scheduling points (``open_point``), each a ``plan_batch``; an empty plan idles
    until the batch falls due or the next arrival (``idle_until``); victims ``park``; a steady
    decode plan goes on in one ``decode_run``, any other step through ``carry_out``. Its own
    entry, so that neither kind of specification compiles the other's plans."""
    bs, num_blocks = params_i[P_BS], params_i[P_NUM_BLOCKS]
    size, order, wait_s = params_i[P_MAX_SEQS], params_i[P_ORDER], params_f[PF_WAIT]
    headroom = plan_idx.shape[0] + 1  # irregular rows one step can write, at most
    rows = plan_idx.shape[0] + batch.shape[1]  # a step's rows, padding rows included
    ctx = np.empty(rows, dtype=np.int64)  # carry_out's scratch, once a call
    new = np.empty(rows, dtype=np.int64)
    steps = 0
    while True:
        code = open_point(req_i, req_f, pending, hkeys, hranks, hitems, params_i, params_f,
                          log_i, irr, st_i, st_f, headroom, until_s, steps, max_steps)
        if code >= 0:
            return code
        now = st_f[SF_NOW]
        n_run, n_heap, n_rejoin = st_i[S_N_RUN], st_i[S_N_HEAP], st_i[S_N_REJOIN]
        n_plan = n_pre = n_pad = 0
        wake = _INF
        steady = False
        if n_run or n_heap or n_rejoin:
            st_i[S_STAMP] += 1
            more = st_i[S_NXT] < st_i[S_KNOWN] or st_i[S_ACCEPTING] != 0
            n_plan, n_pre, n_pad, n_heap, wake, steady = plan_batch(
                req_i, req_f, running, n_run, hkeys, hranks, hitems, n_heap, plan_idx, plan_n,
                pre_idx, batch, st_i, params_i, st_i[S_STAMP], num_blocks - st_i[S_USED], bs,
                size, wait_s, order, more, now)
            st_i[S_N_HEAP] = n_heap
        if n_plan == 0:  # idle: until the batch falls due or the next arrival, or for good
            code = idle_until(req_f, st_i, st_f, n_run, n_heap + st_i[S_N_REJOIN], wake)
            if code >= 0:
                return code
            continue
        for j in range(n_pre):  # each waits to rejoin its batch
            park(req_i, req_f, pre_idx[j], st_i, params_i, now)
        if n_pre:
            n_run = keep_running(req_i, running, n_run)
            st_i[S_N_RUN] = n_run
        if steady:  # the batch's decode steps, repeated until something changes
            taken = decode_run(req_i, req_f, running, n_run, batch, n_pad, hkeys, hranks,
                               hitems, residues, params_i, params_f, analytic, terms, dense,
                               log_i, log_f, log_b, st_i, st_f, until_s, max_steps - steps)
            if taken:
                steps += taken
                continue
        carry_out(req_i, req_f, running, n_run, plan_idx, plan_n, n_plan, batch, n_pad, ctx,
                  new, params_i, analytic, terms, dense, log_i, log_f, log_b, irr, irr_count,
                  st_i, st_f)
        steps += 1
