"""The compiled interpreter (``sim.engine.compiled``) is the general engine, only faster.

Specification: every run it covers gives the same request table, step table, irregular gaps
and summary, bit for bit, whether ``simulate`` runs it compiled or on the general engine (with
its invariant checks) — through KV preemption, the preemption limit, budget and
``max_model_len`` rejections, contexts outgrowing the cache, horizons, several replicas and a
roofline whose decode tail looks at the shortest context too; a run that pauses (to grow its
logs, or at a time it is advanced to) resumes exactly, with requests handed over in between.
``fast_path=True`` compiles only runs large enough to repay loading it.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sim
import sim.engine.compiled as compiled_module
from policies.registry import make_policy
from sim.engine import coverage
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
def test_compiled_equals_the_general_engine_under_kv_pressure_at_scale(cost):
    # 3,000 requests on a cache far too small: many preemptions, several per request at times,
    # prompts pushed over the budget by recompute, a preemption limit rejecting some.
    reqs = _long_tailed(3000, 7, 0.02)
    kw = {"policy": {"name": "continuous", "max_num_seqs": 64, "max_num_batched_tokens": 1024},
          "cost": cost, "kv": {"num_blocks": 400, "block_size": 16, "max_preemptions": 4}}
    compiled = sim.simulate(reqs, **kw, fast_path="compiled")
    assert compiled.summary["num_preemptions"] > 500
    assert (compiled.requests["status"] == "rejected").any()
    assert_same_run(compiled, sim.simulate(reqs, **kw, fast_path="interpreted"))


@pytest.mark.parametrize("policy", [
    {"name": "chunked_prefill", "token_budget": 256, "max_num_seqs": 64},
    {"name": "scheduler", "max_num_batched_tokens": 512, "order": "edf", "victim": "deadline",
     "chunk_size": 128, "ttft_targets_s": {"0": 2.0, "1": 0.5, "2": 0.1}},
    {"name": "scheduler", "composition": "mixed", "admission": "whole", "order": "priority",
     "victim": "priority"}], ids=["chunked", "edf", "mixed-priority"])
def test_every_composition_equals_the_general_engine_under_kv_pressure(policy):
    rng = np.random.default_rng(9)
    reqs = [sim.Request(r.id, r.arrival_s, r.num_prompt_tokens, r.num_output_tokens,
                        priority=int(rng.integers(0, 3))) for r in _long_tailed(1500, 8, 0.02)]
    kw = {"policy": policy, "cost": ROOFLINE,
          "kv": {"num_blocks": 400, "block_size": 16, "max_preemptions": 4}}
    fast = sim.simulate(reqs, **kw, fast_path="compiled")
    assert fast.summary["num_preemptions"] > 200
    assert_same_run(fast, sim.simulate(reqs, **kw, fast_path="interpreted"))


def test_a_replica_advanced_in_pieces_with_requests_handed_over_equals_one_run():
    # The driven form the cluster layer needs: advance to a time, hand over the requests
    # that arrived by then, advance again. The outcome and every step equal one whole run.
    import math

    from sim.core.scheduling import SchedulingSpec
    from sim.engine.compiled import CompiledReplica
    from sim.kv.config import KVConfig

    reqs = _long_tailed(300, 4, 0.03)
    arrival = np.array([r.arrival_s for r in reqs])
    prompt = np.array([r.num_prompt_tokens for r in reqs])
    out = np.array([r.num_output_tokens for r in reqs])
    spec, kv = SchedulingSpec(max_num_batched_tokens=512), KVConfig(num_blocks=600)

    def replica() -> CompiledReplica:
        return CompiledReplica(spec, ROOFLINE, kv, max_model_len=None)

    whole = replica()
    whole.append(arrival, prompt, out)
    whole.close()
    whole.advance_until(math.inf)
    pieces = replica()
    handed = 0
    for t in np.linspace(0.0, float(arrival[-1]), 17):
        k = int(np.searchsorted(arrival, t, side="right"))
        pieces.append(arrival[handed:k], prompt[handed:k], out[handed:k])
        handed = k
        pieces.advance_until(float(t))
        assert pieces.now >= t or pieces.num_steps == 0
    pieces.append(arrival[handed:], prompt[handed:], out[handed:])
    pieces.close()
    pieces.advance_until(math.inf)
    assert pieces.num_steps == whole.num_steps > 1000
    n = whole.num_steps
    np.testing.assert_array_equal(pieces.log_i[:n], whole.log_i[:n])
    np.testing.assert_array_equal(pieces.log_f[:n], whole.log_f[:n])
    a, b = pieces.outcomes(), whole.outcomes()
    for name in ("finish_s", "first_token_s", "max_itl_s", "num_preemptions"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))


def test_compiled_run_pauses_to_grow_its_logs_and_resumes_exactly(monkeypatch):
    monkeypatch.setattr(compiled_module, "INITIAL_LOG_ROWS", 1)
    monkeypatch.setattr(compiled_module, "INITIAL_IRREGULAR_ROWS", 1)
    reqs = _long_tailed(400, 3, 0.05)
    kw = {"policy": "continuous", "cost": ROOFLINE, "kv": {"num_blocks": 2000}}
    compiled = sim.simulate(reqs, **kw, fast_path="compiled")
    # from one row each, doubling: the run paused and resumed several times for each log
    assert len(compiled.steps) > 1024 and len(compiled.irregular_itl_runs[0]) > 256
    assert_same_run(compiled, sim.simulate(reqs, **kw, fast_path="interpreted"))
    chunked = {**kw, "policy": {"name": "chunked_prefill", "token_budget": 256}}
    assert_same_run(sim.simulate(reqs, **chunked, fast_path="compiled"),
                    sim.simulate(reqs, **chunked, fast_path="interpreted"))


def test_a_wall_clock_budget_ends_a_compiled_run_as_partial():
    reqs = _long_tailed(5000, 5, 0.001)
    res = sim.simulate(reqs, policy="continuous", cost=ROOFLINE, kv={"num_blocks": 5000},
                       wall_clock_s=1e-9, fast_path="compiled")
    assert res.summary["partial"] and res.summary["num_unfinished"] > 0


def test_only_the_built_in_cost_models_are_compiled():
    ok = {"checks": False, "event_skipping": True}
    from sim.kv.config import KVConfig

    kv = KVConfig(num_blocks=100)
    vllm, orca = make_policy("continuous"), make_policy({"name": "continuous", "mode": "orca"})
    for cost in (ROOFLINE, sim.ConstantCost(0.1), sim.LinearCost(0.01, 1e-4, 1e-3)):
        assert coverage.fast_path_blocker(vllm, kv, cost, **ok) == ""
        assert coverage.fast_path_blocker(orca, kv, cost, **ok) == ""

    class Custom(sim.ConstantCost):  # may cost steps its own way: the general engine
        pass

    assert coverage.fast_path_blocker(vllm, kv, Custom(0.1), **ok) != ""


def test_the_interpreter_and_its_driver_agree_on_codes():
    # numba freezes a cached function's globals: the codes both sides read must match
    from sim.core.scheduling import COMPOSITIONS
    from sim.engine import compiled_cost, compiled_plan

    assert [compiled_cost.ROOFLINE, compiled_cost.CONSTANT, compiled_cost.LINEAR] == [
        coverage.cost_kind(c) for c in (ROOFLINE, sim.ConstantCost(0.1),
                                        sim.LinearCost(0.01))]
    assert compiled_cost.BOUND_NAMES[compiled_cost.BOUND_CONSTANT] == "constant"
    assert compiled_cost.BOUND_NAMES[compiled_cost.BOUND_LINEAR] == "linear"
    assert [compiled_plan.PREFILL_FIRST, compiled_plan.MIXED, compiled_plan.DECODE_FIRST] == [
        COMPOSITIONS.index(c) for c in ("prefill_first", "mixed", "decode_first")]


def test_auto_compiles_only_large_runs(monkeypatch):
    import sim.engine.compiled_cache as compiled_cache
    import sim.engine.compiled_run as compiled_run
    import sim.engine.simulate as simulate

    calls = []
    real = compiled_run.run_compiled
    monkeypatch.setattr(compiled_run, "run_compiled",
                        lambda *a, **k: calls.append(len(a[0])) or real(*a, **k))
    monkeypatch.setattr(simulate, "COMPILED_MIN_REQUESTS", 50)
    monkeypatch.setattr(compiled_cache, "loop_is_cached",
                        lambda *a, **k: True)
    kw = {"policy": "continuous", "cost": ROOFLINE, "kv": {"num_blocks": 2000}}
    small, large = _long_tailed(49, 1, 0.05), _long_tailed(50, 1, 0.05)
    sim.simulate(small, **kw)
    assert calls == []
    sim.simulate(large, **kw)
    assert calls == [50]
    sim.simulate(large, **kw, fast_path="interpreted")
    sim.simulate(large, **kw, num_replicas=2)  # 25 each: below the threshold
    assert calls == [50]


def test_a_cold_cache_keeps_mid_sized_runs_on_the_general_engine(monkeypatch):
    # compiling the loop (~15 s) repays itself only from COMPILED_COLD_MIN_REQUESTS requests
    import sim.engine.compiled_cache as compiled_cache
    import sim.engine.simulate as simulate

    monkeypatch.setattr(simulate, "COMPILED_MIN_REQUESTS", 20)
    monkeypatch.setattr(simulate, "COMPILED_COLD_MIN_REQUESTS", 60)
    monkeypatch.setattr(compiled_cache, "loop_is_cached",
                        lambda *a, **k: False)
    kw = {"policy": "continuous", "cost": ROOFLINE, "kv": {"num_blocks": 2000}}
    mid = sim.simulate(_long_tailed(59, 1, 0.05), **kw)
    assert mid.engine == "general"
    assert "not in numba's cache" in mid.engine_reason
    assert "fast_path='compiled' from Python, compiles it once" in mid.engine_reason
    assert sim.simulate(_long_tailed(60, 1, 0.05), **kw).engine == "compiled"
    forced = sim.simulate(_long_tailed(59, 1, 0.05), **kw, fast_path="compiled")
    assert forced.engine == "compiled"
    assert_same_run(forced, mid)  # speed only: the same results
    monkeypatch.setattr(compiled_cache, "loop_is_cached",
                        lambda *a, **k: True)
    assert sim.simulate(_long_tailed(59, 1, 0.05), **kw).engine == "compiled"


def test_the_cache_check_reads_numbas_own_index():
    from sim.engine import compiled_loop
    from sim.engine.compiled_cache import loop_is_cached

    sim.simulate(_long_tailed(5, 1, 0.05), policy="continuous", cost=ROOFLINE,
                 fast_path="compiled")  # compiled (or loaded) in this process
    assert compiled_loop.run.overloads
    assert loop_is_cached()
    assert compiled_loop.run._cache._cache_file._load_index()  # and written to the cache


def test_fast_path_choice_is_validated():
    with pytest.raises(ValueError, match="fast_path must be one of"):
        sim.simulate([sim.Request(0, 0.0, 5, 5)], policy="continuous", cost=ROOFLINE,
                     fast_path="numba")
