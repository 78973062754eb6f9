"""What one step does to a replica's state: admission to the batch, KV growth, preemption,
rejection, committing tokens, releasing finished requests, and the invariant checks.

``ReplicaSteps`` holds a replica's queues, KV pool and the state between events;
``sim.engine.replica.Replica`` adds *when* steps happen (the scheduling points, the SimPy process
and the driven form of ``sim.engine.drive``).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from operator import attrgetter
from typing import Any

import numpy as np

from policies.registry import Policy
from sim.core.rules import blocks_for, blocks_needed
from sim.core.state import Seq
from sim.core.types import BatchShape, Plan, Request, SeqView, StepCost
from sim.cost.base import CostModel, StepSeries, step_series
from sim.engine.drive import ReplicaEvent, emit_first_tokens
from sim.kv.cache import BlockPool
from sim.kv.config import KVConfig
from sim.metrics.steplog import StepLog

_COMPUTED = attrgetter("num_computed")


@dataclass(slots=True)
class Flight:
    """A step launched at ``start_s`` and committed at ``end_s``: ``step`` holds what
    ``Replica._commit`` needs; a skipped stretch of steady steps has ``skip`` instead, with
    ``shape`` (the step before the stretch), ``limit`` (the time it had to stop at) and
    ``batch`` (a run-to-completion batch's run, ``sim.engine.batch_skip``)."""

    plan: Plan
    start_s: float
    end_s: float
    step: tuple | None
    skip: tuple = ()
    shape: BatchShape | None = None
    limit: float = math.inf
    batch: bool = False

class ReplicaSteps:
    """One model instance's queues, KV pool and step bookkeeping (see the module doc)."""

    def __init__(self, index: int, requests: Sequence[Request], policy: Policy,
                 cost: CostModel, kv: KVConfig, log: StepLog, seqs: dict[int, Seq],
                 checks: bool = False, horizon_s: float | None = None,
                 skip: bool = True, deadline: float | None = None,
                 max_model_len: int | None = None,
                 series: Callable[[BatchShape, int], StepSeries] | None = None) -> None:
        self.index = index
        self.requests = requests
        self.policy = policy
        self.cost = cost
        #: Costs a skipped stretch's steps (``CostModel.step_series``, or the same numbers in
        #: compiled code: ``sim.engine.compiled_series``, which ``simulate`` gives large runs).
        self.series: Callable[[BatchShape, int], StepSeries] = (
            partial(step_series, cost) if series is None else series)
        #: Costs a step that is not skipped: ``cost.step``, or the same numbers in compiled
        #: code when ``series`` is a ``CompiledSeries`` (its ``step``).
        self.step_cost: Callable[[BatchShape], StepCost] = getattr(series, "step", cost.step)
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
        # ``View.waiting``, kept between steps: the whole tuple (``None`` once the queue has
        # changed), the preempted requests' part of it (``None`` once they have changed) and
        # each waiting request's view in ``waiting``'s order, updated as requests join and
        # leave, so a changed queue is rebuilt by copying views, not by building each one.
        self._queue_views: tuple[SeqView, ...] | None = None
        self._preempted_views: tuple[SeqView, ...] | None = None
        self._waiting_views: dict[int, SeqView] = {}
        #: ``never_fits`` by (prompt, output) tokens: the cache and max_model_len never change.
        self._never_fits_memo: dict[tuple[int, int], str] = {}
        #: Receives a ``ReplicaEvent`` at each first token, prefill end, finish and rejection.
        self.listener: Callable[[Any], None] | None = None
        # Disaggregated serving (``sim.engine.drive``: ``reserve_kv``, ``land_kv``,
        # ``release_held``): finished requests that keep their KV until it has been sent
        # (``hold_kv``), and requests whose blocks are reserved while their KV is in transit.
        self.hold_kv = False
        self.held: dict[int, Seq] = {}
        self.incoming: dict[int, Seq] = {}
        #: ``(time, blocks)`` those calls changed while a skipped stretch was in flight: each
        #: of its steps logs the blocks it ended with, as stepping would (``kv_changes_after``).
        self.kv_changes: list[tuple[float, int]] = []

    # -- state changes ------------------------------------------------------------------------
    def _add_waiting(self, seq: Seq) -> None:
        """``seq`` joins the end of the waiting queue."""
        sid = seq.req.id
        self.waiting[sid] = seq
        self._waiting_views[sid] = seq.view()
        self._queue_views = None

    def _add_preempted(self, seq: Seq) -> None:
        """``seq``, just preempted, joins the front of the queue."""
        self.preempted[seq.req.id] = seq
        self._preempted_views = self._queue_views = None

    def _pop_waiting(self, sid: int) -> Seq:
        """Take request ``sid`` out of the queue (waiting or preempted)."""
        self._queue_views = None
        seq = self.waiting.pop(sid, None)
        if seq is not None:
            del self._waiting_views[sid]
            return seq
        self._preempted_views = None
        return self.preempted.pop(sid)

    def _queued_view_changed(self, seq: Seq) -> None:
        """A queued request's view changed (cached prompt tokens shown): the queue's views
        follow."""
        sid = seq.req.id
        if sid in self._waiting_views:
            self._waiting_views[sid] = seq.view()
        else:
            self._preempted_views = None
        self._queue_views = None

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
        self._add_preempted(seq)

    def _launch(self, plan: Plan, now: float, needs: Sequence[int] = ()
                ) -> tuple[BatchShape, int, int, int]:
        """Move scheduled requests to running, grow their KV and build the batch shape.

        ``needs``: the blocks each request of ``plan.run`` needs, as ``validate_plan``
        counted them; used when every one was running already (a request taken from the
        queue holds its cached prefix blocks first, which changes its count)."""
        pool, cfg = self.pool, self.pool.config
        running, bs = self.running, cfg.block_size
        run = plan.run
        # the usual step admits nobody: one set comparison in C instead of a lookup a row
        admitted = [] if running.keys() >= run.keys() else [
            sid for sid in run if sid not in running]
        for sid in admitted:
            seq = self._pop_waiting(sid)
            running[sid] = seq
            seq.schedule(now)
            # Cached prefix blocks are held before anything is allocated, so no allocation
            # below can evict a block a request of this very plan was shown as cached.
            if seq.hit_tokens:
                pool.pin(seq, seq.hit_tokens // bs)
                seq.take_hit()
        new_tokens = list(run.values())
        context: list[int] = []
        append = context.append
        num_prefill = num_decode = recomputed = 0
        paged = cfg.allocator != "slab"  # no reservation: grow inline, as ``pool.grow`` would
        swaps = admitted and cfg.preemption == "swap"  # only requests taken from the queue
        counted = paged and not admitted and len(needs) == len(run)
        for i, (sid, n) in enumerate(run.items()):
            seq = running[sid]
            if swaps and seq.swapped:  # its KV comes back from host memory before the step
                assert cfg.swap_s_per_token is not None and cfg.kv_bytes_per_token is not None
                self._swap_s += seq.num_computed * cfg.swap_s_per_token
                self._swap_bytes += seq.num_computed * cfg.kv_bytes_per_token
                seq.swapped = False
            computed = seq.num_computed
            target = computed + n
            if seq.max_held > computed:  # ``seq.num_recomputed(n)``, inlined
                recomputed += min(target, seq.max_held) - computed
            if paged:
                need = needs[i] if counted else blocks_needed(target, 0, seq.num_blocks, bs)
                if need:
                    pool.take_for(seq, need)
            else:
                pool.grow(seq, target)
            generated = seq.num_generated
            if generated and seq.req.num_prompt_tokens + generated - computed == 1:
                num_decode += 1
            else:
                num_prefill += n
            append(target)
        pad = 0
        for row in plan.padding:
            new_tokens.append(row.num_tokens)
            append(row.context_len)
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
        capacity = pool.config.capacity_tokens
        leaving = []  # finished, or maybe outgrowing the cache: ``settle`` decides
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
            if seq.status == "finished" or seq.num_computed >= capacity:  # else a no-op
                leaving.append(seq)
        if self.listener is not None:
            emit_first_tokens(self, plan.run, end)
        live, cached = self.live_tokens(), pool.cached
        settle = self.settle
        for seq in leaving:
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
            if self.hold_kv:  # its KV is still to be sent: held until ``release_held``
                self.held[seq.req.id] = seq
            else:
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
        # requests that arrived with their KV (``land_kv``) hold its blocks while they wait
        # (admitted or queued); held and incoming requests hold theirs outside the queues
        landed = [s for s in (*self.waiting.values(), *self.pending) if s.num_blocks]
        self.pool.check(running + landed + [*self.held.values(), *self.incoming.values()])
        for seq in landed:
            bs = self.pool.config.block_size
            if (seq.num_shared or seq.swapped or not seq.num_computed
                    or seq.num_blocks < blocks_for(seq.num_computed, bs)):
                raise AssertionError(f"waiting request {seq.req.id} holds KV it did not bring")
        views = self._waiting_views
        if list(views) != list(self.waiting) or any(
                views[sid] != seq.view() for sid, seq in self.waiting.items()):
            raise AssertionError("the waiting requests' views do not follow the queue")
        for seq in running:
            seq.check(self.pool.config.block_size)
            if seq.swapped or seq.hit_tokens:
                raise AssertionError(f"running request {seq.req.id} has its KV elsewhere")
        for seq in (*(s for s in self.waiting.values() if not s.num_blocks),
                    *self.preempted.values()):
            if seq.num_blocks or seq.num_shared or (seq.num_computed and not seq.swapped):
                raise AssertionError(f"waiting request {seq.req.id} holds KV")
