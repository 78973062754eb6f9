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
"""
from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from typing import TypeGuard

from policies.batch_run import RunToCompletion, check_wait
from policies.ordering import ORDERINGS
from policies.registry import Policy, check_choice, check_positive, register
from sim.core.types import Plan, SeqView, View


def _is_count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


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
        self._key = self._bucket_key()
        self._batch = RunToCompletion()  # per-instance: one policy object per replica

    def _bucket_key(self) -> Callable[[SeqView], int] | None:
        spec = self.bucket_by_prompt
        if spec is None:
            return None
        if _is_count(spec):
            width = int(spec)
            return lambda s: (s.num_uncomputed - 1) // width
        bounds = list(spec) if isinstance(spec, (list, tuple)) else []
        ok = bool(bounds) and all(_is_count(b) for b in bounds) and all(
            a < b for a, b in pairwise(bounds))
        self._require(ok, "bucket_by_prompt", "expected null, a bucket width > 0 or a list "
                      f"of increasing positive token bounds, got {spec!r}")
        return lambda s: bisect_left(bounds, s.num_uncomputed)

    @property
    def max_num_seqs(self) -> int:  # type: ignore[override]  # read-only: derived
        """A batch never has more rows than ``max_batch_size``."""
        return self.max_batch_size

    def schedule(self, view: View) -> Plan:
        """Continue the batch in flight, else dispatch the first full or timed-out bucket."""
        return self._batch.schedule(view, self.ordering, self.max_batch_size, self.max_wait_s,
                                    self._key)
