"""Property tests: random traces, configs and cost models through every registered policy.

Each example runs ``sim.simulate(..., checks=True)`` (the engine's deep per-step invariants: KV
conservation, per-sequence consistency) and then ``helpers.check_invariants`` on the result:
every request finished with all its tokens or was rejected with a reason; arrival <= first
scheduled < first token <= finish; steps of a replica never overlap and time moves forward;
KV usage never exceeds the cache; and token conservation — without preemptions or mid-run
rejections the steps computed exactly ``sum(prompt) + sum(output - 1)`` tokens (the last
output token is sampled, never computed), with them at least that many.

On top: FCFS where a policy promises it (``ordering="fcfs"``, no prompt buckets, no
preemption: first-scheduled times follow arrival order on each replica), and event skipping
(a policy's ``steady`` promise) changing nothing against a run that takes every step.

Policies are taken from ``policies.registered()``, so a new policy is covered by registering
it; its parameters are drawn when their names are known (below), else left at defaults.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
from helpers import NoSkip, check_invariants
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import policies
import sim
from policies.registry import PolicyError, make_policy, policy_params

NAMES = sorted(policies.registered())
SETTINGS = settings(max_examples=250, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

# Known parameter names and what to draw for them (anything else keeps its default).
PARAMS = {
    "max_num_seqs": st.integers(1, 8),
    "max_num_batched_tokens": st.sampled_from([8, 16, 48, 256, 8192]),
    "token_budget": st.sampled_from([8, 16, 48, 512]),
    "chunk_size": st.none() | st.integers(1, 32),
    "batch_size": st.integers(1, 6),
    "max_batch_size": st.integers(1, 6),
    "timeout_s": st.none() | st.sampled_from([0.0, 0.1, 1.0]),
    "max_wait_s": st.sampled_from([0.0, 0.05, 0.5, 2.0]),
    "mode": st.sampled_from(["vllm", "orca"]),
    "ordering": st.sampled_from(["fcfs", "fcfs", "spf", "priority"]),
    "watermark": st.sampled_from([0.0, 0.01, 0.2]),
    "bucket_by_prompt": st.none() | st.integers(1, 32) | st.just([8, 32]),
}


@st.composite
def policy_specs(draw, name):
    spec = {"name": name}
    for key in policy_params(policies.registered()[name]):
        if key in PARAMS:
            spec[key] = draw(PARAMS[key])
    try:
        make_policy(spec)
    except PolicyError:
        assume(False)
    return spec


@st.composite
def traces(draw, max_requests=12):
    n = draw(st.integers(1, max_requests))
    # Gaps on the step grid (ties and arrivals exactly at step boundaries) or anywhere.
    gap = st.sampled_from([0.0, 0.0, 0.25, 0.5, 1.0]) | st.floats(0.0, 2.0)
    gaps = draw(st.lists(gap, min_size=n, max_size=n))
    arrivals = np.cumsum(gaps)
    reqs = []
    for i in range(n):
        reqs.append(sim.Request(
            id=i, arrival_s=float(arrivals[i]),
            num_prompt_tokens=draw(st.integers(1, 48)),
            num_output_tokens=draw(st.integers(1, 16)),
            priority=draw(st.integers(0, 2))))
    order = draw(st.permutations(range(n)))  # simulate accepts requests in any order
    return [reqs[i] for i in order]


kv_configs = st.one_of(
    st.none(),
    st.fixed_dictionaries({"num_blocks": st.integers(1, 40),
                           "block_size": st.sampled_from([1, 2, 4, 16])}),
    st.fixed_dictionaries({"num_blocks": st.integers(4, 40),
                           "block_size": st.sampled_from([2, 4, 16]),
                           "allocator": st.just("slab"),
                           "reserve_tokens": st.integers(8, 64)}),
)

costs = st.one_of(
    st.builds(sim.ConstantCost, step_s=st.sampled_from([0.25, 1.0]) | st.floats(1e-3, 1.0)),
    st.builds(sim.LinearCost, base_s=st.floats(1e-4, 0.05),
              per_token_s=st.floats(0.0, 1e-3), per_seq_s=st.floats(0.0, 1e-2)),
)


def fcfs_promised(spec) -> bool:
    return spec.get("ordering", "fcfs") == "fcfs" and spec.get("bucket_by_prompt") is None \
        and "ordering" in policy_params(policies.registered()[spec["name"]])


@pytest.mark.parametrize("name", NAMES)
@SETTINGS
@given(data=st.data())
def test_every_policy_keeps_the_engine_invariants(name, data):
    spec = data.draw(policy_specs(name), label="policy")
    reqs = data.draw(traces(), label="requests")
    kv = data.draw(kv_configs, label="kv")
    cost = data.draw(costs, label="cost")
    replicas = data.draw(st.integers(1, 2), label="num_replicas")
    res = sim.simulate(reqs, policy=spec, cost=cost, kv=kv, num_replicas=replicas,
                       checks=True)
    check_invariants(res, reqs, res.kv)
    s = res.summary
    assert s["completed"] + s["num_rejected"] == len(reqs)
    assert s["num_unfinished"] == 0
    if isinstance(cost, sim.ConstantCost):  # a request needs at least one step per token
        fin = res.requests[res.requests["status"] == "finished"]
        assert (fin["e2e_s"] >= fin["num_output_tokens"] * cost.step_s * (1 - 1e-9)).all()
        assert (fin["ttft_s"] >= cost.step_s * (1 - 1e-9)).all()
    if fcfs_promised(spec) and s["num_preemptions"] == 0:
        df = res.requests.sort_values(["arrival_s", "id"], kind="stable")
        for _, rep in df.groupby("replica"):
            started = rep["first_scheduled_s"].dropna().to_numpy()
            assert (np.diff(started) >= 0).all(), "FCFS: first scheduled in arrival order"


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_unlimited_kv_and_no_token_limit_finish_everything_exactly(name, data):
    # Without KV pressure or a token budget below the prompts nothing may be rejected or
    # preempted, so token conservation is exact.
    spec = data.draw(policy_specs(name), label="policy")
    for key in ("max_num_batched_tokens", "token_budget"):
        if key in spec:
            spec[key] = 8192
    reqs = data.draw(traces(), label="requests")
    res = sim.simulate(reqs, policy=spec, cost=data.draw(costs, label="cost"), checks=True)
    check_invariants(res, reqs, res.kv)
    assert (res.requests["status"] == "finished").all()
    assert res.summary["num_preemptions"] == 0
    computed = res.steps["num_prefill_tokens"].sum() + res.steps["num_decode_tokens"].sum()
    assert computed == sum(r.num_prompt_tokens + r.num_output_tokens - 1 for r in reqs)


# Every allocator, preemption mode and prefix caching, for the skipping check.
skip_kv_configs = kv_configs | st.fixed_dictionaries({
    "num_blocks": st.integers(2, 40),
    "block_size": st.sampled_from([1, 2, 4, 16]),
    "allocator": st.sampled_from(["paged", "slab"]),
    "slab_reserve": st.just("prompt_plus_max_output"),
    "max_output_tokens": st.integers(1, 24),
    "preemption": st.sampled_from(["recompute", "swap"]),
    "swap_gbps": st.floats(0.5, 50.0),
    "kv_bytes_per_token": st.sampled_from([1e5, 1e7]),
    "max_preemptions": st.sampled_from([None, 0, 3]),
    "prefix_caching": st.booleans(),
})


@st.composite
def shared_prefixes(draw, reqs):
    """Give some requests a shared prefix (for prefix caching), chosen by hypothesis."""
    out = []
    for r in reqs:
        pid = draw(st.sampled_from([None, "a", "b"]))
        shared = draw(st.integers(0, r.num_prompt_tokens)) if pid else 0
        out.append(dataclasses.replace(r, prefix_id=pid, num_prefix_tokens=shared))
    return out


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_event_skipping_changes_nothing(name, data):
    spec = data.draw(policy_specs(name), label="policy")
    reqs = data.draw(traces(max_requests=8), label="requests")
    kv = data.draw(skip_kv_configs, label="kv")
    if kv and kv.get("prefix_caching"):
        reqs = data.draw(shared_prefixes(reqs), label="prefixes")
    cost = data.draw(costs, label="cost")
    # a skip must not start at the horizon either (it once ran one step past it)
    horizon = data.draw(st.sampled_from([None, None, 0.5, 3.0]), label="horizon_s")
    fast = sim.simulate(reqs, policy=make_policy(spec), cost=cost, kv=kv, checks=True,
                        horizon_s=horizon)
    slow = sim.simulate(reqs, policy=NoSkip(make_policy(spec)), cost=cost, kv=kv, checks=True,
                        horizon_s=horizon)
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=False, rtol=1e-12)
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=False, rtol=1e-12)
    for key, v in fast.summary.items():
        w = slow.summary[key]
        if isinstance(v, float) and math.isnan(v):
            assert math.isnan(w), key
        else:
            assert v == pytest.approx(w, rel=1e-9), key


def test_event_skipping_logs_kv_growth_with_an_unlimited_cache():
    # One request, 3 prompt + 16 output tokens, 16-token blocks: from the 15th step on its KV
    # holds 3 + 14 = 17 tokens or more, i.e. 2 blocks (each step logs what it held while it
    # ran, the last one included), with or without skipping.
    reqs = [sim.Request(0, 0.0, 3, 16)]
    runs = [sim.simulate(reqs, policy=p, cost=sim.ConstantCost(0.25), kv=None)
            for p in (make_policy("continuous"), NoSkip(make_policy("continuous")))]
    assert runs[1].steps["kv_used_blocks"].tolist() == [1] * 14 + [2, 2]
    assert runs[0].steps["kv_used_blocks"].tolist() == [1] * 14 + [2, 2]
