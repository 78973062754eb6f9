"""Prediction intervals: the step-time scale is exact, and intervals bracket the estimate."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


def test_one_class_factor_moves_only_that_class():
    from sim.cost.uncertainty import perturbed

    cost = sim.build_cost_model("llama-3-8b", "h100-sxm", engine="vllm-v0")
    shape = BatchShape.of([1] * 8, [900] * 8)
    base = cost.step(shape)
    slower = perturbed(cost, {"overhead": 2.0}).step(shape)
    assert slower.seconds == pytest.approx(base.seconds + base.breakdown["overhead"], rel=1e-12)
    # TP 1 has no all-reduce: the comm factor changes nothing
    assert perturbed(cost, {"comm": 3.0}).step(shape).seconds == base.seconds
    att = perturbed(cost, {"attention": 1.5}).step(shape)
    assert att.breakdown["mlp"] == base.breakdown["mlp"]
    assert att.breakdown["attention"] > base.breakdown["attention"]


def test_residual_quantiles_read_training_rows_only():
    from sim.cost.uncertainty import RESIDUAL_PROBS, residual_quantiles

    meas = np.exp(np.linspace(-0.2, 0.2, 101))
    pred = np.ones(101)
    held = np.zeros(101, bool)
    wild_meas = np.concatenate([meas, np.full(50, 100.0)])  # held-out rows 100x off
    wild = residual_quantiles({"gemm": (np.ones(151), wild_meas,
                                        np.concatenate([held, np.ones(50, bool)]))})
    clean = residual_quantiles({"gemm": (pred, meas, held)})
    assert wild == clean
    assert clean["linear"] == pytest.approx(list(np.quantile(np.log(meas), RESIDUAL_PROBS)),
                                            abs=1e-4)


def test_uncertainty_sources():
    from sim.cost.uncertainty import CLASSES, uncertainty_of

    fitted = uncertainty_of(sim.build_cost_model("llama-3-8b", "h100-sxm"))
    assert fitted.source == "training residuals per operator class"
    assert len(set(fitted.draw_of.values())) == len(CLASSES)  # independent classes
    sheet = uncertainty_of(sim.build_cost_model("llama-3-8b", "mi300x"))
    assert len({sheet.draw_of[c] for c in CLASSES[:3]}) == 1  # one shared GPU factor
    u = np.array([0.05, 0.5, 0.95, 0.3])
    assert uncertainty_of(sim.ConstantCost(0.01)).scales(u) == dict.fromkeys(CLASSES, 1.0)
    # the 5 % and 95 % points of the table are its tabulated quantiles
    table = sim.build_cost_model("llama-3-8b", "h100-sxm").gpu.calibration.fit[
        "train_log_residual_quantiles"]
    s = fitted.scales(u)
    assert s["linear"] == pytest.approx(np.exp(table["linear"][2]))
    assert s["comm"] == pytest.approx(np.exp(table["comm"][8]))
    from sim.core.errors import InputError

    with pytest.raises(InputError, match="sigma: must be a finite number >= 0"):
        uncertainty_of(sim.ConstantCost(0.01), -0.1)


def test_a_malformed_residual_table_names_the_field():
    from dataclasses import replace

    from sim.core.errors import InputError
    from sim.cost.uncertainty import uncertainty_of

    cost = sim.build_cost_model("llama-3-8b", "h100-sxm")
    fit = dict(cost.gpu.calibration.fit)
    fit["train_log_residual_quantiles"] = {**fit["train_log_residual_quantiles"],
                                           "attention": [0.1, -0.1]}
    gpu = replace(cost.gpu, calibration=replace(cost.gpu.calibration, fit=fit))
    bad = sim.build_cost_model("llama-3-8b", gpu)
    with pytest.raises(InputError, match="train_log_residual_quantiles.attention: expected 11"):
        uncertainty_of(bad)


def test_no_uncertainty_and_a_fixed_workload_collapse_the_interval():
    fixed = _requests(0)
    cost = sim.build_cost_model("llama-3-8b", "h100-sxm")
    out = summary_with_intervals(lambda seed: fixed, {"name": "continuous"}, cost, draws=3,
                                 sigma=0.0)
    for m in INTERVAL_METRICS:
        if f"{m}_lo" in out:
            assert out[f"{m}_lo"] == out[m] == out[f"{m}_hi"], m
    assert summary_with_intervals(lambda seed: fixed, {"name": "continuous"}, cost,
                                  draws=0) == sim.simulate(fixed, {"name": "continuous"},
                                                           cost).summary


@settings(max_examples=200, deadline=None)
@given(st.floats(-1e6, 1e6), st.lists(st.floats(-1e6, 1e6), min_size=2, max_size=30),
       st.floats(0.5, 0.98), st.floats(0.5, 0.98))
def test_bounds_bracket_the_point_and_widen_with_the_level(point, draws, a, b):
    from sim.experiments.intervals import bounds

    lo, hi = bounds(point, draws, min(a, b))
    lo2, hi2 = bounds(point, draws, max(a, b))
    assert min(draws + [point]) <= lo2 <= lo <= point <= hi <= hi2 <= max(draws + [point])
    assert all(np.isnan(bounds(float("nan"), draws, a)))
