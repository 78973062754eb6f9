"""Static (request-level) batching, as FasterTransformer serves: fill a batch, run it to the end.

Requests accumulate until ``batch_size`` are waiting (or the oldest has waited ``timeout_s``, or
the trace has no more arrivals); the batch is then prefilled in one step padded to its longest
prompt and decoded until its last member finishes. Finished members keep their slot and are
computed as padding; nobody joins a batch in flight. Both wastes show in the metrics:
``padding_fraction`` (padding tokens) and ``slot_utilization`` (real rows / ``batch_size``).
See ``policies.batch_run`` for the padding rows, KV limits and preemption.

Parameters:

- ``batch_size`` (8): rows of a batch; also the engine's ``max_num_seqs`` and the slot capacity.
- ``timeout_s`` (None): dispatch a partial batch once its oldest request has waited this long;
  ``None`` waits for a full batch (a partial one still goes when no more requests will arrive).
- ``ordering`` ("fcfs" | "spf" | "priority"): which waiting requests form the next batch.

A preset of the run-to-completion batch specification (``sim.core.batching.BatchSpec``):
``batch_size``, ``wait_s`` = ``timeout_s`` (an infinite timeout is none), no buckets.
"""
from __future__ import annotations

from dataclasses import dataclass

from policies.batch_run import RunToCompletion, check_wait, wait_spec
from policies.ordering import ORDERINGS
from policies.registry import Policy, check_choice, check_positive, register
from sim.core.batching import BatchSpec
from sim.core.types import Plan, View


@register("static")
@dataclass
class StaticBatching(Policy):
    """Request-level batching with a fixed batch size (see module docstring)."""

    batch_size: int = 8
    timeout_s: float | None = None
    ordering: str = "fcfs"

    def __post_init__(self) -> None:
        check_positive(self, batch_size=self.batch_size)
        check_wait(self, "timeout_s", self.timeout_s, optional=True)
        check_choice(self, "ordering", self.ordering, ORDERINGS)
        self.spec = BatchSpec(batch_size=self.batch_size, wait_s=wait_spec(self.timeout_s),
                              order=self.ordering)
        self._batch = RunToCompletion(self.spec)  # per-instance: one policy object per replica

    @property
    def max_num_seqs(self) -> int:  # type: ignore[override]  # read-only: derived
        """A batch never has more rows than ``batch_size``."""
        return self.batch_size

    def schedule(self, view: View) -> Plan:
        """Continue the batch in flight, else dispatch a full (or timed-out) one."""
        return self._batch.schedule(view)
