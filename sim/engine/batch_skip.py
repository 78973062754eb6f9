"""Exact event skipping of a run-to-completion batch: its decode steps, finishes included.

A static or dynamic batch in flight (``Plan.on_finish="pad"``, ``ignores_arrivals``) runs the
same rows step after step: a member that finishes keeps its row as a one-token padding row
at the context it would have had, and nobody joins. With a cost model that costs a pure-decode
batch by its multiset of contexts (``skipping.multiset_costed``), every step of the run is one
series over all its rows, and the run up to its last finish is one event: ``plan_batch_run``
finds how far it goes, ``commit_batch_run`` applies it as stepping would have, step by step in
numpy (who is still running, the KV each step held, live tokens, the queue each step saw) and
request by request (its tokens, its finish at its own step's end, its blocks released there).

It stops early (and ``continue_skip`` or the policy takes over) at the first of: growth the
free blocks could not hold even without the finishers' releases, ``MAX_SKIP_STEPS``, the step
at whose end the limit (the horizon, or the time a driven replica is advanced to) has come.
Without a prefix cache only: a finisher's blocks would join prefix chains.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from sim.core.rules import blocks_for
from sim.core.types import BatchShape, Plan
from sim.cost.base import StepSeries
from sim.engine.drive import kv_changes_after
from sim.engine.skipping import (
    MAX_SKIP_STEPS,
    blocks_grown,
    fitting_steps,
    multiset_costed,
    stretch_costs,
    take_arrivals,
)

if TYPE_CHECKING:
    from sim.engine.replica import Replica


def covers(rep: Replica, plan: Plan) -> bool:
    """Whether ``plan`` is a batch run this module skips in one event."""
    return (plan.on_finish == "pad" and rep.pool.cache is None
            and multiset_costed(rep.cost))


def plan_batch_run(rep: Replica, plan: Plan, shape: BatchShape, now: float, limit: float
                   ) -> tuple | None:
    """How far the batch run of ``plan`` goes from ``now`` (``shape``: the step before), with
    its costs: ``(series, ends, computed, held, remaining, now)``, or ``None`` when there is
    nothing to skip."""
    running = rep.running
    seqs = []
    for sid in plan.run:
        seq = running.get(sid)
        if seq is None or seq.req.num_prompt_tokens + seq.num_generated - seq.num_computed != 1:
            return None
        seqs.append(seq)
    if limit <= now:
        return None
    n = len(seqs)
    remaining = np.fromiter((s.req.num_output_tokens - s.num_generated for s in seqs),
                            np.int64, n)
    computed = np.fromiter((s.num_computed for s in seqs), np.int64, n)
    held = np.fromiter((s.num_blocks for s in seqs), np.int64, n)
    # finishers stop growing at their last step
    k = fitting_steps(rep, computed, held, min(MAX_SKIP_STEPS, int(remaining.max())), remaining)
    if k < 1:
        return None
    series, ends = stretch_costs(rep, shape, k, now, limit)
    return series, ends, computed, held, remaining, now


def _before(last: np.ndarray, k: int, weights: np.ndarray) -> np.ndarray:
    """Per step of a ``k``-step batch run, the sum of ``weights`` over the rows that left
    before it (``last``: the step each row runs to; a row whose ``last`` is ``k`` leaves after
    the stretch, if at all)."""
    return np.cumsum(np.bincount(last, weights=weights, minlength=k + 1))[:k].astype(np.int64)


def run_growth(computed: np.ndarray, held: np.ndarray, remaining: np.ndarray, k: int,
               block_size: int) -> np.ndarray:
    """Per step of a ``k``-step batch run, the KV blocks its rows hold beyond those they held
    when it started: what they have grown to by the step, less what the rows that finished
    before it held (they released it). What the run's steps log, and what a router reads of
    a run in flight (``sim.engine.drive.kv_used_blocks``)."""
    last = np.minimum(remaining, k)  # the step each row runs to in this stretch
    grown = blocks_grown(computed, held, block_size, k, last)  # given out up to each step
    final = np.maximum(blocks_for(computed + last, block_size) - held, 0)  # each row's growth
    return grown - _before(last, k, (held + final).astype(np.float64))


def commit_batch_run(rep: Replica, plan: Plan, series: StepSeries, ends: np.ndarray,
                     computed: np.ndarray, held: np.ndarray, remaining: np.ndarray,
                     start: float) -> None:
    """Apply ``len(ends)`` steps of the batch run and log each of them."""
    k, n = len(ends), len(plan.run)
    pool = rep.pool
    bs = pool.config.block_size
    starts = np.concatenate(([start], ends[:-1]))
    seconds = ends - starts  # a step's duration is its clock interval, as stepping records it
    last = np.minimum(remaining, k)  # the step each row runs to in this stretch
    alive = n - _before(last, k, np.ones(n))
    used = (pool.used + run_growth(computed, held, remaining, k, bs)  # held while it ran
            - kv_changes_after(rep, ends))
    # live tokens: every running request's, less those of the rows gone, plus the steps'
    live = (rep.live_tokens() - _before(last, k, computed.astype(np.float64))
            + alive * np.arange(1, k + 1))
    worst = np.maximum.accumulate(seconds)  # each row's longest gap: its run's longest step
    peak = max(pool.peak_used, int(used.max()))
    running = rep.running
    batch = [running[sid] for sid in plan.run]
    slab = pool.config.allocator == "slab"
    if not slab:  # the rows' growth at once: it fits without the finishers' releases
        pool.take_for_all(batch, np.maximum(blocks_for(computed + last, bs) - held, 0)
                          .tolist())
    settle = rep.settle
    last_j, end_s, worst_s = last.tolist(), ends.tolist(), worst.tolist()
    for i in np.argsort(last, kind="stable").tolist():  # finishes in time order
        seq, j = batch[i], last_j[i]
        seq.skip(j, end_s[j - 1], worst_s[j - 1])
        if slab:
            pool.grow(seq, seq.num_computed)
        settle(seq, end_s[j - 1])
    pool.peak_used = peak  # growth was taken at once: the peak is the steps' own
    pad = len(plan.padding) + n - alive
    rep.log.extend(rep.index, starts, seconds, alive, alive, pad, pad, take_arrivals(rep, starts),
                   used, series, alive, kv_live_tokens=live, kv_cached_blocks=0)
    if rep.checks:
        rep.check_invariants()
