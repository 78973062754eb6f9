"""Exact fast path: whole-prompt scheduling specifications without per-row work.

``sim.engine.replica`` asks the policy for a plan every iteration and touches every running
request in Python, which caps it near 10^4 steps a second. For the most common configuration — a
scheduling specification with composition ``prefill_first`` or ``mixed`` (``continuous`` in vLLM
or Orca mode), whole-prompt FCFS admission, the newest as preemption victim, paged KV with
recompute preemption, no prefix caching and a cost model with ``decode_step``, as the allow-list
of ``sim.engine.coverage`` decides — this module runs the
same simulation with every per-step operation in O(1) amortized (O(log n) at admissions and
finishes), producing the same tables bit for bit (tests/test_fastpath.py checks that against
the general engine on random traces, cost models and KV pressure).

Why that is possible: in vLLM mode every step either prefills newly admitted prompts (running
decodes wait) or decodes every running request by one token; in Orca mode every step decodes
every running request, and admitted prompts prefill whole alongside (``mixed_step`` costs such
a batch from the decode aggregates plus the prompts). So a running request's counters
are affine in the global decode-step count ``G``: ``num_computed = key + G`` with ``key`` fixed
at admission. The engine keeps only aggregates — the sum of keys (total context), the count of
keys per residue modulo the block size (who needs a new KV block at the next decode), heaps of
the largest and smallest keys (longest and shortest context for the cost model) and a heap of
the ``G`` at which each request finishes — and materializes a request's state only when it
leaves the running set (finish, preemption, rejection). Inter-token latencies stay exact: a
request's gaps are its first decode's gap plus the global decode-to-decode gaps over the steps
it ran, whose maximum comes from a monotonic stack (suffix maxima of an append-only series).

The interpreter's step logic (``policies.scheduler``) is reproduced here over aggregates; its
scalar rules (admission test, watermark) are ``sim.core.rules``, called, not copied. The
equivalence tests, whose specifications are drawn from the specification's own field domains,
fail when the two disagree. ``sim.engine.fastkernel`` runs the same
algorithm compiled for large vLLM-mode runs; a change here needs the same change there.
"""
from __future__ import annotations

import math
import time
from array import array
from bisect import bisect_left
from collections import deque
from collections.abc import Callable
from functools import partial
from heapq import heappop, heappush
from itertools import chain
from typing import Any

import numpy as np

from sim.core import rules
from sim.core.scheduling import SchedulingSpec
from sim.core.types import BatchShape, StepCost
from sim.cost.base import AggregateCost, PrefillCost
from sim.engine.coverage import fast_path_blocker
from sim.engine.replica import never_fits
from sim.engine.validate import EngineError
from sim.kv.config import KVConfig
from sim.metrics.summary import StepLog

__all__ = ["FastResult", "StepCosts", "arrival_rejections", "fast_path_blocker",
           "run_continuous"]

WAITING, RUNNING, FINISHED, REJECTED = "waiting", "running", "finished", "rejected"
#: Decode steps one numpy stretch covers at most / at least (below it, stepping is faster).
MAX_STRETCH, MIN_STRETCH = 4096, 40
#: Step columns this path writes, packed row by row (``StepLog.packed_*``).
INT_COLUMNS = ("num_seqs", "num_prefill_tokens", "num_decode_tokens", "num_recomputed_tokens",
               "num_waiting", "kv_used_blocks", "num_regular_itl", "kv_live_tokens")
FLOAT_COLUMNS = ("start_s", "duration_s", "flops", "bytes")
#: Step columns that are constant on this path (``replica``: ``StepLog.replica``; the others 0:
#: no padding, prefix cache or swapping).
ZERO_COLUMNS = frozenset({"replica", "num_padding_tokens", "num_padding_rows",
                          "kv_cached_blocks", "swap_s", "swapped_bytes"})


