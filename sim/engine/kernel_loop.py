"""The numba kernel behind ``sim.engine.fastkernel`` (importing this module imports numba).

``run_segment`` is ``sim.engine.fastpath.run_continuous`` in vLLM mode, transcribed into arrays and
scalars and made resumable (its whole state lives in arrays ``sim.engine.fastkernel`` owns): the
waiting queue is a window of an index array, the running set a doubly linked
list in admission order (the tail is the preemption victim), each heap an ``(m, 3)`` array of
``(key, index, epoch)`` rows ordered as Python orders tuples, the groups of newly admitted
requests a flat array with group offsets. Read it side by side with ``sim.engine.fastpath``: each
block names the function it reproduces, and the floating-point expressions are the same
operations in the same order (``RooflineCost.decode_step``'s ``decode_rows`` for decode steps,
``RooflineCost.prefill_cost`` for prefill steps).
"""
from __future__ import annotations

import numpy as np
from numba import njit, objmode

from sim.core import rules
from sim.engine.fastkernel import fill_decode_row, fill_dense_row, past_deadline, prefill_cost

# The scalar rules, compiled from their one definition (``sim.core.rules``) rather than
# restated. numba's on-disk cache of ``run_segment`` only notices when *this* file changes,
# so ``RULES_SHA256`` records the rules' source: a test fails when they differ, and updating
# it here is what invalidates the cached kernel.
RULES_SHA256 = "889a45daa995e9d9c7bedbbf5dfe5df950e5bceed58b0966a8fb47b40d7195bd"
blocks_for = njit(cache=True, inline="always")(rules.blocks_for)
admits = njit(cache=True, inline="always")(rules.admits)

# Codes shared with ``sim.engine.fastkernel``, defined here because numba freezes a cached kernel's
# globals and only notices when this file changes.
WAITING, RUNNING, FINISHED, REJECTED = 0, 1, 2, 3  # a request's status
# why a request was rejected (its message is built afterwards from its final counters)
NO_REASON, ON_ARRIVAL, OVER_BUDGET, PREEMPTED_TOO_OFTEN, OUTGREW = 0, 1, 2, 3, 4
DONE, STALLED, EMPTIED, CUT, LOG_FULL, IRR_FULL = 0, 1, 2, 3, 4, 5  # how ``run_segment`` ended
ROOFLINE, CONSTANT, LINEAR = 0, 1, 2  # the cost model (as ``sim.engine.fastkernel`` codes it)
BOUND_CONSTANT, BOUND_LINEAR = 4, 5  # bound codes past the roofline's four
# columns of res_f / res_i (see ``run_continuous_compiled``)
F_SCHED, F_TOKEN, F_FINISH, F_MAX_ITL, F_LAST_TOKEN, F_ADMITTED_AT = 0, 1, 2, 3, 4, 5
I_PREEMPTIONS, I_GENERATED, I_STATUS, I_REASON = 0, 1, 2, 3


@njit(inline="always")
def _less(a: int, b: int, c: int, x: int, y: int, z: int) -> bool:
    """``(a, b, c) < (x, y, z)`` as Python compares tuples."""
    if a != x:
        return a < x
    if b != y:
        return b < y
    return c < z


@njit(cache=True)
def _heap_push(h: np.ndarray, size: int, a: int, b: int, c: int, epoch: np.ndarray) -> int:
    """``heapq.heappush`` of ``(a, b, c)``; returns the new size. A full heap first drops its
    stale rows (their request left since) and re-heapifies: the live rows, and so every
    ``top`` and pop order, stay the same (rows are totally ordered)."""
    if size == h.shape[0]:
        live = 0
        for r in range(size):
            if h[r, 2] == epoch[h[r, 1]]:
                h[live, 0], h[live, 1], h[live, 2] = h[r, 0], h[r, 1], h[r, 2]
                live += 1
        size = 0
        for r in range(live):  # re-insert in place: a prefix of the array is a heap
            size = _sift_up(h, size, h[r, 0], h[r, 1], h[r, 2])
    return _sift_up(h, size, a, b, c)


