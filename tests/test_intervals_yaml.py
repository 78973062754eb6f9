"""Prediction intervals from YAML: the ``intervals`` block, summary columns, report, capacity.

Exact cases use a constant cost model (no calibration uncertainty) and a workload no seed
changes (constant arrivals, fixed lengths): every draw then repeats the run, and each interval
collapses to its point value. A roofline run checks the brackets, determinism across --jobs and
resumes, and the report's cells.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import sim
from sim.cli.main import main
from sim.experiments.capacity import run_capacity
from sim.experiments.intervals import INTERVAL_METRICS
from sim.report.tables import interval_text, markdown_table

EXACT = """
name: exact
cost: {kind: constant, step_s: 0.01}
kv: {unlimited: true}
workload:
  arrival: {process: constant, rate: 5}
  num_requests: 60
  prompt_tokens: {dist: fixed, value: 10}
  output_tokens: {dist: fixed, value: 10}
policy: {name: continuous, max_num_seqs: 1}
slos: {ttft_ms: 1000}
intervals: {draws: 3}
output: {plots: false}
"""

ROOFLINE = """
name: roof
model: llama-3-8b
hardware: h100-sxm
workload:
  arrival: {process: poisson, rate: 6}
  num_requests: 40
  lengths: {dist: empirical, trace: azure-conv}
policy: {name: continuous}
slos: {ttft_ms: 2000, tpot_ms: 100}
intervals: {draws: 3, level: 0.8}
sweep:
  workload.arrival.rate: [4, 8]