class StepCosts:
    """Step costs as ``(seconds, flops, bytes, bound)``: prefill batches (``prefill_cost``, or
    ``step``) memoized by their prompt lengths (a cost model is a pure function of the batch
    shape), decodes from aggregates through ``cost.decode_step``."""

    def __init__(self, cost: AggregateCost) -> None:
        self.cost = cost
        rows_fn = getattr(cost, "decode_step_for_rows", None)
        #: ``for_rows(rows)`` is ``decode_step`` with the batch size fixed
        self.for_rows = rows_fn if rows_fn is not None else partial(_fixed_rows, cost)
        self.uses_min = bool(getattr(cost, "decode_uses_min_context", False))
        #: ``step`` of whole prompts, as a tuple, when the model has ``prefill_cost``
        self.prompts = cost.prefill_cost if isinstance(cost, PrefillCost) else None
        # ``step`` of decodes batched with whole prompts: Orca mode's, vLLM mode needs none
        self._mixed: Callable[..., StepCost] | None = getattr(cost, "mixed_step", None)
        self._prefill: dict[tuple[int, ...], tuple[float, float, float, str]] = {}

    def mixed(self, rows: int, kv_tokens: int, c_min: int, c_max: int,
              prompts: tuple[int, ...]) -> tuple[float, float, float, str]:
        """Cost of ``rows`` decodes batched with whole ``prompts`` (``cost.mixed_step``)."""
        assert self._mixed is not None  # mixed composition: fast_path_blocker checked it
        s = self._mixed(rows, kv_tokens, c_min, c_max, prompts)
        return s.seconds, s.flops, s.bytes, s.bound

    def prefill(self, tokens: tuple[int, ...]) -> tuple[float, float, float, str]:
        """Cost of a step computing these whole prompts (context = tokens) and nothing else."""
        c = self._prefill.get(tokens)
        if c is None:
            if self.prompts is not None:
                c = self.prompts(tokens)
            else:
                arr = np.asarray(tokens, dtype=np.int64)
                s = self.cost.step(BatchShape(arr, arr, 0))
                c = (s.seconds, s.flops, s.bytes, s.bound)
            if len(self._prefill) > 1 << 18:  # bound the memo on adversarial traces
                self._prefill.clear()
            self._prefill[tokens] = c
        return c


def arrival_rejections(prompt: Any, out: Any, kv: KVConfig, max_tokens: int,
                       max_model_len: int | None) -> dict[int, str]:
    """Why each request that can never run is rejected on arrival (``never_fits``, or a prompt
    over the token budget), by index: a vectorized pass finds the few suspects."""
    prompts, outputs = np.asarray(prompt, dtype=np.int64), np.asarray(out, dtype=np.int64)
    risky = (prompts > max_tokens) | (rules.blocks_for(prompts + 1, kv.block_size) > kv.num_blocks)
    if max_model_len is not None:
        risky |= prompts + outputs > max_model_len
    reasons = {}
    for i in np.flatnonzero(risky).tolist():
        p = int(prompts[i])
        why = never_fits(kv, max_model_len, p, int(outputs[i]))
        if not why and p > max_tokens:
            why = f"prompt of {p} tokens exceeds max_num_batched_tokens={max_tokens}"
        if why:
            reasons[i] = why
    return reasons


def _fixed_rows(cost: AggregateCost, rows: int
                ) -> Callable[[int, int, int], tuple[float, float, float, str]]:
    """``cost.decode_step`` with ``rows`` bound."""
    return partial(cost.decode_step, rows)


class FastResult:
    """Per-request outcome columns of a fast-path run, in the order of ``requests``."""

    def __init__(self, n: int) -> None:
        nan = math.nan
        self.first_scheduled_s = [nan] * n
        self.first_token_s = [nan] * n
        self.finish_s = [nan] * n
        self.max_itl_s = [0.0] * n
        self.num_preemptions = [0] * n
        self.num_generated = [0] * n
        self.status = [WAITING] * n
        self.reason = [""] * n


