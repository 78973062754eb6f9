"""The run-to-completion batch specification: request-level batching written as data.

``BatchSpec`` says how a run-to-completion batcher forms its batches — how many rows, how long
a partial batch waits, whether prompts are grouped by length, and in which order the waiting
queue is read — and ``policies.batch_run`` is its one reference interpreter. The built-in
``static`` (FasterTransformer) and ``dynamic`` (Triton, TF-Serving) policies are presets of it.
What a batch does once it runs is the same for every specification: one padded prefill, decode
steps until its last member finishes, finished members kept as padding rows, nobody joining
(``policies.batch_run``). Each field declares its domain as data (``Domain``), as the
iteration-level ``SchedulingSpec`` does, so validation, documentation and the tests' random
specifications derive from it; the orders are ``SchedulingSpec``'s, with the same codes in a
compiled interpreter.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

from sim.core.errors import InputError
from sim.core.scheduling import ORDERS, Domain, bucket_bounds, domains, field_problem, spec_field

#: Waiting-queue orders a batch is formed in: the first three of ``SchedulingSpec.order``,
#: with the same codes.
BATCH_ORDERS = ORDERS[:3]


@dataclass(frozen=True)
class BatchSpec:
    """How a run-to-completion batcher forms batches (the fields' domains: ``batch_domains()``).

    Defaults are ``static``'s: batches of 8, dispatched only when full (or when no more
    requests will arrive), in arrival order.
    """

    batch_size: int = spec_field(8, Domain(
        "int", "Rows of a batch: the most requests it runs together, and its slot capacity.",
        minimum=1))
    wait_s: float | None = spec_field(None, Domain(
        "float", "A partial batch goes once its oldest request has waited this long (`null`: "
        "only a full batch goes, or a partial one when no more requests will arrive).",
        minimum=0.0, optional=True))
    bucket_by_prompt: int | Sequence[int] | None = spec_field(None, Domain(
        "buckets", "Prompt-length buckets batched apart (`null`: one queue): a width `w` "
        "(prompts of 1..w, w+1..2w, ... tokens), or increasing upper bounds (a last bucket "
        "holds everything longer); each bucket fills and times out on its own.",))
    order: str = spec_field("fcfs", Domain(
        "choice", "Waiting-queue order batches are formed in: `fcfs` (preempted first, then "
        "arrival), `spf` (shortest prompt first), `priority` (higher value first); ties keep "
        "the `fcfs` order.", choices=BATCH_ORDERS))

    def __post_init__(self) -> None:
        bad = self.problem()
        if bad:
            raise InputError(bad[1], field=f"policy.{bad[0]}")
        b = self.bucket_by_prompt
        if b is not None:  # a plain int or a tuple: hashable, as a frozen value must be
            bounds = bucket_bounds(b)
            assert bounds is not None  # checked by its domain above
            object.__setattr__(self, "bucket_by_prompt",
                               bounds[0] if isinstance(b, numbers.Integral) else bounds)

    def problem(self) -> tuple[str, str] | None:
        """The first ``(field, problem)`` of an invalid specification, else ``None``."""
        return field_problem(self)

    @property
    def wait_or_inf_s(self) -> float:
        """``wait_s`` as the rules take it: ``inf`` for none."""
        return math.inf if self.wait_s is None else float(self.wait_s)

    @property
    def bucket_width(self) -> int:
        """The buckets' width (0 when the buckets are bounds, or there are none)."""
        b = self.bucket_by_prompt
        return b if isinstance(b, int) else 0

    @property
    def bucket_upper_bounds(self) -> tuple[int, ...]:
        """The buckets' increasing upper bounds (empty for a width, or no buckets)."""
        b = self.bucket_by_prompt
        return () if b is None or isinstance(b, int) else tuple(b)


def batch_domains() -> dict[str, Domain]:
    """Every field of ``BatchSpec`` with its domain, in declaration order."""
    return domains(BatchSpec)
