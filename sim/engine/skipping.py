"""Exact event skipping: advance a ``steady`` decode plan over many steps in one event.

A policy marks a pure-decode plan ``steady`` when it would repeat it until an arrival, a
finish or a KV shortfall. ``plan_skip`` finds how many steps that is and costs them at once
(``Replica.series``: ``sim.cost.base.step_series``, or the same numbers in compiled code);
``commit_skip`` applies them at once and logs every step exactly as stepping would have: token
times, KV held (growth, evictions of cached prefix blocks), live tokens. Decode blocks join a
prefix chain only when their request finishes (``Replica.settle``), never mid-stretch, so
skipping cannot reorder who extends a chain. Tested to be bit-identical
to stepping for every policy, allocator and preemption mode.

A plan's ``on_finish`` and ``ignores_arrivals`` (``sim.core.types.Plan``) let a stretch go on
past a finish (``continue_skip`` makes the plan the policy would make: the same rows less the
finished ones, or with them as padding rows) and past arrivals: those join the queue at the
scheduling point stepping would have taken them at (the first step start at or after their
arrival), and every step logs the queue it saw.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from sim.core.rules import blocks_for, blocks_needed
from sim.core.types import BatchShape, PaddingRow, Plan
from sim.cost.base import ConstantCost, LinearCost, StepSeries
from sim.cost.roofline import RooflineCost
from sim.engine.drive import kv_changes_after

if TYPE_CHECKING:
    from sim.engine.replica import Replica

#: Most decode steps one skip covers: bounds the arrays built per skip.
MAX_SKIP_STEPS = 2048
#: Longest stretch costed and committed in Python scalars, one step at a time, instead of in
#: numpy: at 80 % load most stretches last one to a few steps (an arrival ends them), where
#: the numpy set-up of a series (tens of calls of about a microsecond each) costs more than
#: the steps. Both forms give the same numbers; the threshold changes speed only.
SHORT_STEPS = 16
#: Most (growing row, step) pairs of a short stretch whose growth is counted by the rule in
#: Python; more go through ``blocks_grown``'s numpy combs (a dozen calls).
GROWN_IN_PYTHON = 96


class ShortSeries(NamedTuple):
    """A short stretch's per-step costs as Python lists (``StepSeries``' fields, by name)."""

    seconds: list[float]
    flops: list[float]
    bytes: list[float]
    bound: list[str]


def multiset_costed(cost: object) -> bool:
    """Whether ``cost`` is known to cost a pure-decode batch by its multiset of context
    lengths alone (neither the order of rows nor which of them are padding enters): the
    built-in models (tests/test_skip_batches.py checks it). A run-to-completion batch's steps
    are then one series over all its rows (``sim.engine.batch_skip``)."""
    from sim.cost.base import ConstantCost, LinearCost
    from sim.cost.roofline import RooflineCost

    return type(cost) in (ConstantCost, LinearCost, RooflineCost)


def decode_stepper(cost: object, rows: int
                   ) -> Callable[[int, int, int], tuple[float, float, float, str]] | None:
    """``cost``'s aggregate ``decode_step`` with ``rows`` bound, ``f(kv_tokens, c_min, c_max)``
    (``sim.cost.base.AggregateCost``: bit-identical to ``step`` on such a batch, so to the
    ``step_series`` a stretch is costed with), for the built-in models; ``None`` for any other
    model and for a sliding window (whose cost needs the rows)."""
    kind = type(cost)
    if kind is RooflineCost:
        if cost.model.sliding_window is not None:  # type: ignore[attr-defined]
            return None
        return cost.decode_step_for_rows(rows)  # type: ignore[attr-defined]
    if kind is ConstantCost or kind is LinearCost:
        step = cost.decode_step  # type: ignore[attr-defined]
        return lambda kv, lo, hi: step(rows, kv, lo, hi)
    return None


def short_stretch(rep: Replica, shape: BatchShape, k: int, now: float, limit: float
                  ) -> tuple[ShortSeries, list[float]] | None:
    """``stretch_costs`` of a stretch that ends within ``SHORT_STEPS`` steps, costed step by
    step with the model's aggregate ``decode_step`` (``decode_stepper``) in Python scalars: the
    same costs and end times (ends summed from ``now`` in order, as ``np.cumsum`` does), as
    lists. ``None`` when the model has no aggregate form, a row is not one token, or the
    stretch runs on past ``SHORT_STEPS`` steps (then the numpy series costs it)."""
    ctx = shape.context_lens.tolist()
    rows = len(ctx)
    if not rows or sum(shape.new_tokens.tolist()) != rows:  # every row one token
        return None
    step = decode_stepper(rep.cost, rows)
    if step is None:
        return None
    # the first step's rows attend one token more than the step before (``shape``)
    kv, lo, hi = sum(ctx) + rows, min(ctx) + 1, max(ctx) + 1
    seconds: list[float] = []
    flops: list[float] = []
    nbytes: list[float] = []
    bounds: list[str] = []
    ends: list[float] = []
    end = now
    for j in range(min(k, SHORT_STEPS)):
        s, f, b, bound = step(kv + rows * j, lo + j, hi + j)
        end = end + s
        seconds.append(s)
        flops.append(f)
        nbytes.append(b)
        bounds.append(bound)
        ends.append(end)
        if end >= limit:  # stepping stops at the step whose end reaches ``limit``
            break
    else:
        if k > SHORT_STEPS:
            return None
    return ShortSeries(seconds, flops, nbytes, bounds), ends


def plan_skip(rep: Replica, plan: Plan, shape: BatchShape, now: float, next_arrival: float
              ) -> tuple | None:
    """How many more steps a steady decode plan runs unchanged, with their costs.

    Stops at the first of: a scheduled request finishing, KV growth needing more blocks than
    policies see free, the step at whose end ``next_arrival`` has come (the next request, or
    the time a driven replica is advanced to), the horizon.
    Returns ``(series, ends, computed, held, now)`` or ``None`` when there is nothing to skip:
    numpy arrays, or for a stretch of at most ``SHORT_STEPS`` steps (``short_stretch``)
    Python lists and, in place of ``computed`` and ``held``, its ``growing_rows`` and ``None``.
    """
    if next_arrival <= now or (rep.horizon_s is not None and now >= rep.horizon_s):
        return None  # stepping would stop here to take the arrival, or end at the horizon
    rows = decode_rows(rep, plan)
    if rows is None:
        return None
    k, computed_, held_ = rows
    if k < 1:
        return None
    limit = min(next_arrival, rep.horizon_s if rep.horizon_s is not None else math.inf)
    # The steps up to the limit cost the same however many fit: cost the short stretch
    # first, then cut it where the KV growth stops fitting (``fitting_steps``' answer for
    # the shorter stretch is the smaller of the two counts, its need being monotone).
    short = short_stretch(rep, shape, k, now, limit)
    if short is not None:
        series, ends = short
        grow = growing_rows(computed_, held_, rep.pool.config.block_size, len(ends))
        m = fitting_steps_short(rep, grow, len(ends))
        if m < 1:
            return None
        if m < len(ends):
            for column in (*series, ends):
                del column[m:]
        return series, ends, grow, None, now
    computed = np.array(computed_, dtype=np.int64)
    held = np.array(held_, dtype=np.int64)
    k = fitting_steps(rep, computed, held, k)
    if k < 1:
        return None
    series_, ends_ = stretch_costs(rep, shape, k, now, limit)
    return series_, ends_, computed, held, now


def decode_rows(rep: Replica, plan: Plan
                ) -> tuple[int, list[int], list[int]] | None:
    """``(k, computed, held)`` of ``plan``'s rows: the fewest output tokens any has left, and
    each one's computed tokens and blocks; ``None`` unless every row is a running decode."""
    running = rep.running
    computed, held = [], []
    k = MAX_SKIP_STEPS
    for sid in plan.run:
        seq = running.get(sid)
        if seq is None:
            return None
        generated, done = seq.num_generated, seq.num_computed
        if seq.req.num_prompt_tokens + generated - done != 1:
            return None  # not a decode
        left = seq.req.num_output_tokens - generated
        if left < k:
            k = left
        computed.append(done)
        held.append(seq.num_blocks)
    return k, computed, held


