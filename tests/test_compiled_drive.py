"""Routed runs on compiled replicas (``sim.engine.compiled_drive``) equal the general engine's.

Every router, every specification drawn from the fields' own domains (as the compiled
interpreter's differential tests draw them: ``tests.test_coverage``), small random traces,
tight caches half the time: the requests table, the steps table, the summary and every
routing decision (the replica chosen and every replica's outstanding requests at that
instant) are bit-identical to the general engine's with its invariant checks on. The loads a
router reads are what the general engine counts, a step straddling the routing instant
included (``load_now``), so any difference in them changes a decision and shows here.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import event, given, settings
from hypothesis import strategies as st

import sim
from tests.test_coverage import COSTS, drawn_kv, kv_blocks, specs
from tests.test_fastpath import assert_same_run

#: Every registered router, with the parameters that change what it reads.
ROUTERS: list[dict[str, Any]] = [
    {"name": "random"},
    {"name": "least_outstanding_requests"},
    {"name": "least_outstanding_tokens"},
    {"name": "least_kv_usage"},
    {"name": "power_of_two", "metric": "tokens"},
    {"name": "power_of_two", "choices": 3, "metric": "kv"},
    {"name": "session_affinity", "max_load_ratio": 1.2},
    {"name": "prefix_affinity", "metric": "tokens", "balance_abs": 2},
    {"name": "weighted", "scorers": {"queue": 1.0, "tokens": 1.0, "kv": 2.0, "prefix": 1.0}},
]


@st.composite
def traces(draw: st.DrawFn) -> list[sim.Request]:
    """Up to 40 requests, bursts and ties in arrival time, shared prefixes, priorities."""
    n = draw(st.integers(1, 40))
    reqs = []
    for i in range(n):
        prompt = draw(st.integers(1, 120))
        prefix = draw(st.sampled_from([None, "a", "b", "c"]))
        reqs.append(sim.Request(i, draw(st.integers(0, 30)) * 0.013, prompt,
                                draw(st.integers(1, 60)), priority=draw(st.integers(0, 2)),
                                prefix_id=prefix,
                                num_prefix_tokens=min(prompt, 32) if prefix else 0))
    return reqs


def check_routed(reqs: list[sim.Request], policy: dict[str, Any], kv: Any, cost: Any,
                 router: dict[str, Any], num_replicas: int, tight: int | None) -> None:
    """One drawn routed run: compiled replicas equal general ones, bit for bit."""
    kv_config = drawn_kv(reqs, kv, cost, tight)
    kw = {"policy": policy, "cost": cost, "kv": kv_config, "num_replicas": num_replicas,
          "router": router}
    fast = sim.simulate(reqs, **kw, fast_path="compiled")
    slow = sim.simulate(reqs, **kw, checks=True)
    assert slow.engine == "general"
    event(f"engine: {fast.engine}")
    assert_same_run(fast, slow)
    assert fast.routing is not None and slow.routing is not None
    for name in ("replica", "outstanding", "time_s", "request_id"):
        assert np.asarray(getattr(fast.routing, name)).tolist() == np.asarray(
            getattr(slow.routing, name)).tolist(), name


@settings(max_examples=150, deadline=None)
@given(reqs=traces(), fields=specs(), kv=kv_blocks, cost=st.sampled_from(COSTS),
       router=st.sampled_from(ROUTERS), num_replicas=st.sampled_from([2, 3, 4]),
       tight=st.none() | st.integers(0, 6))
def test_routed_compiled_replicas_run_exactly_as_the_general_engine(
        reqs, fields, kv, cost, router, num_replicas, tight):
    check_routed(reqs, {"name": "scheduler", **fields}, kv, cost, router, num_replicas, tight)


@settings(max_examples=40, deadline=None)
@given(reqs=traces(), router=st.sampled_from(ROUTERS), tight=st.none() | st.integers(0, 6),
       preset=st.sampled_from([
           {"name": "continuous", "max_num_seqs": 4},
           {"name": "continuous", "max_num_seqs": 8, "mode": "orca"},
           {"name": "chunked_prefill", "token_budget": 64, "max_num_seqs": 4},
           {"name": "chunked_prefill", "token_budget": 256, "max_num_seqs": 16,
            "ordering": "spf"}]))
def test_routed_presets_on_the_roofline_run_exactly_as_the_general_engine(
        reqs, router, tight, preset):
    cost = sim.build_cost_model(model="llama-3-8b", hardware="h100-sxm", tp=1, engine="vllm")
    check_routed(reqs, preset, {"block_size": 16}, cost, router, 3, tight)


def test_the_result_says_which_engine_ran_and_why():
    reqs = [sim.Request(i, i * 0.01, 50, 10) for i in range(30)]
    kw: dict[str, Any] = {"policy": "continuous", "cost": sim.ConstantCost(0.01),
                          "num_replicas": 2}
    ran = sim.simulate(reqs, **kw, router={"name": "least_outstanding_tokens"},
                       fast_path="compiled")
    assert (ran.engine, ran.engine_reason) == ("compiled", "")
    late = sim.simulate(reqs, **kw, router={"name": "least_outstanding_tokens",
                                            "latency_s": 0.001}, fast_path="compiled")
    assert (late.engine, late.engine_reason) == ("general",
                                                "a routing latency (requests in transit)")
    capped = sim.simulate(reqs, **kw, router={"name": "random"}, fast_path="compiled",
                          horizon_s=0.1)
    assert capped.engine == "general" and "horizon" in capped.engine_reason
    small = sim.simulate(reqs, **kw, router={"name": "random"})  # fast_path=True: too small
    assert small.engine == "general" and "fewer than" in small.engine_reason
    assert ran.summary["completed"] == 30
