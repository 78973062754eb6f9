"""A short steady decode stretch that runs on through its finishes in one event.

A plan that says ``on_finish="drop"`` promises that the policy, asked after a finish, would make
the same plan less the finished rows (``skipping.continue_skip`` makes that plan). Skipping
used to end a stretch at every finish and start the next one from the new plan: at 80 % load
a chunked-prefill run does that thousands of times, each one a commit, a new plan and a new
stretch set up. Here a stretch of at most ``SHORT_STEPS`` steps goes on past its finishes:
each step is costed for the rows still running then (the model's aggregate ``decode_step``,
as ``short_stretch``), and the commit replays, segment by segment (between finishes), what the
chain of stretches would have done: each segment's KV growth in row order, then its finishers'
tokens and release (``Replica.settle``) at their own step's end. The step log gets every step
as stepping logs it (its running rows, the KV it held, live tokens); the stretch's last plan
is what ``continue_skip`` makes at landing from the first plan and the stretch's length.

Only where nothing else could see the replica mid-stretch or change what a finish does: a
replica on its own request list (not driven, no listener, no KV held for a hand-off), paged
KV without a prefix cache (a finisher's blocks go straight back to the free list) and
without requests near the cache's capacity, and a plan that does not take arrivals mid-stretch.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from sim.core.rules import blocks_needed
from sim.core.types import BatchShape, Plan

if TYPE_CHECKING:
    from sim.engine.replica import Replica
    from sim.engine.skipping import ShortSeries


class Through(NamedTuple):
    """What ``commit_through`` needs of a stretch through finishes, found when planning it."""

    lefts: list[int]  # per plan row: its last step in the stretch (its finish, or the end)
    grow: list[tuple[int, int, int]]  # ``(row, computed, held)`` of the rows that grow
    num_running: list[int]  # per step: the plan's rows still running
    held: list[int]  # per step: blocks held while it ran, less those held before
    live: list[int]  # per step: live tokens less those before
    finishing: dict[int, list[int]]  # step -> plan rows whose last token it makes


def eligible(rep: Replica, plan: Plan) -> bool:
    """Whether ``plan``'s short stretch may run through its finishes (the module's terms)."""
    pool = rep.pool
    return (plan.on_finish == "drop" and not plan.ignores_arrivals and pool.cache is None
            and pool.config.allocator != "slab" and bool(rep.requests)
            and rep.listener is None and not rep.hold_kv and not rep.incoming
            and not rep.kv_changes and not rep.pending and pool.used == pool.charged)


def plan_through(rep: Replica, plan: Plan, shape: BatchShape, computed: list[int],
                 held: list[int], lefts: list[int], now: float, limit: float
                 ) -> tuple[ShortSeries, list[float], Through] | None:
    """The costs, end times and KV of a stretch of at most ``SHORT_STEPS`` steps from ``now``
    (``shape``: the step before it; ``computed``, ``held`` and ``lefts``: each plan row's
    tokens, blocks and output tokens left) that stops at the first of: the step whose end
    reaches ``limit``, the last plan row's finish, growth that does not fit, ``SHORT_STEPS``.
    ``None`` when the model has no aggregate decode form, a row is not one token, or a row
    could reach the cache's capacity (then a stretch stops at the first finish)."""
    from sim.engine.skipping import SHORT_STEPS, ShortSeries, decode_stepper

    ctx = shape.context_lens.tolist()
    n = len(computed)
    if sum(shape.new_tokens.tolist()) != len(ctx):  # every row one token
        return None
    capacity = rep.pool.config.capacity_tokens
    if max(computed) + SHORT_STEPS >= capacity:
        return None  # ``settle`` might reject a row mid-stretch: stop at finishes instead
    finishing: dict[int, list[int]] = {}  # step -> plan rows whose last token it makes
    for i, left in enumerate(lefts):
        if left <= SHORT_STEPS:
            finishing.setdefault(left, []).append(i)
    alive = list(range(len(ctx)))  # rows in the batch (plan rows, then padding rows)
    n_alive = n
    cost = rep.cost
    seconds: list[float] = []
    flops: list[float] = []
    nbytes: list[float] = []
    bounds: list[str] = []
    ends: list[float] = []
    num_running: list[int] = []
    end = now
    # step t attends each row's context before the stretch (``shape``) plus t
    rows, kv, lo, hi = len(ctx), sum(ctx), min(ctx), max(ctx)
    step = decode_stepper(cost, rows)
    if step is None:
        return None
    t = 0
    while t < SHORT_STEPS:
        if t and t in finishing:  # a new segment: the batch of the rows left
            part = [ctx[i] for i in alive]
            rows, kv, lo, hi = len(part), sum(part), min(part), max(part)
            following = decode_stepper(cost, rows)
            if following is None:
                return None
            step = following
        t += 1
        s, f, b, bound = step(kv + rows * t, lo + t, hi + t)
        end = end + s
        seconds.append(s)
        flops.append(f)
        nbytes.append(b)
        bounds.append(bound)
        ends.append(end)
        num_running.append(n_alive)
        if end >= limit:  # stepping stops at the step whose end reaches ``limit``
            break
        gone = finishing.get(t)
        if gone:
            n_alive -= len(gone)
            if not n_alive:
                break  # nothing of the plan left: the policy is asked (``continue_skip``)
            out = set(gone)
            alive = [i for i in alive if i not in out]
    k, grow, grown, released = fitting_through(rep, computed, held, lefts, finishing,
                                               len(ends))
    if k < 1:
        return None
    if k < len(ends):
        for column in (seconds, flops, nbytes, bounds, ends, num_running):
            del column[k:]
    last = [left if left < k else k for left in lefts]
    held_d = [g - r for g, r in zip(grown, released, strict=True)]
    gone_c = 0
    live = []
    for j in range(1, k + 1):
        live.append(num_running[j - 1] * j - gone_c)  # the tokens of rows still running
        for i in finishing.get(j, ()):
            gone_c += computed[i]  # ...and a finisher's are gone from the next step on
    return (ShortSeries(seconds, flops, nbytes, bounds), ends,
            Through(last, grow, num_running, held_d, live, finishing))


