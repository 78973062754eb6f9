"""The compiled interpreter runs continuous batching as the general engine does, and the
roofline's aggregate forms equal its ``step``.

Specification: for every continuous-batching run (vLLM or Orca mode, any ordering) on paged KV
with recompute preemption and any number of replicas, the compiled interpreter
(``sim.engine.compiled``) gives the same request table, step table, irregular inter-token gaps
and summary, bit for bit, as the general engine with its per-step invariant checks on. Random
traces push it through KV preemption, the ``max_preemptions`` limit, prompts over the token
budget, ``max_model_len`` rejections, contexts outgrowing the cache, the watermark and the
horizon. The roofline's aggregate forms (``decode_step``, ``prefill_step``, ``prefill_cost``,
``mixed_step``) must equal ``step`` on every pure-decode batch, batch of whole prompts and mix
of the two, on every GPU and model.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sim
from policies.registry import make_policy
from sim.core.arrays import TraceArrays
from sim.core.types import BatchShape
from sim.cost.profiles import ProfileError
from sim.engine.coverage import fast_path_blocker
from sim.kv.config import KVConfig

PROFILES = Path(__file__).resolve().parent.parent / "hardware_profiles"
MODELS = sorted(p.stem for p in (PROFILES / "models").glob("*.yaml"))
GPUS = sorted(p.stem for p in (PROFILES / "gpus").glob("*.yaml"))


def assert_same_run(fast: sim.SimResult, slow: sim.SimResult) -> None:
    """Bit-identical tables, gaps and summary (NaN equal to NaN)."""
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=True)
    for a, b in zip(fast.irregular_itl_runs, slow.irregular_itl_runs, strict=True):
        np.testing.assert_array_equal(a, b)
    assert fast.summary.keys() == slow.summary.keys()
    for key, v in fast.summary.items():
        w = slow.summary[key]
        assert v == w or (isinstance(v, float) and math.isnan(v) and math.isnan(w)), key


# -- decode costs from aggregates --------------------------------------------------------------
@pytest.mark.parametrize("gpu", GPUS)
def test_decode_and_prefill_steps_equal_step_on_every_model(gpu):
    rng = np.random.default_rng(sum(map(ord, gpu)))
    for model in MODELS:
        for tp in (1, 2, 8):
            # the override makes the row cost fall with context, so the shortest row counts
            for overrides in ({}, {"attention_split_tokens": 50.0,
                                   "attention_row_tokens": 200.0}):
                try:
                    cost = sim.build_cost_model(model=model, hardware=gpu, tp=tp,
                                                engine="vllm", **overrides)
                except ProfileError:
                    continue  # weights do not fit, or heads do not split
                if cost.model.sliding_window is not None:
                    with pytest.raises(ValueError, match="sliding-window"):
                        cost.decode_step(1, 1, 1, 1)
                    with pytest.raises(ValueError, match="sliding-window"):
                        cost.prefill_step((5,))
                    with pytest.raises(ValueError, match="sliding-window"):
                        cost.prefill_cost((5,))
                    continue
                for rows in (1, 2, 3, 5):  # a prefill step's whole prompts
                    prompts = rng.integers(1, 5000, rows) * (rng.random(rows) < 0.8) + 1
                    want = cost.step(BatchShape(prompts, prompts))
                    got = cost.prefill_step(tuple(int(n) for n in prompts))
                    assert got == want, (model, tp, overrides, prompts)
                    lean = cost.prefill_cost(tuple(int(n) for n in prompts))
                    assert lean == (want.seconds, want.flops, want.bytes, want.bound)
                    # ... and the same prompts joining 40 decodes (an Orca step)
                    ctx = rng.integers(1, 30_000, 40)
                    want = cost.step(BatchShape(np.concatenate([np.ones(40, np.int64), prompts]),
                                                np.concatenate([ctx, prompts])))
                    got = cost.mixed_step(40, int(ctx.sum()), int(ctx.min()), int(ctx.max()),
                                          tuple(int(n) for n in prompts))
                    assert got == want, (model, tp, overrides, prompts, "mixed")
                for rows in (1, 2, 7, 64, 255):
                    ctx = rng.integers(1, 30_000, rows)
                    want = cost.step(BatchShape(np.ones(rows, dtype=np.int64), ctx))
                    got = cost.decode_step(rows, int(ctx.sum()), int(ctx.min()),
                                           int(ctx.max()))
                    assert got == (want.seconds, want.flops, want.bytes, want.bound), \
                        (model, tp, overrides, rows)


@pytest.mark.parametrize("cost", [sim.ConstantCost(0.25), sim.LinearCost(0.01, 1e-4, 3e-3)])
def test_analytic_decode_step_equals_step(cost):
    for rows in (1, 3, 100):
        want = cost.step(BatchShape.of([1] * rows, list(range(1, rows + 1))))
        assert cost.decode_step(rows, rows * (rows + 1) // 2, 1, rows) == (
            want.seconds, want.flops, want.bytes, want.bound)


class _DecodeOnly:
    """A cost model of its own (``decode_step`` alone): the general engine runs it."""

    def decode_step(self, rows, kv_tokens, c_min, c_max):
        return 0.1, 0.0, 0.0, "constant"


# -- which runs take it --------------------------------------------------------------------------
def test_only_the_covered_configurations_take_the_fast_path():
    cost = sim.ConstantCost(0.1)
    paged = KVConfig(num_blocks=100)
    ok = {"checks": False, "event_skipping": True}
    assert fast_path_blocker(make_policy("continuous"), paged, cost, **ok) == ""
    assert fast_path_blocker(make_policy({"name": "continuous", "mode": "orca"}), paged, cost,
                             **ok) == ""
    # every specification is covered since the compiled interpreter (orders, chunked prefill)
    assert fast_path_blocker(make_policy({"name": "continuous", "ordering": "spf"}), paged,
                             cost, **ok) == ""
    assert fast_path_blocker(make_policy("chunked_prefill"), paged, cost, **ok) == ""
    blocked = [
        (make_policy({"name": "continuous", "mode": "orca"}), paged, _DecodeOnly(), ok),
        (make_policy("continuous"), KVConfig(num_blocks=100, allocator="slab",
                                             reserve_tokens=64), cost, ok),
        (make_policy("continuous"), KVConfig(num_blocks=100, prefix_caching=True), cost, ok),
        (make_policy("continuous"), paged, cost, {**ok, "checks": True}),
        (make_policy("continuous"), paged, cost, {**ok, "event_skipping": False}),
        (make_policy("continuous"), paged, object(), ok),
    ]
    for policy, kv, c, kw in blocked:
        assert fast_path_blocker(policy, kv, c, **kw) != ""


# -- equivalence on random runs ------------------------------------------------------------------
@st.composite
def traces(draw):
    n = draw(st.integers(1, 30))
    gap = st.sampled_from([0.0, 0.0, 0.05, 0.25, 1.0]) | st.floats(0.0, 2.0)
    arrivals = np.cumsum(draw(st.lists(gap, min_size=n, max_size=n)))
    reqs = [sim.Request(id=i, arrival_s=float(arrivals[i]),
                        num_prompt_tokens=draw(st.integers(1, 80)),
                        num_output_tokens=draw(st.integers(1, 40))) for i in range(n)]
    order = draw(st.permutations(range(n)))
    return [reqs[i] for i in order]


policies_ = st.fixed_dictionaries({
    "name": st.just("continuous"),
    "max_num_seqs": st.integers(1, 12),
    "max_num_batched_tokens": st.sampled_from([16, 64, 256, 8192]),
    "watermark": st.sampled_from([0.0, 0.01, 0.2]),
    "mode": st.sampled_from(["vllm", "orca"]),
    "ordering": st.sampled_from(["fcfs", "fcfs", "spf", "priority"]),
})
kv_configs = st.none() | st.fixed_dictionaries(
    {"num_blocks": st.integers(1, 60), "block_size": st.sampled_from([1, 2, 4, 16])},
    optional={"max_preemptions": st.sampled_from([None, 0, 1, 3])})
costs = st.one_of(
    st.builds(sim.ConstantCost, step_s=st.sampled_from([0.25, 1.0]) | st.floats(1e-3, 1.0)),
    st.builds(sim.LinearCost, base_s=st.floats(1e-4, 0.05),
              per_token_s=st.floats(0.0, 1e-3), per_seq_s=st.floats(0.0, 1e-2)),
    st.just("roofline"),
)
ROOFLINE = sim.build_cost_model(model="llama-3-8b", hardware="h100-sxm", engine="vllm")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=traces(), spec=policies_, kv=kv_configs, cost=costs,
       max_model_len=st.sampled_from([None, None, 60]),
       horizon_s=st.sampled_from([None, None, 0.5, 3.0]),
       num_replicas=st.sampled_from([1, 1, 2, 3]))
def test_fast_path_equals_the_general_engine(reqs, spec, kv, cost, max_model_len, horizon_s,
                                             num_replicas):
    if cost == "roofline":  # a real roofline, arrivals on its time scale
        cost = ROOFLINE
        reqs = [sim.Request(r.id, r.arrival_s * 0.02, r.num_prompt_tokens,
                            r.num_output_tokens, r.priority) for r in reqs]
    kw = {"policy": spec, "cost": cost, "kv": kv, "max_model_len": max_model_len,
          "horizon_s": horizon_s, "num_replicas": num_replicas}
    fast = sim.simulate(reqs, **kw, fast_path="compiled")
    assert fast.engine == "compiled"
    slow = sim.simulate(reqs, **kw, checks=True)  # the general engine, invariants checked
    assert_same_run(fast, slow)


@pytest.mark.parametrize("mode", ["vllm", "orca"])
def test_fast_path_equals_the_general_engine_under_kv_pressure_at_scale(mode):
    # 600 requests of long-tailed traffic on a cache far too small: hundreds of preemptions.
    rng = np.random.default_rng(7)
    n = 600
    arrivals = np.cumsum(rng.exponential(0.02, n))
    prompts = np.minimum(rng.lognormal(5.5, 1.0, n).astype(int) + 1, 2000)
    outputs = np.minimum(rng.lognormal(4.5, 1.0, n).astype(int) + 1, 1000)
    reqs = [sim.Request(i, float(arrivals[i]), int(prompts[i]), int(outputs[i]))
            for i in range(n)]
    kw = {"policy": {"name": "continuous", "max_num_seqs": 64, "mode": mode}, "cost": ROOFLINE,
          "kv": {"num_blocks": 400, "block_size": 16}}
    fast = sim.simulate(reqs, **kw, fast_path="compiled")
    slow = sim.simulate(reqs, **kw, fast_path=False)
    assert fast.summary["num_preemptions"] > 100
    assert_same_run(fast, slow)


def test_a_wall_clock_budget_ends_a_fast_path_run_as_partial():
    reqs = [sim.Request(i, i * 0.01, 100, 5000) for i in range(200)]
    res = sim.simulate(reqs, policy="continuous", cost=sim.ConstantCost(0.01), kv=None,
                       wall_clock_s=1e-9, fast_path="compiled")
    assert res.summary["partial"] and res.summary["num_unfinished"] > 0


def test_long_decode_stretches_run_exactly():
    # Sparse arrivals and long outputs: most steps are long stretches of decodes, which the
    # general engine skips in numpy (``step_series``) and the interpreter steps one by one.
    rng = np.random.default_rng(11)
    n = 60
    reqs = [sim.Request(i, float(t), int(p), int(o)) for i, (t, p, o) in enumerate(zip(
        np.cumsum(rng.exponential(2.0, n)), rng.integers(10, 3000, n),
        rng.integers(50, 1500, n), strict=True))]
    kw = {"policy": "continuous", "cost": ROOFLINE, "kv": {"num_blocks": 3000}}
    fast = sim.simulate(reqs, **kw, fast_path="compiled")
    assert len(fast.steps) > 20 * n  # mostly decode steps
    assert_same_run(fast, sim.simulate(reqs, **kw, fast_path=False))


@pytest.mark.parametrize("fast_path", ["compiled", False])
def test_columnar_requests_give_the_same_run(fast_path):
    # A TraceArrays (ids = row numbers) simulates exactly like its Request objects.
    arrays = TraceArrays.from_requests(
        sim.Request(i, t, p, o) for i, (t, p, o) in enumerate(
            [(0.0, 40, 5), (0.0, 8, 30), (0.3, 500, 2), (0.1, 20, 9), (2.0, 7, 7)]))
    kw = {"policy": "continuous", "cost": ROOFLINE, "kv": {"num_blocks": 64},
          "fast_path": fast_path}
    assert_same_run(sim.simulate(arrays, **kw), sim.simulate(arrays.to_requests(), **kw))


def test_duplicate_ids_are_refused_on_the_fast_path_too():
    reqs = [sim.Request(1, 0.0, 5, 5), sim.Request(1, 1.0, 5, 5)]
    with pytest.raises(ValueError, match="ids must be unique"):
        sim.simulate(reqs, policy="continuous", cost=sim.ConstantCost(0.1), fast_path="compiled")
