"""Event skipping of run-to-completion batches and of steady plans past finishes: exact.

A static or dynamic batch in flight says ``Plan.on_finish="pad"`` and ``ignores_arrivals``:
the engine runs it to its last finish in one event (``sim.engine.batch_skip``, for the cost
models that cost a decode batch by its multiset of contexts) or piece by piece between
finishes (``sim.engine.skipping.continue_skip``, any other cost model); arrivals meanwhile join
the queue at the step start stepping takes them at. Iteration-level plans with nothing waiting
say ``"drop"``. Every table must come out bit for bit as when every step is its own event.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest
from helpers import NoSkip
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sim
from policies.registry import make_policy
from sim.core.types import BatchShape, StepCost
from sim.cost.base import ShapeCost
from sim.engine.skipping import multiset_costed

ROOFLINE = sim.build_cost_model(model="llama-3-8b", hardware="h100-sxm", tp=1, engine="vllm")


@dataclass(frozen=True)
class RowOrderCost(ShapeCost):
    """A cost model that sees the order of rows and the padding: no multiset shortcut may be
    taken for it, so batch runs are skipped piece by piece between finishes."""

    base_s: float = 0.01

    def step(self, shape: BatchShape) -> StepCost:
        weights = np.arange(1, len(shape.context_lens) + 1)
        seconds = (self.base_s + 1e-6 * float((shape.context_lens * weights).sum())
                   + 3e-4 * shape.num_padding_tokens)
        return StepCost(seconds, bound="order")


COSTS = st.sampled_from([sim.ConstantCost(0.25), sim.LinearCost(0.01, 1e-4, 2e-3),
                         RowOrderCost(), ROOFLINE])

BATCH_POLICIES = st.one_of(
    st.builds(lambda b, t, o: {"name": "static", "batch_size": b, "timeout_s": t,
                               "ordering": o},
              st.integers(1, 6), st.none() | st.sampled_from([0.0, 0.3, 1.0]),
              st.sampled_from(["fcfs", "spf", "priority"])),
    st.builds(lambda b, w, k, o: {"name": "dynamic", "max_batch_size": b, "max_wait_s": w,
                                  "bucket_by_prompt": k, "ordering": o},
              st.integers(1, 6), st.sampled_from([0.0, 0.05, 0.5]),
              st.none() | st.just(16) | st.just([8, 32]),
              st.sampled_from(["fcfs", "spf"])),
)

ITERATION_POLICIES = st.one_of(
    st.builds(lambda s, m: {"name": "continuous", "max_num_seqs": s, "mode": m},
              st.integers(1, 8), st.sampled_from(["vllm", "orca"])),
    st.builds(lambda s, b: {"name": "chunked_prefill", "max_num_seqs": s, "token_budget": b},
              st.integers(1, 8), st.sampled_from([8, 16, 48])),
)

KV = st.one_of(
    st.none(),
    st.fixed_dictionaries({"num_blocks": st.integers(2, 60),
                           "block_size": st.sampled_from([1, 2, 4, 16]),
                           "max_preemptions": st.sampled_from([None, 2])}),
    st.fixed_dictionaries({"num_blocks": st.integers(4, 60),
                           "block_size": st.sampled_from([2, 4, 16]),
                           "allocator": st.just("slab"),
                           "reserve_tokens": st.integers(8, 64)}),
    st.fixed_dictionaries({"num_blocks": st.integers(4, 60),
                           "block_size": st.sampled_from([2, 4]),
                           "prefix_caching": st.just(True)}),
)


@st.composite
def traces(draw, max_requests=24):
    n = draw(st.integers(1, max_requests))
    gaps = draw(st.lists(st.sampled_from([0.0, 0.25, 1.0]) | st.floats(0.0, 3.0),
                         min_size=n, max_size=n))
    arrivals = np.cumsum(gaps)
    return [sim.Request(i, float(arrivals[i]), draw(st.integers(1, 40)),
                        draw(st.integers(1, 30)), priority=draw(st.integers(0, 2)),
                        prefix_id=draw(st.sampled_from([None, "a"])),
                        num_prefix_tokens=draw(st.integers(0, 8)))
            for i in range(n)]


def assert_same_run(spec, reqs, cost, kv, **kw):
    """Skipped and stepped runs give identical tables and summaries."""
    fast = sim.simulate(reqs, policy=make_policy(spec), cost=cost, kv=kv, checks=True, **kw)
    slow = sim.simulate(reqs, policy=NoSkip(make_policy(spec)), cost=cost, kv=kv, checks=True,
                        **kw)
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=True)
    for key, v in fast.summary.items():
        w = slow.summary[key]
        assert (math.isnan(w) if isinstance(v, float) and math.isnan(v) else v == w), key
    return fast


SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(spec=BATCH_POLICIES, reqs=traces(), cost=COSTS, kv=KV,
       horizon=st.sampled_from([None, None, 2.0, 7.5]),
       max_model_len=st.sampled_from([None, None, 50]))
def test_a_batch_run_skipped_is_every_step_taken(spec, reqs, cost, kv, horizon, max_model_len):
    assert_same_run(spec, reqs, cost, kv, horizon_s=horizon, max_model_len=max_model_len)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=ITERATION_POLICIES, reqs=traces(max_requests=16), cost=COSTS, kv=KV,
       horizon=st.sampled_from([None, 4.0]))
def test_decodes_skipped_past_finishes_are_every_step_taken(spec, reqs, cost, kv, horizon):
    assert_same_run(spec, reqs, cost, kv, horizon_s=horizon)


def test_arrivals_during_a_batch_run_join_at_the_next_step_start():
    # Static batches of 2, 1 s steps: the batch of requests 0 and 1 prefills in [0, 1) and
    # decodes 5 steps to t=6. Request 2 arrives at 2.5 (taken at the step start t=3, so the
    # steps from t=3 on see one waiting), request 3 can never fit (rejected at t=4, the first
    # step start after its arrival at 3.2) and request 4 arrives at 5.5 (seen from t=6).
    reqs = [sim.Request(0, 0.0, 4, 6), sim.Request(1, 0.0, 4, 3),
            sim.Request(2, 2.5, 4, 2), sim.Request(3, 3.2, 90, 2), sim.Request(4, 5.5, 4, 2)]
    res = assert_same_run({"name": "static", "batch_size": 2}, reqs, sim.ConstantCost(1.0),
                          None, max_model_len=60)
    steps = res.steps[res.steps["start_s"] < 6]
    assert steps["num_waiting"].tolist() == [0, 0, 0, 1, 1, 1]
    assert steps["num_padding_rows"].tolist() == [0, 0, 0, 1, 1, 1]  # request 1 done at t=3
    rejected = res.requests.set_index("id").loc[3]
    assert rejected["status"] == "rejected" and rejected["finish_s"] == 4.0
    assert res.requests.set_index("id").loc[1, "finish_s"] == 3.0
    assert res.requests.set_index("id").loc[2, "first_scheduled_s"] == 6.0


def test_a_batch_run_is_one_event():
    # 32 requests in one batch with outputs 1..32 tokens: a run of 31 decode steps with a
    # finish at every step, skipped in one event: the policy is asked twice (the dispatch,
    # the first decode step), and the run ends with the batch, nothing being left.
    reqs = [sim.Request(i, 0.0, 10, i + 1) for i in range(32)]
    calls = []

    class Counting(NoSkip):
        def schedule(self, view):
            calls.append(view.now_s)
            return self.inner.schedule(view)

    res = sim.simulate(reqs, policy=Counting(make_policy({"name": "static", "batch_size": 32})),
                       cost=ROOFLINE, kv=None)
    assert len(res.steps) == 32 and (res.requests["status"] == "finished").all()
    assert len(calls) == 2


@settings(max_examples=200, deadline=None)
@given(ctx=st.lists(st.integers(1, 5000), min_size=1, max_size=40),
       pad=st.integers(0, 40), seed=st.integers(0, 2**32 - 1))
def test_the_multiset_costed_models_ignore_row_order_and_padding(ctx, pad, seed):
    # What lets ``sim.engine.batch_skip`` cost a batch run as one series over all its rows.
    perm = np.random.default_rng(seed).permutation(len(ctx))
    ones = np.ones(len(ctx), dtype=np.int64)
    a = BatchShape(ones, np.array(ctx, dtype=np.int64), 0)
    b = BatchShape(ones, np.array(ctx, dtype=np.int64)[perm], min(pad, len(ctx)))
    for cost in (sim.ConstantCost(0.25), sim.LinearCost(0.01, 1e-4, 2e-3), ROOFLINE):
        assert multiset_costed(cost)
        assert cost.step(a) == cost.step(b)
    assert not multiset_costed(RowOrderCost())


@pytest.mark.parametrize("name", ["static", "dynamic"])
def test_a_long_batch_run_is_split_at_max_skip_steps_exactly(name):
    from sim.engine.skipping import MAX_SKIP_STEPS

    reqs = [sim.Request(0, 0.0, 8, MAX_SKIP_STEPS + 700), sim.Request(1, 0.0, 8, 300),
            sim.Request(2, 1.0, 8, 5)]
    spec = {"name": name, **({"batch_size": 2} if name == "static" else
                             {"max_batch_size": 2, "max_wait_s": 0.0})}
    assert_same_run(spec, reqs, sim.ConstantCost(0.01), {"num_blocks": 400, "block_size": 16})


def test_a_batch_run_with_only_a_rejected_arrival_meanwhile():
    # The one request arriving during the run can never fit (max_model_len): it is rejected
    # at t=4, the first step start after its arrival, and nobody joins the queue.
    reqs = [sim.Request(0, 0.0, 4, 6), sim.Request(1, 0.0, 4, 3), sim.Request(2, 3.2, 90, 2)]
    res = assert_same_run({"name": "static", "batch_size": 2}, reqs, sim.ConstantCost(1.0),
                          None, max_model_len=60)
    assert res.requests["finish_s"].tolist() == [6.0, 3.0, 4.0]
    assert res.steps["num_waiting"].tolist() == [0] * 6


@pytest.mark.parametrize("policy", [{"name": "dynamic", "max_batch_size": 8, "max_wait_s": 0.05},
                                    {"name": "static", "batch_size": 4, "timeout_s": 0.1}])
def test_a_router_reading_kv_sees_a_skipped_batch_run_as_stepping_does(policy):
    """The KV a replica holds while a skipped batch run is in flight (what ``least_kv_usage``
    and a disaggregated cluster's load board read) was unpacked as a decode stretch's: a
    ValueError ended every routed or disaggregated run of static or dynamic batching."""
    from sim.workload.build import build_workload

    reqs = build_workload({"arrival": {"rate": 30.0}, "num_requests": 200,
                           "lengths": {"dist": "empirical", "trace": "azure-conv"}},
                          np.random.default_rng(1))
    disagg = {"groups": [{"name": "p", "role": "prefill", "replicas": 2},
                         {"name": "d", "role": "decode", "replicas": 2}],
              "decode_router": "least_kv_usage"}
    keys = {"model": "llama-3-8b", "hardware": "h100-sxm", "tp": 1, "engine": "vllm"}
    for setup in ({"num_replicas": 3, "router": "least_kv_usage"},
                  {"cluster": disagg, "cost_keys": keys}):
        runs = [sim.simulate(reqs, policy=policy, cost=ROOFLINE, kv={"num_blocks": 3000},
                             event_skipping=skip, **setup) for skip in (True, False)]
        pd.testing.assert_frame_equal(runs[0].requests, runs[1].requests)
        pd.testing.assert_frame_equal(runs[0].steps, runs[1].steps)
