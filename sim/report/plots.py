"""Which figures fit an experiment, and drawing them as PNGs.

``plan`` picks the figures from the sweep's shape (``ReportContext.shape``): a load or other
x sweep gets latency against x and the throughput-latency frontier; a seed sweep or single
runs get bars at one point (seed means with 95% intervals) and no frontier. Latency CDFs,
utilization, goodput (only with SLOs), the per-replica load (only with several replicas:
``sim.report.replica_load``) and one timeline per series at the common point follow.
Each ``Chart`` carries the sentence that explains it; ``report.md`` and ``report.html`` show
the same figures with the same captions.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from sim.experiments.results import read_table
from sim.report import plots_runs, plots_sweep, replica_load
from sim.report.context import ReportContext

#: At most this many per-run timelines (one per series at the common point).
MAX_TIMELINES = 4


@dataclass(frozen=True)
class Chart:
    """One figure of the report: ``name`` (file stem and HTML id), ``kind``, its caption, and
    for a timeline the run and series it shows."""

    name: str
    kind: str
    caption: str
    run_id: str | None = None
    series: str | None = None


def slug(text: str) -> str:
    """A file-name-safe form of a series name."""
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_")[:60] or "run"


def _latency_caption(ctx: ReportContext) -> str:
    slo = (" Dotted lines are the SLO limits: where a p99 line crosses its limit, that policy "
           "stops meeting the SLO.") if ctx.slos else ""
    if ctx.has_x:
        bars = (f"; error bars are {ctx.bar_meaning}" if ctx.bar_meaning
                else "; error bars are 95% intervals over seeds when several ran")
        return (f"p50 (dashed) and p99 (solid) TTFT, TPOT and end-to-end latency per policy "
                f"against {ctx.x_label}{bars}.{slo}")
    seeds = (f", means over {ctx.summary['seed'].nunique()} seeds with 95% intervals"
             if ctx.shape == "seeds" else
             f", error bars are {ctx.bar_meaning}" if ctx.bar_meaning else "")
    return f"p50 and p99 TTFT, TPOT and end-to-end latency per policy{seeds}.{slo}"


def plan(ctx: ReportContext) -> list[Chart]:
    """The figures that fit ``ctx``, in report order."""
    where = ctx.where() or ""
    charts = [Chart("latency_vs_load" if ctx.has_x else "latency", "latency",
                    _latency_caption(ctx))]
    if ctx.has_x:
        charts.append(Chart(
            "throughput_vs_latency", "frontier",
            f"One point per swept value ({ctx.x_label}): further right is more output "
            "throughput, lower is lower p99 latency; a curve below and right of another "
            "dominates it."))
    charts.append(Chart(
        "latency_cdf", "cdf",
        f"Share of requests finishing within a latency{where} (TTFT, TPOT, E2E per request; "
        "ITL over every inter-token gap), on log axes: the higher and further left a curve, "
        "the faster." + (" Dotted lines are the SLO limits." if ctx.slos else "")))
    charts.append(Chart(
        "utilization", "utilization",
        f"Busy fraction, slot utilization, padding share, MFU and MBU per policy{where}."))
    if ctx.slos and "request_goodput" in ctx.summary:
        charts.append(Chart(
            "goodput_vs_load" if ctx.has_x else "goodput", "goodput",
            "Requests per second meeting every SLO (goodput, solid) against all requests "
            "served (dotted), and the share of requests meeting them (dashed: 90%)."))
    if replica_load.applies(ctx):
        charts.append(Chart("replica_load", "replica_load", replica_load.CAPTION))
    for _, row in ctx.run_rows().head(MAX_TIMELINES).iterrows():
        name = str(row["series"])
        charts.append(Chart(
            f"timeline_{slug(name)}", "timeline",
            f"One run over time ({name}{where}, replica 0) in equal time buckets: decode batch "
            "size (mean over decoding steps), prefill and decode tokens per second, queue length "
            "and KV usage.", str(row["run_id"]), name))
    return charts


def draw_chart(ctx: ReportContext, chart: Chart, folder: Path) -> Path | None:
    """Draw one ``Chart`` as ``folder/NAME.png``; ``None`` when its data cannot be read."""
    path = folder / f"{chart.name}.png"
    if chart.kind == "timeline":
        try:
            steps = read_table(ctx.runs_dir / str(chart.run_id) / "steps")
        except (OSError, ValueError):
            return None
        return plots_runs.plot_timeline(steps, path, f"{chart.series}{ctx.where()} · {ctx.title}",
                                        ctx.num_blocks(str(chart.run_id)))
    draw = {"latency": plots_sweep.plot_latency, "frontier": plots_sweep.plot_frontier,
            "cdf": plots_runs.plot_latency_cdf, "utilization": plots_sweep.plot_utilization,
            "goodput": plots_sweep.plot_goodput,
            "replica_load": replica_load.plot_replica_load}[chart.kind]
    return draw(ctx, path)


def draw_plots(ctx: ReportContext, folder: Path) -> list[tuple[Chart, Path]]:
    """Draw every planned figure into ``folder``; return (chart, path) of those written."""
    out = []
    for chart in plan(ctx):
        path = draw_chart(ctx, chart, folder)
        if path is not None:
            out.append((chart, path))
    return out