def fitting_steps(rep: Replica, computed: np.ndarray, held: np.ndarray, k: int,
                  remaining: np.ndarray | None = None) -> int:
    """The most decode steps, up to ``k``, whose KV growth fits in the blocks policies see
    free: requests with ``computed`` tokens in ``held`` blocks, each stopping after its
    ``remaining`` steps when given (a finisher grows no more)."""
    cfg = rep.pool.config
    if cfg.unlimited:
        return k
    bs, free = cfg.block_size, rep.pool.view_free

    def need(steps: int) -> int:
        reached = computed + (steps if remaining is None else np.minimum(remaining, steps))
        return int(np.maximum(blocks_for(reached, bs) - held, 0).sum())

    if need(k) <= free:
        return k
    lo, hi = 0, k  # the largest k whose growth fits: need() is monotone in k
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if need(mid) <= free else (lo, mid - 1)
    return lo


def growing_rows(computed: list[int], held: list[int], block_size: int, k: int
                 ) -> list[tuple[int, int, int]]:
    """``(row, computed, held)`` of the rows (``computed`` tokens in ``held`` blocks each) that
    need a block by their ``k``-th decode step (``blocks_needed``, the one rule; monotone in
    the steps, so no other row grows in a shorter stretch either)."""
    return [(i, c, h) for i, (c, h) in enumerate(zip(computed, held, strict=True))
            if blocks_needed(c + k, 0, h, block_size)]


