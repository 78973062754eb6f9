"""A skipped stretch's step costs in compiled code, for the general engine's large runs.

When the general engine skips a stretch of decode steps (``sim.engine.skipping``, and a static
or dynamic batch's run in ``sim.engine.batch_skip``) it costs every step of it at once:
``CostModel.step_series``, the roofline's in numpy. On a batch of a few dozen rows and a few
hundred steps those are some forty numpy calls of a microsecond or more each, about a fifth
of a static batching run. ``CompiledSeries`` costs the same steps in one compiled call, each
by the cost model's own step rule as the compiled interpreter costs it
(``compiled_skip.decode_series``: ``compiled_cost.step_cost`` from ``sim.cost.roofline_terms``).
The numbers are the same: each step's seconds, flops, bytes and bound are ``cost.step``'s for
that step, as the numpy series' are (``tests/test_compiled_series.py`` checks both against
``step``). ``simulate`` takes it for runs large enough to repay loading numba
(``sim.engine.simulate.SERIES_MIN_REQUESTS``); what it does not cover (a prefill row, a cost
model the interpreter does not cost itself, a stretch of one or two steps) goes to
``step_series``. ``CompiledSeries.step`` costs the steps that are not skipped (a batch's
prefill, padded rows and all) likewise: ``compiled_skip.shape_step``, from the batch's
reductions as the roofline's ``step`` takes them (``roofline_terms.batch_reductions``).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from sim.core.types import BatchShape, StepCost
from sim.cost.base import StepSeries, step_series
from sim.engine.compiled_cache import direct
from sim.engine.compiled_cost import BOUND_NAMES, cost_inputs
from sim.engine.compiled_skip import decode_series, shape_step
from sim.engine.coverage import cost_kind

#: Shortest stretch costed in compiled code (``step_series`` itself steps shorter ones).
MIN_STEPS = 3


class CompiledSeries:
    """``step_series(cost, shape, num_steps)`` for a cost model the compiled interpreter costs
    itself (``coverage.cost_kind`` >= 0), pure-decode stretches in compiled code."""

    def __init__(self, cost: Any) -> None:
        kind = cost_kind(cost)
        if kind < 0:
            raise ValueError(f"{type(cost).__name__} is not costed by the compiled interpreter")
        self.cost = cost
        self._inputs = cost_inputs(cost, kind)
        self._call: Any = None  # ``decode_series`` without numba's type dispatch, once known
        self._step_call: Any = None  # ``shape_step`` likewise

    def __call__(self, shape: BatchShape, num_steps: int) -> StepSeries:
        """The costs of ``num_steps`` decode steps from ``shape`` on, each row one token
        longer a step (``CostModel.step_series``)."""
        new, ctx = shape.new_tokens, shape.context_lens
        rows = len(new)
        if num_steps < MIN_STEPS or not rows or not (new == 1).all():
            return step_series(self.cost, shape, num_steps)
        seconds, flops, nbytes = np.empty(num_steps), np.empty(num_steps), np.empty(num_steps)
        bounds = np.empty(num_steps, dtype=np.int8)
        args = (*self._inputs, rows, int(ctx.sum()), int(ctx.min()), int(ctx.max()), seconds,
                flops, nbytes, bounds)
        if self._call is None:
            decode_series(*args)
            self._call = direct(decode_series, args)
        else:
            self._call(*args)
        first = int(bounds[0])
        if (bounds == first).all():  # one bound all along: the usual stretch
            bound = (BOUND_NAMES[first],) * num_steps
        else:
            bound = tuple(BOUND_NAMES[b] for b in bounds.tolist())
        return StepSeries(seconds, flops, nbytes, bound)

    def step(self, shape: BatchShape) -> StepCost:
        """``cost.step(shape)``'s seconds, flops, bytes and bound in one compiled call (no
        per-operator breakdown: the engine reads none); a shape whose columns are not
        contiguous int64 arrays goes to ``cost.step``."""
        new, ctx = shape.new_tokens, shape.context_lens
        if (not len(new) or new.dtype != np.int64 or ctx.dtype != np.int64
                or not (new.flags.c_contiguous and ctx.flags.c_contiguous)):
            return self.cost.step(shape)
        args = (*self._inputs, new, ctx)
        if self._step_call is None:
            seconds, flops, nbytes, bound = shape_step(*args)
            self._step_call = direct(shape_step, args)
        else:
            seconds, flops, nbytes, bound = self._step_call(*args)
        return StepCost(seconds, flops, nbytes, BOUND_NAMES[bound])
