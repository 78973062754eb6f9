"""The reference interpreter of the scheduling specification, and the ``scheduler`` policy.

``schedule(spec, view)`` reads a ``SchedulingSpec`` (``sim.core.scheduling``) and returns the
step's plan; it is the readable definition of every iteration-level policy the project ships.
``continuous`` and ``chunked_prefill`` are presets of it, and the ``scheduler`` policy takes the
specification's fields directly::

    policy: {name: scheduler, composition: decode_first, order: edf, victim: priority,
             ttft_targets_s: {"0": 2.0, "1": 0.25}}

Two step shapes cover the three compositions:

- ``prefill_first`` / ``mixed`` (whole prompts): a ``prefill_first`` step that can admit
  prompts runs only their prefill; otherwise every running request gets its pending tokens
  (one decode, or a whole recompute), preempting victims while the KV does not fit, and a
  ``mixed`` step then admits whole prompts into what is left.
- ``decode_first``: running decodes first (one token each), then running prefills continue,
  then new prompts fill the rest of the budget (in chunks, or whole). When a running request
  cannot get its blocks, a victim among the running requests not yet scheduled this step is
  preempted; a decode with no victim left gives up its own blocks. New prompts are admitted
  only if nothing was preempted.

Admission stops at the first waiting request that does not fit (head-of-line blocking, as
vLLM does), so a long prompt cannot starve. The scalar rules (blocks, admission test, victim
choice) are ``sim.core.rules``.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from policies.ordering import order_queue
from policies.packing import (
    Budget,
    Deadline,
    admit_whole_prompts,
    budget_for,
    grow_running,
    max_fitting_tokens,
    pick_victim,
    watermark_blocks,
)
from policies.registry import Policy, register
from sim.core.rules import VICTIM_NEWEST, blocks_needed
from sim.core.rules import max_fitting_tokens as fitting
from sim.core.scheduling import VICTIMS, SchedulingSpec
from sim.core.types import KVView, Plan, SeqView, View


def schedule(spec: SchedulingSpec, view: View) -> Plan:
    """The plan ``spec`` makes for ``view``."""
    if spec.composition == "decode_first":
        return _decode_first(spec, view)
    return _whole_prompts(spec, view)


def deadline_of(spec: SchedulingSpec) -> Deadline:
    """A request's TTFT deadline: its arrival plus its priority class's target."""
    return lambda s: s.arrival_s + spec.target_s(s.priority)


def ordered(spec: SchedulingSpec, queue: Sequence[SeqView]) -> list[SeqView]:
    """The waiting queue in the spec's order (stable: ties keep the engine's FCFS order)."""
    if spec.order == "edf" and len(queue) > 1:
        return sorted(queue, key=deadline_of(spec))
    return order_queue(queue, spec.order)


def _victim_rule(spec: SchedulingSpec) -> tuple[int, Deadline | None]:
    """The victim rule's code (``sim.core.rules``) and, when it needs one, the deadlines."""
    code = VICTIMS.index(spec.victim)  # ``spec.code("victim")``, without the field lookup
    return code, (deadline_of(spec) if spec.victim == "deadline" else None)


def _whole_prompts(spec: SchedulingSpec, view: View) -> Plan:
    """A ``prefill_first`` or ``mixed`` step with whole-prompt admission."""
    limit = spec.max_num_batched_tokens
    reject = {s.id: f"prompt of {s.num_uncomputed} tokens exceeds max_num_batched_tokens="
              f"{limit}" for s in view.waiting if s.num_uncomputed > limit}
    queue = ordered(spec, [s for s in view.waiting if s.id not in reject])
    kv = view.kv
    # The watermark protects running decodes; with none running it would only block.
    mark = watermark_blocks(kv, spec.watermark) if view.running else 0
    free_seqs = spec.max_num_seqs - len(view.running)
    if spec.composition == "prefill_first" and queue and free_seqs > 0:
        budget = budget_for(kv, free_seqs, limit)
        if admit_whole_prompts(queue, kv, budget, mark):
            return Plan(run=budget.run, reject=reject)
    budget = budget_for(kv, spec.max_num_seqs, limit)
    preempt = grow_running(view.running, kv, budget, *_victim_rule(spec))
    admitted = spec.composition == "mixed" and not preempt and admit_whole_prompts(
        queue, kv, budget, mark)
    # A pure decode plan repeats until an arrival, a finish or a KV shortfall: admission
    # failed for lack of slots, budget or blocks, none of which grows while decoding.
    steady = not preempt and not admitted and not reject
    # With nothing waiting, a finish only frees room: the others decode on alike.
    return Plan(run=budget.run, preempt=preempt, reject=reject, steady=steady,
                on_finish="drop" if steady and not view.waiting else "stop")


