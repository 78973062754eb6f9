"""PNG figures over the runs of a sweep: latency against x, the frontier, goodput, utilization.

With an x axis (``ReportContext.has_x``) each series is a line over x (means over seeds, with
95% intervals as error bars when several seeds ran, or the runs' prediction intervals, their
``COL_lo``/``COL_hi`` columns; the title says which, ``ReportContext.bar_meaning``);
without one, grouped bars at the common point (seed means with 95% intervals). Colours follow
the series order, so a policy has the same colour in every figure; p50 is dashed, p99 solid.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

from sim.report.context import ReportContext, error_bars, point_errors
from sim.report.figures import auto_log, bars, color, marker, new_figure, save

LATENCY = (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2el", "E2E"))
UTILIZATION = (("busy_fraction", "busy"), ("slot_utilization", "slot util."),
               ("padding_fraction", "padding"), ("mfu", "MFU"), ("mbu", "MBU"))


def line(ax: Any, mean: pd.DataFrame, half: pd.DataFrame, col: str, style: str, c: str,
         label: str | None = None, **kw: Any) -> None:
    """One series' ``col`` against x, with error bars when known."""
    if col not in mean:
        return
    err = error_bars(mean, half, col)
    ax.errorbar(mean["x"], mean[col], yerr=err, fmt=style, color=c, label=label, capsize=2,
                elinewidth=0.7, **kw)


def point_bars(ax: Any, ctx: ReportContext, columns: list[str], groups: list[str]) -> None:
    """Grouped bars of ``columns`` per series at the common point (seed means with 95% CIs,
    or single runs with their prediction intervals: ``context.point_errors``)."""
    point = ctx.common_point()
    names = list(dict.fromkeys(point["series"]))
    means, err = point_errors(point, names, columns)
    bars(ax, names, [color(ctx.series.index(n)) for n in names], means, err, groups)


def slo_line(ax: Any, ctx: ReportContext, key: str) -> None:
    """A dotted horizontal line at the SLO limit of ``key`` (``ttft``...), when one is set."""
    limit = ctx.slos.get(f"{key}_ms")
    if limit is not None:
        ax.axhline(limit, color="k", linestyle=":", linewidth=1.0)


def plot_latency(ctx: ReportContext, path: Path) -> Path:
    """p50 (dashed) and p99 (solid) of TTFT, TPOT and E2E against x, one line per series, SLO
    limits dotted; grouped p50/p99 bars per series when there is no x axis."""
    fig, axes = new_figure(3)
    for ax, (key, name) in zip(axes, LATENCY, strict=True):
        if ctx.has_x:
            for series, mean, half in ctx.by_series():
                i = ctx.series.index(series)
                c, m = color(i), marker(i)
                line(ax, mean, half, f"median_{key}_ms", "--", c, marker=m, markersize=2)
                line(ax, mean, half, f"p99_{key}_ms", "-", c, series, marker=m, markersize=3)
            ax.set_xlabel(ctx.x_label, fontsize=8)
        else:
            point_bars(ax, ctx, [f"median_{key}_ms", f"p99_{key}_ms"], ["p50", "p99"])
        slo_line(ax, ctx, key)
        auto_log(ax, ctx.summary[[f"median_{key}_ms", f"p99_{key}_ms"]].to_numpy(float))
        ax.set_title(f"{name} (ms)", fontsize=9)
    styles = [Line2D([], [], color="gray", linestyle="--", label="p50"),
              Line2D([], [], color="gray", linestyle="-", label="p99")] if ctx.has_x else []
    if ctx.slos:
        styles.append(Line2D([], [], color="k", linestyle=":", label="SLO limit"))
    what = {"load": "Latency vs load", "other": f"Latency vs {ctx.x_key}",
            "seeds": "Latency, mean over seeds (95% intervals)"}.get(ctx.shape, "Latency")
    bars = f"; error bars: {ctx.bar_meaning.split(' (')[0]}" if ctx.bar_meaning else ""
    if not ctx.has_x and ctx.shape != "seeds":
        what += bars
    return save(fig, path, f"{what} (p50 dashed, p99 solid){bars}" if ctx.has_x else what,
                ctx.title, extra=styles)