@njit(cache=True)
def _sift_up(h: np.ndarray, size: int, a: int, b: int, c: int) -> int:
    """Put ``(a, b, c)`` at position ``size`` of heap ``h[:size]`` and sift it up."""
    pos = size
    while pos > 0:
        parent = (pos - 1) >> 1
        if _less(a, b, c, h[parent, 0], h[parent, 1], h[parent, 2]):
            h[pos, 0], h[pos, 1], h[pos, 2] = h[parent, 0], h[parent, 1], h[parent, 2]
            pos = parent
        else:
            break
    h[pos, 0], h[pos, 1], h[pos, 2] = a, b, c
    return size + 1


@njit(cache=True)
def _heap_pop(h: np.ndarray, size: int) -> int:
    """``heapq.heappop`` (the smallest row leaves); returns the new size."""
    size -= 1
    if size == 0:
        return 0
    a, b, c = h[size, 0], h[size, 1], h[size, 2]
    pos = 0
    while True:
        child = 2 * pos + 1
        if child >= size:
            break
        right = child + 1
        if right < size and _less(h[right, 0], h[right, 1], h[right, 2],
                                  h[child, 0], h[child, 1], h[child, 2]):
            child = right
        if _less(h[child, 0], h[child, 1], h[child, 2], a, b, c):
            h[pos, 0], h[pos, 1], h[pos, 2] = h[child, 0], h[child, 1], h[child, 2]
            pos = child
        else:
            break
    h[pos, 0], h[pos, 1], h[pos, 2] = a, b, c
    return size


@njit(cache=True)
def _heap_top(h: np.ndarray, size: int, epoch: np.ndarray) -> int:
    """``top``: drop stale rows (their request left since); returns the new size."""
    while h[0, 2] != epoch[h[0, 1]]:
        size = _heap_pop(h, size)
    return size


@njit(cache=True)
def _deadline_passed() -> bool:
    """Ask Python whether the wall-clock budget has run out."""
    with objmode(late="boolean"):
        late = past_deadline()
    return late


@njit(cache=True)
def _prefill_from_python(batch: np.ndarray) -> tuple[float, float, float, int]:
    """Ask Python for the cost of prefilling ``batch`` (its memo; ``RooflineCost``)."""
    with objmode(secs="float64", flops="float64", nbytes="float64", bound="int64"):
        secs, flops, nbytes, bound = prefill_cost(batch)
    return secs, flops, nbytes, bound


@njit(cache=True)
def _decode_row_from_python(table: np.ndarray, rows: int) -> None:
    """Ask Python for the decode constants of batch size ``rows`` (into ``table[rows, 0]``)."""
    with objmode():
        fill_decode_row(table, rows)


@njit(cache=True)
def _dense_row_from_python(table: np.ndarray, known: np.ndarray, tokens: int, rows: int) -> None:
    """Ask Python for ``dense_constants(tokens, rows)`` (into ``table[tokens, rows]``)."""
    with objmode():
        fill_dense_row(table, known, tokens, rows)


