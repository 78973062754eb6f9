"""The report's rules, exactly, on hand-made summaries: plots chosen by the sweep's shape, the
headline, series names, seed intervals, units, CDF and timeline data, and figure layout."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure
from scipy import stats

from sim.report.context import ReportContext, series_names, unit_of
from sim.report.figures import new_figure, save
from sim.report.headline import headlines
from sim.report.plots import draw_plots, plan
from sim.report.samples import bucket_steps, ecdf


def _summary(rows: list[dict]) -> pd.DataFrame:
    base = {"run_id": "r", "completed": 10, "request_throughput": 1.0,
            "output_throughput": 100.0, "num_unfinished": 0, "num_rejected": 0,
            "median_ttft_ms": 10.0, "p99_ttft_ms": 20.0, "median_tpot_ms": 5.0,
            "p99_tpot_ms": 8.0, "median_e2el_ms": 50.0, "p99_e2el_ms": 90.0, "seed": 0}
    df = pd.DataFrame([{**base, **r} for r in rows])
    df["run_id"] = [f"r{i}" for i in range(len(df))]
    return df


def _ctx(df: pd.DataFrame, key: str | None, is_rate: bool = False,
         slos: dict[str, float] | None = None) -> ReportContext:
    df = df.copy()
    df["x"] = df[key] if key else np.nan
    return ReportContext(df, key, "title", Path("/nonexistent"), slos or {}, is_rate)


def _kinds(ctx: ReportContext) -> list[str]:
    return [c.kind for c in plan(ctx) if c.kind != "timeline"]


def test_load_sweep_plots_latency_vs_rate_with_frontier() -> None:
    df = _summary([{"series": s, "workload.rate": r} for s in "ab" for r in (1.0, 2.0, 4.0)])
    ctx = _ctx(df, "workload.rate", is_rate=True, slos={"ttft_ms": 100.0})
    assert ctx.shape == "load"
    assert ctx.x_label == "request rate (req/s)"
    assert _kinds(ctx) == ["latency", "frontier", "cdf", "utilization"]  # no goodput column
    latency = plan(ctx)[0]
    assert latency.name == "latency_vs_load" and "SLO limits" in latency.caption
    assert [c.series for c in plan(ctx) if c.kind == "timeline"] == ["a", "b"]


def test_other_sweep_puts_the_key_and_its_unit_on_x() -> None:
    df = _summary([{"series": "a", "workload.output_tokens.max": m} for m in (32, 128)])
    ctx = _ctx(df, "workload.output_tokens.max")
    assert ctx.shape == "other"
    assert ctx.x_label == "workload.output_tokens.max (tokens)"
    assert "frontier" in _kinds(ctx)


def test_seed_sweep_draws_means_with_intervals_and_no_frontier() -> None:
    df = _summary([{"series": "a", "seed": s, "p99_ttft_ms": v}
                   for s, v in enumerate((10.0, 14.0, 18.0))])
    ctx = _ctx(df, None)
    assert ctx.shape == "seeds"
    assert _kinds(ctx) == ["latency", "cdf", "utilization"]
    assert "means over 3 seeds with 95% intervals" in plan(ctx)[0].caption
    (_, mean, half), = ctx.by_series()
    assert mean["p99_ttft_ms"].iloc[0] == pytest.approx(14.0)
    assert half["p99_ttft_ms"].iloc[0] == pytest.approx(
        stats.sem([10, 14, 18]) * stats.t.ppf(0.975, 2))


def test_single_runs_get_no_frontier() -> None:
    ctx = _ctx(_summary([{"series": "a"}, {"series": "b"}]), None)
    assert ctx.shape == "single"
    assert "frontier" not in _kinds(ctx)
    assert plan(ctx)[0].name == "latency"


@pytest.mark.parametrize(("key", "unit"), [
    ("workload.output_tokens.max", "tokens"), ("policy.max_num_seqs", "sequences"),
    ("kv.block_size", "tokens"), ("metrics.warmup_s", "s"), ("parallelism.tp", "GPUs"),
    ("policy.mode", "")])
def test_units_of_swept_keys(key: str, unit: str) -> None:
    assert unit_of(key) == unit


def test_headline_highest_rate_meeting_slos_and_binding_metric() -> None:
    rows = []
    for rate, ttft, tpot in ((1.0, 50, 5), (2.0, 90, 9), (4.0, 300, 9)):  # a: TTFT binds at 4
        rows.append({"series": "a", "workload.rate": rate, "p99_ttft_ms": ttft,
                     "p99_tpot_ms": tpot})
    for rate in (1.0, 2.0, 4.0):  # b: every rate passes
        rows.append({"series": "b", "workload.rate": rate, "p99_ttft_ms": 10.0})
    for rate in (1.0, 2.0, 4.0):  # c: unstable from the lowest rate
        rows.append({"series": "c", "workload.rate": rate, "num_unfinished": 3})
    ctx = _ctx(_summary(rows), "workload.rate", is_rate=True,
               slos={"ttft_ms": 100.0, "tpot_ms": 10.0})
    a, b, c = headlines(ctx)
    assert (a.best_x, b.best_x, c.best_x) == (2.0, 4.0, None)
    assert a.binding is not None and a.binding.startswith("p99 TTFT (300 ms vs 100 ms)")
    assert a.text.startswith("a: 2 req/s is the highest swept rate meeting the SLOs; at 4 req/s")
    assert b.binding is not None and b.binding.startswith("p99 TPOT")  # 8/10 > 10/100
    assert "sweep higher" in b.text
    assert c.binding is not None and c.binding.startswith("unstable")


def test_headline_needs_every_seed_to_pass() -> None:
    rows = [{"series": "a", "workload.rate": r, "seed": s, "p99_ttft_ms": v}
            for r, vals in ((1.0, (10, 20)), (2.0, (50, 150))) for s, v in enumerate(vals)]
    ctx = _ctx(_summary(rows), "workload.rate", is_rate=True, slos={"ttft_ms": 100.0})
    assert headlines(ctx)[0].best_x == 1.0


def test_series_keep_zipped_keys_together() -> None:
    """A key zipped with the x axis (it moves with it) does not split the series."""
    from sim.experiments.config import RunSpec

    df = _summary([{"label": "p", "policy": "p", "hw": h, "out.max": m, "out.mean": m}
                   for h in ("g1", "g2") for m in (32, 128)])
    runs = [RunSpec({"policy": {"name": "p"}}, {"hw": 0, "out.max": 0, "out.mean": 0}, "p")]
    assert series_names(df, runs, "out.max") == ["p hw=g1"] * 2 + ["p hw=g2"] * 2


def test_ecdf_weighted_and_thinned() -> None:
    v, p = ecdf(np.array([3.0, 1.0, 2.0, np.nan, 0.0]), np.array([1.0, 1.0, 2.0, 1.0, 1.0]))
    assert v.tolist() == [1.0, 2.0, 3.0] and p.tolist() == [0.25, 0.75, 1.0]
    v, p = ecdf(np.arange(1.0, 10_001.0), np.ones(10_000), max_points=100)
    assert len(v) == 100 and p[-1] == 1.0 and v[-1] == 10_000.0


def test_bucket_steps_separates_prefill_and_decode() -> None:
    # 4 steps of 0.5 s in 2 buckets of 1 s: a prefill-only step then a decode step, twice
    steps = pd.DataFrame({"start_s": [0.0, 0.5, 1.0, 1.5], "duration_s": [0.5] * 4,
                          "num_prefill_tokens": [1000, 0, 2000, 0],
                          "num_decode_tokens": [0, 8, 0, 6], "num_padding_tokens": 0,
                          "num_waiting": [2, 0, 4, 2], "kv_used_blocks": [10, 12, 14, 16]})
    d = bucket_steps(steps, buckets=2)
    assert d["t_s"].tolist() == [0.0, 1.0]
    assert d["prefill_tok_s"].tolist() == [1000.0, 2000.0]
    assert d["decode_tok_s"].tolist() == [8.0, 6.0]
    assert d["decode_batch"].tolist() == [8.0, 6.0]  # over decoding steps, not prefill ones
    assert d["num_waiting"].tolist() == [1.0, 3.0]
    assert d["kv_used_blocks"].tolist() == [11.0, 15.0]
    # idle from 2 s to 10 s: 8 buckets of 1.5 s (no more buckets than steps), 2..5 empty
    idle = bucket_steps(pd.concat([steps, steps.assign(start_s=steps["start_s"] + 10)]), 12)
    assert len(idle) == 8
    empty = idle.iloc[2:6]
    assert (empty[["prefill_tok_s", "decode_tok_s"]] == 0).all().all()
    assert empty[["decode_batch", "num_waiting"]].isna().all().all()


def test_long_legend_grows_the_figure(tmp_path: Path) -> None:
    """Many long series names (repro_anyscale's 12) once pushed the margins past the figure
    height (``bottom cannot be >= top``); now the figure grows and the panels keep theirs."""
    fig, axes = new_figure(3)
    for i in range(14):
        axes[0].plot([0, 1], [0, i], label=f"optimized-static hardware=a100-80gb allocator={i}")
    save(fig, tmp_path / "f.png", "what", "context")
    assert isinstance(fig, Figure) and fig.get_size_inches()[1] > 2.6 + 1.3
    bottom, top = fig.subplotpars.bottom, fig.subplotpars.top
    assert (top - bottom) * fig.get_size_inches()[1] == pytest.approx(2.6, abs=0.01)
    assert (tmp_path / "f.png").stat().st_size > 5000


def test_mathtext_labels_are_drawn_as_typed(tmp_path: Path) -> None:
    df = _summary([{"series": s, "workload.rate": r} for s in ("$\\frac{$", "a$b$c")
                   for r in (1.0, 2.0)])
    ctx = _ctx(df, "workload.rate", is_rate=True, slos={"ttft_ms": 100.0})
    written = draw_plots(ctx, tmp_path)  # the per-run figures find no runs and are skipped
    assert {c.kind for c, _ in written} == {"latency", "frontier", "utilization"}


def test_error_bars_from_seeds_else_lo_hi_columns() -> None:
    from sim.report.context import error_bars

    mean = pd.DataFrame({"x": [1.0, 2.0], "p99_ttft_ms": [10.0, 20.0],
                         "p99_ttft_ms_lo": [8.0, 15.0], "p99_ttft_ms_hi": [13.0, 21.0]})
    none = pd.DataFrame({"x": [1.0, 2.0], "p99_ttft_ms": [np.nan, np.nan]})
    bars = error_bars(mean, none, "p99_ttft_ms")
    assert bars is not None and bars.tolist() == [[2.0, 5.0], [3.0, 1.0]]
    seeds = pd.DataFrame({"x": [1.0, 2.0], "p99_ttft_ms": [0.5, 1.5]})
    bars = error_bars(mean, seeds, "p99_ttft_ms")
    assert bars is not None and bars.tolist() == [[0.5, 1.5], [0.5, 1.5]]
    assert error_bars(mean.drop(columns=["p99_ttft_ms_lo"]), none, "p99_ttft_ms") is None


def test_seed_sweep_bars_draw(tmp_path: Path) -> None:
    df = _summary([{"series": s, "seed": k, "p99_ttft_ms": 10.0 + k, "busy_fraction": 0.5}
                   for s in "ab" for k in range(3)])
    written = draw_plots(_ctx(df, None), tmp_path)
    assert [p.name for _, p in written] == ["latency.png", "utilization.png"]


def test_headline_without_load_sweep_says_whether_slos_hold() -> None:
    df = _summary([{"series": "a", "seed": k, "p99_ttft_ms": 50.0 + k} for k in range(2)]
                  + [{"series": "b", "seed": k, "p99_ttft_ms": 150.0} for k in range(2)])
    a, b = headlines(_ctx(df, None, slos={"ttft_ms": 100.0}))
    assert a.text == ("a: 100 output tok/s (mean of 2 seeds), p99 TTFT 50.5 ms, p99 TPOT 8 ms; "
                      "meets the SLOs (closest to its limit: p99 TTFT (51 ms vs 100 ms)).")
    assert "misses the SLOs (binding: p99 TTFT (150 ms vs 100 ms))" in b.text


def test_swept_names_split_series_and_the_first_numeric_key_is_x() -> None:
    from sim.experiments.config import RunSpec
    from sim.report.context import build_context

    runs = [RunSpec({"policy": {"name": "p"}, "hardware": h, "rate": r},
                    {"hardware": h, "workload.arrival.rate": r}, "p")
            for h in ("g1", "g2") for r in (1.0, 2.0)]
    df = _summary([{"label": "p", "policy": "p", **s.swept} for s in runs])
    base = {"workload": {"arrival": {"process": "poisson", "rate": 1.0}}}
    ctx = build_context(Path("/nonexistent"), base, runs, df)
    assert (ctx.x_key, ctx.shape, ctx.x_label) == ("workload.arrival.rate", "load",
                                                    "request rate (req/s)")
    assert ctx.series == ["p hardware=g1", "p hardware=g2"]
    only_names = build_context(Path("/nonexistent"), {"output": {"load_key": "hardware"}},
                               runs[::2], df.iloc[::2])
    assert only_names.x_key is None and only_names.series == ["p hardware=g1", "p hardware=g2"]