def plot_frontier(ctx: ReportContext, path: Path) -> Path:
    """Output throughput against p99 TPOT and p99 E2E, one line per series (x-ordered)."""
    fig, axes = new_figure(2, width=4.8)
    for ax, (key, name) in zip(axes, (("tpot", "TPOT"), ("e2el", "E2E")), strict=True):
        for series, mean, _ in ctx.by_series():
            i = ctx.series.index(series)
            ax.plot(mean["output_throughput"], mean[f"p99_{key}_ms"], "-", marker=marker(i),
                    markersize=3, color=color(i), label=series)
        slo_line(ax, ctx, key)
        ax.set_xlabel("output throughput (tok/s)", fontsize=8)
        ax.set_ylabel(f"p99 {name} (ms)", fontsize=8)
        auto_log(ax, ctx.summary[f"p99_{key}_ms"].to_numpy(float))
        ax.set_title(f"Throughput vs p99 {name}", fontsize=9)
    return save(fig, path, f"Throughput–latency frontier (points: {ctx.x_label})", ctx.title)


def plot_utilization(ctx: ReportContext, path: Path) -> Path:
    """Grouped bars of busy fraction, slot utilization, padding, MFU and MBU per series."""
    point = ctx.common_point()
    cols = [(c, n) for c, n in UTILIZATION if c in point and point[c].notna().any()]
    fig, axes = new_figure(1, width=max(6.5, 1.3 * len(cols) + 1.5))
    point_bars(axes[0], ctx, [c for c, _ in cols], [n for _, n in cols])
    top = np.nanmax(point[[c for c, _ in cols]].to_numpy(float), initial=0)
    axes[0].set_ylim(0, max(1.0, float(top)) * 1.05)
    axes[0].set_ylabel("fraction", fontsize=8)
    bars = (f"; error bars: {ctx.bar_meaning.split(' (')[0]}" if ctx.bar_meaning
            and ctx.shape != "seeds" else "")
    return save(fig, path, f"Utilization{ctx.where()}{bars}", ctx.title)


def plot_goodput(ctx: ReportContext, path: Path) -> Path:
    """Goodput and SLO attainment against x (bars without an x axis)."""
    fig, axes = new_figure(2, width=4.8)
    if ctx.has_x:
        for series, mean, half in ctx.by_series():
            i = ctx.series.index(series)
            c, m = color(i), marker(i)
            axes[0].plot(mean["x"], mean["request_throughput"], ":", color=c)
            line(axes[0], mean, half, "request_goodput", "-", c, series, marker=m, markersize=3)
            line(axes[1], mean, half, "slo_attainment", "-", c, marker=m, markersize=3)
        for ax in axes:
            ax.set_xlabel(ctx.x_label, fontsize=8)
    else:
        point_bars(axes[0], ctx, ["request_throughput", "request_goodput"],
                   ["throughput", "goodput"])
        point_bars(axes[1], ctx, ["slo_attainment"], ["attainment"])
    axes[1].axhline(0.9, color="k", linestyle="--", linewidth=0.8)
    axes[1].text(axes[1].get_xlim()[0], 0.9, " 90% target", fontsize=7, va="bottom")
    axes[1].set_ylim(0, 1.05)
    axes[0].set_title("goodput (solid) vs throughput (dotted), req/s", fontsize=9)
    axes[1].set_title("SLO attainment", fontsize=9)
    slo = ", ".join(f"{k.removesuffix('_ms')} ≤ {v:g} ms" for k, v in ctx.slos.items())
    bars = (f"; error bars: {ctx.bar_meaning.split(' (')[0]}" if ctx.bar_meaning
            and ctx.shape != "seeds" else "")
    return save(fig, path, f"Goodput (SLO: {slo}){bars}", ctx.title)
