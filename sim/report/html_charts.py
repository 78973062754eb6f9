"""The interactive charts of ``report.html``: one plotly figure per planned ``Chart``.

They show what the PNGs show (the same ``plan``, the same seed means, intervals, CDF samples
and timeline buckets), with hover values and a legend whose entries toggle a series in every
panel of the figure (one legend group per series). Text from users (labels) is HTML-escaped,
since plotly reads a subset of HTML in trace names.
"""
from __future__ import annotations

import html
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from sim.experiments.results import read_table
from sim.report.context import ReportContext, error_bars, point_errors, wide_range
from sim.report.figures import COLORS, color, marker
from sim.report.plots import Chart
from sim.report.plots_sweep import LATENCY, UTILIZATION
from sim.report.replica_load import replica_load_figure
from sim.report.samples import CDF_METRICS, bucket_steps, ecdf, kv_use, latency_samples


def safe(text: Any) -> str:
    """User text for a plotly label: HTML-escaped, ``$`` kept literal (no LaTeX)."""
    return html.escape(str(text)).replace("$", "&#36;")


def _err(mean: pd.DataFrame, half: pd.DataFrame, col: str) -> dict[str, Any] | None:
    e = error_bars(mean, half, col)
    if e is None:
        return None
    return {"type": "data", "symmetric": False, "array": np.nan_to_num(e[1]).tolist(),
            "arrayminus": np.nan_to_num(e[0]).tolist(), "thickness": 1, "width": 3}


def _lines(fig: go.Figure, ctx: ReportContext, panels: list[tuple[str, str]], col_of: Any,
           ) -> None:
    """One line per series and panel, ``col_of(key)`` → [(column, dash, shown in legend)]."""
    for series, mean, half in ctx.by_series():
        i = ctx.series.index(series)
        c, symbol = color(i), marker(i, plotly=True)
        for j, (key, _) in enumerate(panels):
            for col, dash, legend in col_of(key):
                if col not in mean:
                    continue
                fig.add_trace(go.Scatter(
                    x=mean["x"], y=mean[col], mode="lines+markers", name=safe(series),
                    legendgroup=safe(series), showlegend=legend and j == 0,
                    line={"color": c, "dash": dash}, marker={"symbol": symbol},
                    error_y=_err(mean, half, col),
                    hovertemplate=f"{safe(series)}<br>{col}: %{{y:.4g}}<br>x: %{{x}}"
                                  "<extra></extra>"), row=1, col=j + 1)


def _point_bars(fig: go.Figure, ctx: ReportContext, columns: list[str], groups: list[str],
                col: int = 1) -> None:
    """Grouped bars of ``columns`` per series at the common point (seed means with 95% CIs,
    or prediction intervals: ``context.point_errors``)."""
    point = ctx.common_point()
    names = list(dict.fromkeys(point["series"]))
    means, errs = point_errors(point, names, columns)
    keep = [j for j, c in enumerate(columns) if c in point]
    for i, name in enumerate(names):
        err = errs[i][:, keep]
        fig.add_trace(go.Bar(
            x=[groups[j] for j in keep], y=means[i, keep],
            name=safe(name), legendgroup=safe(name), showlegend=col == 1,
            marker_color=color(ctx.series.index(name)),
            error_y={"type": "data", "symmetric": False,
                     "array": np.nan_to_num(err[1]).tolist(),
                     "arrayminus": np.nan_to_num(err[0]).tolist(),
                     "visible": bool(np.isfinite(err).any())}), row=1, col=col)


def _slo(fig: go.Figure, ctx: ReportContext, key: str, col: int, vertical: bool = False,
         frontier: bool = False) -> None:
    """A dotted line at the SLO limit of ``key`` (a trace in data coordinates, so it lands
    right on linear and log axes alike and toggles from the legend)."""
    limit = ctx.slos.get(f"{key}_ms")
    if limit is None:
        return
    xs: list[Any]
    if vertical:
        xs, ys = [limit, limit], [0.0, 1.0]
    elif not frontier and not ctx.has_x:
        xs, ys = ["p50", "p99"], [limit, limit]  # across the bar groups
    else:
        x = ctx.summary["output_throughput" if frontier else "x"]
        xs, ys = [float(x.min()), float(x.max())], [limit, limit]
    first = not any(getattr(t, "legendgroup", None) == "slo" for t in fig.data)
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name="SLO limit", legendgroup="slo",
                             showlegend=first, line={"color": "black", "dash": "dot",
                                                     "width": 1},
                             hovertemplate=f"SLO {key} ≤ {limit:g} ms<extra></extra>"),
                  row=1, col=col)