def _decode_first(spec: SchedulingSpec, view: View) -> Plan:
    """A ``decode_first`` step: decodes, running prefill chunks, then new prompts."""
    kv = view.kv
    whole = spec.admission == "whole"
    chunk = None if whole else spec.chunk_size
    limit = spec.max_num_batched_tokens
    reject = ({s.id: f"prompt of {s.num_uncomputed} tokens exceeds max_num_batched_tokens="
               f"{limit}" for s in view.waiting if s.num_uncomputed > limit} if whole else {})
    budget = budget_for(kv, spec.max_num_seqs, limit)
    victim, deadline = _victim_rule(spec)
    victims = list(view.running)  # admission order: the tail is the newest
    paged = kv.reserve_tokens is None and kv.reserve_output_tokens is None  # no slab floor
    done: set[int] = set()  # scheduled, passed over or preempted: no longer a victim
    preempt: list[int] = []
    num_decodes = 0
    decodes: list[SeqView] = []
    prefills: list[SeqView] = []
    for s in view.running:  # one pass: ``is_prefill`` is a property, read once per request
        (prefills if s.is_prefill else decodes).append(s)
    if decodes and _take_decodes(kv, decodes, budget, paged):
        num_decodes = len(budget.run)
        done.update(s.id for s in decodes)
        decodes = []  # all scheduled, or left out for want of slots: nothing left to do
    for decoding, group in ((True, decodes), (False, prefills)):
        for seq in group:
            if seq.id in done:
                continue
            done.add(seq.id)
            n = 1 if decoding else _cap(seq, budget, chunk)
            if n < 1 or budget.seqs < 1:
                continue  # budget spent: it keeps its KV and continues next step
            floor = 0 if paged else kv.floor_tokens(seq)
            n = _fit(kv, seq, floor, n, budget, victims, done, preempt, victim, deadline)
            if n:
                budget.take(seq, n, blocks_needed(seq.num_computed_tokens + n, floor,
                                                  seq.num_blocks, kv.block_size))
                num_decodes += decoding
            elif decoding:  # no victim left: give up its own blocks rather than stall
                preempt.append(seq.id)
                budget.free_blocks += seq.num_blocks
    if not preempt:
        mark = watermark_blocks(kv, spec.watermark) if view.running else 0
        waiting = [s for s in view.waiting if s.id not in reject] if reject else view.waiting
        for seq in ordered(spec, waiting):
            cap = _cap(seq, budget, chunk) if budget.seqs > 0 else 0
            if whole and cap < seq.num_uncomputed:
                break  # the whole prompt must fit this step's budget
            n = max_fitting_tokens(kv, seq, budget.free_blocks - mark, cap)
            if n < 1 or (whole and n < seq.num_uncomputed):
                break  # head-of-line blocking keeps a long prompt from starving
            budget.take(seq, n, kv.blocks_needed(seq, n))
    # Decodes alone repeat until an arrival, a finish or a KV shortfall: whatever was left
    # out (budget, slots or blocks) cannot become schedulable while they decode.
    steady = bool(budget.run) and not preempt and not reject and len(budget.run) == num_decodes
    # With nothing waiting and every running request decoding, a finish only frees room.
    drop = steady and not view.waiting and len(budget.run) == len(view.running)
    return Plan(run=budget.run, preempt=tuple(preempt), reject=reject, steady=steady,
                on_finish="drop" if drop else "stop")


def _take_decodes(kv: KVView, decodes: list[SeqView], budget: Budget, paged: bool) -> bool:
    """Schedule the running decodes at once when their blocks all fit, as the one-by-one loop
    would (one token each while slots last, no victim needed); False when some might not fit
    and the loop must decide, preempting."""
    head = decodes[:max(0, min(len(decodes), budget.seqs))]
    bs = kv.block_size
    if paged:
        need = sum([blocks_needed(s.num_computed_tokens + 1, 0, s.num_blocks, bs) for s in head])
    else:
        need = sum([blocks_needed(s.num_computed_tokens + 1, kv.floor_tokens(s), s.num_blocks,
                                  bs) for s in head])
    if need > budget.free_blocks:
        return False
    run = budget.run
    for s in head:
        run[s.id] = 1
    budget.seqs -= len(head)
    budget.tokens -= len(head)
    budget.free_blocks -= need
    return True


def _cap(seq: SeqView, budget: Budget, chunk_size: int | None) -> int:
    cap = min(seq.num_uncomputed, budget.tokens)
    return min(cap, chunk_size) if chunk_size else cap


def _fit(kv: KVView, seq: SeqView, floor: int, n: int, budget: Budget,
         victims: list[SeqView], done: set[int], preempt: list[int], victim: int,
         deadline: Deadline | None) -> int:
    """Tokens of ``seq`` (up to ``n``; ``floor``: its slab reservation) that fit, preempting
    victims as needed. Calls the rule itself, not ``packing.max_fitting_tokens``: this runs
    for every running request every step."""
    while True:
        fit = fitting(seq.num_computed_tokens, seq.num_blocks, floor, kv.block_size,
                      budget.free_blocks, n)
        if victim == VICTIM_NEWEST:
            while victims and victims[-1].id in done:
                victims.pop()
            j = len(victims) - 1
        else:
            j = -1 if fit else pick_victim(victims, victim, deadline, done)
        if fit or j < 0:
            return fit
        chosen = victims.pop(j)
        done.add(chosen.id)
        preempt.append(chosen.id)
        budget.free_blocks += chosen.num_blocks


@register("scheduler")
@dataclass(frozen=True)
class Scheduler(SchedulingSpec, Policy):
    """Any iteration-level scheduler, given as the fields of ``SchedulingSpec``."""

    def __post_init__(self) -> None:
        bad = self.problem()
        if bad:
            self._require(False, *bad)
        self._prepare()

    @property
    def spec(self) -> SchedulingSpec:
        """The specification this policy interprets (itself, as a plain value)."""
        return SchedulingSpec(**{f.name: getattr(self, f.name)
                                 for f in dataclasses.fields(SchedulingSpec)})

    def schedule(self, view: View) -> Plan:
        """The reference interpreter's plan (``policies.scheduler.schedule``)."""
        return schedule(self, view)
