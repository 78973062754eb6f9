"""Continuous (iteration-level) batching: Orca (OSDI'22) and vLLM (SOSP'23).

The batch is recomposed every iteration: finished sequences leave and free their KV at once,
waiting requests enter with their whole prompt while the sequence slots, the token budget and
free KV blocks (less a watermark) allow. Two documented modes:

- ``vllm`` (default): prefill-prioritized. A step that admits new prompts runs only their
  prefill; running decodes wait one step (vLLM's v0 scheduler without chunked prefill).
- ``orca``: mixed steps. New prompts' full prefills run in the same pass as every running
  decode (Orca's selective batching).

When decode growth runs out of blocks the newest running sequence is preempted by recompute.
A preset of the scheduling specification (``policies.scheduler``): ``vllm`` is composition
``prefill_first``, ``orca`` is ``mixed``, both with ``whole`` admission.

Parameters: ``max_num_seqs`` (256) batch rows; ``max_num_batched_tokens`` (8192) tokens per
step — a prompt longer than this can never run whole and is rejected; ``watermark`` (0.01)
share of KV blocks kept free when admitting; ``mode`` ("vllm" | "orca"); ``ordering`` ("fcfs" |
"spf" | "priority") of the waiting queue.
"""
from __future__ import annotations

from dataclasses import dataclass

from policies.ordering import ORDERINGS
from policies.registry import Policy, check_choice, check_positive, register
from policies.scheduler import schedule
from sim.core.scheduling import SchedulingSpec
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
        check_choice(self, "mode", self.mode, MODES)
        check_choice(self, "ordering", self.ordering, ORDERINGS)

        self.spec = SchedulingSpec(
            composition="prefill_first" if self.mode == "vllm" else "mixed", admission="whole",
            max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
            watermark=self.watermark, order=self.ordering)

    def schedule(self, view: View) -> Plan:
        """Admit prompts (prefill-first or mixed), else decode every running sequence."""
        return schedule(self.spec, view)