@njit(cache=True)
def _prefill_in_kernel(sizes, m, tokens, params_f, dense_table, dense_known,  # noqa: ANN202
                       uses_min, L, tpf, tp):
    """``RooflineCost.prefill_cost`` of the whole prompts ``sizes[:m]`` (``tokens`` in all):
    ``_prompt_attention``'s one prefill operator, then ``assemble_one_attention`` with the
    dense constants of ``(tokens, m)``, the same operations in the same order. Returns
    ``(False, ...)`` where Python must cost it: a one-token prompt (a second, decode-style
    operator) or a shape beyond the constants table."""
    if m >= dense_table.shape[1] or tokens >= dense_table.shape[0]:
        return False, 0.0, 0.0, 0.0, 0
    fpp, kvt, row_tok, q_bytes, bw, hkv, split, dec_half = (
        params_f[1], params_f[2], params_f[4], params_f[5], params_f[7], params_f[8],
        params_f[9], params_f[10])
    peak_att = params_f[6]
    peak, compute_eff, m_half, pad_tokens, hq, pf_half = (
        params_f[11], params_f[12], params_f[13], params_f[14], params_f[15], params_f[16])
    pairs_all = 0
    c_lo, c_hi = sizes[0], sizes[0]
    for j in range(m):
        n = sizes[j]
        if n == 1:
            return False, 0.0, 0.0, 0.0, 0
        pairs_all += n * n - (n * n - n) // 2
        c_lo = min(c_lo, n)
        c_hi = max(c_hi, n)
    # ``_decode_tail_s`` over every row
    slow = _unit(float(c_hi), fpp, peak_att, kvt, row_tok, q_bytes, bw, hkv, split)
    if uses_min:
        low = _unit(float(c_lo), fpp, peak_att, kvt, row_tok, q_bytes, bw, hkv, split)
        slow = slow if slow >= low else low
    tail = dec_half * slow
    f = fpp * pairs_all
    b = kvt * (tokens + tokens + m * row_tok) + q_bytes * tokens
    chunk = tokens / m
    eff = compute_eff * chunk / (chunk + m_half)
    pad = fpp * pad_tokens
    peak_eff = peak * eff
    worst = 0.0
    for j in range(m):
        n = sizes[j]
        pairs = n * n - (n * n - n) // 2
        tc = (fpp * pairs + pad * n) / peak_eff
        tm = (kvt * (n + n + row_tok) + q_bytes * n) / bw
        u = (tc if tc >= tm else tm) / (hq * (1.0 + n / 128.0))
        if j == 0 or u > worst:
            worst = u
    worst = pf_half * worst
    if worst > tail:
        tail = worst
    tc = (f + pad * tokens) / peak_eff + tail
    tm = b / bw + tail
    if not dense_known[tokens, m]:
        _dense_row_from_python(dense_table, dense_known, tokens, m)
    secs, flops, nbytes, bound = _assemble(dense_table, tokens, m, tc, tm, f, b, L, tpf, tp)
    return True, secs, flops, nbytes, bound


@njit(cache=True)
def _assemble(table, i, j, tc, tm, f, b, L, tpf, tp):  # noqa: ANN001, ANN202
    """``assemble_one_attention``: a step's ``(seconds, flops, bytes, bound code)`` from its
    ``dense_constants`` (``table[i, j]``, named as there; read in place: a row view would cost
    reference counting every step) and its one attention operator ``(tc, tm, f, b)``, in
    ``_assemble``'s order of operations."""
    s3, t0, t1, t2 = table[i, j, 0], table[i, j, 1], table[i, j, 2], table[i, j, 3]
    t3, att_lat, t_norm, e_norm = table[i, j, 4], table[i, j, 5], table[i, j, 6], table[i, j, 7]
    norms_l, comm_l, emb_s, lm_s = (table[i, j, 8], table[i, j, 9], table[i, j, 10],
                                    table[i, j, 11])
    overhead, c2, m2, f2, b2 = (table[i, j, 12], table[i, j, 13], table[i, j, 14],
                                table[i, j, 15], table[i, j, 16])
    memory_if_compute, compute_if_memory = table[i, j, 19], table[i, j, 20]
    if tc > tm:
        t = tc
        compute_s, memory_s = (t0 + t) * L + c2, memory_if_compute
    else:
        t = tm
        compute_s = compute_if_memory
        memory_s = ((t1 + t) + att_lat + t_norm) * L + m2
    secs = s3 + (t + att_lat) * L + norms_l
    if tp > 1:
        secs += comm_l
    secs = secs + emb_s + lm_s + overhead
    if memory_s >= compute_s:
        bound, top = 1, memory_s
    else:
        bound, top = 0, compute_s
    if comm_l > top:
        bound, top = 2, comm_l
    if overhead >= top:
        bound = 3
    return secs, ((t2 + f) * L + f2) * tpf, (((t3 + b) + e_norm) * L + b2) * tpf, bound


@njit(cache=True)
def _unit(c: float, fpp: float, peak_att: float, kvt: float, row_tok: float, q_bytes: float,
          att_bw: float, hkv: float, split: float) -> float:
    """``decode_step_function``'s ``unit``: one decode row's per-unit attention time."""
    tc = fpp * c / peak_att
    tm = (kvt * (c + row_tok + 1.0) + q_bytes) / att_bw
    return (tc if tc > tm else tm) / (hkv * (1.0 + c / split))


