"""Disaggregated pools on the compiled interpreter give the general engine's results, bit for bit.

The same requests, cluster and routers run twice, ``fast_path="interpreted"`` (every replica on
the general engine) and ``fast_path="compiled"`` (every replica a
``sim.engine.compiled_handoff.HandoffCompiled``); the drawn clusters have small decode caches
and slow links, so finished prefills wait holding their KV (back-pressure), decode replicas
preempt, and some requests never fit. Requests, steps, routing logs, transfers and links must
be identical.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

import sim
from sim.cost.base import ConstantCost, LinearCost

BPT = 1e5  # KV bytes per token


def _requests(n: int, seed: int, max_prompt: int, max_out: int) -> list[sim.Request]:
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(0.004, n))
    return [sim.Request(id=i, arrival_s=float(t[i]),
                        num_prompt_tokens=int(rng.integers(1, max_prompt)),
                        num_output_tokens=int(rng.integers(1, max_out))) for i in range(n)]


def _run(reqs: list[sim.Request], cl: dict, router: str, fast_path: str) -> sim.SimResult:
    return sim.simulate(reqs, policy="continuous", cluster=cl, router=router,
                        fast_path=fast_path, slos={"ttft_ms": 50, "tpot_ms": 10})


def _same(a: sim.SimResult, b: sim.SimResult) -> None:
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    pd.testing.assert_frame_equal(a.steps, b.steps, check_exact=True)
    pd.testing.assert_frame_equal(a.links, b.links, check_exact=True)
    for log in ("routing",):
        x, y = getattr(a, log), getattr(b, log)
        assert (x.time_s, x.request_id, x.replica, x.outstanding) == (
            y.time_s, y.request_id, y.replica, y.outstanding)
    assert a.summary.keys() == b.summary.keys()
    for key, value in a.summary.items():
        assert value == b.summary[key] or (value != value and b.summary[key] != b.summary[key]), key


POLICIES = st.sampled_from([
    {"name": "continuous", "max_num_seqs": 4},
    {"name": "continuous", "max_num_seqs": 16, "watermark": 0.05},
    {"name": "chunked_prefill", "max_num_seqs": 8, "token_budget": 64},
    {"name": "scheduler", "composition": "decode_first", "order": "spf",
     "max_num_seqs": 8, "max_num_batched_tokens": 128},
])


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), n_p=st.integers(1, 3), n_d=st.integers(1, 3),
       prefill=POLICIES, decode=POLICIES, blocks_p=st.integers(12, 120),
       blocks_d=st.integers(10, 80), gbps=st.sampled_from([0.05, 1.0, 50.0]),
       per_node=st.sampled_from([1, 8]), linear=st.booleans(),
       router=st.sampled_from(["least_outstanding_tokens", "round_robin", "least_kv_usage"]),
       decode_router=st.sampled_from(["least_kv_usage", "round_robin",
                                      "least_outstanding_requests"]))
def test_compiled_pools_give_the_general_engines_results(
        seed, n_p, n_d, prefill, decode, blocks_p, blocks_d, gbps, per_node, linear, router,
        decode_router) -> None:
    reqs = _requests(120, seed, max_prompt=200, max_out=60)
    cost_p = LinearCost(base_s=0.002, per_token_s=2e-5) if linear else ConstantCost(0.004)
    cost_d = LinearCost(base_s=0.003, per_token_s=1e-6) if linear else ConstantCost(0.003)

    def kv(n: int) -> dict:
        return {"num_blocks": n, "block_size": 16, "kv_bytes_per_token": BPT}

    cl = {"groups": [
        {"name": "p", "role": "prefill", "replicas": n_p, "cost": cost_p, "kv": kv(blocks_p),
         "policy": prefill},
        {"name": "d", "role": "decode", "replicas": n_d, "cost": cost_d, "kv": kv(blocks_d),
         "policy": decode}],
        "network": {"gpus_per_node": per_node, "nvlink_gbps": gbps, "nic_gbps": gbps / 2},
        "decode_router": {"name": decode_router}}
    general = _run(reqs, cl, router, "interpreted")
    compiled = _run(reqs, cl, router, "compiled")
    assert general.engine == "general" and compiled.engine == "compiled", compiled.engine_reason
    _same(general, compiled)


def test_back_pressure_and_decode_preemption_are_exercised() -> None:
    """The drawn settings reach the hand-off's hard cases (so the test above can fail)."""
    reqs = _requests(150, 7, max_prompt=200, max_out=60)
    cl = {"groups": [
        {"name": "p", "role": "prefill", "replicas": 1, "cost": ConstantCost(0.004),
         "kv": {"num_blocks": 60, "block_size": 16, "kv_bytes_per_token": BPT}},
        {"name": "d", "role": "decode", "replicas": 1, "cost": ConstantCost(0.003),
         "kv": {"num_blocks": 12, "block_size": 16, "kv_bytes_per_token": BPT}}],
        "network": {"nvlink_gbps": 0.05}}
    general = _run(reqs, cl, "round_robin", "interpreted")
    compiled = _run(reqs, cl, "round_robin", "compiled")
    _same(general, compiled)
    s = compiled.summary
    assert s["mean_kv_wait_ms"] > 0 and s["num_preemptions"] > 0
    assert (compiled.requests["status"] == "rejected").any()


def test_a_pool_the_compiled_interpreter_does_not_cover_stays_general_and_says_why() -> None:
    reqs = _requests(40, 3, max_prompt=100, max_out=20)
    cl = {"groups": [
        {"name": "p", "role": "prefill", "replicas": 1, "cost": ConstantCost(0.004),
         "kv": {"num_blocks": 60, "block_size": 16, "kv_bytes_per_token": BPT}},
        {"name": "d", "role": "decode", "replicas": 1, "cost": ConstantCost(0.003),
         "kv": {"num_blocks": 60, "block_size": 16, "kv_bytes_per_token": BPT,
                "preemption": "swap", "swap_gbps": 25.0}}]}
    mixed = _run(reqs, cl, "round_robin", "compiled")
    assert mixed.engine == "compiled+general"
    assert mixed.engine_reason == ("group 'd': kv.preemption='swap' is not covered by the "
                                   "compiled interpreter")
    _same(_run(reqs, cl, "round_robin", "interpreted"), mixed)