def fitting_steps_short(rep: Replica, grow: list[tuple[int, int, int]], k: int) -> int:
    """``fitting_steps`` (no finishers) of a short stretch over its ``growing_rows``."""
    cfg = rep.pool.config
    if cfg.unlimited or not grow:
        return k
    bs, free = cfg.block_size, rep.pool.view_free
    while k > 0 and sum([blocks_needed(c + k, 0, h, bs) for _, c, h in grow]) > free:
        k -= 1  # need is monotone in k: the first that fits, counting down
    return k


def grown_short(grow: list[tuple[int, int, int]], block_size: int, k: int) -> list[int]:
    """``blocks_grown`` (no finishers) of a short stretch over its ``growing_rows`` (for ``k``
    steps or more): the blocks given after each of its ``k`` steps,
    ``sum(blocks_needed(computed + j, held))``, j = 1..k; by the rule in Python for a few
    rows and steps, else by ``blocks_grown``'s combs (integers: the same counts)."""
    if not grow:
        return [0] * k
    if len(grow) * k > GROWN_IN_PYTHON:
        computed = np.array([c for _, c, _ in grow], dtype=np.int64)
        held = np.array([h for _, _, h in grow], dtype=np.int64)
        return blocks_grown(computed, held, block_size, k).tolist()
    return [sum([blocks_needed(c + j, 0, h, block_size) for _, c, h in grow])
            for j in range(1, k + 1)]


def stretch_grown(computed: np.ndarray | list[tuple[int, int, int]], held: np.ndarray | None,
                  block_size: int, k: int) -> int:
    """Blocks a skipped stretch has given by the end of its ``k``-th step, from ``plan_skip``'s
    ``computed`` and ``held`` (a short stretch's ``growing_rows`` and ``None``)."""
    if held is None:
        assert isinstance(computed, list)
        return grown_short(computed, block_size, k)[-1]
    assert isinstance(computed, np.ndarray)
    return int(blocks_grown(computed, held, block_size, k)[-1])


def stretch_costs(rep: Replica, shape: BatchShape, k: int, now: float, limit: float
                  ) -> tuple[StepSeries, np.ndarray]:
    """The costs of ``k`` decode steps after a step of ``shape`` and their end times from
    ``now``, cut after the step whose end reaches ``limit`` (stepping stops there)."""
    base = BatchShape(shape.new_tokens, shape.context_lens + 1, shape.num_padding_tokens)
    series = rep.series(base, k)
    ends = np.cumsum(np.concatenate(([now], series.seconds)))[1:]
    if ends[-1] >= limit:
        ends = ends[:int(np.searchsorted(ends, limit, side="left")) + 1]
    return series, ends