def fitting_through(rep: Replica, computed: list[int], held: list[int], lefts: list[int],
                    finishing: dict[int, list[int]], k: int
                    ) -> tuple[int, list[tuple[int, int, int]], list[int], list[int]]:
    """The most steps, up to ``k``, whose KV growth fits as a chain of stretches checks it,
    segment by segment (``fitting_steps`` against the free blocks policies see, a finisher's
    blocks free again after its step): with the rows that grow and, per step, the blocks
    the rows still running have grown and the blocks the rows gone before it came with.
    The blocks a step holds beyond those before the stretch are the difference (a finisher's
    grown blocks went back with it), and a step fits when that is within the free blocks."""
    from sim.engine.skipping import GROWN_IN_PYTHON, blocks_grown

    pool = rep.pool
    bs = pool.config.block_size
    # a row grows up to its last step: by the rule ``blocks_needed`` at each step
    grow = [(i, c, h) for i, (c, h) in enumerate(zip(computed, held, strict=True))
            if blocks_needed(c + (lefts[i] if lefts[i] < k else k), 0, h, bs)]
    if len(grow) * k > GROWN_IN_PYTHON:  # ``blocks_grown``'s combs, each cut at its finish
        rows = [i for i, _, _ in grow]
        total = blocks_grown(np.array([c for _, c, _ in grow], dtype=np.int64),
                             np.array([h for _, _, h in grow], dtype=np.int64), bs, k,
                             np.array([lefts[i] for i in rows], dtype=np.int64)).tolist()
        grown = []
        gone = 0  # blocks finishers grew, held on in ``total`` after their finish
        for t in range(1, k + 1):
            grown.append(total[t - 1] - gone)
            for i in finishing.get(t, ()):
                gone += blocks_needed(computed[i] + t, 0, held[i], bs)
    else:
        grown = [sum([blocks_needed(c + t, 0, h, bs) for i, c, h in grow if lefts[i] >= t])
                 for t in range(1, k + 1)]
    released = []
    rel = 0
    for t in range(1, k + 1):
        released.append(rel)
        for i in finishing.get(t, ()):  # gone after step t (its grown blocks with it)
            rel += held[i]
    if not pool.config.unlimited:
        free = pool.view_free
        for t in range(k):
            if grown[t] - released[t] > free:  # this step's growth does not fit
                k = t
                break
    return k, grow, grown[:k], released[:k]


def commit_through(rep: Replica, plan: Plan, series: ShortSeries, ends: list[float],
                   info: Through, start: float) -> None:
    """Apply a stretch through finishes (``plan_through``) and log each of its steps."""
    from sim.engine.skipping import take_arrivals

    k = len(ends)
    pool = rep.pool
    bs = pool.config.block_size
    starts = [start, *ends[:-1]]
    seconds = [e - s for e, s in zip(ends, starts, strict=True)]
    used0 = pool.used
    used = [used0 + d for d in info.held]
    cached = [pool.cached] * k  # no prefix cache: nothing cached, growth only takes free blocks
    live0 = rep.live_tokens()
    live = [live0 + d for d in info.live]
    running = rep.running
    batch = [running[sid] for sid in plan.run]
    lefts, grow = info.lefts, info.grow
    # worst gap of each row: the longest of its steps (each token came one step after)
    worst_by: dict[int, float] = {}
    worst = 0.0
    for j, s in enumerate(seconds, 1):
        if s > worst:
            worst = s
        worst_by[j] = worst
    settle = rep.settle
    finishing = info.finishing
    segment_ends = [t for t in sorted(finishing) if t < k]
    segment_ends.append(k)
    for t in segment_ends:  # each segment's growth in row order, then its finishers leave
        for i, _, _ in grow:
            if lefts[i] >= t:
                seq = batch[i]
                # its tokens are committed once (at its finish or the end): t steps on
                need = blocks_needed(seq.num_computed + t, 0, seq.num_blocks, bs)
                if need:
                    pool.take_for(seq, need)
        if t < k:
            end_t = ends[t - 1]
            for i in finishing[t]:
                seq = batch[i]
                seq.skip(t, end_t, worst_by[t])
                settle(seq, end_t)
    end = ends[-1]
    for i, left in enumerate(lefts):
        if left == k:
            seq = batch[i]
            seq.skip(k, end, worst_by[k])
            if seq.status == "finished":
                settle(seq, end)
    pad = len(plan.padding)
    rep.log.extend(rep.index, starts, seconds, info.num_running, info.num_running, pad, pad,
                   take_arrivals(rep, starts), used, series, info.num_running,
                   kv_live_tokens=live, kv_cached_blocks=cached)
    if rep.checks:
        rep.check_invariants()