def latency(ctx: ReportContext) -> go.Figure:
    """p50 (dashed) / p99 (solid) latency against x, or bars at one point."""
    fig = make_subplots(1, 3, subplot_titles=[f"{n} (ms)" for _, n in LATENCY])
    if ctx.has_x:
        _lines(fig, ctx, list(LATENCY), lambda k: [(f"median_{k}_ms", "dash", False),
                                                   (f"p99_{k}_ms", "solid", True)])
        fig.update_xaxes(title_text=ctx.x_label)
    for j, (key, _) in enumerate(LATENCY):
        if not ctx.has_x:
            _point_bars(fig, ctx, [f"median_{key}_ms", f"p99_{key}_ms"], ["p50", "p99"], j + 1)
        _slo(fig, ctx, key, j + 1)
        if wide_range(ctx.summary[[f"median_{key}_ms", f"p99_{key}_ms"]].to_numpy(float)):
            fig.update_yaxes(type="log", row=1, col=j + 1)
    return fig


def frontier(ctx: ReportContext) -> go.Figure:
    """Output throughput against p99 TPOT and E2E."""
    keys = ("tpot", "e2el")
    fig = make_subplots(1, 2, subplot_titles=["throughput vs p99 TPOT", "throughput vs p99 E2E"])
    for series, mean, _ in ctx.by_series():
        for j, key in enumerate(keys):
            fig.add_trace(go.Scatter(
                x=mean["output_throughput"], y=mean[f"p99_{key}_ms"], customdata=mean["x"],
                mode="lines+markers", name=safe(series), legendgroup=safe(series),
                showlegend=j == 0, line={"color": color(ctx.series.index(series))},
                marker={"symbol": marker(ctx.series.index(series), plotly=True)},
                hovertemplate=f"{safe(series)}<br>%{{x:.4g}} tok/s, p99 %{{y:.4g}} ms"
                              f"<br>{safe(ctx.x_label)}: %{{customdata}}<extra></extra>"),
                row=1, col=j + 1)
    for j, key in enumerate(keys):
        _slo(fig, ctx, key, j + 1, frontier=True)
        if wide_range(ctx.summary[f"p99_{key}_ms"].to_numpy(float)):
            fig.update_yaxes(type="log", row=1, col=j + 1)
    fig.update_xaxes(title_text="output throughput (tok/s)")
    fig.update_yaxes(title_text="p99 (ms)", row=1, col=1)
    return fig


def cdf(ctx: ReportContext) -> go.Figure | None:
    """Latency CDFs at the common point on log x axes (``None`` when no run can be read)."""
    fig = make_subplots(1, 4, subplot_titles=[f"{n} CDF" for _, n, _ in CDF_METRICS])
    for _, row in ctx.run_rows().iterrows():
        samples = latency_samples(ctx.runs_dir / str(row["run_id"]))
        if samples is None:
            continue
        name = str(row["series"])
        for j, (key, _, _) in enumerate(CDF_METRICS):
            v, p = ecdf(*samples[key])
            fig.add_trace(go.Scatter(
                x=v, y=p, mode="lines", line={"shape": "hv",
                                              "color": color(ctx.series.index(name))},
                name=safe(name), legendgroup=safe(name), showlegend=j == 0,
                hovertemplate=f"{safe(name)}<br>%{{y:.1%}} ≤ %{{x:.4g}} ms<extra></extra>"),
                row=1, col=j + 1)
    if not fig.data:
        return None
    for j, (key, _, _) in enumerate(CDF_METRICS):
        _slo(fig, ctx, key, j + 1, vertical=True)
    fig.update_xaxes(type="log", title_text="ms (log)")
    fig.update_yaxes(range=[0, 1.02])
    return fig


