"""The compiled fast path (``sim.engine.fastkernel``) is the interpreted one, only faster.

Specification: every run the kernel covers (vLLM-mode continuous batching on a roofline cost
model, FCFS, paged KV with recompute) gives the same request table, step table, irregular gaps
and summary, bit for bit, whether ``simulate`` runs it compiled, interpreted or on the general
engine with its invariant checks — through KV preemption, the preemption limit, budget and
``max_model_len`` rejections, contexts outgrowing the cache, horizons, several replicas and a
roofline whose decode tail looks at the shortest context too. ``fast_path=True`` compiles only
runs large enough to repay loading the kernel.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sim
import sim.engine.fastkernel as fastkernel
from policies.registry import make_policy
from tests.test_fastpath import ROOFLINE, assert_same_run, costs, traces

#: A roofline whose fitted row cost falls with context: the decode tail reads the shortest row.
MIN_CONTEXT_ROOFLINE = sim.build_cost_model(model="llama-3-8b", hardware="h100-sxm",
                                            engine="vllm", attention_split_tokens=50.0,
                                            attention_row_tokens=200.0)

vllm_policies = st.fixed_dictionaries({
    "name": st.just("continuous"),
    "max_num_seqs": st.integers(1, 12),
    "max_num_batched_tokens": st.sampled_from([16, 64, 256, 8192]),
    "watermark": st.sampled_from([0.0, 0.01, 0.2]),
})
kv_configs = st.none() | st.fixed_dictionaries(
    {"num_blocks": st.integers(1, 60), "block_size": st.sampled_from([1, 2, 4, 16])},
    optional={"max_preemptions": st.sampled_from([None, 0, 1, 3])})


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=traces(), spec=vllm_policies, kv=kv_configs,
       cost=st.sampled_from([ROOFLINE, MIN_CONTEXT_ROOFLINE]) | costs.filter(
           lambda c: c != "roofline"),
       max_model_len=st.sampled_from([None, None, 60]),
       horizon_s=st.sampled_from([None, None, 0.01, 0.06]),
       num_replicas=st.sampled_from([1, 1, 2, 3]))
def test_compiled_equals_the_general_engine(reqs, spec, kv, cost, max_model_len, horizon_s,
                                            num_replicas):
    if isinstance(cost, type(ROOFLINE)):  # arrivals on the roofline's time scale
        reqs = [sim.Request(r.id, r.arrival_s * 0.02, r.num_prompt_tokens, r.num_output_tokens)
                for r in reqs]
    kw = {"policy": spec, "cost": cost, "kv": kv, "max_model_len": max_model_len,
          "horizon_s": horizon_s, "num_replicas": num_replicas}
    compiled = sim.simulate(reqs, **kw, fast_path="compiled")
    assert_same_run(compiled, sim.simulate(reqs, **kw, checks=True))


def _long_tailed(n: int, seed: int, mean_gap_s: float) -> list[sim.Request]:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(mean_gap_s, n))
    prompts = np.minimum(rng.lognormal(5.5, 1.0, n).astype(int) + 1, 2000)
    outputs = np.minimum(rng.lognormal(4.5, 1.0, n).astype(int) + 1, 1000)
    return [sim.Request(i, float(arrivals[i]), int(prompts[i]), int(outputs[i]))
            for i in range(n)]


@pytest.mark.parametrize("cost", [ROOFLINE, MIN_CONTEXT_ROOFLINE], ids=["max", "min-and-max"])
def test_compiled_equals_interpreted_under_kv_pressure_at_scale(cost):
    # 3,000 requests on a cache far too small: many preemptions, several per request at times,
    # prompts pushed over the budget by recompute, a preemption limit rejecting some.
    reqs = _long_tailed(3000, 7, 0.02)
    kw = {"policy": {"name": "continuous", "max_num_seqs": 64, "max_num_batched_tokens": 1024},
          "cost": cost, "kv": {"num_blocks": 400, "block_size": 16, "max_preemptions": 4}}
    compiled = sim.simulate(reqs, **kw, fast_path="compiled")
    assert compiled.summary["num_preemptions"] > 500
    assert (compiled.requests["status"] == "rejected").any()
    assert_same_run(compiled, sim.simulate(reqs, **kw, fast_path="interpreted"))


def test_compiled_run_pauses_to_grow_its_logs_and_resumes_exactly(monkeypatch):
    monkeypatch.setattr(fastkernel, "INITIAL_LOG_ROWS", 1)
    monkeypatch.setattr(fastkernel, "INITIAL_IRREGULAR_ROWS", 1)
    reqs = _long_tailed(400, 3, 0.05)
    kw = {"policy": "continuous", "cost": ROOFLINE, "kv": {"num_blocks": 2000}}
    compiled = sim.simulate(reqs, **kw, fast_path="compiled")
    # from one row each, doubling: the run paused and resumed several times for each log
    assert len(compiled.steps) > 1024 and len(compiled.irregular_itl_runs[0]) > 256
    assert_same_run(compiled, sim.simulate(reqs, **kw, fast_path="interpreted"))


def test_a_wall_clock_budget_ends_a_compiled_run_as_partial():
    reqs = _long_tailed(5000, 5, 0.001)
    res = sim.simulate(reqs, policy="continuous", cost=ROOFLINE, kv={"num_blocks": 5000},
                       wall_clock_s=0.0, fast_path="compiled")
    assert res.summary["partial"] and res.summary["num_unfinished"] > 0


def test_only_vllm_mode_on_the_built_in_cost_models_is_compiled():
    vllm, orca = make_policy("continuous"), make_policy({"name": "continuous", "mode": "orca"})
    for cost in (ROOFLINE, sim.ConstantCost(0.1), sim.LinearCost(0.01, 1e-4, 1e-3)):
        assert fastkernel.compiled_blocker(vllm, cost, 1000) == ""
        assert fastkernel.compiled_blocker(orca, cost, 1000) != ""

    class Custom(sim.ConstantCost):  # may cost steps its own way: stays interpreted
        pass

    assert fastkernel.compiled_blocker(vllm, Custom(0.1), 1000) != ""


def test_the_kernel_and_its_driver_agree_on_codes():
    # numba freezes a cached kernel's globals: the two modules' copies must match
    from sim.engine import kernel_loop as loop

    assert (loop.ROOFLINE, loop.CONSTANT, loop.LINEAR) == (
        fastkernel.ROOFLINE, fastkernel.CONSTANT, fastkernel.LINEAR)
    assert list(fastkernel._BOUNDS[[loop.BOUND_CONSTANT, loop.BOUND_LINEAR]]) == [
        "constant", "linear"]


def test_auto_compiles_only_large_runs(monkeypatch):
    calls = []
    real = fastkernel.run_continuous_compiled
    monkeypatch.setattr(fastkernel, "run_continuous_compiled",
                        lambda *a, **k: calls.append(len(a[0])) or real(*a, **k))
    monkeypatch.setattr(fastkernel, "COMPILED_MIN_REQUESTS", 50)
    kw = {"policy": "continuous", "cost": ROOFLINE, "kv": {"num_blocks": 2000}}
    small, large = _long_tailed(49, 1, 0.05), _long_tailed(50, 1, 0.05)
    sim.simulate(small, **kw)
    assert calls == []
    sim.simulate(large, **kw)
    assert calls == [50]
    sim.simulate(large, **kw, fast_path="interpreted")
    sim.simulate(large, **kw, num_replicas=2)  # 25 each: below the threshold
    assert calls == [50]


def test_fast_path_choice_is_validated():
    with pytest.raises(ValueError, match="fast_path must be one of"):
        sim.simulate([sim.Request(0, 0.0, 5, 5)], policy="continuous", cost=ROOFLINE,
                     fast_path="numba")


def test_gap_stack_prunes_what_no_running_request_needs():
    # Prompts shrink as they arrive, each alone: the decode-to-decode gap spanning its
    # prefill is longer than every later gap, so the monotonic stack keeps all 1,200 of them
    # (the interpreted path's stack reaches 1,193) — far more than the kernel's buffer of
    # twice the longest output (464). It must prune to the oldest running request's span and
    # stay exact.
    reqs = [sim.Request(i, i * 0.4, 4000 - 3 * i, 200) for i in range(1200)]
    kw = {"policy": "continuous", "cost": ROOFLINE, "kv": {"num_blocks": 20000}}
    compiled = sim.simulate(reqs, **kw, fast_path="compiled")
    assert_same_run(compiled, sim.simulate(reqs, **kw, fast_path="interpreted"))