def blocks_grown(computed: np.ndarray, held: np.ndarray, block_size: int, k: int,
                 last: np.ndarray | None = None) -> np.ndarray:
    """Blocks the requests (``computed`` tokens in ``held`` blocks each) have been given after
    each of ``k`` decode steps: ``sum(max(0, ceil((computed + j) / bs) - held))``, j = 1..k;
    with ``last``, each request decodes only up to its ``last`` step (its finish).

    A request first needs a block at step ``held * bs - computed + 1`` and then every ``bs``
    steps, so the per-step allocations are a comb per request: counted in O(k + rows) instead
    of the O(k × rows) of evaluating the sum for every step (integers: exact). A request that
    stops at ``last`` has its comb cancelled from the first tooth after it."""
    first = held * block_size - computed + 1
    span = -(-(k + 1) // block_size) * block_size  # steps 0..k, a whole number of combs
    if last is None:
        first = first[first <= k]
        if not len(first):
            return np.zeros(k, dtype=np.int64)
        starts = np.bincount(first, minlength=span)
    else:
        grows = first <= last
        first, last = first[grows], last[grows]
        stop = first + block_size * ((last - first) // block_size + 1)  # first tooth after
        starts = (np.bincount(first, minlength=span)
                  - np.bincount(stop[stop <= k], minlength=span))
    per_step = starts.reshape(-1, block_size).cumsum(axis=0).ravel()  # each comb's teeth
    return np.cumsum(per_step[1:k + 1])


def commit_skip(rep: Replica, plan: Plan, series: Any, ends: np.ndarray | list[float],
                computed: np.ndarray | list[tuple[int, int, int]], held: np.ndarray | None,
                start: float) -> None:
    """Apply ``len(ends)`` identical decode steps at once and log each of them (the per-step
    columns in numpy, or in Python lists for a short stretch, whose ``computed`` is then its
    ``growing_rows``: the same numbers)."""
    k = len(ends)
    pool = rep.pool
    bs = pool.config.block_size
    n = len(plan.run)
    used: Any
    cached: Any
    live: Any
    grow: list[tuple[int, int, int]] | None = None
    if type(ends) is list:  # a short stretch (``short_stretch``): the same columns in lists
        assert isinstance(computed, list)
        grow = computed
        starts: Any = [start, *ends[:-1]]
        seconds: Any = [e - s for e, s in zip(ends, starts, strict=True)]
        grown = grown_short(grow, bs, k)
        used0, free, cached0 = pool.used, pool.free, pool.cached
        if rep.kv_changes:
            changes = kv_changes_after(rep, np.asarray(ends))
            assert isinstance(changes, np.ndarray)
            used = [used0 + g - c for g, c in zip(grown, changes.tolist(), strict=True)]
        else:
            used = [used0 + g for g in grown]
        cached = [cached0 - (g - free if g > free else 0) for g in grown]
        live0 = rep.live_tokens()
        live = [live0 + n * j for j in range(1, k + 1)]
        end = ends[-1]
        worst = max(seconds)
    else:
        assert isinstance(ends, np.ndarray)
        starts = np.concatenate(([start], ends[:-1]))
        # A step's duration is its clock interval (end - start), as stepping records it; it
        # can differ from the cost model's seconds in the last bit once added to the clock.
        seconds = ends - starts
        steps = np.arange(1, k + 1)
        # allocated up to and including each step
        assert isinstance(computed, np.ndarray) and held is not None
        grown_ = blocks_grown(computed, held, bs, k)
        # held by each step while it ran (less what a hand-off changed after it ended)
        used = pool.used + grown_ - kv_changes_after(rep, ends)
        # Growth takes free blocks first, then evicts unreferenced cached prefix blocks.
        cached = pool.cached - np.maximum(grown_ - pool.free, 0)
        live = rep.live_tokens() + n * steps
        end = float(ends[-1])
        worst = float(np.diff(np.concatenate(([start], ends))).max())  # gaps as stepping sees
    running = rep.running
    batch = [running[sid] for sid in plan.run]
    capacity = pool.config.capacity_tokens
    leaving = []  # finished, or maybe outgrowing the cache: ``settle`` decides
    for seq in batch:
        seq.skip(k, end, worst)
        if seq.status == "finished" or seq.num_computed >= capacity:  # else a no-op
            leaving.append(seq)
    # growth after every row's tokens (each take touches its own row and the pool only)
    if pool.config.allocator == "slab":
        for seq in batch:
            pool.grow(seq, seq.num_computed)
    else:  # paged: ``pool.grow`` inlined, over the growing rows only when they are known
        for seq in (batch if grow is None else [batch[i] for i, _, _ in grow]):
            need = blocks_needed(seq.num_computed, 0, seq.num_blocks, bs)
            if need:
                pool.take_for(seq, need)
    settle = rep.settle
    for seq in leaving:
        settle(seq, end)
    pad = len(plan.padding)
    rep.log.extend(rep.index, starts, seconds, n, n, pad, pad, take_arrivals(rep, starts),
                   used, series, n, kv_live_tokens=live, kv_cached_blocks=cached)
    if rep.checks:
        rep.check_invariants()


def take_arrivals(rep: Replica, starts: np.ndarray | list[float]) -> int | np.ndarray:
    """Let the replica's own requests that arrived by the stretch's last scheduling point join
    the queue, each at the first step start at or after its arrival (the scheduling point that
    stepping takes it at); return the queue length each step saw. Without
    ``Plan.ignores_arrivals`` the stretch ended before the next arrival: nothing joins."""
    waiting = len(rep.waiting) + len(rep.preempted)
    reqs, i, last = rep.requests, rep.next_index, float(starts[-1])
    if i >= len(reqs) or reqs[i].arrival_s > last:
        return waiting
    starts = np.asarray(starts)
    seqs, arrivals, batch = rep.seqs, [], []
    for j in range(i, len(reqs)):  # one pass: the arrivals by ``last``
        r = reqs[j]
        if r.arrival_s > last:
            break
        arrivals.append(r.arrival_s)
        batch.append(seqs[r.id])
    at = np.searchsorted(starts, arrivals, side="left")  # first start >= arrival
    enter, joined = rep._enter, []
    for seq, step, t in zip(batch, at.tolist(), starts[at].tolist(), strict=True):
        enter(seq, t)  # rejected there if it never fits
        if seq.status == "waiting":
            joined.append(step)
    rep.next_index = i + len(batch)
    return waiting + np.cumsum(np.bincount(np.array(joined, dtype=np.int64),
                                           minlength=len(starts)))


def continue_skip(rep: Replica, plan: Plan, shape: BatchShape, k: int
                  ) -> tuple[Plan, BatchShape] | None:
    """The plan the policy would make after ``k`` skipped steps of ``plan`` (``shape``: the step
    before them), when its promise covers it, and the shape of the stretch's last step in that
    plan's row order; ``None``: ask the policy. Rows of requests that left (finished, or
    rejected as their context outgrew the cache) go by ``plan.on_finish``."""
    ctx = shape.context_lens + k
    n = len(plan.run)
    running = rep.running
    alive = [sid in running for sid in plan.run]
    if all(alive):
        return plan, BatchShape(shape.new_tokens, ctx, shape.num_padding_tokens)
    if plan.on_finish == "stop" or not any(alive):
        return None
    keep = np.flatnonzero(alive)
    new = shape.new_tokens
    if plan.on_finish == "drop":
        rows = np.concatenate((keep, np.arange(n, len(ctx))))
        new_tokens, context = new[rows], ctx[rows]
        pad = shape.num_padding_tokens
        padding = plan.padding
    else:  # "pad": every padding row is one token, in increasing context order
        gone = np.flatnonzero(np.logical_not(alive))
        pad_ctx = np.sort(np.concatenate((ctx[gone], ctx[n:])), kind="stable")
        context = np.concatenate((ctx[keep], pad_ctx))
        new_tokens = np.ones(len(context), dtype=np.int64)
        pad = len(pad_ctx)
        padding = tuple(PaddingRow(1, c + 1) for c in pad_ctx.tolist())
    ids = list(plan.run)
    nxt = Plan(run={ids[i]: 1 for i in keep.tolist()}, padding=padding, steady=True,
               on_finish=plan.on_finish, ignores_arrivals=plan.ignores_arrivals)
    return nxt, BatchShape(new_tokens, context, pad)