def run_continuous(arrival: list[float], prompt: list[int], out: list[int],
                   spec: SchedulingSpec, cost: Any, kv: KVConfig, log: StepLog, *,
                   max_model_len: int | None, horizon_s: float | None,
                   deadline: float | None, replica: int = 0,
                   name: str = "continuous") -> FastResult:
    """Simulate requests given as arrival times (sorted; ties in id order), prompt and
    output lengths, on replica number ``replica``, under ``spec`` (one that
    ``fast_path_blocker`` admits) of the policy called ``name``; fill ``log`` (this replica's
    alone) and return the outcomes in that order."""
    n = len(arrival)
    res = FastResult(n)
    first_sched, first_tok, finish = res.first_scheduled_s, res.first_token_s, res.finish_s
    max_itl, npre, gen, status, reason = (res.max_itl_s, res.num_preemptions,
                                          res.num_generated, res.status, res.reason)
    max_held = [0] * n
    last_tok = [math.nan] * n
    # running requests: computed = key + G, generated = G - base; admitted at decode count
    # adm_g, at time adm_end; epoch invalidates heap entries when a request leaves
    key, base, adm_g, adm_end, epoch = [0] * n, [0] * n, [0] * n, [0.0] * n, [0] * n

    bs, num_blocks = kv.block_size, kv.num_blocks
    capacity = kv.capacity_tokens
    max_seqs, max_tokens = spec.max_num_seqs, spec.max_num_batched_tokens
    orca = spec.composition == "mixed"  # new prompts share steps with the decodes
    mark_blocks = rules.watermark_blocks(spec.watermark, num_blocks)
    limit = kv.max_preemptions
    costs = StepCosts(cost)
    admits, blocks_for = rules.admits, rules.blocks_for
    for_rows, uses_min = costs.for_rows, costs.uses_min
    decode_by_rows: dict[int, Any] = {}  # batch size -> ``decode_step`` with it bound

    cols = log.cols
    log.zero_columns = ZERO_COLUMNS
    log.packed_int_columns, log.packed_float_columns = INT_COLUMNS, FLOAT_COLUMNS
    packed_ints, packed_floats = log.packed_ints, log.packed_floats
    assert isinstance(packed_ints, array) and isinstance(packed_floats, array)  # appendable
    put_ints, put_floats = packed_ints.extend, packed_floats.extend
    put_bound = cols["bound"].append
    log.replica = replica
    log_irregular = log.add_irregular_itl

    def add_irregular(at_s: float, gap_s: float, count: int = 1) -> None:
        log_irregular(at_s, gap_s, count, replica)

    waiting: deque[int] = deque()
    preempted: list[int] = []  # a stack: the newest preempted request is admitted first
    over_budget: list[int] = []  # preempted requests whose recompute exceeds the token budget
    running: dict[int, None] = {}  # admission order; the newest is the preemption victim
    fin_heap: list[tuple[int, int, int]] = []  # (G at which it finishes, index, epoch)
    max_heap: list[tuple[int, int, int]] = []  # (-key, index, epoch)
    min_heap: list[tuple[int, int, int]] = []  # (key, index, epoch), if the cost needs it
    residues = [0] * bs  # running requests per key % block size
    key_sum = 0
    used = 0  # blocks held (paged, nothing shared: what policies see as used too)
    G = 0  # decode steps so far
    last_decode_end = math.nan
    last_secs = math.inf  # the last decode step's duration: guesses whether a stretch pays
    decode_series = getattr(cost, "decode_series", None)
    can_stretch = decode_series is not None and deadline is None
    gap_idx: list[int] = []  # monotonic stack of (decode index, gap to the previous decode)
    gap_val: list[float] = []
    # steps that admitted requests since the last decode step: (end, those still running)
    groups: list[tuple[float, list[int]]] = []

    def suffix_max(first: int) -> float:
        """Largest decode-to-decode gap of decode steps ``first``..``G``."""
        j = bisect_left(gap_idx, first)
        return gap_val[j] if j < len(gap_val) else -math.inf

    def leave(i: int) -> None:
        """Materialize running request ``i``'s counters and drop it from the aggregates,
        releasing its blocks."""
        nonlocal key_sum, used
        k = key[i]
        computed = k + G
        gen[i] = G - base[i]
        if computed > max_held[i]:
            max_held[i] = computed
        a = adm_g[i]
        if G > a:
            last_tok[i] = last_decode_end
            if G >= a + 2:
                m = suffix_max(a + 2)
                if m > max_itl[i]:
                    max_itl[i] = m
        else:
            last_tok[i] = adm_end[i]
        key_sum -= k
        residues[k % bs] -= 1
        epoch[i] += 1
        used -= blocks_for(computed, bs)

    def reject(i: int, now: float, why: str) -> None:
        status[i] = REJECTED
        reason[i] = why
        finish[i] = now

    def admit_running(i: int, computed: int, end: float) -> None:
        """Request ``i`` just had its prefill (or recompute) and decodes from now on."""
        nonlocal key_sum
        running[i] = None
        k = key[i] = computed - G
        base[i] = G - gen[i]
        adm_g[i] = G
        adm_end[i] = end
        key_sum += k
        residues[k % bs] += 1
        ep = epoch[i]
        heappush(fin_heap, (base[i] + out[i], i, ep))
        heappush(max_heap, (-k, i, ep))
        if uses_min:
            heappush(min_heap, (k, i, ep))

    def top(heap: list[tuple[int, int, int]]) -> int:
        while heap[0][2] != epoch[heap[0][1]]:
            heappop(heap)
        return heap[0][0]

    def record(start: float, end: float, num_seqs: int, num_prefill: int, num_decode: int,
               recomputed: int, held: int, flops: float, nbytes: float, bound: str,
               regular: int, live: int) -> None:
        """Append one step to the log (``INT_COLUMNS``, ``FLOAT_COLUMNS``, the bound)."""
        put_ints((num_seqs, num_prefill, num_decode, recomputed,
                  len(waiting) + len(preempted) + len(over_budget), held, regular, live))
        put_floats((start, end - start, flops, nbytes))
        put_bound(bound)

    def preempt_newest(need: int, now: float) -> int:
        """The policy's ``grow_running``: preempt the newest running requests until the
        blocks the others need at this decode fit; return the blocks still needed."""
        free = num_blocks - used
        victims = []
        while need > free:  # running is never emptied: see ``Replica.settle``
            v, _ = running.popitem()
            c = key[v] + G
            if c % bs == 0:
                need -= 1
            free += blocks_for(c, bs)
            victims.append(v)
            for _, members in reversed(groups):  # the newest admitted is last here
                if members:
                    if members[-1] == v:
                        members.pop()
                    break
        for v in victims:
            leave(v)
            npre[v] += 1
            if limit is not None and npre[v] > limit:
                reject(v, now, f"preempted {npre[v]} time{'s' if npre[v] > 1 else ''} "
                               f"(kv.max_preemptions={limit})")
                continue
            status[v] = WAITING
            (over_budget if prompt[v] + gen[v] > max_tokens else preempted).append(v)
        if not running:
            raise EngineError(f"fast path: preemption emptied the batch at t={now:.6f}s")
        return need

    def first_decode_gaps(end: float, start: float, rows: int) -> int:
        """The first decode after steps that admitted requests: log the gaps that are not
        this step's duration (decodes that waited through prefill-only steps, requests
        admitted before the last step), update the new requests' longest gap; return how many
        tokens came one step after the previous."""
        regular = rows
        fresh = 0
        for _, members in groups:
            fresh += len(members)
        old = rows - fresh
        if old and last_decode_end != start:  # they waited through prefill-only steps
            regular -= old
            add_irregular(end, end - last_decode_end, old)
        for gend, members in groups:
            if not members:
                continue
            gap = end - gend
            for i in members:
                if gap > max_itl[i]:
                    max_itl[i] = gap
            if gend != start:
                regular -= len(members)
                add_irregular(end, gap, len(members))
        groups.clear()
        return regular

    def choose_admissions(seats: int, budget: int, free: int, mark: int) -> list[int]:
        """The policy's ``admit_whole_prompts``: the head of the queue (preempted first,
        newest first; then arrivals) while slots, tokens and blocks above ``mark`` allow."""
        chosen = []
        for i in chain(reversed(preempted), waiting) if preempted else waiting:
            tokens = prompt[i] + gen[i]
            blocks = blocks_for(tokens, bs)
            if not admits(seats, tokens, budget, free, blocks, mark):
                break  # head-of-line: later requests wait behind this one
            seats -= 1
            budget -= tokens
            free -= blocks
            chosen.append(i)
        return chosen

    def launch_admitted(admitted: list[int], now: float) -> tuple[list[int], int]:
        """Take ``admitted`` off the queues and give them their blocks; return their token
        counts (prompt, or prompt + generated for a recompute) and the recomputed tokens."""
        nonlocal used
        num_pre = min(len(admitted), len(preempted))  # the queue lists preempted first
        del preempted[len(preempted) - num_pre:]
        for _ in range(len(admitted) - num_pre):
            waiting.popleft()
        recomputed = 0
        sizes = []
        for i in admitted:
            status[i] = RUNNING
            if first_sched[i] != first_sched[i]:
                first_sched[i] = now
            tokens = prompt[i] + gen[i]
            if max_held[i]:
                recomputed += min(tokens, max_held[i])
            used += blocks_for(tokens, bs)
            sizes.append(tokens)
        return sizes, recomputed

    def commit_admitted(admitted: list[int], sizes: list[int], start: float,
                        end: float) -> int:
        """Sample the token each admitted prefill (or recompute) yields at ``end``; finish,
        reject or start decoding each. Return how many of those tokens were regular."""
        nonlocal used
        regular = 0
        members = []
        for i, tokens in zip(admitted, sizes, strict=True):
            if tokens > max_held[i]:
                max_held[i] = tokens
            g = gen[i] = gen[i] + 1
            last = last_tok[i]
            last_tok[i] = end
            if g == 1:
                first_tok[i] = end
            else:
                gap = end - last
                if gap > max_itl[i]:
                    max_itl[i] = gap
                if last == start:
                    regular += 1
                else:
                    add_irregular(end, gap)
            if g >= out[i]:
                status[i] = FINISHED
                finish[i] = end
                used -= blocks_for(tokens, bs)
            elif tokens >= capacity and blocks_for(tokens + 1, bs) > num_blocks:
                used -= blocks_for(tokens, bs)
                reject(i, end, "context outgrew the KV cache")
            else:
                admit_running(i, tokens, end)
                members.append(i)
        groups.append((end, members))
        return regular

    def mixed_step(admitted: list[int], now: float, rows: int) -> None:
        """An Orca step: every running request decodes while ``admitted`` prefill whole
        (decode blocks already taken); log it as the general engine would."""
        nonlocal G, last_decode_end, last_secs
        sizes, recomputed = launch_admitted(admitted, now)
        held = used
        c_max = G + 1 - top(max_heap)
        c_min = G + 1 + top(min_heap) if uses_min else c_max
        secs, flops, nbytes, bound = costs.mixed(rows, key_sum + rows * (G + 1), c_min, c_max,
                                                 tuple(sizes))
        end = now + secs
        last_secs = secs
        G += 1
        regular = first_decode_gaps(end, now, rows) if groups else rows
        if G >= 2:
            push_gap(end - last_decode_end)
        last_decode_end = end
        live = key_sum + rows * G + sum(sizes)
        if fin_heap and fin_heap[0][0] <= G:
            finish_due(end)
        drop_outgrown(c_max, end)
        regular += commit_admitted(admitted, sizes, now, end)
        record(now, end, rows + len(admitted), sum(sizes), rows, recomputed, held, flops,
               nbytes, bound, regular, live)

    def push_gap(gap: float) -> None:
        """The decode-to-decode gap of step ``G`` joins the monotonic stack."""
        while gap_val and gap_val[-1] <= gap:
            gap_val.pop()
            gap_idx.pop()
        gap_idx.append(G)
        gap_val.append(gap)

    def drop_outgrown(c_max: int, end: float) -> None:
        """Reject the running request whose context reached the cache's size, if any
        (``c_max``, the longest context this step, tells cheaply that none did)."""
        while c_max >= capacity and running and G - top(max_heap) >= capacity:
            i = max_heap[0][1]
            if blocks_for(key[i] + G + 1, bs) <= num_blocks:
                break
            del running[i]
            leave(i)
            reject(i, end, "context outgrew the KV cache")

    def finish_due(end: float) -> None:
        """Release the requests whose last token came at the end of decode step ``G``."""
        while fin_heap and fin_heap[0][0] <= G:
            _, i, ep = heappop(fin_heap)
            if ep != epoch[i]:
                continue
            del running[i]
            leave(i)
            status[i] = FINISHED
            finish[i] = end

    def decode_stretch(now: float) -> float | None:
        """Exact event skipping: run the decode steps up to the next finish, arrival,
        horizon or KV shortfall in numpy (``cost.decode_series``) and log each of them as
        stepping would; return the end of the last, or ``None`` when too few steps are
        ahead for numpy to pay."""
        nonlocal G, used, last_decode_end, last_secs
        rows = len(running)
        top(fin_heap)
        k = min(fin_heap[0][0] - G, MAX_STRETCH,
                capacity - 1 + top(max_heap) - G)  # no context reaches the cache's size
        limit = arrival[nxt] if nxt < n else math.inf
        if horizon_s is not None and horizon_s < limit:
            limit = horizon_s
        ahead = (limit - now) / last_secs  # steps until the next arrival, roughly
        if k < MIN_STRETCH or ahead < MIN_STRETCH:
            return None
        if ahead < k:  # steps lengthen as contexts grow: a margin, then trim exactly below
            k = min(k, int(ahead * 1.25) + 8)
        js = np.arange(k, dtype=np.int64)
        grown = np.cumsum(np.asarray(residues)[(-(G + js)) % bs])  # blocks taken by step j
        free = num_blocks - used
        if grown[-1] > free:  # stepping would preempt at the first step past the free blocks
            k = int(np.searchsorted(grown, free, side="right"))
            if k < MIN_STRETCH:
                return None
        c_max = G + 1 - max_heap[0][0]
        c_min = G + 1 + top(min_heap) if uses_min else c_max
        assert decode_series is not None  # can_stretch
        secs, flops, nbytes, bounds = decode_series(rows, key_sum + rows * (G + 1), c_min,
                                                    c_max, k)
        ends = np.cumsum(np.concatenate(([now], secs[:k])))[1:]  # the clock, as stepping adds
        if ends[-1] >= limit:
            k = int(np.searchsorted(ends, limit, side="left")) + 1
            ends = ends[:k]
        starts = np.concatenate(([now], ends[:-1]))
        durations = ends - starts
        steps = js[:k] + (G + 1)  # decode indices of these steps
        ints = np.zeros((k, len(INT_COLUMNS)), dtype=np.int64)  # the rows ``record`` writes
        ints[:, 0] = ints[:, 2] = ints[:, 6] = rows  # sequences, decodes, regular ITLs
        ints[:, 5] = used + grown[:k]
        ints[:, 7] = key_sum + rows * steps
        packed_ints.frombytes(ints.tobytes())
        floats = np.empty((k, len(FLOAT_COLUMNS)))
        floats[:, 0], floats[:, 1], floats[:, 2], floats[:, 3] = (starts, durations, flops[:k],
                                                                  nbytes[:k])
        packed_floats.frombytes(floats.tobytes())
        cols["bound"].extend(bounds[:k])
        # the decode-to-decode gaps join the monotonic stack: a new gap stays if it is larger
        # than every later one, an old entry if it is larger than all of them
        later = np.maximum.accumulate(durations[::-1])[::-1]
        keep = np.append(durations[:-1] > later[1:], True)
        largest = later[0]
        while gap_val and gap_val[-1] <= largest:
            gap_val.pop()
            gap_idx.pop()
        gap_idx.extend(steps[keep].tolist())
        gap_val.extend(durations[keep].tolist())
        G += k
        used += int(grown[k - 1])
        last_decode_end = float(ends[-1])
        last_secs = float(durations[-1])
        return last_decode_end

    rejected_on_arrival = arrival_rejections(prompt, out, kv, max_tokens, max_model_len)

    now, nxt = 0.0, 0
    while True:
        if horizon_s is not None and now >= horizon_s:
            break
        if deadline is not None and time.perf_counter() > deadline:
            break
        while nxt < n and arrival[nxt] <= now:
            why = rejected_on_arrival.get(nxt)
            if why:
                reject(nxt, now, why)
            else:
                waiting.append(nxt)
            nxt += 1
        if over_budget:
            for i in over_budget:
                reject(i, now, f"prompt of {prompt[i] + gen[i]} tokens exceeds "
                               f"max_num_batched_tokens={max_tokens}")
            over_budget.clear()
        num_running = len(running)
        if not (waiting or preempted or num_running):
            if nxt >= n:
                break
            now = arrival[nxt]
            continue
        # -- admission: whole prompts, FCFS, while slots, token budget and blocks allow -----
        # (vLLM mode: before any decode; Orca mode: only when nothing runs, else below)
        admitted = None
        if (waiting or preempted) and num_running < max_seqs and not (orca and num_running):
            admitted = choose_admissions(max_seqs - num_running, max_tokens,
                                         num_blocks - used, mark_blocks if num_running else 0)
        if admitted:
            sizes, recomputed = launch_admitted(admitted, now)
            secs, flops, nbytes, bound = costs.prefill(tuple(sizes))
            end = now + secs
            held = used
            live = key_sum + num_running * G + sum(sizes)
            regular = commit_admitted(admitted, sizes, now, end)
            record(now, end, len(admitted), sum(sizes), 0, recomputed, held, flops, nbytes,
                   bound, regular, live)
            now = end
        elif num_running:
            # -- decode steps, back to back while no arrival, queue, horizon or budget can
            # change the plan: every running request decodes one token per step ------------
            queued = len(waiting) + len(preempted) + len(over_budget)
            while True:
                if (can_stretch and fin_heap[0][0] - G >= MIN_STRETCH
                        and (nxt >= n or arrival[nxt] - now >= MIN_STRETCH * last_secs)
                        and not (groups or queued)):
                    stretch_end = decode_stretch(now)  # a cheap pre-check above: most steps
                    # are near an arrival or a finish, and numpy only pays over long stretches
                    if stretch_end is not None:  # many steps at once, up to a finish or arrival
                        if fin_heap and fin_heap[0][0] <= G:
                            finish_due(stretch_end)
                        now = stretch_end
                        if (not running or (nxt < n and arrival[nxt] <= now)
                                or (horizon_s is not None and now >= horizon_s)):
                            break
                        continue
                need = residues[-G % bs]
                victims = need > num_blocks - used
                if victims:
                    need = preempt_newest(need, now)
                    queued = len(waiting) + len(preempted) + len(over_budget)
                rows = len(running)
                used += need
                if orca and queued and not victims and (waiting or preempted):
                    # Orca: new prompts join this very step, in what the decodes leave
                    admitted = choose_admissions(max_seqs - rows, max_tokens - rows,
                                                 num_blocks - used, mark_blocks)
                    if admitted:
                        mixed_step(admitted, now, rows)
                        now = last_decode_end
                        queued = len(waiting) + len(preempted) + len(over_budget)
                        if ((nxt < n and arrival[nxt] <= now) or queued or not running
                                or (horizon_s is not None and now >= horizon_s)):
                            break
                        continue
                held = used
                entry = max_heap[0]
                if entry[2] != epoch[entry[1]]:
                    top(max_heap)
                    entry = max_heap[0]
                c_max = G + 1 - entry[0]
                decode_cost = decode_by_rows.get(rows)
                if decode_cost is None:
                    decode_cost = decode_by_rows[rows] = for_rows(rows)
                secs, flops, nbytes, bound = decode_cost(
                    key_sum + rows * (G + 1), G + 1 + top(min_heap) if uses_min else c_max,
                    c_max)
                last_secs = secs
                end = now + secs
                G += 1
                regular = first_decode_gaps(end, now, rows) if groups else rows
                if G >= 2:  # ``push_gap``, inlined
                    gap = end - last_decode_end
                    while gap_val and gap_val[-1] <= gap:
                        gap_val.pop()
                        gap_idx.pop()
                    gap_idx.append(G)
                    gap_val.append(gap)
                last_decode_end = end
                live = key_sum + rows * G
                if fin_heap and fin_heap[0][0] <= G:
                    finish_due(end)
                if c_max >= capacity:  # (c_max: the longest context now, or more)
                    drop_outgrown(c_max, end)
                # ``record``, inlined: this runs once per decode step
                put_ints((rows, 0, rows, 0, queued, held, regular, live))
                put_floats((now, end - now, flops, nbytes))
                put_bound(bound)
                now = end
                if ((nxt < n and arrival[nxt] <= now) or queued or not running
                        or deadline is not None
                        or (horizon_s is not None and now >= horizon_s)):
                    break
        else:  # nothing admitted and nothing running: wait for the next arrival
            if nxt >= n:
                queued = len(waiting) + len(preempted)
                raise EngineError(
                    f"policy {name!r} stalled at t={now:.6f}s: empty plan, no wake_at_s,"
                    f" no arrivals left, {queued} waiting and 0 running")
            now = arrival[nxt]
    for i in running:  # cut short (horizon, wall clock): materialize who is still running
        leave(i)
    return res
