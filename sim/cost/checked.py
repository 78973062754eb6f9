"""Step times of a user's cost model, checked as the engines read them.

A cost model is user code: one that returns a NaN, negative or infinite step time would give
NaN, negative or infinite latencies with no error (or stall the clock). ``checked_cost`` wraps
any model that is not one of the built-in ones (whose parameters are validated when they are
built, so their steps cannot go wrong) in a proxy that checks every step time it hands out and
raises ``InputError`` naming the model and the method. The proxy exposes exactly the methods
the model has, so the engines pick the same paths for it.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from sim.core.errors import InputError
from sim.cost.base import MAX_STEP_S, ConstantCost, LinearCost, StepSeries

#: Methods whose result carries step times, and how to read the seconds out of it.
_SECONDS: dict[str, Callable[[Any], Any]] = {
    "step": lambda r: r.seconds,
    "mixed_step": lambda r: r.seconds,
    "step_time": lambda r: r,
    "decode_step": lambda r: r[0],
    "prefill_cost": lambda r: r[0],
    "decode_series": lambda r: r[0],
    "step_series": lambda r: r.seconds if isinstance(r, StepSeries) else r,
}


def checked_cost(cost: Any) -> Any:
    """``cost`` itself when it is a built-in model, else a proxy checking every step time
    (``InputError`` when ``cost`` has no ``step`` at all)."""
    from sim.cost.roofline import RooflineCost

    if type(cost) in (ConstantCost, LinearCost, RooflineCost):
        return cost
    if not callable(getattr(cost, "step", None)):
        raise InputError(f"expected a cost model (an object with step(shape) -> StepCost), "
                         f"got {type(cost).__name__}", field="cost")
    return CheckedCost(cost)


def check_seconds(seconds: Any, cost: Any, method: str) -> None:
    """Raise unless every step time in ``seconds`` is finite and in ``[0, MAX_STEP_S]``."""
    if isinstance(seconds, float | int) and not isinstance(seconds, bool):
        if 0 <= seconds <= MAX_STEP_S:  # False for NaN
            return
        bad: Any = seconds
    else:
        values = np.asarray(seconds, dtype=np.float64)
        with np.errstate(invalid="ignore"):
            wrong = ~((values >= 0) & (values <= MAX_STEP_S))
        if not wrong.any():
            return
        bad = float(values[int(np.argmax(wrong))])
    shown = repr(bad) if not isinstance(bad, float) or math.isfinite(bad) else str(bad)
    raise InputError(f"{type(cost).__name__}.{method} returned a step time of {shown} s; a "
                     f"step must take a finite time in [0, {MAX_STEP_S:g}] s", field="cost")


class CheckedCost:
    """A user's cost model whose step times are checked (see the module docstring)."""

    def __init__(self, cost: Any) -> None:
        self._cost = cost

    def __getattr__(self, name: str) -> Any:
        # only called for names the proxy itself lacks: everything but ``_cost``
        if name == "_cost":  # not set yet (copy or unpickle): no recursion into __getattr__
            raise AttributeError(name)
        attr = getattr(self._cost, name)
        if name == "decode_step_for_rows" and callable(attr):
            return lambda rows: self._checked(attr(rows), "decode_step")
        if name in _SECONDS and callable(attr):
            return self._checked(attr, name)
        return attr

    def _checked(self, method: Callable[..., Any], name: str) -> Callable[..., Any]:
        read, cost = _SECONDS[name], self._cost

        def call(*args: Any, **kwargs: Any) -> Any:
            result = method(*args, **kwargs)
            check_seconds(read(result), cost, name)
            return result

        return call
