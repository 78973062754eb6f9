"""The cost-model interface and the two analytic models used by tests and queueing checks.

A cost model is pure: it maps a ``BatchShape`` to a ``StepCost`` and knows nothing of requests,
ids or the clock (the httpx "transport + mock transport" pattern). ``peak_flops`` and
``peak_bytes_per_s`` (aggregate over the model's GPUs) let metrics report MFU and MBU; analytic
models leave them ``None``.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from sim.types import BatchShape, StepCost


@dataclass(frozen=True)
class StepSeries:
    """Costs of ``k`` successive decode steps (context +1 per row per step), as arrays."""

    seconds: np.ndarray
    flops: np.ndarray
    bytes: np.ndarray
    bound: tuple[str, ...]


@runtime_checkable
class CostModel(Protocol):
    """Anything with ``step(shape) -> StepCost``; ``step_time`` is the convenience form."""

    peak_flops: float | None
    peak_bytes_per_s: float | None

    def step(self, shape: BatchShape) -> StepCost:
        """Cost of one forward pass over ``shape``."""
        ...

    def step_time(self, new_tokens: Sequence[int], context_lens: Sequence[int]) -> float:
        """Seconds for one forward pass with these per-sequence new tokens and context lengths."""
        ...

    def step_series(self, shape: BatchShape, num_steps: int) -> StepSeries:
        """Costs of ``shape`` and the ``num_steps - 1`` steps after it, each row's context one
        token longer per step (what event skipping needs); equal to repeated ``step`` calls."""
        ...


def step_series(cost: CostModel, shape: BatchShape, num_steps: int) -> StepSeries:
    """``cost.step_series`` when the model has one, else repeated ``step`` calls (the one
    method DESIGN requires of a cost model is ``step``)."""
    method = getattr(cost, "step_series", None)
    if method is not None:
        return method(shape, num_steps)
    return _ShapeCost.step_series(cost, shape, num_steps)  # type: ignore[arg-type]


class _ShapeCost:
    """Mixin giving every cost model the list-based ``step_time`` form of the public API."""

    peak_flops: float | None = None
    peak_bytes_per_s: float | None = None

    def step(self, shape: BatchShape) -> StepCost:  # pragma: no cover - overridden
        raise NotImplementedError

    def step_time(self, new_tokens: Sequence[int], context_lens: Sequence[int]) -> float:
        """Seconds for one forward pass with these per-sequence new tokens and context lengths."""
        return self.step(BatchShape.of(list(new_tokens), list(context_lens))).seconds

    def step_series(self, shape: BatchShape, num_steps: int) -> StepSeries:
        """Repeated ``step`` calls with contexts growing by one; models override with numpy."""
        costs = [self.step(BatchShape(shape.new_tokens, shape.context_lens + j,
                                      shape.num_padding_tokens)) for j in range(num_steps)]
        return StepSeries(np.array([c.seconds for c in costs]), np.array([c.flops for c in costs]),
                          np.array([c.bytes for c in costs]), tuple(c.bound for c in costs))

    def _flat_series(self, shape: BatchShape, num_steps: int) -> StepSeries:
        """Series of a model whose cost does not depend on context length."""
        c = self.step(shape)
        return StepSeries(np.full(num_steps, c.seconds), np.full(num_steps, c.flops),
                          np.full(num_steps, c.bytes), (c.bound,) * num_steps)


@dataclass(frozen=True)
class ConstantCost(_ShapeCost):
    """Every step takes ``step_s`` whatever the batch: for exact-timing and queueing tests."""

    step_s: float

    def __post_init__(self) -> None:
        if not self.step_s > 0:
            raise ValueError(f"ConstantCost.step_s must be > 0, got {self.step_s}")

    def step(self, shape: BatchShape) -> StepCost:
        """Always ``step_s``."""
        return StepCost(self.step_s, bound="constant")

    def step_series(self, shape: BatchShape, num_steps: int) -> StepSeries:
        """``num_steps`` copies of ``step_s``."""
        return self._flat_series(shape, num_steps)


@dataclass(frozen=True)
class LinearCost(_ShapeCost):
    """``base_s + per_token_s × tokens + per_seq_s × rows``: a closed-form saturation model."""

    base_s: float
    per_token_s: float = 0.0
    per_seq_s: float = 0.0

    def __post_init__(self) -> None:
        if self.base_s < 0 or self.per_token_s < 0 or self.per_seq_s < 0:
            raise ValueError("LinearCost parameters must be >= 0")
        if self.base_s == 0 and self.per_token_s == 0 and self.per_seq_s == 0:
            raise ValueError("LinearCost needs at least one positive parameter")

    def step(self, shape: BatchShape) -> StepCost:
        """Linear in tokens computed and rows in the batch."""
        seconds = (self.base_s + self.per_token_s * shape.num_tokens
                   + self.per_seq_s * len(shape.new_tokens))
        return StepCost(seconds, bound="linear")

    def step_series(self, shape: BatchShape, num_steps: int) -> StepSeries:
        """Context length does not enter the linear model: a flat series."""
        return self._flat_series(shape, num_steps)
