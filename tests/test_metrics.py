"""The metrics contract: names (as in ``vllm bench serve``) and hand-computed values.

Every expected number below is worked out by hand from a timeline with ``ConstantCost`` steps
of 1 s, so each test doubles as the definition of its metric:

- ``duration``: first arrival to last finish of the counted requests; throughputs divide by it;
- TTFT = first token − arrival; E2E = finish − arrival; TPOT = (E2E − TTFT) / (N − 1), undefined
  for a single output token; ITL = the gap between consecutive tokens of one request;
- ``busy_fraction``: summed step time / duration; ``slot_utilization``: step-time-weighted share
  of the policy's slots holding a real request; ``padding_fraction``: padding tokens / all
  computed tokens; ``mean_batch_size``: mean real rows per step;
- ``mfu`` / ``mbu``: useful FLOPs (bytes) / (duration × peak);
- SLO attainment: share of the counted requests (rejected ones included, as failures) that meet
  every SLO; ``request_goodput``: those requests per second of duration;
- warm-up/cool-down trimming counts requests arriving in [first + warmup, last − cooldown] and
  steps starting between the window's start and its last finish.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
from helpers import requests

import policies
import sim
from sim.core.types import BatchShape, StepCost

SUMMARY_NAMES = [
    "completed", "duration", "request_throughput", "output_throughput",
    "total_token_throughput",
    *[f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el")
      for s in ("mean", "median", "p90", "p99")],
    "busy_fraction", "mfu", "mbu", "slot_utilization", "padding_fraction", "mean_batch_size",
    "num_preemptions", "max_kv_usage",
]
REQUEST_COLUMNS = ["id", "arrival_s", "first_scheduled_s", "first_token_s", "finish_s",
                   "ttft_s", "tpot_s", "e2e_s", "max_itl_s", "num_preemptions",
                   "num_prompt_tokens", "num_output_tokens"]
STEP_COLUMNS = ["start_s", "duration_s", "num_seqs", "num_prefill_tokens", "num_decode_tokens",
                "num_padding_tokens", "kv_used_blocks", "flops", "bytes", "bound"]


def simulate(reqs, policy=None, **kw):
    policy = policy or {"name": "continuous", "max_num_seqs": 4}
    return sim.simulate(reqs, policy=policy, cost=kw.pop("cost", sim.ConstantCost(1.0)),
                        checks=True, **kw)


def two_requests(**kw):
    """Request 0 (arrives 0, 4 tokens) and 1 (arrives 1.3, 2 tokens), 10-token prompts, vLLM
    mode: 0's tokens at 1, 2, 4, 5 (1's prefill-only step [2, 3) delays it); 1's at 3 and 4."""
    return simulate(requests([0.0, 1.3], 10, [4, 2]), **kw)


# -- names -------------------------------------------------------------------------------------

def test_summary_has_every_design_name():
    s = two_requests().summary
    assert set(SUMMARY_NAMES) <= set(s)
    assert "request_goodput" not in s and "slo_attainment" not in s
    s = two_requests(slos={"ttft_ms": 1000}).summary
    assert {"request_goodput", "slo_attainment"} <= set(s)


def test_tables_have_the_documented_columns():
    res = two_requests()
    assert set(REQUEST_COLUMNS) <= set(res.requests.columns)
    assert set(STEP_COLUMNS) <= set(res.steps.columns)
    assert res.requests["id"].tolist() == [0, 1]
    assert len(res.steps) == 5


# -- hand-computed values ----------------------------------------------------------------------

def test_throughput_and_latency_summary_by_hand():
    s = two_requests().summary
    assert s["completed"] == 2
    assert s["duration"] == 5.0  # first arrival 0 to last finish 5
    assert s["request_throughput"] == pytest.approx(2 / 5)
    assert s["output_throughput"] == pytest.approx((4 + 2) / 5)
    assert s["total_token_throughput"] == pytest.approx((4 + 2 + 10 + 10) / 5)
    ttft = [1.0, 3.0 - 1.3]
    e2e = [5.0, 4.0 - 1.3]
    tpot = [(5.0 - 1.0) / 3, (4.0 - 3.0) / 1]
    itl = [1.0, 2.0, 1.0, 1.0]
    for name, values in (("ttft", ttft), ("e2el", e2e), ("tpot", tpot), ("itl", itl)):
        assert s[f"mean_{name}_ms"] == pytest.approx(np.mean(values) * 1e3)
        for stat, q in (("median", 50), ("p90", 90), ("p99", 99)):
            assert s[f"{stat}_{name}_ms"] == pytest.approx(np.percentile(values, q) * 1e3)
    assert s["busy_fraction"] == 1.0  # 5 steps of 1 s over 5 s
    assert s["mean_batch_size"] == pytest.approx((1 + 1 + 1 + 2 + 1) / 5)
    assert s["slot_utilization"] == pytest.approx((1 + 1 + 1 + 2 + 1) / 4 / 5)  # 4 slots
    assert s["padding_fraction"] == 0.0
    assert s["num_preemptions"] == 0
    assert math.isnan(s["max_kv_usage"])  # unlimited cache
    assert math.isnan(s["mfu"]) and math.isnan(s["mbu"])  # no peaks in ConstantCost


