"""Dynamic batching (Triton / TF-Serving): dispatch when full or when the oldest has waited.

Run-to-completion like ``static`` (shared code in ``policies.batch_run``), but a batch goes as
soon as ``max_batch_size`` requests wait or the oldest has waited ``max_wait_s``; requests that
arrive while a batch is pending simply join it, since the batch is the head of the queue at
dispatch time. A partial batch also goes at once when no more requests will arrive.

With ``bucket_by_prompt`` the queue is split into prompt-length buckets and only requests of one
bucket are batched together (padding-aware batching); each bucket fills and times out on its
own, and the first ready bucket in queue order is dispatched.

Parameters:

- ``max_batch_size`` (8): rows of a batch; also ``max_num_seqs`` and the slot capacity.
- ``max_wait_s`` (0.05): the longest the oldest request of a bucket waits for others.
- ``bucket_by_prompt`` (None): ``None`` for no buckets; an integer width ``w`` (prompts of
  1..w, w+1..2w, ... tokens share a bucket); or a list of increasing upper bounds, e.g.
  ``[128, 512, 2048]`` (a last bucket holds everything longer). Lengths are the tokens a
  request would prefill now (its prompt, or prompt + generated when recomputing).
- ``ordering`` ("fcfs" | "spf" | "priority"): queue order used to form batches.

A preset of the run-to-completion batch specification (``sim.core.batching.BatchSpec``):
``batch_size`` = ``max_batch_size``, ``wait_s`` = ``max_wait_s`` (an infinite wait is none),
``bucket_by_prompt``.
"""
from __future__ import annotations

from dataclasses import dataclass

from policies.batch_run import RunToCompletion, check_wait, wait_spec
from policies.ordering import ORDERINGS
from policies.registry import Policy, check_choice, check_positive, register
from sim.core.batching import BatchSpec, batch_domains
from sim.core.types import Plan, View


@register("dynamic")
@dataclass
class DynamicBatching(Policy):
    """Run-to-completion batches dispatched on size or timeout (see module docstring)."""

    max_batch_size: int = 8
    max_wait_s: float = 0.05
    bucket_by_prompt: int | list[int] | None = None
    ordering: str = "fcfs"

    def __post_init__(self) -> None:
        check_positive(self, max_batch_size=self.max_batch_size)
        check_wait(self, "max_wait_s", self.max_wait_s, optional=False)
        check_choice(self, "ordering", self.ordering, ORDERINGS)
        why = batch_domains()["bucket_by_prompt"].problem(self.bucket_by_prompt)
        self._require(not why, "bucket_by_prompt", why)
        self.spec = BatchSpec(batch_size=self.max_batch_size, wait_s=wait_spec(self.max_wait_s),
                              bucket_by_prompt=self.bucket_by_prompt, order=self.ordering)
        self._batch = RunToCompletion(self.spec)  # per-instance: one policy object per replica

    @property
    def max_num_seqs(self) -> int:  # type: ignore[override]  # read-only: derived
        """A batch never has more rows than ``max_batch_size``."""
        return self.max_batch_size

    def schedule(self, view: View) -> Plan:
        """Continue the batch in flight, else dispatch the first full or timed-out bucket."""
        return self._batch.schedule(view)
