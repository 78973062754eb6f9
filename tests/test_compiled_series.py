"""A skipped stretch costed in compiled code is the cost model's own steps, number for number.

``sim.engine.compiled_series.CompiledSeries`` costs the general engine's skipped decode
stretches for large runs; ``step_series`` (numpy, or repeated ``step`` calls) for the others.
Which one a run takes depends on its size and on numba's cache, so both must give each step's
``cost.step`` exactly: seconds, flops, bytes and bound. The same holds for the steps large
runs cost one at a time (``CompiledSeries.step``: prefill steps, padded or not).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim
from sim.core.types import BatchShape
from sim.cost.base import ConstantCost, LinearCost, step_series
from sim.engine.compiled_series import CompiledSeries
from sim.workload.build import build_workload_arrays

COSTS = {
    "llama-3-8b/h100 tp1": sim.build_cost_model(model="llama-3-8b", hardware="h100-sxm", tp=1,
                                                 engine="vllm"),
    "llama-3-70b/a100-80gb tp4": sim.build_cost_model(model="llama-3-70b",
                                                       hardware="a100-80gb", tp=4,
                                                       engine="vllm"),
    "llama-3-70b/h200 tp8": sim.build_cost_model(model="llama-3-70b", hardware="h200", tp=8),
    "constant": ConstantCost(0.01),
    "linear": LinearCost(0.002, 1e-5, 3e-5),
}
SERIES = {name: CompiledSeries(cost) for name, cost in COSTS.items()}


def _stepped(cost, shape: BatchShape, k: int) -> list[tuple]:
    return [(c.seconds, c.flops, c.bytes, c.bound) for c in (
        cost.step(BatchShape(shape.new_tokens, shape.context_lens + j, shape.num_padding_tokens))
        for j in range(k))]


def _rows(series) -> list[tuple]:
    return list(zip(series.seconds.tolist(), series.flops.tolist(), series.bytes.tolist(),
                    series.bound, strict=True))


@pytest.mark.parametrize("name", sorted(COSTS))
@settings(max_examples=40, deadline=None)
@given(context=st.lists(st.integers(1, 6000), min_size=1, max_size=48),
       k=st.integers(1, 400), padding=st.integers(0, 5))
def test_each_step_of_a_compiled_series_is_the_cost_models_step(name, context, k, padding):
    cost = COSTS[name]
    shape = BatchShape(np.ones(len(context), dtype=np.int64), np.array(context, dtype=np.int64),
                       min(padding, len(context)))
    got = SERIES[name](shape, k)
    assert _rows(got) == _stepped(cost, shape, k)
    assert _rows(got) == _rows(step_series(cost, shape, k))  # what a small run costs it with


@pytest.mark.parametrize("name", sorted(COSTS))
@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.tuples(st.sampled_from([1, 1, 1, 2, 16, 300, 2048]),
                               st.integers(0, 6000)), min_size=1, max_size=160))
def test_a_compiled_step_is_the_cost_models_step(name, rows):
    # any shape the general engine launches: decode rows, prompt chunks after a cached or
    # computed prefix, padding rows; past ROWS_IN_PYTHON rows the model takes numpy
    new = np.array([n for n, _ in rows], dtype=np.int64)
    ctx = np.array([n + c for n, c in rows], dtype=np.int64)
    shape = BatchShape(new, ctx, int(new[-1]) if len(rows) > 1 else 0)
    want, got = COSTS[name].step(shape), SERIES[name].step(shape)
    assert (got.seconds, got.flops, got.bytes, got.bound) == (
        want.seconds, want.flops, want.bytes, want.bound)


def test_a_step_of_other_integer_columns_is_left_to_the_cost_model():
    cost = COSTS["llama-3-8b/h100 tp1"]
    shape = BatchShape(np.array([7, 1], dtype=np.int32), np.array([7, 40], dtype=np.int32))
    assert SERIES["llama-3-8b/h100 tp1"].step(shape) == cost.step(shape)  # its breakdown too


def test_a_stretch_with_prefill_rows_is_left_to_step_series():
    cost = COSTS["llama-3-8b/h100 tp1"]
    shape = BatchShape(np.array([1, 7]), np.array([40, 7]))
    assert _rows(SERIES["llama-3-8b/h100 tp1"](shape, 5)) == _stepped(cost, shape, 5)


def test_a_cost_model_the_interpreter_does_not_cost_is_refused():
    windowed = sim.build_cost_model(model="mistral-7b", hardware="h100-sxm", tp=1)
    assert windowed.model.sliding_window is not None
    with pytest.raises(ValueError, match="not costed by the compiled interpreter"):
        CompiledSeries(windowed)


@pytest.mark.parametrize("policy", [{"name": "static", "batch_size": 8, "timeout_s": 0.2},
                                    {"name": "dynamic", "max_batch_size": 8, "max_wait_s": 0.1}])
def test_a_run_on_compiled_stretch_costs_is_the_run_on_numpy_ones(policy, monkeypatch):
    from sim.engine import simulate as simulate_module

    spec = {"arrival": {"process": "poisson", "rate": 4.0}, "num_requests": 400,
            "lengths": {"dist": "empirical", "trace": "azure-conv"}}
    reqs = build_workload_arrays(spec, np.random.default_rng(3))
    cost = COSTS["llama-3-8b/h100 tp1"]
    calls = []

    class Counted(CompiledSeries):
        def __call__(self, shape, num_steps):
            calls.append(num_steps)
            return super().__call__(shape, num_steps)

    def run(series):
        monkeypatch.setattr(simulate_module, "_compiled_series", lambda *a: series)
        return sim.simulate(reqs, policy=policy, cost=cost, kv={"block_size": 16,
                                                                "num_blocks": 3000})

    compiled, numpy_costed = run(Counted(cost)), run(None)
    assert len(calls) > 50  # every batch's run was costed in compiled code
    pd.testing.assert_frame_equal(compiled.steps, numpy_costed.steps, check_exact=True)
    pd.testing.assert_frame_equal(compiled.requests, numpy_costed.requests, check_exact=True)
    assert compiled.summary == numpy_costed.summary


def test_only_runs_that_repay_loading_numba_take_compiled_stretch_costs(monkeypatch):
    import sim.engine.compiled_cache as compiled_cache
    from sim.engine import simulate as simulate_module
    from sim.engine.simulate import SERIES_COLD_MIN_REQUESTS, SERIES_MIN_REQUESTS

    series = simulate_module._compiled_series
    cost = COSTS["llama-3-8b/h100 tp1"]
    below, cached_size = SERIES_MIN_REQUESTS - 1, SERIES_MIN_REQUESTS
    assert series(cost, below, 1, True, True) is None  # numba would cost more than it saves
    assert series(cost, 2 * below, 2, True, True) is None  # counted per replica
    monkeypatch.setattr(compiled_cache, "loop_is_cached",
                        lambda *a, **k: True)
    assert isinstance(series(cost, cached_size, 1, True, True), CompiledSeries)
    assert series(cost, cached_size, 1, "interpreted", True) is None
    assert series(cost, cached_size, 1, True, False) is None  # nothing is skipped
    windowed = sim.build_cost_model(model="mistral-7b", hardware="h100-sxm", tp=1)
    assert series(windowed, cached_size, 1, True, True) is None
    monkeypatch.setattr(compiled_cache, "loop_is_cached",
                        lambda *a, **k: False)
    assert series(cost, cached_size, 1, True, True) is None  # a cold cache: compiling too
    assert isinstance(series(cost, SERIES_COLD_MIN_REQUESTS, 1, True, True), CompiledSeries)


def test_the_cache_check_sees_the_compiled_stretch_costs():
    from sim.engine import compiled_skip
    from sim.engine.compiled_cache import loop_is_cached

    shape = BatchShape(np.ones(3, dtype=np.int64), np.array([5, 9, 40]))
    SERIES["llama-3-8b/h100 tp1"](shape, 8)  # compiled (or loaded) in this process
    assert compiled_skip.decode_series.overloads
    assert loop_is_cached(series=True)
    assert compiled_skip.decode_series._cache._cache_file._load_index()  # written to the cache