"""


def _write(tmp_path: Path, text: str, name: str = "exp.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _pairs(summary: pd.DataFrame) -> list[str]:
    return [m for m in INTERVAL_METRICS if f"{m}_lo" in summary]


def test_no_calibration_uncertainty_and_no_seed_noise_collapse_every_interval(tmp_path):
    exp = _write(tmp_path, EXACT)
    assert main(["run", str(exp), "--out", str(tmp_path / "o"), "--quiet"]) == 0
    s = pd.read_csv(tmp_path / "o" / "summary.csv")
    metrics = _pairs(s)
    assert {"p99_ttft_ms", "request_throughput", "slo_attainment"} <= set(metrics)
    for m in metrics:
        assert (s[f"{m}_lo"] == s[m]).all() and (s[f"{m}_hi"] == s[m]).all(), m
    assert list(s["interval_level"]) == [0.9] and list(s["interval_draws"]) == [3]


def test_intervals_off_by_default_add_no_column(tmp_path):
    exp = _write(tmp_path, EXACT.replace("intervals: {draws: 3}\n", ""))
    assert main(["run", str(exp), "--out", str(tmp_path / "o"), "--quiet"]) == 0
    s = pd.read_csv(tmp_path / "o" / "summary.csv")
    assert not [c for c in s.columns if c.endswith(("_lo", "_hi")) or c.startswith("interval")]


def test_roofline_intervals_bracket_are_deterministic_and_show_in_the_report(tmp_path):
    exp = _write(tmp_path, ROOFLINE)
    assert main(["run", str(exp), "--out", str(tmp_path / "a"), "--quiet"]) == 0
    a = pd.read_csv(tmp_path / "a" / "summary.csv")
    for m in _pairs(a):
        assert (a[f"{m}_lo"] <= a[m]).all() and (a[m] <= a[f"{m}_hi"]).all(), m
    assert (a["median_tpot_ms_hi"] > a["median_tpot_ms_lo"]).all()  # calibration widens
    report = (tmp_path / "a" / "report.md").read_text()
    assert f"{interval_text(a.iloc[0], 'p99_ttft_ms')} |" in report
    assert "80% prediction intervals" in report
    assert "error bars are 80% prediction intervals" in report
    html = (tmp_path / "a" / "report.html").read_text()
    assert 'class="pi"' in html and "80% prediction intervals" in html
    # --jobs: the same intervals; a resume simulates nothing and rewrites the same table
    assert main(["run", str(exp), "--out", str(tmp_path / "b"), "--jobs", "2", "--quiet",
                 "--no-plots"]) == 0
    cols = [c for c in a.columns if c.endswith(("_lo", "_hi"))]
    pd.testing.assert_frame_equal(a[cols], pd.read_csv(tmp_path / "b" / "summary.csv")[cols])
    assert main(["run", str(exp), "--out", str(tmp_path / "a"), "--quiet", "--no-plots"]) == 0
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "a" / "summary.csv"), a)


def test_markdown_cells_show_value_and_interval():
    df = pd.DataFrame({"p99_ttft_ms": [123.0, 5.0], "p99_ttft_ms_lo": [110.0, float("nan")],
                       "p99_ttft_ms_hi": [140.0, float("nan")]})
    table = markdown_table(df, ["p99_ttft_ms"])
    assert "| 123 [110, 140] |" in table and "| 5 |" in table


@pytest.mark.parametrize("override, fragment", [
    ("intervals.draws=1", "intervals.draws: must be 0 (no intervals) or at least 2"),
    ("intervals.draws=-2", "intervals.draws: must be >= 0"),
    ("intervals.draws=2000", "intervals.draws: must be <= 1000"),
    ("intervals.level=1.0", "intervals.level: must be <= 0.98"),
    ("intervals.level=0.2", "intervals.level: must be >= 0.5"),
    ("intervals.level=high", "intervals.level: expected"),
])
def test_bad_interval_settings_exit_2_with_one_line(tmp_path, capsys, override, fragment):
    exp = _write(tmp_path, EXACT)
    assert main(["run", str(exp), "--out", str(tmp_path / "o"), "--set", override]) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and str(exp) in err and len(err.splitlines()) == 1
    assert not (tmp_path / "o" / "runs").exists()


def test_unknown_interval_key_in_the_file_exits_2(tmp_path, capsys):
    exp = _write(tmp_path, EXACT.replace("{draws: 3}", "{draws: 3, width: 2}"))
    assert main(["run", str(exp), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{exp}: intervals.width: unknown key" in err and len(err.splitlines()) == 1


def test_python_api_shares_the_rules():
    from sim import ConstantCost
    from sim.core.errors import InputError
    from sim.experiments.intervals import summary_with_intervals

    with pytest.raises(InputError, match="intervals.draws: must be 0"):
        summary_with_intervals(lambda s: [], {"name": "continuous"}, ConstantCost(0.01),
                               draws=1)
    with pytest.raises(InputError, match="intervals.level: must be <= 0.98"):
        summary_with_intervals(lambda s: [], {"name": "continuous"}, ConstantCost(0.01),
                               level=0.99)


def test_capacity_with_intervals_exact_and_on_the_console(tmp_path, capsys):
    exp = _write(tmp_path, EXACT.replace("slos: {ttft_ms: 1000}\n", ""))
    out = tmp_path / "cap"
    assert main(["capacity", str(exp), "--slo", "ttft_p99_ms=1000", "--out", str(out),
                 "--tolerance", "0.05", "--set", "intervals.draws=2"]) == 0
    text = capsys.readouterr().out
    cap = pd.read_csv(out / "capacity.csv")
    point = cap.loc[0, "max_rate"]
    assert cap.loc[0, "max_rate_lo"] == point == cap.loc[0, "max_rate_hi"]
    assert f"(90% prediction interval {point:.4g}-{point:.4g})" in text
    assert "draw 2/2: max rate" in text
    trace = pd.read_csv(out / "search.csv")
    assert trace["phase"].str.startswith("draw2-").any()
    # cached: the same table again, from the probes alone
    again = run_capacity(exp, slo="ttft_p99_ms=1000", tolerance=0.05, out=out, quiet=True,
                         overrides=["intervals.draws=2"])
    pd.testing.assert_frame_equal(again.reset_index(drop=True), cap, check_dtype=False)


def test_a_cluster_gets_intervals_with_every_group_perturbed(tmp_path):
    from sim.core.types import BatchShape
    from sim.experiments.intervals import draw_cluster, draw_cost

    text = ROOFLINE.replace("sweep:\n  workload.arrival.rate: [4, 8]\n", "") + (
        "cluster: {groups: [{name: a, replicas: 1}, {name: b, replicas: 1, "
        "hardware: a100-80gb}]}\n")
    exp = _write(tmp_path, text)
    assert main(["run", str(exp), "--out", str(tmp_path / "o"), "--quiet"]) == 0
    s = pd.read_csv(tmp_path / "o" / "summary.csv")
    for m in _pairs(s):
        assert (s[f"{m}_lo"] <= s[m]).all() and (s[m] <= s[f"{m}_hi"]).all(), m
    assert (s["median_tpot_ms_hi"] > s["median_tpot_ms_lo"]).all()
    # each group's cost model is its own, under the run's draw
    keys = {"model": "llama-3-8b", "hardware": "h100-sxm", "tp": 1, "engine": "vllm-v0",
            "weight_dtype": "bf16", "kv_dtype": "bf16"}
    cluster = {"groups": [{"name": "a", "replicas": 1},
                          {"name": "b", "replicas": 1, "hardware": "a100-80gb"}]}
    drawn = draw_cluster(cluster, keys, {"name": "continuous"}, None, 0, 1)
    shape = BatchShape.of([1] * 4, [500] * 4)
    for g, gpu in zip(drawn["groups"], ("h100-sxm", "a100-80gb"), strict=True):
        want = draw_cost(sim.build_cost_model("llama-3-8b", gpu), 0, 1)
        assert g["cost"].step(shape).seconds == want.step(shape).seconds
        assert g["hardware"] == gpu


def test_a_seed_sweep_with_intervals_aggregates_one_row_per_point(tmp_path):
    import warnings

    text = ROOFLINE.replace("workload.arrival.rate: [4, 8]", "seed: [0, 1]").replace(
        "{draws: 3, level: 0.8}", "{draws: 2}")
    exp = _write(tmp_path, text)
    with warnings.catch_warnings():
        warnings.simplefilter("error", pd.errors.PerformanceWarning)  # a wide frame, built once
        assert main(["run", str(exp), "--out", str(tmp_path / "o"), "--quiet"]) == 0
    agg = pd.read_csv(tmp_path / "o" / "summary_by_seed.csv")
    # the steps_calibrated counts differ by seed: they are metrics, not grouping keys
    assert len(agg) == 1
    assert {"p99_ttft_ms_lo", "p99_ttft_ms_ci95", "steps_calibrated"} <= set(agg.columns)


def test_single_run_bars_take_their_prediction_interval():
    from sim.report.context import point_errors

    point = pd.DataFrame({"series": ["a", "b"], "p99_ttft_ms": [100.0, 50.0],
                          "p99_ttft_ms_lo": [90.0, 50.0], "p99_ttft_ms_hi": [130.0, 55.0]})
    means, err = point_errors(point, ["a", "b"], ["p99_ttft_ms"])
    assert means.tolist() == [[100.0], [50.0]]
    assert err[:, :, 0].tolist() == [[10.0, 30.0], [0.0, 5.0]]  # (below, above) per series
    _, none = point_errors(point.drop(columns=["p99_ttft_ms_lo"]), ["a", "b"], ["p99_ttft_ms"])
    assert not np.isfinite(none).any()


def test_intervals_off_keep_the_run_id_on_keep_it_apart():
    import yaml

    from sim.experiments.config import expand_runs
    from sim.experiments.intervals import capacity_interval
    from sim.experiments.runner import run_id

    (off,) = expand_runs(yaml.safe_load(EXACT.replace("{draws: 3}", "{draws: 0}")))[1]
    (on,) = expand_runs(yaml.safe_load(EXACT))[1]
    assert run_id(off.config) == run_id({k: v for k, v in off.config.items()
                                         if k != "intervals"})
    assert run_id(on.config) != run_id(off.config)
    # an infeasible draw (NaN: no rate passed) is a capacity of 0, not a missing value
    out = capacity_interval(10.0, lambda k: [float("nan"), 12.0, 11.0][k], 3, 0.9)
    assert out["max_rate_lo"] == pytest.approx(0.1 * 11.0)  # 5 % between 0 and 11
    assert out["max_rate_hi"] == pytest.approx(11.0 + 0.9 * 1.0)
