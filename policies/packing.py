"""Packing helpers shared by the iteration-level policies: decode growth and prompt admission.

These walk queues the policy has already ordered and respect three limits: the sequence slots
(``max_num_seqs``), the step's token budget, and the free KV blocks (minus a watermark kept back
so running decodes can grow, as vLLM does).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sim.core import rules
from sim.core.rules import VICTIM_NEWEST, outranks
from sim.core.types import KVView, SeqView

#: A request's TTFT deadline in seconds (``victim`` ``deadline`` and ``edf`` read it).
Deadline = Callable[[SeqView], float]


@dataclass
class Budget:
    """What is left of one step's limits while a plan is being packed."""

    seqs: int
    tokens: int
    free_blocks: int
    run: dict[int, int] = field(default_factory=dict)

    def take(self, seq: SeqView, num_tokens: int, blocks: int) -> None:
        """Schedule ``num_tokens`` of ``seq`` using ``blocks`` new KV blocks."""
        self.run[seq.id] = num_tokens
        self.seqs -= 1
        self.tokens -= num_tokens
        self.free_blocks -= blocks


def budget_for(kv: KVView, max_num_seqs: int | None, max_num_batched_tokens: int | None
               ) -> Budget:
    """A fresh budget for one step."""
    big = 1 << 62
    return Budget(max_num_seqs if max_num_seqs else big,
                  max_num_batched_tokens if max_num_batched_tokens else big, kv.free_blocks)


def grow_running(running: Sequence[SeqView], kv: KVView, budget: Budget,
                 victim: int = VICTIM_NEWEST, deadline: Deadline | None = None
                 ) -> tuple[int, ...]:
    """Schedule every running sequence's pending tokens, preempting when KV runs out.

    Running sequences are in admission order; by default the newest is the victim, the
    cheapest to lose (least work done and, under FCFS, latest arrival); ``victim`` picks
    another rule (``sim.core.rules.outranks``). Returns the ids to preempt.
    """
    active = list(running)
    preempt: list[int] = []
    need = [kv.blocks_needed(s, s.num_uncomputed) for s in active]
    if sum(need) > budget.free_blocks:
        while active and sum(need) > budget.free_blocks:
            j = pick_victim(active, victim, deadline)
            chosen = active.pop(j)
            need.pop(j)
            preempt.append(chosen.id)
            budget.free_blocks += chosen.num_blocks
    run = budget.run
    for seq in active:  # ``budget.take(seq, seq.num_uncomputed, blocks)`` for each, batched
        run[seq.id] = seq.num_uncomputed
    budget.seqs -= len(active)
    budget.tokens -= sum(run[s.id] for s in active)
    budget.free_blocks -= sum(need)
    return tuple(preempt)


def admit_whole_prompts(queue: Sequence[SeqView], kv: KVView, budget: Budget,
                        watermark_blocks: int) -> list[int]:
    """Admit waiting requests with their whole prompt (or recompute) while everything fits.

    Stops at the first request that does not fit (FCFS head-of-line blocking, as vLLM does) so
    later, smaller requests cannot starve it. Returns the admitted ids.
    """
    admitted: list[int] = []
    admits = rules.admits
    for seq in queue:
        tokens = seq.num_uncomputed
        blocks = kv.blocks_needed(seq, tokens)
        if not admits(budget.seqs, tokens, budget.tokens, budget.free_blocks, blocks,
                      watermark_blocks):
            break
        budget.take(seq, tokens, blocks)
        admitted.append(seq.id)
    return admitted


def watermark_blocks(kv: KVView, watermark: float) -> int:
    """Blocks kept free at admission (``sim.core.rules.watermark_blocks``)."""
    return rules.watermark_blocks(watermark, kv.total_blocks)


def max_fitting_tokens(kv: KVView, seq: SeqView, free_blocks: int, cap: int) -> int:
    """The most tokens of ``seq`` (at most ``cap``) whose KV fits in ``free_blocks`` (0 if
    none): ``sim.core.rules.max_fitting_tokens``."""
    paged = kv.reserve_tokens is None and kv.reserve_output_tokens is None  # no floor
    return rules.max_fitting_tokens(seq.num_computed_tokens, seq.num_blocks,
                                    0 if paged else kv.floor_tokens(seq), kv.block_size,
                                    free_blocks, cap)


def pick_victim(candidates: Sequence[SeqView], victim: int, deadline: Deadline | None,
                done: set[int] | None = None) -> int:
    """Index in ``candidates`` (admission order) of the preemption victim under rule
    ``victim``, skipping ids in ``done``; -1 when none is left. Scans from the newest, so ties
    go to the newest (``sim.core.rules.outranks``)."""
    best = -1
    best_priority, best_deadline = 0, 0.0
    for i in range(len(candidates) - 1, -1, -1):
        seq = candidates[i]
        if done is not None and seq.id in done:
            continue
        d = deadline(seq) if deadline is not None else 0.0
        if best < 0:
            if victim == VICTIM_NEWEST:
                return i
            best, best_priority, best_deadline = i, seq.priority, d
        elif outranks(victim, seq.priority, d, best_priority, best_deadline):
            best, best_priority, best_deadline = i, seq.priority, d
    return best


def fitting_prefix(queue: Sequence[SeqView], kv: KVView, free_blocks: int) -> list[SeqView]:
    """The longest prefix of ``queue`` whose whole prompts (or recomputes) fit in the blocks."""
    taken: list[SeqView] = []
    for seq in queue:
        blocks = kv.blocks_needed(seq, seq.num_uncomputed)
        if blocks > free_blocks:
            break
        free_blocks -= blocks
        taken.append(seq)
    return taken