def utilization(ctx: ReportContext) -> go.Figure:
    """Busy, slot utilization, padding, MFU, MBU per series."""
    fig = make_subplots(1, 1)
    point = ctx.common_point()
    cols = [(c, n) for c, n in UTILIZATION if c in point and point[c].notna().any()]
    _point_bars(fig, ctx, [c for c, _ in cols], [n for _, n in cols])
    fig.update_yaxes(title_text="fraction")
    return fig


def goodput(ctx: ReportContext) -> go.Figure:
    """Goodput vs throughput and SLO attainment."""
    fig = make_subplots(1, 2, subplot_titles=["goodput (solid) vs throughput (dotted), req/s",
                                              "SLO attainment"])
    if ctx.has_x:
        panels = [("request_goodput", ""), ("slo_attainment", "")]
        _lines(fig, ctx, panels, lambda k: [(k, "solid", True)])
        for series, mean, _ in ctx.by_series():
            fig.add_trace(go.Scatter(x=mean["x"], y=mean["request_throughput"], mode="lines",
                                     name=safe(series), legendgroup=safe(series),
                                     showlegend=False, line={"dash": "dot", "color": color(
                                         ctx.series.index(series))}), row=1, col=1)
        fig.update_xaxes(title_text=ctx.x_label)
    else:
        _point_bars(fig, ctx, ["request_throughput", "request_goodput"],
                    ["throughput", "goodput"], 1)
        _point_bars(fig, ctx, ["slo_attainment"], ["attainment"], 2)
    fig.add_hline(y=0.9, line_dash="dash", line_width=1, row=1, col=2,
                  annotation_text="90% target")
    fig.update_yaxes(range=[0, 1.05], row=1, col=2)
    return fig


def timeline(ctx: ReportContext, chart: Chart) -> go.Figure | None:
    """One run's bucketed timeline (replica 0); ``None`` when its steps cannot be read."""
    try:
        steps = read_table(ctx.runs_dir / str(chart.run_id) / "steps")
    except (OSError, ValueError):
        return None
    st = steps[steps["replica"] == steps["replica"].min()] if len(steps) else steps
    d = bucket_steps(st)
    fig = make_subplots(4, 1, shared_xaxes=True, vertical_spacing=0.04)
    rows = [(1, "decode_batch", "decode batch", COLORS[0]),
            (2, "prefill_tok_s", "prefill tok/s", COLORS[3]),
            (2, "decode_tok_s", "decode tok/s", COLORS[0]),
            (2, "padding_tok_s", "padding tok/s", COLORS[7]),
            (3, "num_waiting", "queue", COLORS[1])]
    for r, col, name, c in rows:
        y = d[col].where(d[col] > 0) if r == 2 else d[col]
        if r == 2 and not d[col].any():
            continue
        fig.add_trace(go.Scatter(x=d["t_s"], y=y, mode="lines", name=name,
                                 line={"shape": "hv", "color": c, "width": 1}), row=r, col=1)
    kv, kv_title = kv_use(d, ctx.num_blocks(str(chart.run_id)))
    fig.add_trace(go.Scatter(x=d["t_s"], y=kv, mode="lines", name=kv_title,
                             line={"shape": "hv", "color": COLORS[2], "width": 1}), row=4, col=1)
    fig.update_yaxes(type="log", row=2, col=1)
    for r, title in enumerate(("decode batch", "tokens/s", "queue", kv_title), start=1):
        fig.update_yaxes(title_text=title, row=r, col=1)
    fig.update_xaxes(title_text="time (s)", row=4, col=1)
    return fig


def build(ctx: ReportContext, chart: Chart) -> go.Figure | None:
    """The plotly figure of ``chart`` (``None`` when its data cannot be read)."""
    if chart.kind == "timeline":
        fig = timeline(ctx, chart)
    else:
        fig = {"latency": latency, "frontier": frontier, "cdf": cdf,
               "utilization": utilization, "goodput": goodput,
               "replica_load": replica_load_figure}[chart.kind](ctx)
    if fig is not None:
        tall = chart.kind == "timeline"
        fig.update_layout(height=640 if tall else fig.layout.height or 380,
                          margin={"l": 60, "r": 20, "t": 40, "b": 50},
                          template="plotly_white", legend={"orientation": "h", "y": -0.25},
                          barmode="group", hovermode="closest")
    return fig
