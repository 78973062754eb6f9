"""Bucketed step tables (``step_table="buckets"``): flat memory, the same summary.

The summary of a bucketed run is computed from every step through streaming sums, never from
the buckets: counts, maxima and percentiles equal the full table's exactly, sums of floats to
summation order. The fold sizes are shrunk here so that rows are folded mid-run (the general
engine's log and the compiled interpreter's buffer), and some steps are held back past the
window's last known finish (warm-up, cool-down, horizon, several replicas).
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

import sim
import sim.engine.compiled as compiled
import sim.metrics.steplog as steplog
from sim.core.errors import InputError
from sim.metrics.stream import SUM_COLUMNS, is_bucketed, timeline_frame
from sim.workload.build import build_workload_arrays

COST = sim.build_cost_model(model="llama-3-8b", hardware="h100-sxm", tp=1, engine="vllm")
#: Metrics that are sums of floats: equal to the full table's up to summation order.
FLOAT_SUMS = {"busy_fraction", "mfu", "mbu", "slot_utilization", "mean_kv_usage",
              "mean_itl_ms", "swapped_bytes", "preemption_time_lost_s",
              "mean_kv_live_fraction", "kv_internal_fragmentation", "imbalance_cv"}


@pytest.fixture(autouse=True)
def small_folds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(steplog, "FOLD_ROWS", 97)
    monkeypatch.setattr(compiled, "INITIAL_LOG_ROWS", 64)


def workload(n: int = 400, rate: float = 12.0):  # noqa: ANN201
    spec = {"arrival": {"process": "poisson", "rate": rate}, "num_requests": n,
            "lengths": {"dist": "empirical", "trace": "azure-conv"}}
    return build_workload_arrays(spec, np.random.default_rng(5))


def assert_same_summary(full: dict, bucketed: dict) -> None:
    assert full.keys() == bucketed.keys()
    for key, want in full.items():
        got = bucketed[key]
        if isinstance(want, float) and math.isnan(want):
            assert isinstance(got, float) and math.isnan(got), key
        elif key in FLOAT_SUMS:
            assert got == pytest.approx(want, rel=1e-12, abs=1e-300), key
        else:
            assert got == want, key


CASES = [
    ({"name": "chunked_prefill", "token_budget": 512}, False, {}),
    ({"name": "chunked_prefill", "token_budget": 512}, False,
     {"warmup_s": 5.0, "cooldown_s": 8.0, "num_replicas": 2}),
    ({"name": "static", "batch_size": 8, "timeout_s": 0.5}, False, {"horizon_s": 20.0}),
    ({"name": "continuous", "max_num_seqs": 64}, False,
     {"kv": {"block_size": 16, "num_blocks": 300, "preemption": "swap", "swap_gbps": 25.0,
             "kv_bytes_per_token": 131072}}),
    ({"name": "continuous"}, "compiled", {"cooldown_s": 6.0, "num_replicas": 3}),
    ({"name": "continuous"}, "compiled", {"horizon_s": 15.0}),
    # a routed run: its routing metrics read busy seconds (a KeyError on buckets before)
    ({"name": "continuous"}, False, {"num_replicas": 2, "router": "least_outstanding_tokens"}),
]


@pytest.mark.parametrize("policy,fast_path,kwargs", CASES)
def test_bucketed_runs_have_the_summary_and_requests_of_full_runs(policy, fast_path, kwargs):
    reqs = workload()
    kw = {"kv": {"block_size": 16, "num_blocks": 2000}, **kwargs}
    full = sim.simulate(reqs, policy=policy, cost=COST, fast_path=fast_path,
                        step_table="full", **kw)
    bucketed = sim.simulate(reqs, policy=policy, cost=COST, fast_path=fast_path,
                            step_table="buckets", **kw)
    assert (full.step_table, bucketed.step_table) == ("full", "buckets")
    assert len(full.steps) > 200  # many folds of 97 (or 64) rows
    pd.testing.assert_frame_equal(full.requests, bucketed.requests)
    assert_same_summary(full.summary, bucketed.summary)
    if full.replicas is not None:  # a routed run's table per replica: busy seconds summed
        pd.testing.assert_frame_equal(full.replicas, bucketed.replicas, rtol=1e-12)
    # the buckets hold every step: their sums and maxima are the full table's
    b, s = bucketed.steps, full.steps
    assert is_bucketed(b) and not is_bucketed(s)
    assert int(b["num_steps"].sum()) == len(s)
    for col in ("num_seqs", "num_prefill_tokens", "num_decode_tokens", "kv_used_blocks",
                "num_regular_itl"):
        assert int(b[f"{col}_sum"].sum()) == int(s[col].sum()), col
    width = float(b["bucket_s"].iloc[0])
    index = np.floor(s["start_s"].to_numpy() / width).astype(np.int64)
    by = s.assign(bucket=index).groupby(["replica", "bucket"])
    np.testing.assert_array_equal(b["kv_used_blocks_max"], by["kv_used_blocks"].max())
    np.testing.assert_array_equal(b["num_steps"], by.size())
    np.testing.assert_array_equal(b["start_s"], by.size().index.get_level_values(1) * width)


def test_auto_keeps_small_runs_whole_and_buckets_large_ones(monkeypatch):
    reqs = workload(150)
    small = sim.simulate(reqs, policy="chunked_prefill", cost=COST)
    full = sim.simulate(reqs, policy="chunked_prefill", cost=COST, step_table="full")
    assert small.step_table == "full"
    pd.testing.assert_frame_equal(small.steps, full.steps)
    monkeypatch.setattr(steplog, "AUTO_MAX_STEPS", 100)
    large = sim.simulate(reqs, policy="chunked_prefill", cost=COST)
    assert large.step_table == "buckets" and len(full.steps) > 100
    assert_same_summary(full.summary, large.summary)
    # the interpreted fast path hands its rows over at the end: "auto" buckets them there
    fast = sim.simulate(reqs, policy="continuous", cost=COST, fast_path="interpreted")
    fast_full = sim.simulate(reqs, policy="continuous", cost=COST, fast_path="interpreted",
                             step_table="full")
    assert fast.step_table == "buckets"
    assert int(fast.steps["num_steps"].sum()) == len(fast_full.steps)
    assert_same_summary(fast_full.summary, fast.summary)


def test_timeline_frame_gives_per_step_means_per_bucket():
    res = sim.simulate(workload(150), policy="chunked_prefill", cost=COST, step_table="buckets")
    frame = timeline_frame(res.steps)
    assert len(frame) == len(res.steps)
    n = res.steps["num_steps"].to_numpy()
    np.testing.assert_allclose(frame["num_seqs"] * n, res.steps["num_seqs_sum"])
    assert {"start_s", "duration_s", *SUM_COLUMNS} <= set(frame.columns)


def test_an_unknown_step_table_is_an_input_error():
    with pytest.raises(InputError, match="step_table"):
        sim.simulate(workload(5), policy="continuous", cost=COST, step_table="rows")