@njit(cache=True)
def run_segment(arrival, prompt, out, rejected_on_arrival, params_i, params_f,  # noqa: C901
                decode_table, dense_table, dense_known, res_f, res_i, work, queues, groups_f,
                groups_i, heaps, gaps_i, gaps_f, residues, log_i, log_f, log_b, irr, irr_count,
                state_i, state_f):
    """Run the simulation from the state in ``state_i``/``state_f`` until it ends or a log
    buffer fills; save the state back and return ``(code, time, queued)``. ``code`` is
    ``DONE``, ``CUT`` (wall clock), ``LOG_FULL``/``IRR_FULL`` (grow that buffer and call again:
    the run resumes exactly where it paused) or an error (``STALLED``, ``EMPTIED``).

    No array is reassigned inside the loop (numba would count references to it every
    iteration): heaps compact in place, the gap stack drops what no running request can ask
    for, and the caller grows the log buffers between calls."""
    n = arrival.shape[0]
    bs, num_blocks, capacity, max_seqs, max_tokens, mark_blocks = (
        params_i[0], params_i[1], params_i[2], params_i[3], params_i[4], params_i[5])
    limit, uses_min, has_horizon, has_deadline, num_layers, tp, cost_kind = (
        params_i[6], params_i[7] != 0, params_i[8] != 0, params_i[9] != 0, params_i[10],
        params_i[11], params_i[12])
    # ``ConstantCost`` (1): every step ``base_s``; ``LinearCost`` (2): ``base_s + per_token_s
    # × tokens + per_seq_s × rows``; 0: the roofline
    base_s, per_token_s, per_seq_s = params_f[17], params_f[18], params_f[19]
    horizon, fpp, kvt, g_lat, row_tok, q_bytes, peak_att, att_bw, hkv, split, par_half = (
        params_f[0], params_f[1], params_f[2], params_f[3], params_f[4], params_f[5],
        params_f[6], params_f[7], params_f[8], params_f[9], params_f[10])
    L = float(num_layers)
    tpf = float(tp)
    cap_log, cap_irr = log_i.shape[0], irr.shape[0]
    irr_headroom = min(max_seqs, n) + 2  # irregular rows one step can write, at most

    first_sched, first_tok, finish, max_itl = res_f[F_SCHED], res_f[F_TOKEN], res_f[F_FINISH], \
        res_f[F_MAX_ITL]
    last_tok, adm_end = res_f[F_LAST_TOKEN], res_f[F_ADMITTED_AT]
    npre, gen, status, reason = res_i[I_PREEMPTIONS], res_i[I_GENERATED], res_i[I_STATUS], \
        res_i[I_REASON]
    max_held, key, base, adm_g, epoch = work[0], work[1], work[2], work[3], work[4]
    run_prev, run_next = work[5], work[6]  # running set: a list in admission order
    # arrivals in order waiting[w_head:w_tail]; preempted: a stack, the newest first
    waiting, preempted, over_budget = queues[0], queues[1], queues[2]
    admitted, sizes, victims, members = queues[3], queues[4], queues[5], queues[6]
    # groups admitted since the last decode: group g's members are members[lo[g]:lo[g + 1]]
    group_end, group_lo = groups_f, groups_i
    fin_heap, max_heap, min_heap = heaps[0], heaps[1], heaps[2]
    gap_idx, gap_val = gaps_i, gaps_f  # monotonic stack of decode gaps

    (run_head, run_tail, n_run, w_head, w_tail, n_pre, n_over, n_groups, n_members, n_fin,
     n_max, n_min, n_gap, n_log, n_irr, key_sum, used, G, nxt, iterations) = (
        state_i[0], state_i[1], state_i[2], state_i[3], state_i[4], state_i[5], state_i[6],
        state_i[7], state_i[8], state_i[9], state_i[10], state_i[11], state_i[12],
        state_i[13], state_i[14], state_i[15], state_i[16], state_i[17], state_i[18],
        state_i[19])
    now, last_decode_end = state_f[0], state_f[1]
    code = -1  # still running
    queued = 0
    while True:
        if n_log >= cap_log:
            code = LOG_FULL
            break
        if n_irr + irr_headroom > cap_irr:
            code = IRR_FULL
            break
        if has_horizon and now >= horizon:
            code = DONE
            break
        if has_deadline:
            iterations += 1
            if iterations % 64 == 0:
                if _deadline_passed():
                    code = CUT
                    break
        while nxt < n and arrival[nxt] <= now:
            if rejected_on_arrival[nxt]:
                status[nxt], reason[nxt], finish[nxt] = REJECTED, ON_ARRIVAL, now
            else:
                waiting[w_tail] = nxt
                w_tail += 1
            nxt += 1
        for j in range(n_over):
            i = over_budget[j]
            status[i], reason[i], finish[i] = REJECTED, OVER_BUDGET, now
        n_over = 0
        num_running = n_run
        queue_len = (w_tail - w_head) + n_pre
        if queue_len == 0 and num_running == 0:
            if nxt >= n:
                code = DONE
                break
            now = arrival[nxt]
            continue
        # -- ``choose_admissions``: preempted (newest first), then arrivals, head-of-line ----
        m = 0
        if queue_len and num_running < max_seqs:
            seats = max_seqs - num_running
            budget = max_tokens
            free = num_blocks - used
            mark = mark_blocks if num_running else 0
            for q in range(queue_len):
                i = preempted[n_pre - 1 - q] if q < n_pre else waiting[w_head + q - n_pre]
                tokens = prompt[i] + gen[i]
                blocks = blocks_for(tokens, bs)
                if not admits(seats, tokens, budget, free, blocks, mark):
                    break
                seats -= 1
                budget -= tokens
                free -= blocks
                admitted[m] = i
                m += 1
        if m:
            # -- ``launch_admitted`` --------------------------------------------------------
            num_from_pre = min(m, n_pre)
            n_pre -= num_from_pre
            w_head += m - num_from_pre
            recomputed = 0
            total = 0
            for j in range(m):
                i = admitted[j]
                status[i] = RUNNING
                if first_sched[i] != first_sched[i]:
                    first_sched[i] = now
                tokens = prompt[i] + gen[i]
                if max_held[i]:
                    recomputed += min(tokens, max_held[i])
                used += blocks_for(tokens, bs)
                sizes[j] = tokens
                total += tokens
            # -- ``RooflineCost.prefill_cost`` in the kernel; Python for what it leaves out ----
            if cost_kind == CONSTANT:
                ok, secs, flops, nbytes, bound = True, base_s, 0.0, 0.0, BOUND_CONSTANT
            elif cost_kind == LINEAR:
                ok, flops, nbytes, bound = True, 0.0, 0.0, BOUND_LINEAR
                secs = base_s + per_token_s * total + per_seq_s * m
            else:
                ok, secs, flops, nbytes, bound = _prefill_in_kernel(
                    sizes, m, total, params_f, dense_table, dense_known, uses_min, L, tpf, tp)
            if not ok:
                batch = sizes[:m]
                secs, flops, nbytes, bound = _prefill_from_python(batch)
            end = now + secs
            held = used
            live = key_sum + num_running * G + total
            # -- ``commit_admitted`` --------------------------------------------------------
            regular = 0
            group_end[n_groups] = end
            group_lo[n_groups] = n_members
            n_groups += 1
            for j in range(m):
                i = admitted[j]
                tokens = sizes[j]
                if tokens > max_held[i]:
                    max_held[i] = tokens
                gen[i] += 1
                g = gen[i]
                last = last_tok[i]
                last_tok[i] = end
                if g == 1:
                    first_tok[i] = end
                else:
                    gap = end - last
                    if gap > max_itl[i]:
                        max_itl[i] = gap
                    if last == now:
                        regular += 1
                    else:
                        n_irr = _add_irregular(irr, irr_count, n_irr, end, gap, 1)
                if g >= out[i]:
                    status[i], finish[i] = FINISHED, end
                    used -= blocks_for(tokens, bs)
                elif tokens >= capacity and blocks_for(tokens + 1, bs) > num_blocks:
                    used -= blocks_for(tokens, bs)
                    status[i], reason[i], finish[i] = REJECTED, OUTGREW, end
                else:
                    # ``admit_running``
                    run_prev[i], run_next[i] = run_tail, -1
                    if run_tail >= 0:
                        run_next[run_tail] = i
                    else:
                        run_head = i
                    run_tail = i
                    n_run += 1
                    k = tokens - G
                    key[i] = k
                    base[i] = G - gen[i]
                    adm_g[i] = G
                    adm_end[i] = end
                    key_sum += k
                    residues[k % bs] += 1
                    ep = epoch[i]
                    n_fin = _heap_push(fin_heap, n_fin, base[i] + out[i], i, ep, epoch)
                    n_max = _heap_push(max_heap, n_max, -k, i, ep, epoch)
                    if uses_min:
                        n_min = _heap_push(min_heap, n_min, k, i, ep, epoch)
                    members[n_members] = i
                    n_members += 1
            # -- ``record`` ------------------------------------------------------------------
            log_i[n_log, 0], log_i[n_log, 1], log_i[n_log, 2], log_i[n_log, 3] = \
                m, total, 0, recomputed
            log_i[n_log, 4], log_i[n_log, 5], log_i[n_log, 6], log_i[n_log, 7] = \
                (w_tail - w_head) + n_pre + n_over, held, regular, live
            log_f[n_log, 0], log_f[n_log, 1], log_f[n_log, 2], log_f[n_log, 3] = \
                now, end - now, flops, nbytes
            log_b[n_log] = bound
            n_log += 1
            now = end
        elif num_running:
            # -- decode steps, back to back while nothing can change the plan -------------
            queued = (w_tail - w_head) + n_pre + n_over
            while True:
                need = residues[(-G) % bs]
                preempting = need > num_blocks - used
                if preempting:
                    # -- ``preempt_newest`` ----------------------------------------------
                    free = num_blocks - used
                    n_victims = 0
                    while need > free:
                        v = run_tail
                        run_tail = run_prev[v]
                        if run_tail >= 0:
                            run_next[run_tail] = -1
                        else:
                            run_head = -1
                        n_run -= 1
                        c = key[v] + G
                        if c % bs == 0:
                            need -= 1
                        free += blocks_for(c, bs)
                        victims[n_victims] = v
                        n_victims += 1
                        if n_members and members[n_members - 1] == v:
                            n_members -= 1  # the newest admitted is the last member
                            gi = n_groups - 1
                            while gi >= 0 and group_lo[gi] > n_members:
                                group_lo[gi] = n_members
                                gi -= 1
                    for j in range(n_victims):
                        v = victims[j]
                        key_sum, used, n_gap = _leave(
                            v, G, last_decode_end, key, base, adm_g, adm_end, gen, max_held,
                            last_tok, max_itl, epoch, residues, bs, gap_idx, gap_val, n_gap,
                            key_sum, used)
                        npre[v] += 1
                        if limit >= 0 and npre[v] > limit:
                            status[v], reason[v], finish[v] = REJECTED, PREEMPTED_TOO_OFTEN, now
                            continue
                        status[v] = WAITING
                        if prompt[v] + gen[v] > max_tokens:
                            over_budget[n_over] = v
                            n_over += 1
                        else:
                            preempted[n_pre] = v
                            n_pre += 1
                    if n_run == 0:
                        code = EMPTIED
                        break
                    queued = (w_tail - w_head) + n_pre + n_over
                rows = n_run
                used += need
                held = used
                n_max = _heap_top(max_heap, n_max, epoch)
                c_max = G + 1 - max_heap[0, 0]
                if uses_min:
                    n_min = _heap_top(min_heap, n_min, epoch)
                    c_min = G + 1 + min_heap[0, 0]
                else:
                    c_min = c_max
                if cost_kind == CONSTANT:
                    secs, flops, nbytes, bound = base_s, 0.0, 0.0, BOUND_CONSTANT
                elif cost_kind == LINEAR:
                    secs = base_s + per_token_s * rows + per_seq_s * rows
                    flops, nbytes, bound = 0.0, 0.0, BOUND_LINEAR
                else:
                    # -- ``decode_rows`` of ``RooflineCost.decode_step_function`` ------------
                    if decode_table[rows, 0, 0] != decode_table[rows, 0, 0]:
                        _decode_row_from_python(decode_table, rows)
                    rows_row_tok, rows_kq = decode_table[rows, 0, 17], decode_table[rows, 0, 18]
                    kv_tokens = key_sum + rows * (G + 1)
                    f = fpp * kv_tokens
                    b = kvt * (kv_tokens + rows_row_tok) + rows_kq
                    if uses_min:
                        hi = _unit(float(c_max), fpp, peak_att, kvt, row_tok, q_bytes, att_bw,
                                   hkv, split)
                        lo = _unit(float(c_min), fpp, peak_att, kvt, row_tok, q_bytes, att_bw,
                                   hkv, split)
                        tail = par_half * (hi if hi >= lo else lo)
                    else:
                        tail = par_half * _unit(float(c_max), fpp, peak_att, kvt, row_tok,
                                                q_bytes, att_bw, hkv, split)
                    tc = f / peak_att + g_lat
                    tm = b / att_bw + g_lat
                    tc += tail
                    tm += tail
                    secs, flops, nbytes, bound = _assemble(decode_table, rows, 0, tc, tm, f, b,
                                                           L, tpf, tp)
                end = now + secs
                G += 1
                # -- ``first_decode_gaps`` ------------------------------------------------
                regular = rows
                if n_groups:
                    old = rows - n_members
                    if old and last_decode_end != now:
                        regular -= old
                        n_irr = _add_irregular(irr, irr_count, n_irr, end, end - last_decode_end,
                                               old)
                    for gi in range(n_groups):
                        lo_m = group_lo[gi]
                        hi_m = group_lo[gi + 1] if gi + 1 < n_groups else n_members
                        if hi_m <= lo_m:
                            continue
                        gend = group_end[gi]
                        gap = end - gend
                        for j in range(lo_m, hi_m):
                            if gap > max_itl[members[j]]:
                                max_itl[members[j]] = gap
                        if gend != now:
                            regular -= hi_m - lo_m
                            n_irr = _add_irregular(irr, irr_count, n_irr, end, gap, hi_m - lo_m)
                    n_groups, n_members = 0, 0
                if G >= 2:  # ``push_gap``
                    gap = end - last_decode_end
                    while n_gap and gap_val[n_gap - 1] <= gap:
                        n_gap -= 1
                    if n_gap == gap_idx.shape[0]:  # only requests still running will ask
                        n_gap = _prune_gaps(gap_idx, gap_val, n_gap, adm_g[run_head] + 2)
                    gap_idx[n_gap], gap_val[n_gap] = G, gap
                    n_gap += 1
                last_decode_end = end
                live = key_sum + rows * G
                # -- ``finish_due`` -------------------------------------------------------
                while n_fin and fin_heap[0, 0] <= G:
                    i, ep = fin_heap[0, 1], fin_heap[0, 2]
                    n_fin = _heap_pop(fin_heap, n_fin)
                    if ep != epoch[i]:
                        continue
                    run_head, run_tail = _unlink(i, run_prev, run_next, run_head, run_tail)
                    n_run -= 1
                    key_sum, used, n_gap = _leave(
                        i, G, last_decode_end, key, base, adm_g, adm_end, gen, max_held,
                        last_tok, max_itl, epoch, residues, bs, gap_idx, gap_val, n_gap,
                        key_sum, used)
                    status[i], finish[i] = FINISHED, end
                # -- ``drop_outgrown`` ----------------------------------------------------
                if c_max >= capacity:
                    while n_run:
                        n_max = _heap_top(max_heap, n_max, epoch)
                        if G - max_heap[0, 0] < capacity:
                            break
                        i = max_heap[0, 1]
                        if blocks_for(key[i] + G + 1, bs) <= num_blocks:
                            break
                        run_head, run_tail = _unlink(i, run_prev, run_next, run_head,
                                                     run_tail)
                        n_run -= 1
                        key_sum, used, n_gap = _leave(
                            i, G, last_decode_end, key, base, adm_g, adm_end, gen, max_held,
                            last_tok, max_itl, epoch, residues, bs, gap_idx, gap_val, n_gap,
                            key_sum, used)
                        status[i], reason[i], finish[i] = REJECTED, OUTGREW, end
                # -- ``record`` -----------------------------------------------------------
                log_i[n_log, 0], log_i[n_log, 1], log_i[n_log, 2], log_i[n_log, 3] = \
                    rows, 0, rows, 0
                log_i[n_log, 4], log_i[n_log, 5], log_i[n_log, 6], log_i[n_log, 7] = \
                    queued, held, regular, live
                log_f[n_log, 0], log_f[n_log, 1], log_f[n_log, 2], log_f[n_log, 3] = \
                    now, end - now, flops, nbytes
                log_b[n_log] = bound
                n_log += 1
                now = end
                if ((nxt < n and arrival[nxt] <= now) or queued or n_run == 0 or has_deadline
                        or (has_horizon and now >= horizon) or n_log >= cap_log
                        or n_irr + irr_headroom > cap_irr):
                    break  # (a full buffer: the loop's top pauses the run)
            if code >= 0:
                break
        else:  # nothing admitted and nothing running: wait for the next arrival
            if nxt >= n:
                code, queued = STALLED, (w_tail - w_head) + n_pre
                break
            now = arrival[nxt]
    if code == DONE or code == CUT:  # cut short (horizon, wall clock): materialize who runs
        i = run_head
        while i >= 0:
            key_sum, used, n_gap = _leave(
                i, G, last_decode_end, key, base, adm_g, adm_end, gen, max_held, last_tok,
                max_itl, epoch, residues, bs, gap_idx, gap_val, n_gap, key_sum, used)
            i = run_next[i]
    (state_i[0], state_i[1], state_i[2], state_i[3], state_i[4], state_i[5], state_i[6],
     state_i[7], state_i[8], state_i[9], state_i[10], state_i[11], state_i[12], state_i[13],
     state_i[14], state_i[15], state_i[16], state_i[17], state_i[18], state_i[19]) = (
        run_head, run_tail, n_run, w_head, w_tail, n_pre, n_over, n_groups, n_members, n_fin,
        n_max, n_min, n_gap, n_log, n_irr, key_sum, used, G, nxt, iterations)
    state_f[0], state_f[1] = now, last_decode_end
    return code, now, queued


