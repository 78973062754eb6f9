"""Packing helpers shared by the iteration-level policies: decode growth and prompt admission.

These walk queues the policy has already ordered and respect three limits: the sequence slots
(``max_num_seqs``), the step's token budget, and the free KV blocks (minus a watermark kept back
so running decodes can grow, as vLLM does).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from sim.core.types import KVView, SeqView


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


def grow_running(running: Sequence[SeqView], kv: KVView, budget: Budget
                 ) -> tuple[int, ...]:
    """Schedule every running sequence's pending tokens, preempting the newest when KV runs out.

    Running sequences are in admission order; the newest is the cheapest to lose (least work
    done and, under FCFS, latest arrival). Returns the ids to preempt (recompute).
    """
    active = list(running)
    preempt: list[int] = []
    need = [kv.blocks_needed(s, s.num_uncomputed) for s in active]
    if sum(need) > budget.free_blocks:
        while active and sum(need) > budget.free_blocks:
            victim = active.pop()
            need.pop()
            preempt.append(victim.id)
            budget.free_blocks += victim.num_blocks
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
    for seq in queue:
        tokens = seq.num_uncomputed
        blocks = kv.blocks_needed(seq, tokens)
        if (budget.seqs < 1 or tokens > budget.tokens
                or budget.free_blocks - blocks < watermark_blocks):
            break
        budget.take(seq, tokens, blocks)
        admitted.append(seq.id)
    return admitted


def watermark_blocks(kv: KVView, watermark: float) -> int:
    """Blocks kept free at admission: ``watermark`` × total (0 for an unlimited cache)."""
    return int(watermark * kv.total_blocks) if kv.total_blocks < (1 << 40) else 0


def max_fitting_tokens(kv: KVView, seq: SeqView, free_blocks: int, cap: int) -> int:
    """The most tokens of ``seq`` (at most ``cap``) whose KV fits in ``free_blocks`` (0 if none).

    Chunked prefill sizes a chunk by what the cache can hold rather than skipping the request;
    for a slab allocator the first allocation must also cover the whole reservation.
    """
    if cap < 1 or free_blocks < 0:
        return 0
    n = min(cap, (seq.num_blocks + free_blocks) * kv.block_size - seq.num_computed_tokens)
    if n < 1 or kv.blocks_needed(seq, n) > free_blocks:
        return 0
    return n


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
