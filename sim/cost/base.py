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

from sim.core.errors import InputError
from sim.core.fields import is_real
from sim.core.types import BatchShape, StepCost

#: Shortest step an analytic model may take: below it float time (ulp ~1e-7 s at t ~ 1e9 s,
#: the longest trace allowed) stops advancing, and results would be nonsense.
MIN_STEP_S = 1e-6
#: Longest step (a day): anything longer is a units mistake.
MAX_STEP_S = 86_400.0


def linear_seconds(base_s: float, per_token_s: float, per_seq_s: float, tokens: int,
                   rows: int) -> float:
    """``LinearCost``'s step time: ``base_s + per_token_s × tokens + per_seq_s × rows`` (a plain
    function of numbers, so the compiled interpreter compiles this very rule)."""
    return base_s + per_token_s * tokens + per_seq_s * rows


@dataclass(frozen=True)
class StepSeries:
    """Costs of ``k`` successive decode steps (context +1 per row per step), as arrays."""

    seconds: np.ndarray
    flops: np.ndarray
    bytes: np.ndarray
    bound: tuple[str, ...]


class SupportsStep(Protocol):
    """The one method every cost model must have."""

    def step(self, shape: BatchShape) -> StepCost:
        """Cost of one forward pass over ``shape``."""
        ...


@runtime_checkable
class CostModel(Protocol):
    """Anything with ``step(shape) -> StepCost``; ``step_time`` is the convenience form."""

    # read-only: a frozen dataclass (``RooflineCost``) provides them
    @property
    def peak_flops(self) -> float | None:
        """Peak FLOP/s over the model's GPUs (for MFU); ``None`` for analytic models."""
        ...

    @property
    def peak_bytes_per_s(self) -> float | None:
        """Peak HBM bytes/s over the model's GPUs (for MBU); ``None`` for analytic models."""
        ...

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