@njit(cache=True)
def _unlink(i, run_prev, run_next, head, tail):  # noqa: ANN202
    """Remove ``i`` from the running list; returns the new head and tail."""
    p, q = run_prev[i], run_next[i]
    if p >= 0:
        run_next[p] = q
    else:
        head = q
    if q >= 0:
        run_prev[q] = p
    else:
        tail = p
    return head, tail


@njit(cache=True)
def _leave(i, G, last_decode_end, key, base, adm_g, adm_end, gen, max_held, last_tok,  # noqa: ANN202
           max_itl, epoch, residues, bs, gap_idx, gap_val, n_gap, key_sum, used):
    """``leave``: materialize running request ``i``'s counters and drop it from the
    aggregates; returns the new key sum, blocks used and gap-stack size."""
    k = key[i]
    computed = k + G
    gen[i] = G - base[i]
    if computed > max_held[i]:
        max_held[i] = computed
    a = adm_g[i]
    if G > a:
        last_tok[i] = last_decode_end
        if G >= a + 2:
            j = _bisect_left(gap_idx, n_gap, a + 2)  # ``suffix_max``
            if j < n_gap and gap_val[j] > max_itl[i]:
                max_itl[i] = gap_val[j]
    else:
        last_tok[i] = adm_end[i]
    residues[k % bs] -= 1
    epoch[i] += 1
    return key_sum - k, used - blocks_for(computed, bs), n_gap


