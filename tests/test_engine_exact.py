"""Exact timings of the engine with a constant step cost (the SimPy way: assert the clock).

With ``ConstantCost(step_s=D)`` every step lasts exactly ``D``, so each scenario below has a
timeline that can be written down by hand; the tests assert it to the last bit (the step
lengths are powers of two, so every sum of them is exact in floating point). They pin down:
the "computed tokens catch up" rule (the prefill step yields the first token, each decode step
one more), the same-time rule (an arrival at ``arrival_s <= now`` is visible to the plan made
at ``now``), vLLM-mode prefill priority vs Orca-mode mixed steps, recompute preemption, KV
rejection, plan validation (``EngineError`` naming the policy and the broken rule),
determinism, and the weighted ITL percentiles.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest
from helpers import NoSkip, check_invariants, requests
from hypothesis import given, settings
from hypothesis import strategies as st

import policies
import sim
from policies.registry import Policy
from sim.core.types import Plan, View
from sim.engine.replica import EngineError
from sim.metrics.summary import _stats

D = 0.25  # a power of two: k * D and sums of steps are exact


def run(reqs, kv=None, step_s=D, **policy):
    spec = {"name": "continuous", **policy}
    return sim.simulate(reqs, policy=spec, cost=sim.ConstantCost(step_s=step_s), kv=kv,
                        checks=True)


def row(res, rid):
    return res.requests.set_index("id").loc[rid]


# -- one request ------------------------------------------------------------------------------

@pytest.mark.parametrize("prompt,output", [(1, 1), (100, 5), (512, 128), (7, 2)])
def test_one_request_ttft_is_one_step_and_e2e_is_one_step_per_token(prompt, output):
    res = run(requests([0.0], prompt, output), max_num_seqs=8)
    r = row(res, 0)
    assert r["status"] == "finished"
    assert r["ttft_s"] == D
    assert r["e2e_s"] == output * D
    assert r["first_scheduled_s"] == 0.0
    assert r["first_token_s"] == D
    assert r["finish_s"] == output * D
    assert r["num_generated"] == output
    assert r["max_itl_s"] == (D if output > 1 else 0.0)
    if output > 1:
        assert r["tpot_s"] == D
    else:
        assert math.isnan(r["tpot_s"])
    steps = res.steps
    assert len(steps) == output
    assert steps["start_s"].tolist() == [k * D for k in range(output)]
    assert (steps["duration_s"] == D).all()
    # The prefill step computes the whole prompt; each later step one decode token.
    assert steps["num_prefill_tokens"].tolist() == [prompt] + [0] * (output - 1)
    assert steps["num_decode_tokens"].tolist() == [0] + [1] * (output - 1)
    assert (steps["num_seqs"] == 1).all()


def test_an_idle_engine_starts_a_request_at_its_arrival_instant():
    res = run(requests([3.75], 10, 3))
    r = row(res, 0)
    assert r["first_scheduled_s"] == 3.75
    assert r["first_token_s"] == 3.75 + D
    assert r["finish_s"] == 3.75 + 3 * D
    assert res.steps["start_s"].tolist() == [3.75, 3.75 + D, 3.75 + 2 * D]


# -- the same-time rule -----------------------------------------------------------------------

def test_an_arrival_exactly_at_a_step_boundary_is_seen_by_the_next_plan():
    # Request 0 decodes in steps [0, D), [D, 2D), [2D, 3D). Request 1 arrives at exactly D,
    # the end of the first step: the plan made at D sees it (arrival_s <= now) and, in vLLM
    # mode, runs its prefill in [D, 2D).
    res = run(requests([0.0, D], 10, [3, 1]), max_num_seqs=2)
    assert row(res, 1)["first_scheduled_s"] == D
    assert row(res, 1)["finish_s"] == 2 * D
    # One ulp later it misses that plan and waits for the next boundary.
    late = math.nextafter(D, 1.0)
    res = run(requests([0.0, late], 10, [3, 1]), max_num_seqs=2)
    assert row(res, 1)["first_scheduled_s"] == 2 * D


def test_requests_arriving_together_are_admitted_together():
    res = run(requests([0.5, 0.5, 0.5], [4, 5, 6], 2), max_num_seqs=8)
    assert res.requests["first_scheduled_s"].tolist() == [0.5] * 3
    assert res.steps["num_prefill_tokens"].tolist() == [15, 0]
    assert res.steps["num_decode_tokens"].tolist() == [0, 3]


# -- two requests under continuous batching ---------------------------------------------------

def test_vllm_mode_second_request_waits_for_the_boundary_then_delays_the_first_by_one_step():
    # 0: arrives 0, 4 tokens out. 1: arrives 1.3 (mid-step), 2 tokens out. D = 1.
    #   [0,1) prefill 0 -> token 1 of 0      [1,2) decode 0 -> token 2 of 0
    #   [2,3) prefill 1 only (vLLM prefill priority): 0 waits; token 1 of 1 at 3
    #   [3,4) decode 0 and 1 -> token 3 of 0, token 2 of 1 (1 finishes)
    #   [4,5) decode 0 -> token 4 of 0 (finishes at 5, one step later than alone)
    res = run(requests([0.0, 1.3], 10, [4, 2]), step_s=1.0, max_num_seqs=4, mode="vllm")
    a, b = row(res, 0), row(res, 1)
    assert (a["first_scheduled_s"], a["first_token_s"], a["finish_s"]) == (0.0, 1.0, 5.0)
    assert (b["first_scheduled_s"], b["first_token_s"], b["finish_s"]) == (2.0, 3.0, 4.0)
    assert a["ttft_s"] == 1.0 and a["e2e_s"] == 5.0
    assert b["ttft_s"] == pytest.approx(1.7, abs=1e-12)
    assert b["e2e_s"] == pytest.approx(2.7, abs=1e-12)
    assert a["max_itl_s"] == 2.0  # token 2 at 2, token 3 at 4: the prefill step in between
    assert a["tpot_s"] == pytest.approx(4 / 3)
    assert b["tpot_s"] == 1.0
    s = res.steps
    assert s["start_s"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert s["num_seqs"].tolist() == [1, 1, 1, 2, 1]
    assert s["num_prefill_tokens"].tolist() == [10, 0, 10, 0, 0]
    assert s["num_decode_tokens"].tolist() == [0, 1, 0, 2, 1]
    assert s["num_waiting"].tolist() == [0, 0, 0, 0, 0]
    # ITLs: request 0 has 1, 2, 1; request 1 has 1 -> mean 1.25 s, max 2 s.
    assert res.summary["mean_itl_ms"] == pytest.approx(1250.0)
    assert res.summary["p99_itl_ms"] == pytest.approx(np.percentile([1, 1, 1, 2], 99) * 1e3)


def test_orca_mode_runs_the_new_prefill_in_the_same_step_as_the_decodes():
    res = run(requests([0.0, 1.3], 10, [4, 2]), step_s=1.0, max_num_seqs=4, mode="orca")
    a, b = row(res, 0), row(res, 1)
    assert (a["first_token_s"], a["finish_s"]) == (1.0, 4.0)
    assert (b["first_scheduled_s"], b["first_token_s"], b["finish_s"]) == (2.0, 3.0, 4.0)
    assert a["max_itl_s"] == 1.0
    s = res.steps
    assert s["num_seqs"].tolist() == [1, 1, 2, 2]
    assert s["num_prefill_tokens"].tolist() == [10, 0, 10, 0]
    assert s["num_decode_tokens"].tolist() == [0, 1, 1, 2]


def test_a_full_batch_makes_the_next_request_wait_for_a_free_slot():
    # max_num_seqs=1: request 1 (arrives at 0.5) runs only after request 0 finishes at 3D.
    res = run(requests([0.0, 0.5 * D], 8, 3), max_num_seqs=1)
    assert row(res, 1)["first_scheduled_s"] == 3 * D
    assert row(res, 1)["finish_s"] == 6 * D
    # num_waiting counts what the plan left waiting: request 1 arrives during step 0, so the
    # engine first sees it at the plan of step 1.
    assert res.steps["num_waiting"].tolist() == [0, 1, 1, 0, 0, 0]


# -- KV cache: preemption and rejection -------------------------------------------------------

def test_kv_exhaustion_preempts_the_newest_by_recompute_with_exact_token_counts():
    # 3 blocks of 4 tokens; two requests of 4 prompt + 6 output tokens arrive together.
    #   [0,1)  both prefilled (1 block each), first tokens at 1.
    #   t=1    each decode needs a 2nd block, 1 free: the newest (1) is preempted (KV dropped).
    #   [1,6)  0 decodes alone (grows to 3 blocks), finishes at 6; 1 cannot re-enter (its
    #          recompute of 4 + 1 tokens needs 2 blocks) until 0 frees its KV.
    #   [6,7)  1 recomputes 5 tokens (prompt + its first output) and samples token 2 at 7.
    #   [7,11) 1 decodes tokens 3..6, finishes at 11.
    kv = {"num_blocks": 3, "block_size": 4}
    res = run(requests([0.0, 0.0], 4, 6), kv=kv, step_s=1.0, max_num_seqs=2, watermark=0.0)
    a, b = row(res, 0), row(res, 1)
    assert a["status"] == b["status"] == "finished"
    assert (a["num_preemptions"], b["num_preemptions"]) == (0, 1)
    assert b["num_generated"] == b["num_output_tokens"] == 6
    assert (a["first_token_s"], a["finish_s"]) == (1.0, 6.0)
    assert (b["first_scheduled_s"], b["first_token_s"], b["finish_s"]) == (0.0, 1.0, 11.0)
    assert b["max_itl_s"] == 6.0
    s = res.steps
    assert len(s) == 11
    assert s["num_prefill_tokens"].tolist() == [8, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0]
    assert s["num_decode_tokens"].tolist() == [0, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1]
    assert s["num_waiting"].tolist() == [0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0]
    # Without preemption 2 * (4 + 5) tokens are computed; the recompute redoes the 4 lost.
    assert int(s["num_prefill_tokens"].sum() + s["num_decode_tokens"].sum()) == 18 + 4
    assert res.summary["num_preemptions"] == 1


def test_step_kv_usage_is_what_the_step_held_while_it_ran():
    # Same scenario as above: request 0 holds 3 blocks (the whole cache) in its last step
    # [5, 6), request 1 likewise in [10, 11).
    kv = {"num_blocks": 3, "block_size": 4}
    res = run(requests([0.0, 0.0], 4, 6), kv=kv, step_s=1.0, max_num_seqs=2, watermark=0.0)
    assert res.steps["kv_used_blocks"].tolist() == [2, 2, 2, 2, 2, 3, 2, 2, 2, 2, 3]
    assert res.summary["max_kv_usage"] == 1.0


def test_a_request_that_can_never_fit_in_kv_is_rejected_with_a_reason():
    # Request 0 needs ceil(101 / 16) = 7 blocks; the cache has 4. Request 1 fits and finishes.
    res = run(requests([0.0, 0.5], [100, 10], 2), kv={"num_blocks": 4, "block_size": 16})
    a, b = row(res, 0), row(res, 1)
    assert a["status"] == "rejected"
    assert a["reason"] == "needs 7 KV blocks, the cache has 4"
    assert a["finish_s"] == 0.0 and math.isnan(a["first_scheduled_s"])
    assert a["num_generated"] == 0 and math.isnan(a["e2e_s"])
    assert b["status"] == "finished" and b["finish_s"] == 0.5 + 2 * D
    assert res.summary["completed"] == 1 and res.summary["num_rejected"] == 1


def test_a_context_that_outgrows_the_whole_cache_is_rejected_mid_run():
    # 2 blocks of 16 hold 32 tokens: 10 prompt + 22 decodes reach 32 computed tokens after
    # 23 steps; the next token could never be stored, so the request ends there (no hang).
    res = run(requests([0.0], 10, 100), kv={"num_blocks": 2, "block_size": 16}, step_s=1.0)
    r = row(res, 0)
    assert r["status"] == "rejected"
    assert r["reason"] == "context outgrew the KV cache"
    assert r["num_generated"] == 23
    assert r["finish_s"] == 23.0
    assert len(res.steps) == 23


def test_a_prompt_longer_than_the_token_budget_is_rejected_by_continuous():
    res = run(requests([0.0, 0.0], [65, 64], 2), max_num_batched_tokens=64, max_num_seqs=64)
    a, b = row(res, 0), row(res, 1)
    assert a["status"] == "rejected"
    assert "max_num_batched_tokens=64" in a["reason"]
    assert math.isnan(a["first_scheduled_s"])
    assert b["status"] == "finished" and b["finish_s"] == 2 * D


# -- plan validation --------------------------------------------------------------------------

@dataclass
class FixedPlan(Policy):
    """A test-only policy returning whatever plan ``make(view)`` builds."""

    make: object = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    name = "fixed-plan-for-tests"

    def schedule(self, view: View) -> Plan:
        return self.make(view)


def all_waiting(view: View, n: int | None = None) -> dict[int, int]:
    return {s.id: n if n is not None else s.num_uncomputed for s in view.waiting}


@pytest.mark.parametrize("make,limits,kv,rule", [
    (lambda v: Plan(run={999: 1}), {}, None, "request 999 is not waiting or running"),
    (lambda v: Plan(run=all_waiting(v, 11)), {}, None, "11 tokens scheduled, 1..10 allowed"),
    (lambda v: Plan(run=all_waiting(v, 0)), {}, None, "0 tokens scheduled"),
    (lambda v: Plan(run=all_waiting(v)), {"max_num_seqs": 1}, None,
     "2 sequences > max_num_seqs=1"),
    (lambda v: Plan(run=all_waiting(v)), {"max_num_batched_tokens": 15}, None,
     "20 tokens > max_num_batched_tokens=15"),
    (lambda v: Plan(run=all_waiting(v)), {}, {"num_blocks": 1, "block_size": 16},
     "needs 2 KV blocks, only 1 free"),
    (lambda v: Plan(preempt=(0,)), {}, None, "preempt of request 0, which is not running"),
    (lambda v: Plan(reject={999: "no"}), {}, None, "reject of request 999, which is not waiting"),
    (lambda v: Plan(wake_at_s=v.now_s), {}, None, "is not in the future"),
    (lambda v: Plan(), {}, None, "stalled"),
])
def test_an_invalid_plan_raises_an_engine_error_naming_the_policy_and_the_rule(
        make, limits, kv, rule):
    pol = FixedPlan(make=make, **limits)
    with pytest.raises(EngineError) as err:
        sim.simulate(requests([0.0, 0.0], 10, 2), policy=pol, cost=sim.ConstantCost(D), kv=kv)
    assert "'fixed-plan-for-tests'" in str(err.value)
    assert rule in str(err.value)



def test_a_plan_may_schedule_up_to_the_num_uncomputed_of_the_view_its_policy_saw():
    # ``validate_plan`` reads that very view by field name: mid-prefill (chunks of 4 of a
    # 10-token prompt) the range it allows is the view's own ``num_uncomputed``
    seen: list[int] = []

    def make(v: View) -> Plan:
        if len(seen) < 2:
            seen.append(0)
            return Plan(run={s.id: min(4, s.num_uncomputed) for s in (*v.running, *v.waiting)})
        s = v.running[0]
        seen.append(s.num_uncomputed)
        return Plan(run={s.id: s.num_uncomputed + 1})

    with pytest.raises(EngineError) as err:
        sim.simulate(requests([0.0], 10, 2), policy=FixedPlan(make=make),
                     cost=sim.ConstantCost(D))
    assert seen[-1] == 2
    assert "request 0: 3 tokens scheduled, 1..2 allowed" in str(err.value)

def test_a_policy_instance_is_used_as_given():
    # No registration needed: an instance passes straight through make_policy.
    pol = FixedPlan(make=lambda v: Plan(run={s.id: s.num_uncomputed
                                             for s in v.waiting + v.running}))
    res = sim.simulate(requests([0.0, 0.0], 10, 3), policy=pol, cost=sim.ConstantCost(D),
                       checks=True)
    assert res.requests["finish_s"].tolist() == [3 * D, 3 * D]


def test_a_cost_model_with_only_step_works():
    class OnlyStep:
        peak_flops = None
        peak_bytes_per_s = None

        def step(self, shape):
            return sim.StepCost(D)

    res = sim.simulate(requests([0.0], 4, 5), policy="continuous", cost=OnlyStep())
    assert res.requests["finish_s"].tolist() == [5 * D]


# -- determinism ------------------------------------------------------------------------------

def test_same_inputs_give_identical_tables_and_summary():
    rng = np.random.default_rng(7)
    n = 300
    reqs = requests(np.cumsum(rng.exponential(0.02, n)), rng.integers(1, 200, n),
                    rng.integers(1, 50, n))
    kv = {"num_blocks": 60, "block_size": 16}
    cost = sim.LinearCost(base_s=0.004, per_token_s=2e-5, per_seq_s=1e-4)
    runs = [sim.simulate(list(order), policy={"name": "continuous", "max_num_seqs": 16},
                         cost=cost, kv=kv, checks=True)
            for order in (reqs, reqs, reqs[::-1])]
    first = runs[0]
    assert first.summary["num_preemptions"] > 0  # the tight cache exercises preemption
    for other in runs[1:]:
        pd.testing.assert_frame_equal(first.requests, other.requests)
        pd.testing.assert_frame_equal(first.steps, other.steps)
        assert first.irregular_itl == other.irregular_itl
        assert first.summary.keys() == other.summary.keys()
        for k, v in first.summary.items():
            w = other.summary[k]
            assert v == w or (isinstance(v, float) and math.isnan(v) and math.isnan(w)), k
    check_invariants(first, reqs, first.kv)


# -- ITL statistics ---------------------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1e3, allow_nan=False), st.integers(0, 6)),
                min_size=1, max_size=30).filter(lambda xs: any(c for _, c in xs)))
def test_weighted_itl_stats_equal_numpy_on_the_expanded_sample(pairs):
    values = np.array([v for v, _ in pairs])
    counts = np.array([c for _, c in pairs], dtype=float)
    got = _stats(values, counts)
    expanded = np.repeat(values, counts.astype(int))
    want = {"mean": expanded.mean(), "median": np.percentile(expanded, 50),
            "p90": np.percentile(expanded, 90), "p99": np.percentile(expanded, 99)}
    for k, v in want.items():
        assert got[k] == pytest.approx(v * 1e3, rel=1e-9, abs=1e-9), k


class Recorder(NoSkip):
    """Keeps every view the wrapped policy saw and plan it made, one plan per step."""

    name = "recorder"

    def __init__(self, inner: Policy) -> None:
        super().__init__(inner)
        self.log: list[tuple[View, Plan]] = []

    def schedule(self, view: View) -> Plan:
        plan = super().schedule(view)
        self.log.append((view, plan))
        return plan


def token_times(rec: Recorder, res) -> dict[int, list[float]]:
    """Each request's token times, rebuilt from the views alone: a token sampled in a step shows
    up as ``num_generated + 1`` in the next view (or as the request leaving, finished)."""
    ends = (res.steps["start_s"] + res.steps["duration_s"]).tolist()
    times: dict[int, list[float]] = {}
    k = 0
    for i, (view, plan) in enumerate(rec.log):
        if not plan.run:
            continue
        now = {s.id: s.num_generated for s in view.waiting + view.running}
        nxt = {}
        if i + 1 < len(rec.log):
            v2 = rec.log[i + 1][0]
            nxt = {s.id: s.num_generated for s in v2.waiting + v2.running}
        for sid in plan.run:
            if sid in nxt:
                sampled = nxt[sid] - now[sid]
            else:  # left the engine: finished exactly at this step's end
                assert row(res, sid)["finish_s"] == ends[k]
                sampled = 1
            times.setdefault(sid, []).extend([ends[k]] * sampled)
        k += 1
    assert k == len(ends)
    return times


def test_itl_statistics_of_a_run_equal_numpy_on_every_token_gap():
    # Preemptions and stalls make irregular gaps; the engine stores those apart from the
    # one-step gaps it only counts. Rebuild every gap independently and compare.
    rng = np.random.default_rng(3)
    n = 80
    reqs = requests(np.cumsum(rng.exponential(0.3, n)), rng.integers(1, 30, n),
                    rng.integers(1, 13, n))
    rec = Recorder(policies.make_policy({"name": "continuous", "max_num_seqs": 4}))
    res = sim.simulate(reqs, policy=rec, cost=sim.LinearCost(base_s=0.05, per_token_s=1e-3),
                       kv={"num_blocks": 6, "block_size": 8}, checks=True)
    assert res.summary["num_preemptions"] > 0
    assert (res.requests["status"] == "finished").all()
    times = token_times(rec, res)
    gaps = []
    for r in reqs:
        t = np.array(times[r.id])
        x = row(res, r.id)
        assert len(t) == r.num_output_tokens
        assert t[0] == x["first_token_s"] and t[-1] == x["finish_s"]
        assert x["max_itl_s"] == (np.diff(t).max() if len(t) > 1 else 0.0)
        gaps.extend(np.diff(t))
    assert len(gaps) == sum(r.num_output_tokens - 1 for r in reqs)
    assert res.summary["mean_itl_ms"] == pytest.approx(np.mean(gaps) * 1e3)
    for stat, q in (("median", 50), ("p90", 90), ("p99", 99)):
        assert res.summary[f"{stat}_itl_ms"] == pytest.approx(np.percentile(gaps, q) * 1e3)


def test_requests_beyond_the_models_context_are_rejected_at_arrival():
    # Llama-3-70B's max_position_embeddings is 8192 (its HF config): a 20,000-token prompt,
    # or 8,000 prompt + 500 output tokens, can never be served whole (vLLM refuses them too).
    cost = sim.build_cost_model(model="llama-3-70b", hardware="h100-sxm", tp=4)
    reqs = [sim.Request(0, 0.0, 20_000, 10), sim.Request(1, 0.0, 8_000, 500),
            sim.Request(2, 0.0, 8_000, 192)]
    res = sim.simulate(reqs, policy={"name": "continuous", "max_num_batched_tokens": 32768},
                       cost=cost, kv={"block_size": 16})
    status = dict(zip(res.requests["id"], res.requests["status"], strict=True))
    assert status == {0: "rejected", 1: "rejected", 2: "finished"}
    assert "max_model_len=8192" in res.requests.loc[1, "reason"]
    # An explicit limit overrides the model's; None lifts it.
    lifted = sim.simulate(reqs[1:2], policy={"name": "continuous"}, cost=cost,
                          kv={"block_size": 16}, max_model_len=None)
    assert lifted.requests.loc[0, "status"] == "finished"