def test_tpot_is_e2e_minus_ttft_over_n_minus_1():
    rng = np.random.default_rng(1)
    n = 40
    reqs = requests(np.cumsum(rng.exponential(0.5, n)), rng.integers(1, 30, n),
                    rng.integers(1, 9, n))
    df = simulate(reqs, cost=sim.LinearCost(base_s=0.1, per_token_s=0.01)).requests
    many = df["num_output_tokens"] > 1
    want = (df["e2e_s"] - df["ttft_s"]) / (df["num_output_tokens"] - 1)
    np.testing.assert_allclose(df.loc[many, "tpot_s"], want[many], rtol=1e-12)
    assert df.loc[~many, "tpot_s"].isna().all()
    np.testing.assert_allclose(df["ttft_s"], df["first_token_s"] - df["arrival_s"])
    np.testing.assert_allclose(df["e2e_s"], df["finish_s"] - df["arrival_s"])


def test_busy_fraction_counts_idle_time_between_requests():
    # Steps [0,1), [1,2), then idle until 10, steps [10,11), [11,12): busy 4 s of 12 s.
    s = simulate(requests([0.0, 10.0], 5, 2)).summary
    assert s["duration"] == 12.0
    assert s["busy_fraction"] == pytest.approx(4 / 12)
    assert s["request_throughput"] == pytest.approx(2 / 12)
    assert s["mean_batch_size"] == 1.0
    assert s["slot_utilization"] == pytest.approx(1 / 4)


def test_padding_and_slot_utilization_of_a_static_batch():
    # Batch of 2: prompts 4 and 2 (the shorter padded by 2 tokens), outputs 1 and 3. Request 0
    # finishes after the prefill; its slot is computed as 1 padding token in each of the two
    # decode steps of request 1. Real tokens 4 + 2 + 1 + 1, padding 2 + 1 + 1.
    if "static" not in policies.registered():
        pytest.skip("no 'static' policy registered")
    res = simulate(requests([0.0, 0.0], [4, 2], [1, 3]),
                   policy={"name": "static", "batch_size": 2})
    s = res.summary
    assert res.steps["num_padding_tokens"].tolist() == [2, 1, 1]
    assert s["padding_fraction"] == pytest.approx(4 / 12)
    assert s["slot_utilization"] == pytest.approx((2 + 1 + 1) / 2 / 3)
    assert s["mean_batch_size"] == pytest.approx(4 / 3)


@dataclass(frozen=True)
class CountingCost(sim.ConstantCost):
    """1 s per step, 100 FLOPs and 50 bytes per token computed; peaks 1000 FLOP/s, 100 B/s."""

    step_s: float = 1.0
    peak_flops: float = 1000.0
    peak_bytes_per_s: float = 100.0

    def step(self, shape: BatchShape) -> StepCost:
        return StepCost(1.0, flops=100.0 * shape.num_tokens, bytes=50.0 * shape.num_tokens,
                        bound="test")


def test_mfu_and_mbu_by_hand():
    # One request, prompt 3, 2 outputs: steps of 3 and 1 tokens over 2 s.
    s = simulate(requests([0.0], 3, 2), cost=CountingCost()).summary
    assert s["mfu"] == pytest.approx(100 * 4 / (2 * 1000))
    assert s["mbu"] == pytest.approx(50 * 4 / (2 * 100))


