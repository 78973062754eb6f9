"""The replica core: scheduling points and landings, driven by SimPy or from outside.

The core works in two moves: ``begin`` (at a scheduling point) and ``land``
(at the end of the step in flight). ``Replica.process(env)`` is the SimPy process
``sim.simulate`` runs, a thin driver fed from the replica's own arrival list;
``advance_until`` / ``admit`` / ``close`` / ``state`` drive the same core from outside
(``sim.engine.drive``). What a step does to the state lives in ``sim.engine.steps``.

Each iteration: take the arrivals due, snapshot a ``View``, ask the policy for a ``Plan``,
validate it (``sim.engine.validate``), apply rejections and preemptions, grow KV, cost the batch,
``yield`` the step's duration, then commit tokens (first token, finish, free KV) and record the
step. Steady decode stretches are advanced in one event (``sim.engine.skipping``; a static
or dynamic batch to its last finish: ``sim.engine.batch_skip``).

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
from collections.abc import Iterator

import numpy as np
import simpy

from sim.core.rules import blocks_for, target_tokens
from sim.core.state import Seq
from sim.core.types import BatchShape, Plan, Request, View
from sim.engine.batch_skip import commit_batch_run, covers, plan_batch_run
from sim.engine.drive import ReplicaState, admit, advance_until, replica_state
from sim.engine.skipping import MAX_SKIP_STEPS, commit_skip, continue_skip, plan_skip
from sim.engine.steps import Flight, ReplicaSteps
from sim.engine.validate import EngineError, validate_plan
from sim.kv.config import KVConfig

__all__ = ["MAX_SKIP_STEPS", "EngineError", "Flight", "Replica", "never_fits"]

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

class Replica(ReplicaSteps):
    """One model instance: its queues, KV pool, policy and the SimPy process that drives them."""

    # -- the SimPy process: a thin driver of the core below ------------------------------------
    def process(self, env: simpy.Environment):  # noqa: ANN201 - a SimPy generator
        """The replica's SimPy process, fed from its own sorted ``requests``.

        The replica keeps its own clock, set to exactly the time stepping reaches (start +
        step seconds, or an arrival or wake time), and only asks SimPy to wait until then:
        SimPy's relative timeouts cannot always land on a given float, and replicas never
        interact, so this keeps token times bit-identical whether stretches are skipped or not.
        """
        self.clock = env.now
        for t in self._waits():
            yield env.timeout(max(0.0, t - env.now))
            self.clock = t

    def run_alone(self) -> None:
        """Run the replica on its own requests with no other process on the clock: what
        ``process`` does under SimPy with one replica, without an event per step."""
        self.clock = 0.0
        for t in self._waits():
            self.clock = t

    def _waits(self) -> Iterator[float]:
        """The replica's loop over its own list: yields each time to wait until; the driver
        sets the clock to exactly that time before resuming it."""
        reqs = self.requests
        self.accepting = False  # its own list is all that will arrive
        while True:
            flight = self.flight
            if flight is not None:
                yield flight.end_s
                self.land()
                continue
            wake = self.begin()
            if self.flight is not None:
                continue
            if wake is None:
                return
            if self.next_index < len(reqs):
                wake = min(wake, reqs[self.next_index].arrival_s)
            yield wake
            self.idle = False

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
    def begin(self, limit: float | None = None) -> float | None:
        """At the scheduling point ``self.clock``: take the arrivals, plan, and launch a step
        (``self.flight``) or go idle. Returns when to plan again if idle (``inf``: at the next
        arrival or admission), ``None`` when the replica is done (horizon, wall-clock budget,
        or nothing left and no arrivals to come). A steady plan whose tokens all came one step
        ago launches a skipped stretch at once, stopping as ``land`` says (``limit``)."""
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
        needs = validate_plan(self, plan, view)
        for sid, reason in plan.reject.items():
            self._reject(self._pop_waiting(sid), now, reason)
        if not plan.run:
            if plan.preempt:  # room for requests that bring their KV (``validate_plan``)
                for sid in plan.preempt:
                    self._preempt(self.running.pop(sid), now)
                return self.begin()  # plan again at the same instant
            wake = self._idle_until(plan, now)
            if wake is None:
                self.done = True
                return None
            self.idle, self.wake_s = True, wake
            return wake
        for sid in plan.preempt:
            self._preempt(self.running.pop(sid), now)
        if plan.steady and self.skip and not self.pending and not plan.preempt:
            before = self._shape_before(plan, now)
            if before is not None and self._launch_skip(plan, before, now, limit):
                assert self.flight is not None
                return self.flight.end_s
        shape, num_prefill, num_decode, recomputed = self._launch(plan, now, needs)
        step = self.step_cost(shape)
        # host transfers since the last step (a preemption-only plan's swap-outs included)
        swap_s, swap_bytes = self._swap_s, self._swap_bytes
        self._swap_s = self._swap_bytes = 0.0
        # x + 0.0 == x exactly, so a step without transfers ends at now + step.seconds.
        self.flight = Flight(plan, now, now + (step.seconds + swap_s),
                             (step, shape, num_prefill, num_decode, recomputed, swap_s,
                              swap_bytes))
        return self.flight.end_s

    def land(self, limit: float | None = None) -> None:
        """The flight has ended (``self.clock`` is its end): commit it. A steady step may
        launch a skipped stretch (a new flight) that ends at the first step ending at or after
        ``limit`` (the time a driven replica is advanced to; ``None``: the next arrival of the
        replica's own list, unless the plan ignores arrivals). A stretch that ended short of
        its limit goes on where the plan's promise covers it (``continue_skip``)."""
        flight = self.flight
        assert flight is not None
        self.flight = None
        plan, end = flight.plan, self.clock
        if flight.step is None:
            (commit_batch_run if flight.batch else commit_skip)(self, plan, *flight.skip)
            assert flight.shape is not None
            go_on = (None if self.pending or end >= flight.limit else
                     continue_skip(self, plan, flight.shape, len(flight.skip[1])))
            if go_on is None:
                return
            plan, shape = go_on
        elif plan.steady and self.skip and not self.pending:  # admitted requests: plan now
            self._commit(plan, flight.start_s, end, *flight.step)
            go_on = continue_skip(self, plan, flight.step[1], 0)  # finishers' rows, if any
            if go_on is None:
                return
            plan, shape = go_on
        else:
            self._commit(plan, flight.start_s, end, *flight.step)
            return
        self._launch_skip(plan, shape, end, limit)

    def _launch_skip(self, plan: Plan, shape: BatchShape, now: float, limit: float | None
                     ) -> bool:
        """Launch the skipped stretch of steady ``plan`` from ``now`` (``shape``: the step
        before it), if there is one, up to ``limit`` (``None``: the replica's own next arrival,
        unless the plan ignores arrivals) and the horizon."""
        if limit is None:
            limit = math.inf if plan.ignores_arrivals else self._next_arrival()
        if self.horizon_s is not None:
            limit = min(limit, self.horizon_s)
        batch = covers(self, plan)
        skip = (plan_batch_run if batch else plan_skip)(
            self, plan, shape, now, limit)  # (series, ends, ...)
        if skip is None:
            return False
        self.flight = Flight(plan, now, float(skip[1][-1]), None, skip, shape, limit, batch)
        return True

    def _shape_before(self, plan: Plan, now: float) -> BatchShape | None:
        """The step before a steady ``plan`` as its rows had it, when every one of them is a
        running decode whose last token came at ``now`` (its next one then comes one step
        later, as skipping counts it) and every padding row is one token; else ``None``."""
        running = self.running
        context = []
        for sid in plan.run:
            seq = running.get(sid)
            if seq is None or seq.last_token_s != now:
                return None
            context.append(seq.num_computed)
        for row in plan.padding:
            if row.num_tokens != 1:
                return None
            context.append(row.context_len - 1)
        return BatchShape(np.ones(len(context), dtype=np.int64),
                          np.array(context, dtype=np.int64), len(plan.padding))

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
            self._add_waiting(seq)

    def _never_fits(self, seq: Seq) -> str:
        """Why a request can never be served by this replica's KV cache ('' if it can)."""
        r = seq.req
        key = (r.num_prompt_tokens, r.num_output_tokens)
        reason = self._never_fits_memo.get(key)
        if reason is None:
            reason = self._never_fits_memo[key] = never_fits(
                self.pool.config, self.max_model_len, *key)
        return reason

    def _view(self, now: float) -> View:
        pool = self.pool
        if pool.cache is not None:  # show each waiting request the prefix blocks cached now
            for s in (*self.preempted.values(), *self.waiting.values()):
                if (not s.num_computed and (s.req.prefix_id is not None or s.req.hash_ids)
                        and s.offer_hit(pool.hit_blocks(s) * pool.config.block_size)):
                    self._queued_view_changed(s)
        # The queue's views change only when a request joins or leaves it (or is shown new
        # cached tokens): kept between steps, and a changed queue's tuple copied from the
        # views kept (``_add_waiting``) rather than built request by request, which made every
        # step that changed a long queue O(queue) in Python. Running views change every step.
        waiting = self._queue_views
        if waiting is None:
            front = self._preempted_views
            if front is None:
                front = self._preempted_views = tuple(
                    map(_SEQ_VIEW, reversed(self.preempted.values())))
            waiting = self._queue_views = front + tuple(self._waiting_views.values())
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
