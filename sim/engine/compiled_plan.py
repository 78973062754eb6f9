"""The compiled interpreter's plans: ``policies.scheduler`` over explicit per-request arrays.

Each function here is one function of the reference interpreter, read side by side with it:
``plan_decode_first`` is ``_decode_first`` (with ``_fit`` and ``_cap``), ``plan_whole`` is
``_whole_prompts`` (with ``admit_whole_prompts``), ``grow_running`` is
``packing.grow_running`` (run-to-completion batches' too), ``pick_victim`` is
``packing.pick_victim``. The rules themselves (blocks needed, the admission test, the most
tokens that fit, which victim outranks) are ``sim.core.rules``, compiled from their source.

A plan is written into ``plan_idx``/``plan_n`` (request index, tokens, in the reference's
``Plan.run`` order) and ``pre_idx`` (the preemption victims, in order). ``done`` marks a request
scheduled, passed over or preempted in the plan numbered ``stamp``. Requests waiting are in
the heap of ``sim.engine.compiled_queue``; admitted ones leave it here (a plan that admits
always runs).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from sim.engine.compiled_cost import KERNEL, admits, blocks_needed, max_fitting_tokens, outranks
from sim.engine.compiled_queue import pop

# Rows of the per-request integer and float arrays (``req_i``, ``req_f``).
RI_PROMPT, RI_OUT, RI_PRIORITY, RI_COMPUTED, RI_GENERATED, RI_BLOCKS = 0, 1, 2, 3, 4, 5
RI_NPRE, RI_MAX_HELD, RI_STATUS, RI_REASON, RI_DONE, RI_ENTRY = 6, 7, 8, 9, 10, 11
RI_NEXT_SETTLED = 12  # the next request to settle, + 1 (``compiled_slots.P_HOLD``)
RI_ID = 13  # the request's id, for a driver that shows a policy views (``sim.engine.planned``)
# A run-to-completion batch's member (``sim.engine.compiled_batch``): the context its row had
# in the last step it took part in (as a padding row too, once it left), and the sequence
# number of its last preemption (the newest preempted rejoins first on ties).
RI_PAD_CTX, RI_RANK = 14, 15
NUM_RI = 16
RF_ARRIVAL, RF_DEADLINE, RF_FIRST_SCHED, RF_FIRST_TOKEN, RF_LAST_TOKEN = 0, 1, 2, 3, 4
RF_FINISH, RF_MAX_ITL = 5, 6
NUM_RF = 7
# Compositions (``SchedulingSpec.composition``) by code.
PREFILL_FIRST, MIXED, DECODE_FIRST = 0, 1, 2
VICTIM_NEWEST = 0


@njit(**KERNEL)
def pick_victim(req_i: np.ndarray, req_f: np.ndarray, running: np.ndarray, n_run: int,
                victim: int, stamp: int) -> int:
    """Position in ``running`` (admission order) of the victim under rule ``victim`` among
    the requests not done in this plan; -1 when none is left. Scans from the newest, so ties
    go to the newest (``rules.outranks``)."""
    best = -1
    best_priority, best_deadline = 0, 0.0
    for r in range(n_run - 1, -1, -1):
        i = running[r]
        if req_i[i, RI_DONE] == stamp:
            continue
        if best < 0:
            if victim == VICTIM_NEWEST:
                return r
            best, best_priority, best_deadline = r, req_i[i, RI_PRIORITY], req_f[i, RF_DEADLINE]
        elif outranks(victim, req_i[i, RI_PRIORITY], req_f[i, RF_DEADLINE], best_priority,
                      best_deadline):
            best, best_priority, best_deadline = r, req_i[i, RI_PRIORITY], req_f[i, RF_DEADLINE]
    return best


@njit(**KERNEL)
def _admit(req_i: np.ndarray, hkeys: np.ndarray, hranks: np.ndarray, hitems: np.ndarray,
           n_heap: int, plan_idx: np.ndarray, plan_n: np.ndarray, n_plan: int, seats: int,
           tokens: int, free: int, mark: int, bs: int, whole: bool, chunk: int,
           decode_first: bool) -> tuple[int, int, int, int, int]:
    """Admit waiting requests in the queue's order while they fit (head-of-line blocking):
    ``_decode_first``'s admission loop, or ``admit_whole_prompts``. Returns the new heap and
    plan sizes and what is left of seats, tokens and blocks."""
    while n_heap > 0:
        i = hitems[0]
        computed, held = req_i[i, RI_COMPUTED], req_i[i, RI_BLOCKS]
        unc = req_i[i, RI_PROMPT] + req_i[i, RI_GENERATED] - computed
        if decode_first:
            cap = 0
            if seats > 0:
                cap = unc if unc <= tokens else tokens
                if chunk > 0 and chunk < cap:
                    cap = chunk
            if whole and cap < unc:
                break  # the whole prompt must fit this step's budget
            n = max_fitting_tokens(computed, held, 0, bs, free - mark, cap)
            if n < 1 or (whole and n < unc):
                break
            need = blocks_needed(computed + n, 0, held, bs)
        else:
            n = unc
            need = blocks_needed(computed + n, 0, held, bs)
            if not admits(seats, n, tokens, free, need, mark):
                break
        n_heap = pop(hkeys, hranks, hitems, n_heap)
        plan_idx[n_plan], plan_n[n_plan] = i, n
        n_plan += 1
        seats -= 1
        tokens -= n
        free -= need
    return n_heap, n_plan, seats, tokens, free


@njit(**KERNEL)
def plan_decode_first(req_i, req_f, running, n_run, hkeys, hranks, hitems, n_heap,  # noqa: ANN001, ANN201
                      plan_idx, plan_n, pre_idx, stamp, max_seqs, max_tokens, free, mark,
                      bs, whole, chunk, victim):
    """``_decode_first``: running decodes, then running prefills, then (if nothing was
    preempted) new prompts. Returns ``(n_plan, n_pre, n_heap)``."""
    seats, tokens = max_seqs, max_tokens
    n_plan = n_pre = 0
    for decoding in (True, False):
        for r in range(n_run):
            i = running[r]
            computed, held = req_i[i, RI_COMPUTED], req_i[i, RI_BLOCKS]
            gen = req_i[i, RI_GENERATED]
            unc = req_i[i, RI_PROMPT] + gen - computed
            if (unc > 1 or gen == 0) == decoding or req_i[i, RI_DONE] == stamp:
                continue
            req_i[i, RI_DONE] = stamp
            if decoding:
                n = 1
            else:  # ``_cap``
                n = unc if unc <= tokens else tokens
                if chunk > 0 and chunk < n:
                    n = chunk
            if n < 1 or seats < 1:
                continue  # budget spent: it keeps its KV and continues next step
            while True:  # ``_fit``: preempt victims until the tokens fit, or none is left
                fit = max_fitting_tokens(computed, held, 0, bs, free, n)
                if fit:
                    break
                j = pick_victim(req_i, req_f, running, n_run, victim, stamp)
                if j < 0:
                    break
                v = running[j]
                req_i[v, RI_DONE] = stamp
                pre_idx[n_pre] = v
                n_pre += 1
                free += req_i[v, RI_BLOCKS]
            if fit:
                plan_idx[n_plan], plan_n[n_plan] = i, fit
                n_plan += 1
                seats -= 1
                tokens -= fit
                free -= blocks_needed(computed + fit, 0, held, bs)
            elif decoding:  # no victim left: give up its own blocks rather than stall
                pre_idx[n_pre] = i
                n_pre += 1
                free += held
    if n_pre == 0:
        n_heap, n_plan, seats, tokens, free = _admit(
            req_i, hkeys, hranks, hitems, n_heap, plan_idx, plan_n, n_plan, seats, tokens,
            free, mark if n_run else 0, bs, whole, chunk, True)
    return n_plan, n_pre, n_heap


@njit(**KERNEL)
def grow_running(req_i, req_f, running, n_run, plan_idx, plan_n, pre_idx, stamp, free, bs,  # noqa: ANN001, ANN201
                 victim):
    """``packing.grow_running``: every running request's pending tokens, in running order,
    victims (rule ``victim``) out while the blocks they need exceed ``free``. Returns
    ``(n_plan, n_pre, tokens, left)``: the rows planned, the victims, the tokens the rows
    compute and the blocks left free once they grew (the victims' given back)."""
    total = tokens = 0
    n_plan = n_pre = 0
    for r in range(n_run):
        i = running[r]
        c = req_i[i, RI_COMPUTED]
        unc = req_i[i, RI_PROMPT] + req_i[i, RI_GENERATED] - c
        total += blocks_needed(c + unc, 0, req_i[i, RI_BLOCKS], bs)
        plan_idx[n_plan], plan_n[n_plan] = i, unc
        n_plan += 1
        tokens += unc
    if total > free:  # rare: victims out, then the plan again without them
        active = n_run
        while active > 0 and total > free:
            j = pick_victim(req_i, req_f, running, n_run, victim, stamp)
            v = running[j]
            req_i[v, RI_DONE] = stamp
            pre_idx[n_pre] = v
            n_pre += 1
            c = req_i[v, RI_COMPUTED]
            unc = req_i[v, RI_PROMPT] + req_i[v, RI_GENERATED] - c
            total -= blocks_needed(c + unc, 0, req_i[v, RI_BLOCKS], bs)
            free += req_i[v, RI_BLOCKS]
            active -= 1
        n_plan = tokens = 0
        for r in range(n_run):
            i = running[r]
            if req_i[i, RI_DONE] == stamp:
                continue
            unc = req_i[i, RI_PROMPT] + req_i[i, RI_GENERATED] - req_i[i, RI_COMPUTED]
            plan_idx[n_plan], plan_n[n_plan] = i, unc
            n_plan += 1
            tokens += unc
    return n_plan, n_pre, tokens, free - total


@njit(**KERNEL)
def plan_whole(req_i, req_f, running, n_run, hkeys, hranks, hitems, n_heap, plan_idx,  # noqa: ANN001, ANN201
               plan_n, pre_idx, stamp, max_seqs, max_tokens, free, mark, bs, composition,
               victim):
    """``_whole_prompts``: a ``prefill_first`` step that can admit runs only the admitted
    prompts; otherwise every running request grows (preempting victims while the KV does not
    fit), and a ``mixed`` step then admits whole prompts. Returns ``(n_plan, n_pre, n_heap)``."""
    mark = mark if n_run else 0  # the watermark protects running decodes
    free_seqs = max_seqs - n_run
    if composition == PREFILL_FIRST and n_heap > 0 and free_seqs > 0:
        n_heap, n_plan, _, _, _ = _admit(req_i, hkeys, hranks, hitems, n_heap, plan_idx,
                                         plan_n, 0, free_seqs, max_tokens, free, mark, bs,
                                         True, 0, False)
        if n_plan:
            return n_plan, 0, n_heap
    n_plan, n_pre, tokens, left = grow_running(req_i, req_f, running, n_run, plan_idx,
                                               plan_n, pre_idx, stamp, free, bs, victim)
    if composition == MIXED and n_pre == 0:
        n_heap, n_plan, _, _, _ = _admit(req_i, hkeys, hranks, hitems, n_heap, plan_idx,
                                         plan_n, n_plan, max_seqs - n_plan,
                                         max_tokens - tokens, left, mark, bs, True, 0, False)
    return n_plan, n_pre, n_heap