@njit(cache=True)
def _add_irregular(irr, irr_count, n_irr, at, gap, count):  # noqa: ANN202
    """``StepLog.add_irregular_itl``: merge with the last entry when time and gap match
    (the caller keeps room for a step's rows); returns the new row count."""
    if n_irr and irr[n_irr - 1, 0] == at and irr[n_irr - 1, 1] == gap:
        irr_count[n_irr - 1] += count
        return n_irr
    irr[n_irr, 0], irr[n_irr, 1], irr_count[n_irr] = at, gap, count
    return n_irr + 1


@njit(cache=True)
def _prune_gaps(gap_idx, gap_val, n_gap, first):  # noqa: ANN202
    """Drop the stack's entries older than decode ``first`` (the oldest running request's
    first decode gap: nobody asks for earlier ones again); returns the new size. The stack
    spans at most the oldest request's output length, so a buffer twice the longest output
    always has room after this."""
    j = _bisect_left(gap_idx, n_gap, first)
    keep = n_gap - j
    for r in range(keep):  # forward: the target never overtakes the source
        gap_idx[r], gap_val[r] = gap_idx[j + r], gap_val[j + r]
    return keep


@njit(cache=True)
def _bisect_left(a: np.ndarray, size: int, x: int) -> int:
    """``bisect.bisect_left(a[:size], x)`` (hand-written: numba's ``np.searchsorted`` costs
    seconds of compile time)."""
    lo, hi = 0, size
    while lo < hi:
        mid = (lo + hi) >> 1
        if a[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo
