"""Prediction intervals: the step-time scale is exact, and intervals bracket the estimate."""
from __future__ import annotations

import numpy as np
import pytest

import sim
from sim.core.types import BatchShape
from sim.cost.uncertainty import DATASHEET_SIGMA, scaled, step_sigma
from sim.experiments.intervals import INTERVAL_METRICS, summary_with_intervals
from sim.workload.build import build_workload_arrays


def _requests(seed: int):
    return build_workload_arrays({"arrival": {"process": "poisson", "rate": 8.0},
                                  "num_requests": 60,
                                  "lengths": {"dist": "empirical", "trace": "azure-conv"}},
                                 np.random.default_rng(seed)).to_requests()


@pytest.mark.parametrize("engine", ["vllm-v0", "ideal"])
def test_scaled_cost_multiplies_every_step(engine):
    cost = sim.build_cost_model("llama-3-70b", "h100-sxm", 4, engine=engine)
    for shape in (BatchShape.of([1] * 8, [900] * 8), BatchShape.of([512, 1], [512, 40]),
                  BatchShape.of([4096], [4096])):
        assert scaled(cost, 1.3).step(shape).seconds == pytest.approx(
            1.3 * cost.step(shape).seconds, rel=1e-9)
    with pytest.raises(ValueError):
        scaled(cost, 0.0)


def test_sigma_follows_the_calibration():
    fitted = sim.build_cost_model("llama-3-8b", "h100-sxm", engine="ideal")
    sheet = sim.build_cost_model("llama-3-8b", "mi300x", engine="ideal")
    derived = sim.build_cost_model("llama-3-8b", "h100-sxm", engine="vllm-v1")
    assert 0.05 < step_sigma(fitted) < 0.2
    assert step_sigma(sheet) == pytest.approx(DATASHEET_SIGMA)
    assert step_sigma(derived) > step_sigma(fitted)


def test_intervals_bracket_the_point_estimate_and_are_deterministic():
    cost = sim.build_cost_model("llama-3-8b", "h100-sxm")
    a = summary_with_intervals(_requests, {"name": "continuous"}, cost, draws=4)
    b = summary_with_intervals(_requests, {"name": "continuous"}, cost, draws=4)
    assert a == b
    for m in INTERVAL_METRICS:
        if f"{m}_lo" in a:
            assert a[f"{m}_lo"] <= a[m] <= a[f"{m}_hi"], m
    assert a["median_tpot_ms_hi"] > a["median_tpot_ms_lo"]
    wider = summary_with_intervals(_requests, {"name": "continuous"}, cost, draws=4, sigma=0.5)
    assert (wider["median_tpot_ms_hi"] - wider["median_tpot_ms_lo"]
            > a["median_tpot_ms_hi"] - a["median_tpot_ms_lo"])


def test_capacity_has_an_interval_that_widens_with_sigma():
    from sim.experiments.intervals import capacity_with_interval

    def requests(rate: float, seed: int):
        return build_workload_arrays({"arrival": {"process": "poisson", "rate": rate},
                                      "num_requests": 60,
                                      "lengths": {"dist": "empirical", "trace": "azure-conv"}},
                                     np.random.default_rng(seed)).to_requests()

    def passes(s) -> bool:
        return s["num_unfinished"] == 0 and s["p99_tpot_ms"] <= 30.0

    cost = sim.build_cost_model("llama-3-8b", "h100-sxm")
    none = capacity_with_interval(requests, {"name": "continuous"}, cost, passes, 4.0,
                                  draws=3, sigma=0.0, tolerance=0.1)
    wide = capacity_with_interval(requests, {"name": "continuous"}, cost, passes, 4.0,
                                  draws=3, sigma=0.5, tolerance=0.1)
    assert none["max_rate_lo"] <= none["max_rate"] <= none["max_rate_hi"]
    assert wide["max_rate"] == none["max_rate"]  # the point search never scales the cost
    assert (wide["max_rate_hi"] - wide["max_rate_lo"]
            >= none["max_rate_hi"] - none["max_rate_lo"])
