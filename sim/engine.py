"""The simulation engine: one SimPy process per replica replaying arrivals against a policy.

Each iteration: take the arrivals due, snapshot a ``View``, ask the policy for a ``Plan``,
validate it, apply rejections and preemptions, grow KV, cost the batch, ``yield`` the step's
duration, then commit tokens (first token, finish, free KV) and record the step.

Same-time rule (documented, tested): a request whose ``arrival_s`` is <= the clock at a
scheduling point is visible to that plan, so an arrival exactly at a step boundary is seen by
the next plan. Arrivals are pulled from each replica's sorted list rather than being separate
SimPy events, which makes this ordering explicit and costs no event per request.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import simpy

from policies.registry import Policy
from sim.cost import CostModel, step_series
from sim.kv import BlockPool, KVConfig
from sim.metrics import StepLog
from sim.state import Seq
from sim.types import BatchShape, Plan, Request, View

#: Most decode steps one skip covers: bounds the arrays built per skip.
MAX_SKIP_STEPS = 2048


class EngineError(RuntimeError):
    """A policy returned a plan that breaks an engine rule (names the policy and the rule)."""


class Replica:
    """One model instance: its queues, KV pool, policy and the SimPy process that drives them."""

    def __init__(self, index: int, requests: Sequence[Request], policy: Policy,
                 cost: CostModel, kv: KVConfig, log: StepLog, seqs: dict[int, Seq],
                 checks: bool = False, horizon_s: float | None = None,
                 skip: bool = True) -> None:
        self.index = index
        self.requests = requests
        self.policy = policy
        self.cost = cost
        self.pool = BlockPool(kv)
        self.log = log
        self.seqs = seqs
        self.checks = checks
        self.horizon_s = horizon_s
        self.skip = skip
        self.waiting: dict[int, Seq] = {}
        self.preempted: dict[int, Seq] = {}  # listed before ``waiting``, newest first
        self.running: dict[int, Seq] = {}
        self._next = 0
        self.clock = 0.0

    # -- the loop -----------------------------------------------------------------------------
    def process(self, env: simpy.Environment):  # noqa: ANN201 - a SimPy generator
        """The replica's SimPy process.

        The replica keeps its own clock, set to exactly the time stepping reaches (start +
        step seconds, or an arrival or wake time), and only asks SimPy to wait until then:
        SimPy's relative timeouts cannot always land on a given float, and replicas never
        interact, so this keeps token times bit-identical whether stretches are skipped or not.
        """
        reqs = self.requests
        self.clock = env.now
        while True:
            now = self.clock
            if self.horizon_s is not None and now >= self.horizon_s:
                return
            self._take_arrivals(now)
            if not (self.waiting or self.preempted or self.running):
                if self._next >= len(reqs):
                    return
                yield from self._wait_until(env, reqs[self._next].arrival_s)
                continue
            view = self._view(now)
            plan = self.policy.schedule(view)
            self._validate(plan, view)
            for sid, reason in plan.reject.items():
                self._reject(self._pop_waiting(sid), now, reason)
            if not plan.run:
                wake = self._idle_until(plan, now)
                if wake is None:
                    return
                yield from self._wait_until(env, wake)
                continue
            for sid in plan.preempt:
                self._preempt(self.running.pop(sid))
            shape, num_prefill, num_decode = self._launch(plan, now)
            step = self.cost.step(shape)
            yield from self._wait_until(env, now + step.seconds)
            self._commit(plan, now, self.clock, step, shape, num_prefill, num_decode)
            if plan.steady and self.skip:
                skip = self._plan_skip(plan, shape, self.clock)
                if skip is not None:
                    yield from self._wait_until(env, float(skip[1][-1]))
                    self._commit_skip(plan, *skip)

    def _wait_until(self, env: simpy.Environment, t: float):  # noqa: ANN202 - generator
        """Let SimPy run until ``t``, then set the replica's clock to exactly ``t``."""
        yield env.timeout(max(0.0, t - env.now))
        self.clock = t

    def _take_arrivals(self, now: float) -> None:
        reqs, i, n = self.requests, self._next, len(self.requests)
        while i < n and reqs[i].arrival_s <= now:
            seq = self.seqs[reqs[i].id]
            reason = self._never_fits(seq)
            if reason:
                self._reject(seq, now, reason)
            else:
                self.waiting[seq.req.id] = seq
            i += 1
        self._next = i

    def _never_fits(self, seq: Seq) -> str:
        """Why a request can never be served by this replica's KV cache ('' if it can)."""
        cfg = self.pool.config
        need = -(-(seq.req.num_prompt_tokens + 1) // cfg.block_size)
        if cfg.allocator == "slab" and cfg.reserve_tokens is not None:
            if seq.req.num_prompt_tokens + 1 > cfg.reserve_tokens:
                return (f"prompt of {seq.req.num_prompt_tokens} tokens exceeds the slab "
                        f"reservation of {cfg.reserve_tokens} tokens")
            need = max(need, -(-cfg.reserve_tokens // cfg.block_size))
        if need > cfg.num_blocks:
            return f"needs {need} KV blocks, the cache has {cfg.num_blocks}"
        return ""

    def _view(self, now: float) -> View:
        waiting = tuple(s.view() for s in reversed(self.preempted.values()))
        waiting += tuple(s.view() for s in self.waiting.values())
        running = tuple(s.view() for s in self.running.values())
        more = self._next < len(self.requests)
        return View(now, waiting, running, self.pool.view(), more)

    def _idle_until(self, plan: Plan, now: float) -> float | None:
        """When an empty plan should be asked again; ``None`` ends the replica."""
        candidates = []
        if self._next < len(self.requests):
            candidates.append(self.requests[self._next].arrival_s)
        if plan.wake_at_s is not None:
            candidates.append(plan.wake_at_s)
        if candidates:
            return min(candidates)
        if self.waiting or self.preempted or self.running:
            raise EngineError(
                f"policy {self.policy.name!r} stalled at t={now:.6f}s: empty plan, no wake_at_s,"
                f" no arrivals left, {len(self.waiting) + len(self.preempted)} waiting and "
                f"{len(self.running)} running")
        return None

    # -- validation ---------------------------------------------------------------------------
    def _fail(self, now: float, rule: str) -> None:
        raise EngineError(f"policy {self.policy.name!r} at t={now:.6f}s broke a rule: {rule}")

    def _validate(self, plan: Plan, view: View) -> None:
        now, pol = view.now_s, self.policy
        for sid in plan.reject:
            if sid not in self.waiting and sid not in self.preempted:
                self._fail(now, f"reject of request {sid}, which is not waiting")
        freed = 0
        for sid in plan.preempt:
            seq = self.running.get(sid)
            if seq is None:
                self._fail(now, f"preempt of request {sid}, which is not running")
            if sid in plan.run:
                self._fail(now, f"request {sid} both preempted and scheduled")
            freed += seq.num_blocks
        if plan.wake_at_s is not None and not plan.run and plan.wake_at_s <= now:
            self._fail(now, f"wake_at_s={plan.wake_at_s} is not in the future")
        if not plan.run:
            if plan.padding or plan.preempt:
                self._fail(now, "padding rows or preemptions without any request to run")
            return
        if pol.max_num_seqs is not None and len(plan.run) > pol.max_num_seqs:
            self._fail(now, f"{len(plan.run)} sequences > max_num_seqs={pol.max_num_seqs}")
        total = 0
        blocks = 0
        kv = view.kv
        for sid, n in plan.run.items():
            seq = self.running.get(sid) or self.waiting.get(sid) or self.preempted.get(sid)
            if seq is None or sid in plan.reject:
                self._fail(now, f"request {sid} is not waiting or running")
            if not isinstance(n, int) or n < 1 or n > seq.num_uncomputed:
                self._fail(now, f"request {sid}: {n!r} tokens scheduled, 1..{seq.num_uncomputed}"
                           " allowed")
            total += n
            blocks += kv.blocks_needed(seq.view(), n)
        if pol.max_num_batched_tokens is not None and total > pol.max_num_batched_tokens:
            self._fail(now, f"{total} tokens > max_num_batched_tokens="
                       f"{pol.max_num_batched_tokens}")
        if blocks > kv.free_blocks + freed:
            self._fail(now, f"needs {blocks} KV blocks, only {kv.free_blocks + freed} free")
        for row in plan.padding:
            if row.num_tokens < 1 or row.context_len < row.num_tokens:
                self._fail(now, f"invalid padding row {row}")

    # -- state changes ------------------------------------------------------------------------
    def _pop_waiting(self, sid: int) -> Seq:
        seq = self.waiting.pop(sid, None)
        return seq if seq is not None else self.preempted.pop(sid)

    def _reject(self, seq: Seq, now: float, reason: str) -> None:
        self.pool.release(seq.num_blocks)
        seq.reject(now, reason)

    def _preempt(self, seq: Seq) -> None:
        self.pool.release(seq.num_blocks)
        seq.preempt()
        self.preempted[seq.req.id] = seq

    def _launch(self, plan: Plan, now: float) -> tuple[BatchShape, int, int]:
        """Move scheduled requests to running, grow their KV and build the batch shape."""
        cfg = self.pool.config
        reserve = cfg.reserve_tokens if cfg.allocator == "slab" else 0
        bs = cfg.block_size
        new_tokens: list[int] = []
        context: list[int] = []
        num_prefill = num_decode = 0
        for sid, n in plan.run.items():
            seq = self.running.get(sid)
            if seq is None:
                seq = self._pop_waiting(sid)
                self.running[sid] = seq
                seq.schedule(now)
            target = seq.num_computed + n
            need = -(-max(target, reserve or 0) // bs) - seq.num_blocks
            if need > 0:
                self.pool.allocate(need)
                seq.num_blocks += need
            if seq.num_generated and seq.num_uncomputed == 1:
                num_decode += 1
            else:
                num_prefill += n
            new_tokens.append(n)
            context.append(target)
        pad = 0
        for row in plan.padding:
            new_tokens.append(row.num_tokens)
            context.append(row.context_len)
            pad += row.num_tokens
        return BatchShape.of(new_tokens, context, pad), num_prefill, num_decode

    def _commit(self, plan: Plan, start: float, end: float, step, shape: BatchShape,
                num_prefill: int, num_decode: int) -> None:
        """Advance computed tokens, sample, finish, and record the step."""
        log = self.log
        held = self.pool.used  # what the step held while it ran, before finishers release
        regular = 0
        for sid, n in plan.run.items():
            seq = self.running[sid]
            itl = seq.advance(n, start, end)
            if itl is not None:
                if itl < 0:
                    regular += 1
                else:
                    log.add_irregular_itl(end, itl)
            if seq.finished:
                self.pool.release(seq.num_blocks)
                seq.num_blocks = 0
                del self.running[sid]
            elif seq.num_uncomputed == 1 and self._never_grows(seq):
                del self.running[sid]
                self._reject(seq, end, "context outgrew the KV cache")
        num_waiting = len(self.waiting) + len(self.preempted)
        log.record(self.index, start, end - start, len(plan.run), num_prefill, num_decode,
                   shape.num_padding_tokens, len(plan.padding), num_waiting, held, step,
                   regular)
        if self.checks:
            self._check_invariants()

    # -- exact event skipping -----------------------------------------------------------------
    def _plan_skip(self, plan: Plan, shape: BatchShape, now: float):  # noqa: ANN202
        """How many more steps a steady decode plan runs unchanged, with their costs.

        Stops at the first of: a scheduled request finishing, KV growth needing more blocks
        than are free, the step at whose end the next request has arrived, the horizon.
        Returns ``(series, ends, computed, held, now)`` or ``None`` when there is nothing to
        skip.
        """
        running = self.running
        seqs = []
        for sid in plan.run:
            seq = running.get(sid)
            if seq is None or seq.num_uncomputed != 1:
                return None
            seqs.append(seq)
        next_arrival = (self.requests[self._next].arrival_s
                        if self._next < len(self.requests) else math.inf)
        if next_arrival <= now:
            return None
        k = min(MAX_SKIP_STEPS, min(s.req.num_output_tokens - s.num_generated for s in seqs))
        computed = np.fromiter((s.num_computed for s in seqs), np.int64, len(seqs))
        held = np.fromiter((s.num_blocks for s in seqs), np.int64, len(seqs))
        cfg = self.pool.config
        if not cfg.unlimited:
            bs, free = cfg.block_size, self.pool.free

            def need(steps: int) -> int:
                return int(np.maximum(-(-(computed + steps) // bs) - held, 0).sum())

            if need(k) > free:  # largest k whose growth fits: need() is monotone in k
                lo, hi = 0, k
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    lo, hi = (mid, hi) if need(mid) <= free else (lo, mid - 1)
                k = lo
        if k < 1:
            return None
        base = BatchShape(shape.new_tokens, shape.context_lens + 1, shape.num_padding_tokens)
        series = step_series(self.cost, base, k)
        ends = np.cumsum(np.concatenate(([now], series.seconds)))[1:]
        limit = min(next_arrival, self.horizon_s if self.horizon_s is not None else math.inf)
        if ends[-1] >= limit:
            k = int(np.searchsorted(ends, limit, side="left")) + 1
            ends = ends[:k]
        return series, ends, computed, held, now

    def _commit_skip(self, plan: Plan, series, ends: np.ndarray, computed: np.ndarray,  # noqa: ANN001
                     held: np.ndarray, start: float) -> None:
        """Apply ``len(ends)`` identical decode steps at once and log each of them."""
        k = len(ends)
        seconds = series.seconds[:k]
        starts = np.concatenate(([start], ends[:-1]))
        cfg = self.pool.config
        steps = np.arange(1, k + 1)
        grow = np.maximum(-(-(computed[:, None] + steps[None, :]) // cfg.block_size)
                          - held[:, None], 0)
        used = self.pool.used + grow.sum(axis=0)  # held by each step while it ran
        end = float(ends[-1])
        worst = float(np.diff(np.concatenate(([start], ends))).max())  # gaps as stepping sees
        n = len(plan.run)
        for sid in plan.run:
            seq = self.running[sid]
            seq.skip(k, end, worst)
            need = -(-seq.num_computed // cfg.block_size) - seq.num_blocks
            if need > 0:
                self.pool.allocate(need)
                seq.num_blocks += need
            if seq.finished:
                self.pool.release(seq.num_blocks)
                seq.num_blocks = 0
                del self.running[sid]
            elif self._never_grows(seq):
                del self.running[sid]
                self._reject(seq, end, "context outgrew the KV cache")
        pad = len(plan.padding)
        self.log.extend(self.index, starts, seconds, n, n, pad, pad,
                        len(self.waiting) + len(self.preempted), used, series, n)
        if self.checks:
            self._check_invariants()

    def _never_grows(self, seq: Seq) -> bool:
        cfg = self.pool.config
        return -(-(seq.num_computed + 1) // cfg.block_size) > cfg.num_blocks

    def _check_invariants(self) -> None:
        """Deep per-step checks (on in tests): KV conservation and per-sequence consistency."""
        self.pool.check()
        held = 0
        for seq in self.running.values():
            seq.check(self.pool.config.block_size)
            held += seq.num_blocks
        if held != self.pool.used:
            raise AssertionError(f"KV leak: running sequences hold {held} blocks, pool says "
                                 f"{self.pool.used}")
        for seq in (*self.waiting.values(), *self.preempted.values()):
            if seq.num_blocks or seq.num_computed:
                raise AssertionError(f"waiting request {seq.req.id} holds KV")