@runtime_checkable
class AggregateCost(SupportsStep, Protocol):
    """The aggregate forms of ``step``: costs of a batch given by its aggregates (row count,
    total context, shortest and longest row, whole prompts), each bit-identical to ``step`` on
    the batch it describes. ``ConstantCost``, ``LinearCost`` and ``RooflineCost`` have all
    three."""

    def decode_step(self, rows: int, kv_tokens: int, c_min: int, c_max: int
                    ) -> tuple[float, float, float, str]:
        """``(seconds, flops, bytes, bound)`` of ``rows`` one-token decodes attending
        ``kv_tokens`` keys in all, the shortest context ``c_min``, the longest ``c_max``."""
        ...

    def decode_series(self, rows: int, kv_tokens: int, c_min: int, c_max: int, k: int
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
        """``decode_step`` of ``k`` successive steps, every context a token longer each step,
        as arrays ``(seconds, flops, bytes, bounds)``."""
        ...

    def mixed_step(self, dec_rows: int, dec_kv: int, dec_c_min: int, dec_c_max: int,
                   prompts: tuple[int, ...]) -> StepCost:
        """``step`` of ``dec_rows`` decodes (as ``decode_step``'s arguments) batched with
        whole ``prompts`` (Orca's mixed steps)."""
        ...


@runtime_checkable
class PrefillCost(Protocol):
    """A cost model that costs whole-prompt batches without building a ``BatchShape``
    (``RooflineCost``); optional: ``isinstance(cost, PrefillCost)`` tells."""

    def prefill_cost(self, prompts: tuple[int, ...]) -> tuple[float, float, float, str]:
        """``(seconds, flops, bytes, bound)`` of ``step`` on a batch of whole ``prompts``."""
        ...


@runtime_checkable
class KVSizedCost(Protocol):
    """A cost model that knows its hardware's memory (``RooflineCost``), so a KV block count
    can be derived from it; optional: ``isinstance(cost, KVSizedCost)`` tells."""

    def kv_capacity_tokens(self, gpu_memory_utilization: float = ...,
                           activation_reserve_gb: float = ...) -> int:
        """KV tokens that fit per replica after the weights and an activation reserve."""
        ...


def step_series(cost: SupportsStep, shape: BatchShape, num_steps: int) -> StepSeries:
    """``cost.step_series`` when the model has one, else repeated ``step`` calls (the one
    method every cost model must have is ``step``)."""
    method = getattr(cost, "step_series", None)
    if method is not None:
        return method(shape, num_steps)
    return _stepped_series(cost, shape, num_steps)


def _stepped_series(cost: SupportsStep, shape: BatchShape, num_steps: int) -> StepSeries:
    """Repeated ``cost.step`` calls with contexts growing by one, as a ``StepSeries``."""
    costs = [cost.step(BatchShape(shape.new_tokens, shape.context_lens + j,
                                  shape.num_padding_tokens)) for j in range(num_steps)]
    return StepSeries(np.array([c.seconds for c in costs]), np.array([c.flops for c in costs]),
                      np.array([c.bytes for c in costs]), tuple(c.bound for c in costs))


class ShapeCost:
    """Mixin giving every cost model the list-based ``step_time`` form of the public API."""

    peak_flops: float | None = None
    peak_bytes_per_s: float | None = None

    def step(self, shape: BatchShape) -> StepCost:  # pragma: no cover - overridden
        """The cost of one forward pass of ``shape`` (each model defines it)."""
        raise NotImplementedError

    def step_time(self, new_tokens: Sequence[int], context_lens: Sequence[int]) -> float:
        """Seconds for one forward pass with these per-sequence new tokens and context lengths."""
        return self.step(BatchShape.of(list(new_tokens), list(context_lens))).seconds

    def step_series(self, shape: BatchShape, num_steps: int) -> StepSeries:
        """Repeated ``step`` calls with contexts growing by one; models override with numpy."""
        return _stepped_series(self, shape, num_steps)

    def _flat_series(self, shape: BatchShape, num_steps: int) -> StepSeries:
        """Series of a model whose cost does not depend on context length."""
        c = self.step(shape)
        return StepSeries(np.full(num_steps, c.seconds), np.full(num_steps, c.flops),
                          np.full(num_steps, c.bytes), (c.bound,) * num_steps)


def _seconds(value: object, name: str) -> float:
    """A cost parameter as float seconds; anything but a real number (``sim.core.fields``'
    rule: a string such as ``"0.01"``, a bool) is an ``InputError`` at ``cost.<name>``."""
    if not is_real(value):
        raise InputError(f"expected a number of seconds, got {value!r}", field=f"cost.{name}")
    return float(value)  # type: ignore[arg-type]


@dataclass(frozen=True)
class ConstantCost(ShapeCost):
    """Every step takes ``step_s`` whatever the batch: for exact-timing and queueing tests."""

    step_s: float

    def __post_init__(self) -> None:
        # an int literal stays exact; a string or a bool is no number of seconds
        object.__setattr__(self, "step_s", _seconds(self.step_s, "step_s"))
        if not MIN_STEP_S <= self.step_s <= MAX_STEP_S:
            raise InputError(f"must be in [{MIN_STEP_S:g}, {MAX_STEP_S:g}] s, got "
                             f"{self.step_s:g}", field="cost.step_s")

    def step(self, shape: BatchShape) -> StepCost:
        """Always ``step_s``."""
        return StepCost(self.step_s, bound="constant")

    def decode_step(self, rows: int, kv_tokens: int, c_min: int, c_max: int
                    ) -> tuple[float, float, float, str]:
        """``(seconds, flops, bytes, bound)`` of a pure-decode step from aggregates (as
        ``RooflineCost.decode_step``): always ``step_s``."""
        return self.step_s, 0.0, 0.0, "constant"

    def decode_series(self, rows: int, kv_tokens: int, c_min: int, c_max: int, k: int
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
        """``k`` successive ``decode_step`` results as arrays."""
        return _flat_decode(self.decode_step(rows, kv_tokens, c_min, c_max), k)

    def mixed_step(self, dec_rows: int, dec_kv: int, dec_c_min: int, dec_c_max: int,
                   prompts: tuple[int, ...]) -> StepCost:
        """``step`` of decodes batched with whole prompts (as ``RooflineCost.mixed_step``)."""
        return StepCost(self.step_s, bound="constant")

    def step_series(self, shape: BatchShape, num_steps: int) -> StepSeries:
        """``num_steps`` copies of ``step_s``."""
        return self._flat_series(shape, num_steps)


@dataclass(frozen=True)
class LinearCost(ShapeCost):
    """``base_s + per_token_s × tokens + per_seq_s × rows``: a closed-form saturation model."""

    base_s: float
    per_token_s: float = 0.0
    per_seq_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("base_s", "per_token_s", "per_seq_s"):
            value = _seconds(getattr(self, name), name)
            object.__setattr__(self, name, value)
            if not 0 <= value <= MAX_STEP_S:
                raise InputError(f"must be in [0, {MAX_STEP_S:g}] s, got {value:g}",
                                 field=f"cost.{name}")
        if self.base_s + self.per_token_s + self.per_seq_s < MIN_STEP_S:
            raise InputError(f"a one-token step would take less than {MIN_STEP_S:g} s; give "
                             "base_s, per_token_s or per_seq_s a positive value",
                             field="cost.base_s")

    def step(self, shape: BatchShape) -> StepCost:
        """Linear in tokens computed and rows in the batch."""
        return StepCost(linear_seconds(self.base_s, self.per_token_s, self.per_seq_s,
                                       shape.num_tokens, len(shape.new_tokens)), bound="linear")

    def decode_step(self, rows: int, kv_tokens: int, c_min: int, c_max: int
                    ) -> tuple[float, float, float, str]:
        """``(seconds, flops, bytes, bound)`` of ``rows`` one-token decodes, as ``step``."""
        return (linear_seconds(self.base_s, self.per_token_s, self.per_seq_s, rows, rows), 0.0,
                0.0, "linear")

    def decode_series(self, rows: int, kv_tokens: int, c_min: int, c_max: int, k: int
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
        """``k`` successive ``decode_step`` results as arrays (context does not enter)."""
        return _flat_decode(self.decode_step(rows, kv_tokens, c_min, c_max), k)

    def mixed_step(self, dec_rows: int, dec_kv: int, dec_c_min: int, dec_c_max: int,
                   prompts: tuple[int, ...]) -> StepCost:
        """``step`` of ``dec_rows`` decodes batched with whole ``prompts``."""
        return StepCost(linear_seconds(self.base_s, self.per_token_s, self.per_seq_s,
                                       dec_rows + sum(prompts), dec_rows + len(prompts)),
                        bound="linear")


    def step_series(self, shape: BatchShape, num_steps: int) -> StepSeries:
        """Context length does not enter the linear model: a flat series."""
        return self._flat_series(shape, num_steps)


def _flat_decode(cost: tuple[float, float, float, str], k: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """``k`` copies of one ``decode_step`` result, as ``decode_series`` returns them."""
    seconds, flops, nbytes, bound = cost
    return np.full(k, seconds), np.full(k, flops), np.full(k, nbytes), [bound] * k