def test_mfu_counts_only_the_useful_share_of_padded_steps():
    if "static" not in policies.registered():
        pytest.skip("no 'static' policy registered")
    # The static batch above: 12 tokens computed over 3 s, 8 of them real.
    s = simulate(requests([0.0, 0.0], [4, 2], [1, 3]), policy={"name": "static", "batch_size": 2},
                 cost=CountingCost()).summary
    assert s["mfu"] == pytest.approx(100 * 8 / (3 * 1000))
    assert s["mbu"] == pytest.approx(50 * 12 / (3 * 100))  # padding still reads memory


def test_kv_usage_summary():
    # Two requests of prompt 20 + 2 outputs, 16-token blocks: 2 blocks each while they run.
    res = simulate(requests([0.0, 0.0], 20, 3), kv={"num_blocks": 8, "block_size": 16})
    assert res.steps["kv_used_blocks"].max() == 4
    assert res.summary["max_kv_usage"] == pytest.approx(4 / 8)


# -- SLOs and goodput --------------------------------------------------------------------------

def test_slo_attainment_and_goodput_by_hand():
    # Request 0: TTFT 1000 ms, TPOT 1333 ms. Request 1: TTFT 1700 ms, TPOT 1000 ms.
    s = two_requests(slos={"ttft_ms": 1500, "tpot_ms": 1500}).summary
    assert s["slo_attainment"] == 0.5
    assert s["request_goodput"] == pytest.approx(1 / 5)
    s = two_requests(slos={"ttft_ms": 2000, "tpot_ms": 1200}).summary
    assert s["slo_attainment"] == 0.5  # now request 0 fails on TPOT
    s = two_requests(slos={"e2el_ms": 5000}).summary
    assert s["slo_attainment"] == 1.0
    assert s["request_goodput"] == pytest.approx(2 / 5)
    s = two_requests(slos={"ttft_ms": 999}).summary
    assert s["slo_attainment"] == 0.0 and s["request_goodput"] == 0.0


def test_a_single_token_request_cannot_violate_a_tpot_slo():
    s = simulate(requests([0.0], 5, 1), slos={"tpot_ms": 1}).summary
    assert s["slo_attainment"] == 1.0


def test_a_rejected_request_counts_against_slo_attainment():
    # Request 1's prompt exceeds the token budget: rejected, so 1 of 2 requests meets the SLO.
    res = simulate(requests([0.0, 0.0], [5, 100], 2),
                   policy={"name": "continuous", "max_num_batched_tokens": 64, "max_num_seqs": 64},
                   slos={"ttft_ms": 10_000})
    s = res.summary
    assert s["completed"] == 1 and s["num_rejected"] == 1
    assert s["slo_attainment"] == 0.5
    assert s["request_goodput"] == pytest.approx(1 / 2)  # 1 good request over 2 s


# -- warm-up and cool-down ---------------------------------------------------------------------

def three_spaced(**kw):
    """Requests at 0, 10 and 20, two tokens each: steps [0,2), [10,12), [20,22)."""
    return simulate(requests([0.0, 10.0, 20.0], 5, 2), **kw).summary


def test_warmup_drops_the_requests_and_steps_before_the_window():
    s = three_spaced(warmup_s=5.0)
    assert s["completed"] == 2
    assert s["duration"] == 12.0  # first counted arrival 10 to last finish 22
    assert s["num_steps"] == 4
    assert s["busy_fraction"] == pytest.approx(4 / 12)
    assert s["mean_ttft_ms"] == 1000.0


def test_cooldown_drops_the_requests_after_the_window():
    s = three_spaced(cooldown_s=5.0)
    assert s["completed"] == 2
    assert s["duration"] == 12.0  # arrival 0 to finish 12
    assert s["num_steps"] == 4
    assert s["busy_fraction"] == pytest.approx(4 / 12)


def test_no_trimming_counts_everything():
    s = three_spaced()
    assert (s["completed"], s["duration"], s["num_steps"]) == (3, 22.0, 6)


def test_trimming_keeps_the_itl_stalls_of_the_requests_in_the_window():
    # The two-request timeline plus a third request at 50 that the cool-down trims. The kept
    # requests' ITLs are 1, 2, 1 (request 0) and 1 (request 1), as without trimming.
    reqs = requests([0.0, 1.3, 50.0], 10, [4, 2, 1])
    s = simulate(reqs, cooldown_s=10.0).summary
    assert s["completed"] == 2
    assert s["mean_itl_ms"] == pytest.approx(1250.0)
    assert s["p99_itl_ms"] == pytest.approx(np.percentile([1, 1, 1, 2], 99) * 1e3)
