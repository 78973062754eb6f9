"""The simulation engine: one SimPy process per replica replaying arrivals against a policy.

Each iteration: take the arrivals due, snapshot a ``View``, ask the policy for a ``Plan``,
validate it (``sim.engine.validate``), apply rejections and preemptions, grow KV, cost the batch,
``yield`` the step's duration, then commit tokens (first token, finish, free KV) and record the
step. Steady decode stretches are advanced in one event (``sim.engine.skipping``).

Same-time rule (documented, tested): a request whose ``arrival_s`` is <= the clock at a
scheduling point is visible to that plan, so an arrival exactly at a step boundary is seen by
the next plan. Arrivals are pulled from each replica's sorted list rather than being separate
SimPy events, which makes this ordering explicit and costs no event per request.

KV (``sim.kv.cache``): a preempted request either drops its KV (``recompute``) or moves it to host
memory (``swap``); a swap's PCIe transfer time, out and back in, is added to the duration of
the step in which it happens. A request preempted more than ``kv.max_preemptions`` times is
rejected, so no request can be preempted forever.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import numpy as np
import simpy

from policies.registry import Policy
from sim.core.rules import blocks_for, blocks_needed, target_tokens
from sim.core.state import Seq
from sim.core.types import BatchShape, Plan, Request, SeqView, View
from sim.cost.base import CostModel
from sim.engine.drive import (
    ReplicaEvent,
    ReplicaState,
    admit,
    advance_until,
    emit_first_tokens,
    replica_state,
)
from sim.engine.skipping import MAX_SKIP_STEPS, commit_skip, plan_skip
from sim.engine.validate import EngineError, validate_plan
from sim.kv.cache import BlockPool
from sim.kv.config import KVConfig
from sim.metrics.summary import StepLog

__all__ = ["MAX_SKIP_STEPS", "EngineError", "Replica", "never_fits"]

_COMPUTED = attrgetter("num_computed")
_SEQ_VIEW = Seq.view


def never_fits(cfg: KVConfig, max_model_len: int | None, prompt: int, output: int) -> str:
    """Why a request can never be served by a replica with this KV cache ('' if it can)."""
    if max_model_len is not None and prompt + output > max_model_len:
        return f"prompt + output = {prompt + output} tokens exceed max_model_len={max_model_len}"
    reserve = cfg.reserve_for(prompt)
    if cfg.allocator == "slab" and prompt + 1 > reserve:
        return f"prompt of {prompt} tokens exceeds the slab reservation of {reserve} tokens"
    need = blocks_for(target_tokens(prompt + 1, reserve), cfg.block_size)
    if need > cfg.num_blocks:
        return f"needs {need} KV blocks, the cache has {cfg.num_blocks}"
    return ""


@dataclass(slots=True)
class Flight:
    """A step launched at ``start_s`` and committed at ``end_s``: ``step`` holds what
    ``Replica._commit`` needs; a skipped stretch of steady steps has ``skip`` instead."""

    plan: Plan
    start_s: float
    end_s: float
    step: tuple | None
    skip: tuple = ()


class Replica:
    """One model instance: its queues, KV pool, policy and the SimPy process that drives them."""

    def __init__(self, index: int, requests: Sequence[Request], policy: Policy,
                 cost: CostModel, kv: KVConfig, log: StepLog, seqs: dict[int, Seq],
                 checks: bool = False, horizon_s: float | None = None,
                 skip: bool = True, deadline: float | None = None,
                 max_model_len: int | None = None) -> None:
        self.index = index
        self.requests = requests
        self.policy = policy
        self.cost = cost
        self.pool = BlockPool(kv)
        self.log = log
        self.seqs = seqs
        self.checks = checks
        self.horizon_s = horizon_s
        self.deadline = deadline  # time.perf_counter() value past which the replica stops
        self.max_model_len = max_model_len
        self.skip = skip
        self.waiting: dict[int, Seq] = {}
        self.preempted: dict[int, Seq] = {}  # listed before ``waiting``, newest first
        self.running: dict[int, Seq] = {}
        self.next_index = 0
        self.clock = 0.0
        self._swap_s = 0.0  # host transfers of the step being prepared
        self._swap_bytes = 0.0
        # The core's state between events (see ``sim.engine.drive`` for the driven form).
        self.flight: Flight | None = None  # the step (or skipped stretch) in flight
        self.idle = False  # the last plan was empty: plan again at ``wake_s`` or on an arrival
        self.wake_s = math.inf
        self.done = False  # horizon or wall-clock budget reached, or nothing left for good
        self.pending: list[Seq] = []  # admitted from outside, taken at the next scheduling point
        # Built without a request list, it is driven from outside: more may come until ``close``.
        self.accepting = not requests
        self.advanced_s = 0.0  # the time the replica was advanced to (driven form)
        self._queue_views: tuple[SeqView, ...] | None = None  # ``View.waiting``, kept
        #: Receives a ``ReplicaEvent`` at each first token, prefill end, finish and rejection.
        self.listener: Callable[[Any], None] | None = None

    # -- the SimPy process: a thin driver of the core below ------------------------------------
    def process(self, env: simpy.Environment):  # noqa: ANN201 - a SimPy generator
        """The replica's SimPy process, fed from its own sorted ``requests``.

        The replica keeps its own clock, set to exactly the time stepping reaches (start +
        step seconds, or an arrival or wake time), and only asks SimPy to wait until then:
        SimPy's relative timeouts cannot always land on a given float, and replicas never
        interact, so this keeps token times bit-identical whether stretches are skipped or not.
        """
        reqs = self.requests
        self.clock = env.now
        self.accepting = False  # its own list is all that will arrive
        while True:
            flight = self.flight
            if flight is not None:
                yield from self._wait_until(env, flight.end_s)
                self._land(self._next_arrival())
                continue
            wake = self._begin()
            if self.flight is not None:
                continue
            if wake is None:
                return
            if self.next_index < len(reqs):
                wake = min(wake, reqs[self.next_index].arrival_s)
            yield from self._wait_until(env, wake)
            self.idle = False

    def _wait_until(self, env: simpy.Environment, t: float):  # noqa: ANN202 - generator
        """Let SimPy run until ``t``, then set the replica's clock to exactly ``t``."""
        yield env.timeout(max(0.0, t - env.now))
        self.clock = t

    def _next_arrival(self) -> float:
        """Arrival time of the next request of the replica's own list (inf when none)."""
        reqs = self.requests
        return reqs[self.next_index].arrival_s if self.next_index < len(reqs) else math.inf

    # -- the driven form (``sim.engine.drive``) -----------------------------------------------
    def advance_until(self, t: float) -> None:
        """Run steps until the clock reaches ``t`` or nothing is left (``sim.engine.drive``)."""
        advance_until(self, t)

    def admit(self, request: Request) -> None:
        """Hand ``request`` to the replica at the time it was advanced to."""
        admit(self, request)

    def close(self) -> None:
        """No more admissions will come: policies see ``more_arrivals=False`` from now."""
        self.accepting = False

    def state(self) -> ReplicaState:
        """The replica now, as a frozen ``ReplicaState``."""
        return replica_state(self)

    # -- the core: one scheduling point, one landing ----------------------------------------
    def _begin(self) -> float | None:
        """At the scheduling point ``self.clock``: take the arrivals, plan, and launch a step
        (``self.flight``) or go idle. Returns when to plan again if idle (``inf``: at the next
        arrival or admission), ``None`` when the replica is done (horizon, wall-clock budget,
        or nothing left and no arrivals to come)."""
        now = self.clock
        if self.horizon_s is not None and now >= self.horizon_s:
            self.done = True
            return None
        if self.deadline is not None and time.perf_counter() > self.deadline:
            self.done = True  # wall-clock budget spent: the run ends here, marked partial
            return None
        if self.next_index < len(self.requests):
            self._take_arrivals(now)
        if self.pending:
            self._take_pending(now)
        if not (self.waiting or self.preempted or self.running):
            if self._more_arrivals():
                self.idle, self.wake_s = True, math.inf
                return math.inf
            self.done = True
            return None
        view = self._view(now)
        plan = self.policy.schedule(view)
        validate_plan(self, plan, view)
        for sid, reason in plan.reject.items():
            self._reject(self._pop_waiting(sid), now, reason)
        if not plan.run:
            wake = self._idle_until(plan, now)
            if wake is None:
                self.done = True
                return None
            self.idle, self.wake_s = True, wake
            return wake
        self._swap_s = self._swap_bytes = 0.0
        for sid in plan.preempt:
            self._preempt(self.running.pop(sid), now)
        shape, num_prefill, num_decode, recomputed = self._launch(plan, now)
        step = self.cost.step(shape)
        swap_s, swap_bytes = self._swap_s, self._swap_bytes
        # x + 0.0 == x exactly, so a step without transfers ends at now + step.seconds.
        self.flight = Flight(plan, now, now + (step.seconds + swap_s),
                             (step, shape, num_prefill, num_decode, recomputed, swap_s,
                              swap_bytes))
        return self.flight.end_s

    def _land(self, limit: float) -> None:
        """The flight has ended (``self.clock`` is its end): commit it. A steady step may
        launch a skipped stretch (a new flight) that ends at the first step ending at or after
        ``limit`` (the next arrival, or the time the replica is advanced to)."""
        flight = self.flight
        assert flight is not None
        self.flight = None
        plan, end = flight.plan, self.clock
        if flight.step is None:
            commit_skip(self, plan, *flight.skip)
            return
        self._commit(plan, flight.start_s, end, *flight.step)
        if plan.steady and self.skip and not self.pending:  # admitted requests: plan now
            skip = plan_skip(self, plan, flight.step[1], end, limit)  # (series, ends, ...)
            if skip is not None:
                self.flight = Flight(plan, end, float(skip[1][-1]), None, skip)

    def _more_arrivals(self) -> bool:
        """Can more requests still reach this replica (policies see it as ``more_arrivals``)?"""
        return self.next_index < len(self.requests) or self.accepting

    def _take_arrivals(self, now: float) -> None:
        """Take the requests of the replica's own list that have arrived by ``now``."""
        reqs, i, n = self.requests, self.next_index, len(self.requests)
        while i < n and reqs[i].arrival_s <= now:
            self._enter(self.seqs[reqs[i].id], now)
            i += 1
        self.next_index = i

    def _take_pending(self, now: float) -> None:
        """Take the admitted requests (``admit``) at the first scheduling point after."""
        pending, self.pending = self.pending, []
        for seq in pending:
            self._enter(seq, now)

    def _enter(self, seq: Seq, now: float) -> None:
        """A request reaches the waiting queue, or is rejected if it can never fit."""
        reason = self._never_fits(seq)
        if reason:
            self._reject(seq, now, reason)
        else:
            self.waiting[seq.req.id] = seq
            self._queue_views = None

    def _never_fits(self, seq: Seq) -> str:
        """Why a request can never be served by this replica's KV cache ('' if it can)."""
        r = seq.req
        return never_fits(self.pool.config, self.max_model_len, r.num_prompt_tokens,
                          r.num_output_tokens)

    def _view(self, now: float) -> View:
        pool = self.pool
        if pool.cache is not None:  # show each waiting request the prefix blocks cached now
            for s in (*self.preempted.values(), *self.waiting.values()):
                if (not s.num_computed and s.req.prefix_id is not None
                        and s.offer_hit(pool.hit_blocks(s) * pool.config.block_size)):
                    self._queue_views = None
        # The queue's views change only when a request joins or leaves it (or is shown new
        # cached tokens): kept between steps instead of rebuilt, which made every step
        # O(queue) in a long queue. Running views change every step.
        waiting = self._queue_views
        if waiting is None:
            waiting = tuple(s.view() for s in reversed(self.preempted.values()))
            waiting += tuple(s.view() for s in self.waiting.values())
            self._queue_views = waiting
        running = tuple(map(_SEQ_VIEW, self.running.values()))
        return View(now, waiting, running, pool.view(), self._more_arrivals())

    def _idle_until(self, plan: Plan, now: float) -> float | None:
        """When an empty plan should be asked again; ``None`` ends the replica."""
        if plan.wake_at_s is not None:
            return plan.wake_at_s
        if self._more_arrivals():
            return math.inf  # until the next arrival
        if self.waiting or self.preempted or self.running:
            raise EngineError(
                f"policy {self.policy.name!r} stalled at t={now:.6f}s: empty plan, no wake_at_s,"
                f" no arrivals left, {len(self.waiting) + len(self.preempted)} waiting and "
                f"{len(self.running)} running")
        return None

    # -- state changes ------------------------------------------------------------------------
    def _pop_waiting(self, sid: int) -> Seq:
        self._queue_views = None
        seq = self.waiting.pop(sid, None)
        return seq if seq is not None else self.preempted.pop(sid)

    def _reject(self, seq: Seq, now: float, reason: str) -> None:
        self.pool.release(seq)
        seq.reject(now, reason)
        if self.listener is not None:
            self.listener(ReplicaEvent("rejected", seq.req.id, self.index, now))

    def _preempt(self, seq: Seq, now: float) -> None:
        """Recompute or swap ``seq`` out; past ``kv.max_preemptions`` reject it instead."""
        cfg = self.pool.config
        limit = cfg.max_preemptions
        if limit is not None and seq.num_preemptions >= limit:
            seq.num_preemptions += 1
            n = seq.num_preemptions
            self._reject(seq, now, f"preempted {n} time{'s' if n > 1 else ''} "
                         f"(kv.max_preemptions={limit})")
            return
        self.pool.release(seq)
        if cfg.preemption == "swap" and seq.num_computed:
            # KVConfig refuses swap preemption without both rates
            assert cfg.swap_s_per_token is not None and cfg.kv_bytes_per_token is not None
            self._swap_s += seq.num_computed * cfg.swap_s_per_token
            self._swap_bytes += seq.num_computed * cfg.kv_bytes_per_token
            seq.swap_out()
        else:
            seq.preempt()
        self.preempted[seq.req.id] = seq
        self._queue_views = None

    def _launch(self, plan: Plan, now: float) -> tuple[BatchShape, int, int, int]:
        """Move scheduled requests to running, grow their KV and build the batch shape."""
        pool, cfg = self.pool, self.pool.config
        admitted = []
        for sid in plan.run:
            if sid not in self.running:
                seq = self._pop_waiting(sid)
                self.running[sid] = seq
                seq.schedule(now)
                admitted.append(seq)
        # Cached prefix blocks are held before anything is allocated, so no allocation below
        # can evict a block a request of this very plan was shown as cached.
        for seq in admitted:
            if seq.hit_tokens:
                pool.pin(seq, seq.hit_tokens // cfg.block_size)
                seq.take_hit()
        new_tokens: list[int] = []
        context: list[int] = []
        num_prefill = num_decode = recomputed = 0
        running, bs = self.running, cfg.block_size
        paged = cfg.allocator != "slab"  # no reservation: grow inline, as ``pool.grow`` would
        for sid, n in plan.run.items():
            seq = running[sid]
            if seq.swapped:  # its KV comes back from host memory before the step
                assert cfg.swap_s_per_token is not None and cfg.kv_bytes_per_token is not None
                self._swap_s += seq.num_computed * cfg.swap_s_per_token
                self._swap_bytes += seq.num_computed * cfg.kv_bytes_per_token
                seq.swapped = False
            computed = seq.num_computed
            target = computed + n
            if seq.max_held > computed:  # ``seq.num_recomputed(n)``, inlined
                recomputed += min(target, seq.max_held) - computed
            if paged:
                need = blocks_needed(target, 0, seq.num_blocks, bs)
                if need:
                    pool.take_for(seq, need)
            else:
                pool.grow(seq, target)
            generated = seq.num_generated
            if generated and seq.req.num_prompt_tokens + generated - computed == 1:
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
        # valid by construction (plan checked by ``validate_plan``): no ``BatchShape.of`` checks
        shape = BatchShape(np.array(new_tokens, dtype=np.int64),
                           np.array(context, dtype=np.int64), pad)
        return shape, num_prefill, num_decode, recomputed

    def _commit(self, plan: Plan, start: float, end: float, step, shape: BatchShape,  # noqa: ANN001
                num_prefill: int, num_decode: int, recomputed: int, swap_s: float,
                swap_bytes: float) -> None:
        """Advance computed tokens, sample, finish, and record the step."""
        log, pool = self.log, self.pool
        held = pool.used  # what the step held while it ran, before finishers release
        regular = 0
        running = self.running
        add_irregular = log.add_irregular_itl
        cache = pool.cache
        for sid, n in plan.run.items():
            seq = running[sid]
            itl = seq.advance(n, start, end)
            if itl is not None:
                if itl < 0:
                    regular += 1
                else:
                    add_irregular(end, itl, 1, self.index)
            if cache is not None and seq.num_computed - n < seq.req.num_prompt_tokens:
                pool.register(seq, seq.req.num_prompt_tokens)  # computed prompt tokens
        if self.listener is not None:
            emit_first_tokens(self, plan.run, end)
        live, cached = self.live_tokens(), pool.cached
        settle, capacity = self.settle, pool.config.capacity_tokens
        for sid in plan.run:
            seq = running[sid]
            if seq.status == "finished" or seq.num_computed >= capacity:  # else a no-op
                settle(seq, end)
        num_waiting = len(self.waiting) + len(self.preempted)
        log.record(self.index, start, end - start, len(plan.run), num_prefill, num_decode,
                   shape.num_padding_tokens, len(plan.padding), num_waiting, held, step,
                   regular, kv_live_tokens=live, kv_cached_blocks=cached,
                   num_recomputed_tokens=recomputed, swap_s=swap_s, swapped_bytes=swap_bytes)
        if self.checks:
            self.check_invariants()

    def settle(self, seq: Seq, end: float) -> None:
        """After a step: release a finished request (its full blocks join its prefix chain),
        reject one whose next token can never fit."""
        if seq.status == "finished":
            self.pool.register(seq, seq.num_computed)
            self.pool.release(seq)
            del self.running[seq.req.id]
            if self.listener is not None:
                self.listener(ReplicaEvent("finish", seq.req.id, self.index, end))
            stream = self.log.stream
            if stream is not None:  # a bucketed step table tracks its window's last finish
                stream.finished(seq.req.arrival_s, end)
        elif (seq.num_computed >= self.pool.config.capacity_tokens
              and seq.num_uncomputed == 1 and self._never_grows(seq)):
            del self.running[seq.req.id]
            self._reject(seq, end, "context outgrew the KV cache")

    def live_tokens(self) -> int:
        """Tokens whose KV is stored on the GPU now, shared prefix blocks counted once."""
        pool = self.pool
        if pool.cache is None:  # nothing shared
            return sum(map(_COMPUTED, self.running.values()))
        bs = pool.config.block_size
        own = sum(s.num_computed - s.num_shared * bs for s in self.running.values())
        return own + pool.cache.referenced * bs

    def _never_grows(self, seq: Seq) -> bool:
        cfg = self.pool.config
        return blocks_for(seq.num_computed + 1, cfg.block_size) > cfg.num_blocks

    def check_invariants(self) -> None:
        """Deep per-step checks (on in tests): KV conservation and per-sequence consistency."""
        running = list(self.running.values())
        self.pool.check(running)
        for seq in running:
            seq.check(self.pool.config.block_size)
            if seq.swapped or seq.hit_tokens:
                raise AssertionError(f"running request {seq.req.id} has its KV elsewhere")
        for seq in (*self.waiting.values(), *self.preempted.values()):
            if seq.num_blocks or seq.num_shared or (seq.num_computed and not seq.swapped):
                raise AssertionError(f"waiting request {seq.req.id} holds KV")
