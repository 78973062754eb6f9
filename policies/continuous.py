"""Continuous (iteration-level) batching: Orca (OSDI'22) and vLLM (SOSP'23).

The batch is recomposed every iteration: finished sequences leave and free their KV at once,
waiting requests enter with their whole prompt while the sequence slots, the token budget and
free KV blocks (less a watermark) allow. Two documented modes:

- ``vllm`` (default): prefill-prioritized. A step that admits new prompts runs only their
  prefill; running decodes wait one step (vLLM's v0 scheduler without chunked prefill).
- ``orca``: mixed steps. New prompts' full prefills run in the same pass as every running
  decode (Orca's selective batching).

When decode growth runs out of blocks the newest running sequence is preempted by recompute.

Parameters: ``max_num_seqs`` (256) batch rows; ``max_num_batched_tokens`` (8192) tokens per
step — a prompt longer than this can never run whole and is rejected; ``watermark`` (0.01)
share of KV blocks kept free when admitting; ``mode`` ("vllm" | "orca"); ``ordering`` ("fcfs" |
"spf" | "priority") of the waiting queue.
"""
from __future__ import annotations

from dataclasses import dataclass

from policies.ordering import ORDERINGS, order_queue
from policies.packing import admit_whole_prompts, budget_for, grow_running, watermark_blocks
from policies.registry import Policy, check_positive, register
from sim.core.types import Plan, View

MODES = ("vllm", "orca")


@register("continuous")
@dataclass
class ContinuousBatching(Policy):
    """Iteration-level batching with whole-prompt admission (see module docstring)."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    watermark: float = 0.01
    mode: str = "vllm"
    ordering: str = "fcfs"

    def __post_init__(self) -> None:
        check_positive(self, max_num_seqs=self.max_num_seqs,
                       max_num_batched_tokens=self.max_num_batched_tokens)
        self._require(0 <= self.watermark < 1, "watermark", f"must be in [0, 1), got "
                      f"{self.watermark!r}")
        self._require(self.mode in MODES, "mode", f"unknown {self.mode!r}; accepted: {MODES}")
        self._require(self.ordering in ORDERINGS, "ordering",
                      f"unknown {self.ordering!r}; accepted: {tuple(ORDERINGS)}")

    def schedule(self, view: View) -> Plan:
        """Admit prompts (prefill-first or mixed), else decode every running sequence."""
        reject = {s.id: f"prompt of {s.num_uncomputed} tokens exceeds max_num_batched_tokens="
                  f"{self.max_num_batched_tokens}"
                  for s in view.waiting if s.num_uncomputed > self.max_num_batched_tokens}
        queue = order_queue([s for s in view.waiting if s.id not in reject], self.ordering)
        kv = view.kv
        # The watermark protects running decodes; with none running it would only block.
        mark = watermark_blocks(kv, self.watermark) if view.running else 0
        free_seqs = self.max_num_seqs - len(view.running)
        if self.mode == "vllm" and queue and free_seqs > 0:
            budget = budget_for(kv, free_seqs, self.max_num_batched_tokens)
            if admit_whole_prompts(queue, kv, budget, mark):
                return Plan(run=budget.run, reject=reject)
        budget = budget_for(kv, self.max_num_seqs, self.max_num_batched_tokens)
        preempt = grow_running(view.running, kv, budget)
        admitted = self.mode == "orca" and not preempt and admit_whole_prompts(
            queue, kv, budget, mark)
        # A pure decode plan repeats until an arrival, a finish or a KV shortfall: admission
        # failed for lack of slots, budget or blocks, none of which grows while decoding.
        steady = not preempt and not admitted and not reject
        return Plan(run=budget.run, preempt=preempt, reject=reject, steady=steady)
