"""Chunked prefill (Sarathi-Serve, OSDI'24): decodes first, prompts fill the rest of the budget.

Every step has a fixed ``token_budget``. Running decodes are scheduled first (one token each),
then partially prefilled running requests continue with their next chunk, then new prompts are
admitted in chunks to fill what is left. A long prompt therefore never stalls running decodes
for longer than one budget-sized step, and a prompt of any length is served as long as it fits
in the KV cache (chunks only allocate the blocks they fill).

KV: when a running request cannot get its blocks, the newest running request not yet scheduled
this step is preempted (recompute), as vLLM v1 does — the request itself if it is the newest.
New prompts are admitted only if nothing was preempted and while the free blocks, less a
``watermark`` kept back for decode growth, hold their chunk.

Parameters:

- ``token_budget`` (512): tokens per step; declared as ``max_num_batched_tokens``.
- ``max_num_seqs`` (256): running requests; must not exceed ``token_budget`` (every running
  decode must fit in one step, vLLM's rule).
- ``chunk_size`` (None): most prefill tokens one request gets per step (``None``: the budget).
- ``watermark`` (0.01): share of KV blocks kept free when admitting new prompts.
- ``ordering`` ("fcfs" | "spf" | "priority"): order of the waiting queue.
"""
from __future__ import annotations

from dataclasses import dataclass

from policies.ordering import ORDERINGS, order_queue
from policies.packing import Budget, budget_for, max_fitting_tokens, watermark_blocks
from policies.registry import Policy, check_positive, register
from sim.core.types import KVView, Plan, SeqView, View


@register("chunked_prefill")
@dataclass
class ChunkedPrefill(Policy):
    """Sarathi-Serve-style stall-free batching with a per-step token budget."""

    token_budget: int = 512
    max_num_seqs: int = 256
    chunk_size: int | None = None
    watermark: float = 0.01
    ordering: str = "fcfs"

    def __post_init__(self) -> None:
        check_positive(self, token_budget=self.token_budget, max_num_seqs=self.max_num_seqs)
        ok = self.chunk_size is None or (isinstance(self.chunk_size, int)
                                         and not isinstance(self.chunk_size, bool)
                                         and self.chunk_size > 0)
        self._require(ok, "chunk_size", f"must be null or an integer > 0, got "
                      f"{self.chunk_size!r}")
        self._require(self.max_num_seqs <= self.token_budget, "max_num_seqs",
                      f"{self.max_num_seqs} > token_budget={self.token_budget}: every running "
                      "decode must fit in one step's budget")
        self._require(0 <= self.watermark < 1, "watermark", f"must be in [0, 1), got "
                      f"{self.watermark!r}")
        self._require(self.ordering in ORDERINGS, "ordering",
                      f"unknown {self.ordering!r}; accepted: {tuple(ORDERINGS)}")

    @property
    def max_num_batched_tokens(self) -> int:  # type: ignore[override]  # read-only: derived
        """The step's token budget, declared so the engine validates every plan against it."""
        return self.token_budget

    def _cap(self, seq: SeqView, budget: Budget) -> int:
        cap = min(seq.num_uncomputed, budget.tokens)
        return min(cap, self.chunk_size) if self.chunk_size else cap

    def schedule(self, view: View) -> Plan:
        """Decodes, then running prefill chunks, then new prompts, within the token budget."""
        kv = view.kv
        budget = budget_for(kv, self.max_num_seqs, self.token_budget)
        victims = list(view.running)  # admission order: the tail is the newest, the victim
        done: set[int] = set()  # scheduled, passed over or preempted: no longer a victim
        preempt: list[int] = []
        num_decodes = 0
        for decoding in (True, False):
            for seq in [s for s in view.running if s.is_prefill != decoding]:
                if seq.id in done:
                    continue
                done.add(seq.id)
                n = 1 if decoding else self._cap(seq, budget)
                if n < 1 or budget.seqs < 1:
                    continue  # budget spent: it keeps its KV and continues next step
                n = self._fit(kv, seq, n, budget, victims, done, preempt)
                if n:
                    budget.take(seq, n, kv.blocks_needed(seq, n))
                    num_decodes += decoding
                elif decoding:  # no victim left: give up its own blocks rather than stall
                    preempt.append(seq.id)
                    budget.free_blocks += seq.num_blocks
        if not preempt:
            mark = watermark_blocks(kv, self.watermark) if view.running else 0
            for seq in order_queue(view.waiting, self.ordering):
                cap = self._cap(seq, budget) if budget.seqs > 0 else 0
                n = max_fitting_tokens(kv, seq, budget.free_blocks - mark, cap)
                if n < 1:
                    break  # head-of-line blocking keeps a long prompt from starving
                budget.take(seq, n, kv.blocks_needed(seq, n))
        # Decodes alone repeat until an arrival, a finish or a KV shortfall: whatever was left
        # out (budget, slots or blocks) cannot become schedulable while they decode.
        steady = bool(budget.run) and not preempt and len(budget.run) == num_decodes
        return Plan(run=budget.run, preempt=tuple(preempt), steady=steady)

    @staticmethod
    def _fit(kv: KVView, seq: SeqView, n: int, budget: Budget, victims: list[SeqView],
             done: set[int], preempt: list[int]) -> int:
        """Tokens of ``seq`` (up to ``n``) that fit, preempting the newest others as needed."""
        while True:
            fit = max_fitting_tokens(kv, seq, budget.free_blocks, n)
            while victims and victims[-1].id in done:
                victims.pop()
            if fit or not victims:
                return fit
            victim = victims.pop()
            done.add(victim.id)
            preempt.append(victim.id)
            budget.free_blocks += victim.num_blocks
