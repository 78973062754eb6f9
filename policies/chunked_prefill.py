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

A preset of the scheduling specification (``policies.scheduler``): composition
``decode_first`` with ``chunked`` admission.
"""
from __future__ import annotations

from dataclasses import dataclass

from policies.ordering import ORDERINGS
from policies.registry import Policy, check_choice, check_positive, register
from policies.scheduler import schedule
from sim.core.scheduling import SchedulingSpec
from sim.core.types import Plan, View


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
        check_choice(self, "ordering", self.ordering, ORDERINGS)

        self.spec = SchedulingSpec(
            composition="decode_first", admission="chunked", chunk_size=self.chunk_size,
            max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.token_budget,
            watermark=self.watermark, order=self.ordering)

    @property
    def max_num_batched_tokens(self) -> int:  # type: ignore[override]  # read-only: derived
        """The step's token budget, declared so the engine validates every plan against it."""
        return self.token_budget

    def schedule(self, view: View) -> Plan:
        """Decodes, then running prefill chunks, then new prompts, within the token budget."""
        return schedule(self.spec, view)
