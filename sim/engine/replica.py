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

import time
from collections.abc import Sequence
from operator import attrgetter

import simpy

from policies.registry import Policy
from sim.core.rules import blocks_for, blocks_needed, target_tokens
from sim.core.state import Seq
from sim.core.types import BatchShape, Plan, Request, View
from sim.cost.base import CostModel
from sim.engine.skipping import MAX_SKIP_STEPS, commit_skip, plan_skip
from sim.engine.validate import EngineError, validate_plan
from sim.kv.cache import BlockPool
from sim.kv.config import KVConfig
from sim.metrics.summary import StepLog

__all__ = ["MAX_SKIP_STEPS", "EngineError", "Replica", "never_fits"]

_COMPUTED = attrgetter("num_computed")


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
            if self.deadline is not None and time.perf_counter() > self.deadline:
                return  # wall-clock budget spent: the run ends here, marked partial
            self._take_arrivals(now)
            if not (self.waiting or self.preempted or self.running):
                if self.next_index >= len(reqs):
                    return
                yield from self._wait_until(env, reqs[self.next_index].arrival_s)
                continue
            view = self._view(now)
            plan = self.policy.schedule(view)
            validate_plan(self, plan, view)
            for sid, reason in plan.reject.items():
                self._reject(self._pop_waiting(sid), now, reason)
            if not plan.run:
                wake = self._idle_until(plan, now)
                if wake is None:
                    return
                yield from self._wait_until(env, wake)
                continue
            self._swap_s = self._swap_bytes = 0.0
            for sid in plan.preempt:
                self._preempt(self.running.pop(sid), now)
            shape, num_prefill, num_decode, recomputed = self._launch(plan, now)
            step = self.cost.step(shape)
            swap_s, swap_bytes = self._swap_s, self._swap_bytes
            # x + 0.0 == x exactly, so a step without transfers ends at now + step.seconds.
            yield from self._wait_until(env, now + (step.seconds + swap_s))
            self._commit(plan, now, self.clock, step, shape, num_prefill, num_decode,
                         recomputed, swap_s, swap_bytes)
            if plan.steady and self.skip:
                skip = plan_skip(self, plan, shape, self.clock)
                if skip is not None:
                    yield from self._wait_until(env, float(skip[1][-1]))
                    commit_skip(self, plan, *skip)

    def _wait_until(self, env: simpy.Environment, t: float):  # noqa: ANN202 - generator
        """Let SimPy run until ``t``, then set the replica's clock to exactly ``t``."""
        yield env.timeout(max(0.0, t - env.now))
        self.clock = t

    def _take_arrivals(self, now: float) -> None:
        reqs, i, n = self.requests, self.next_index, len(self.requests)
        while i < n and reqs[i].arrival_s <= now:
            seq = self.seqs[reqs[i].id]
            reason = self._never_fits(seq)
            if reason:
                self._reject(seq, now, reason)
            else:
                self.waiting[seq.req.id] = seq
            i += 1
        self.next_index = i

    def _never_fits(self, seq: Seq) -> str:
        """Why a request can never be served by this replica's KV cache ('' if it can)."""
        r = seq.req
        return never_fits(self.pool.config, self.max_model_len, r.num_prompt_tokens,
                          r.num_output_tokens)

    def _view(self, now: float) -> View:
        pool = self.pool
        if pool.cache is not None:  # show each waiting request the prefix blocks cached now
            for s in (*self.preempted.values(), *self.waiting.values()):
                if not s.num_computed and s.req.prefix_id is not None:
                    s.offer_hit(pool.hit_blocks(s) * pool.config.block_size)
        waiting = tuple(s.view() for s in reversed(self.preempted.values()))
        waiting += tuple(s.view() for s in self.waiting.values())
        running = tuple(s.view() for s in self.running.values())
        more = self.next_index < len(self.requests)
        return View(now, waiting, running, pool.view(), more)

    def _idle_until(self, plan: Plan, now: float) -> float | None:
        """When an empty plan should be asked again; ``None`` ends the replica."""
        candidates = []
        if self.next_index < len(self.requests):
            candidates.append(self.requests[self.next_index].arrival_s)
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

    # -- state changes ------------------------------------------------------------------------
    def _pop_waiting(self, sid: int) -> Seq:
        seq = self.waiting.pop(sid, None)
        return seq if seq is not None else self.preempted.pop(sid)

    def _reject(self, seq: Seq, now: float, reason: str) -> None:
        self.pool.release(seq)
        seq.reject(now, reason)

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
        return BatchShape.of(new_tokens, context, pad), num_prefill, num_decode, recomputed

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
        live, cached = self.live_tokens(), pool.cached
        settle = self.settle
        for sid in plan.run:
            settle(running[sid], end)
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
