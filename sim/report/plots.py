"""The experiment plots: one function per figure, each writing PNG(s) and returning the path.

Figures are built on ``matplotlib.figure.Figure`` (the Agg canvas, no pyplot, no global state)
from a ``PlotContext``: the summary table with a ``series`` column (one line per policy label,
plus any non-load swept values) and an ``x`` column (the load key's value). Colours follow the
series order, so a policy has the same colour in every figure; p50 is dashed, p99 solid.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from sim.experiments.results import atomic_write, read_table
from sim.metrics.stream import is_bucketed, timeline_frame

DPI = 110
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
          "#7f7f7f", "#bcbd22", "#17becf")
LATENCY = (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2el", "E2E"))
UTILIZATION = (("busy_fraction", "busy"), ("slot_utilization", "slot util."),
               ("padding_fraction", "padding"), ("mfu", "MFU"), ("mbu", "MBU"))
MAX_POINTS = 5000


@dataclass
class PlotContext:
    """What every experiment plot needs.

    ``summary`` has one row per finished run plus ``series`` (legend name) and ``x`` (value of
    ``load_key``, or NaN without one); ``runs_dir`` holds ``<run_id>/`` folders.
    """

    summary: pd.DataFrame
    load_key: str | None
    title: str
    runs_dir: Path
    slos: dict[str, float] = field(default_factory=dict)

    @property
    def series(self) -> list[str]:
        """Series names in first-seen order."""
        return list(dict.fromkeys(self.summary["series"]))

    def color(self, name: str) -> str:
        """The colour of a series."""
        return COLORS[self.series.index(name) % len(COLORS)]

    @property
    def has_load(self) -> bool:
        """True when a numeric load axis exists with more than one value."""
        return (self.load_key is not None and pd.api.types.is_numeric_dtype(self.summary["x"])
                and self.summary["x"].nunique() > 1)

    def by_series(self) -> list[tuple[str, pd.DataFrame]]:
        """Per series: rows averaged over seeds, sorted by load."""
        out = []
        for name in self.series:
            rows = self.summary[self.summary["series"] == name]
            num = rows.select_dtypes("number").groupby(rows["x"], dropna=False).mean()
            out.append((name, num.drop(columns="x", errors="ignore").reset_index()
                        .sort_values("x")))
        return out

    def common_point(self) -> pd.DataFrame:
        """One row per series at the highest load that every series finished."""
        s = self.summary
        if not self.has_load:
            return s.drop_duplicates("series")
        clean = s[s.get("num_unfinished", 0) == 0] if "num_unfinished" in s else s
        for table in (clean, s):
            loads = [set(table.loc[table["series"] == n, "x"]) for n in self.series]
            common = set.intersection(*loads) if loads else set()
            if common:
                x = max(common)
                return table[table["x"] == x].drop_duplicates("series")
        return s.sort_values("x").drop_duplicates("series", keep="last")


def _figure(ncols: int, nrows: int = 1, width: float = 4.2,
            height: float = 3.4) -> tuple[Figure, np.ndarray]:
    fig = Figure(figsize=(width * ncols, height * nrows), dpi=DPI)
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    for ax in axes:
        ax.grid(True, alpha=0.3, linewidth=0.6)
        ax.tick_params(labelsize=8)
    return fig, axes


def _save(fig: Figure, path: Path, what: str, context: str, legend: bool = True,
          extra: list[Any] | None = None) -> Path:
    """Title (``what`` over ``context``), a shared legend below, margins in inches, save."""
    fig.suptitle(f"{what}\n{context}", fontsize=9.5)
    w, h = fig.get_size_inches()
    handles, labels = fig.axes[0].get_legend_handles_labels()
    for artist in extra or []:
        handles.append(artist)
        labels.append(artist.get_label())
    rows = -(-len(labels) // 4) if legend and handles else 0
    if rows:
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 4),
                   fontsize=8, frameon=False)
    fig.subplots_adjust(left=0.75 / w, right=1 - 0.2 / w, top=1 - 0.7 / h,
                        bottom=(0.55 + 0.22 * rows) / h, wspace=0.3, hspace=0.4)
    atomic_write(path, lambda p: fig.savefig(p, format="png", dpi=DPI))
    return path


def _bars(ax: Any, ctx: PlotContext, rows: pd.DataFrame, columns: list[str],
          names: list[str]) -> None:
    """Grouped bars: one group per column, one bar per series."""
    n = len(rows)
    width = 0.8 / max(n, 1)
    for i, (_, row) in enumerate(rows.iterrows()):
        pos = np.arange(len(columns)) + (i - (n - 1) / 2) * width
        ax.bar(pos, [row.get(c, np.nan) for c in columns], width, color=ctx.color(row["series"]),
               label=row["series"])
    ax.set_xticks(np.arange(len(columns)), names, fontsize=8)


def _auto_log(ax: Any, values: np.ndarray, ratio: float = 50.0) -> None:
    """Use a log y axis when positive ``values`` span more than ``ratio``."""
    v = values[np.isfinite(values) & (values > 0)]
    if v.size and v.max() / v.min() > ratio:
        ax.set_yscale("log")


def plot_latency_vs_load(ctx: PlotContext, path: Path) -> Path:
    """p50 (dashed) and p99 (solid) of TTFT, TPOT and E2E against load, one line per series;
    grouped p50/p99 bars per series when there is no load axis."""
    fig, axes = _figure(3)
    for ax, (key, name) in zip(axes, LATENCY, strict=True):
        if ctx.has_load:
            for series, rows in ctx.by_series():
                c = ctx.color(series)
                ax.plot(rows["x"], rows[f"median_{key}_ms"], "--", color=c, marker=".")
                ax.plot(rows["x"], rows[f"p99_{key}_ms"], "-", color=c, marker="o",
                        markersize=3, label=series)
            ax.set_xlabel(ctx.load_key or "", fontsize=8)
        else:
            _bars(ax, ctx, ctx.common_point(), [f"median_{key}_ms", f"p99_{key}_ms"],
                  ["p50", "p99"])
        _auto_log(ax, ctx.summary[[f"median_{key}_ms", f"p99_{key}_ms"]].to_numpy(float))
        ax.set_title(f"{name} (ms)", fontsize=9)
    styles = [Line2D([], [], color="gray", linestyle="--", label="p50"),
              Line2D([], [], color="gray", linestyle="-", label="p99")] if ctx.has_load else []
    return _save(fig, path, "Latency vs load (p50 dashed, p99 solid)", ctx.title,
                 extra=styles)


def plot_frontier(ctx: PlotContext, path: Path) -> Path:
    """Output throughput against p99 TPOT and p99 E2E, one line per series (load-ordered)."""
    fig, axes = _figure(2, width=4.8)
    for ax, (key, name) in zip(axes, (("tpot", "TPOT"), ("e2el", "E2E")), strict=True):
        for series, rows in ctx.by_series():
            ax.plot(rows["output_throughput"], rows[f"p99_{key}_ms"], "-o", markersize=3,
                    color=ctx.color(series), label=series)
        ax.set_xlabel("output throughput (tok/s)", fontsize=8)
        ax.set_ylabel(f"p99 {name} (ms)", fontsize=8)
        _auto_log(ax, ctx.summary[f"p99_{key}_ms"].to_numpy(float))
        ax.set_title(f"Throughput vs p99 {name}", fontsize=9)
    return _save(fig, path, "Throughput–latency frontier", ctx.title)


def _ecdf(values: np.ndarray, max_points: int = 2000) -> tuple[np.ndarray, np.ndarray]:
    v = np.sort(values[~np.isnan(values)])
    p = np.arange(1, v.size + 1) / max(v.size, 1)
    if v.size > max_points:
        idx = np.linspace(0, v.size - 1, max_points).astype(int)
        v, p = v[idx], p[idx]
    return v, p


def plot_latency_cdf(ctx: PlotContext, path: Path) -> Path:
    """CDFs of TTFT and E2E per series at the highest load every series finished."""
    fig, axes = _figure(2, width=4.8)
    point = ctx.common_point()
    for _, row in point.iterrows():
        try:
            req = read_table(ctx.runs_dir / str(row["run_id"]) / "requests")
        except (OSError, ValueError):
            continue
        done = req[req["status"] == "finished"]
        for ax, col in zip(axes, ("ttft_s", "e2e_s"), strict=True):
            v, p = _ecdf(done[col].to_numpy(float) * 1e3)
            ax.step(v, p, where="post", color=ctx.color(row["series"]), label=row["series"])
    for ax, name in zip(axes, ("TTFT", "E2E latency"), strict=True):
        ax.set_xlabel(f"{name} (ms)", fontsize=8)
        ax.set_ylabel("fraction of requests", fontsize=8)
        ax.set_ylim(0, 1.02)
        ax.set_title(f"{name} CDF", fontsize=9)
    where = f" at {ctx.load_key}={point['x'].iloc[0]:g}" if ctx.has_load and len(point) else ""
    return _save(fig, path, f"Latency CDFs{where}", ctx.title)


def plot_utilization(ctx: PlotContext, path: Path) -> Path:
    """Grouped bars of busy fraction, slot utilization, padding, MFU and MBU per series."""
    point = ctx.common_point()
    cols = [(c, n) for c, n in UTILIZATION if c in point and point[c].notna().any()]
    fig, axes = _figure(1, width=max(6.5, 1.3 * len(cols) + 1.5))
    _bars(axes[0], ctx, point, [c for c, _ in cols], [n for _, n in cols])
    axes[0].set_ylim(0, max(1.0, float(np.nanmax(point[[c for c, _ in cols]].to_numpy(float),
                                                 initial=0))) * 1.05)
    axes[0].set_ylabel("fraction", fontsize=8)
    where = f" at {ctx.load_key}={point['x'].iloc[0]:g}" if ctx.has_load and len(point) else ""
    return _save(fig, path, f"Utilization{where}", ctx.title)


def plot_goodput(ctx: PlotContext, path: Path) -> Path | None:
    """Goodput and SLO attainment against load (bars without a load axis); ``None`` when no
    SLO is configured."""
    s = ctx.summary
    if "request_goodput" not in s or not ctx.slos:
        return None
    fig, axes = _figure(2, width=4.8)
    if ctx.has_load:
        for series, rows in ctx.by_series():
            c = ctx.color(series)
            axes[0].plot(rows["x"], rows["request_throughput"], ":", color=c)
            axes[0].plot(rows["x"], rows["request_goodput"], "-o", markersize=3, color=c,
                         label=series)
            axes[1].plot(rows["x"], rows["slo_attainment"], "-o", markersize=3, color=c)
        for ax in axes:
            ax.set_xlabel(ctx.load_key or "", fontsize=8)
    else:
        point = ctx.common_point()
        _bars(axes[0], ctx, point, ["request_throughput", "request_goodput"],
              ["throughput", "goodput"])
        _bars(axes[1], ctx, point, ["slo_attainment"], ["attainment"])
    axes[1].axhline(0.9, color="k", linestyle="--", linewidth=0.8)
    axes[1].text(axes[1].get_xlim()[0], 0.9, " 90% target", fontsize=7, va="bottom")
    axes[1].set_ylim(0, 1.05)
    axes[0].set_title("goodput (solid) vs throughput (dotted), req/s", fontsize=9)
    axes[1].set_title("SLO attainment", fontsize=9)
    slo = ", ".join(f"{k.removesuffix('_ms')} ≤ {v:g} ms" for k, v in ctx.slos.items())
    return _save(fig, path, f"Goodput vs load (SLO: {slo})", ctx.title)


def _chunk_mean(values: np.ndarray, n: int) -> np.ndarray:
    """Means of ``n`` near-equal consecutive chunks of ``values``."""
    edges = np.linspace(0, values.size, n + 1).astype(int)[:-1]
    counts = np.diff(np.append(edges, values.size))
    return np.add.reduceat(values.astype(float), edges) / counts


def downsample(steps: pd.DataFrame, columns: list[str],
               max_points: int = MAX_POINTS) -> pd.DataFrame:
    """At most ``max_points`` rows: chunk means of ``columns`` (chunk start times)."""
    if len(steps) <= max_points:
        return steps[["start_s", *columns]].reset_index(drop=True)
    out = {"start_s": steps["start_s"].to_numpy()[
        np.linspace(0, len(steps), max_points + 1).astype(int)[:-1]]}
    for c in columns:
        out[c] = _chunk_mean(steps[c].to_numpy(), max_points)
    return pd.DataFrame(out)


def _with_idle(st: pd.DataFrame) -> pd.DataFrame:
    """Insert an empty-batch row at the end of each step followed by idle time."""
    end = (st["start_s"] + st["duration_s"]).to_numpy()
    nxt = np.append(st["start_s"].to_numpy()[1:], np.inf)
    idle = st[nxt > end + 1e-9].copy()
    idle["start_s"] = end[nxt > end + 1e-9]
    idle[["num_seqs", "num_prefill_tokens", "num_decode_tokens", "num_padding_tokens"]] = 0
    return pd.concat([st, idle]).sort_values("start_s", kind="stable")


def plot_timeline(steps: pd.DataFrame, path: Path, title: str,
                  num_blocks: float | None = None) -> Path:
    """Batch size, tokens per step (prefill/decode/padding), queue length and KV usage over
    time for replica 0 of one run."""
    n_rep = int(steps["replica"].nunique()) if len(steps) else 1
    st = steps[steps["replica"] == steps["replica"].min()] if len(steps) else steps
    cols = ["num_seqs", "num_prefill_tokens", "num_decode_tokens", "num_padding_tokens",
            "num_waiting", "kv_used_blocks"]
    # a bucketed table (metrics.step_table): per-step means per bucket, idle time included
    d = downsample(timeline_frame(st) if is_bucketed(st) else _with_idle(st), cols)
    fig, axes = _figure(1, 4, width=9.0, height=1.7)
    t = d["start_s"].to_numpy()
    axes[0].plot(t, d["num_seqs"], drawstyle="steps-post", color=COLORS[0], linewidth=0.8)
    axes[0].set_ylabel("batch size", fontsize=8)
    axes[1].stackplot(t, d["num_prefill_tokens"], d["num_decode_tokens"],
                      d["num_padding_tokens"], colors=(COLORS[3], COLORS[0], COLORS[7]),
                      labels=("prefill", "decode", "padding"), step="post")
    axes[1].set_ylabel("tokens/step", fontsize=8)
    axes[1].legend(fontsize=7, loc="upper right", ncol=3, frameon=False)
    axes[2].plot(t, d["num_waiting"], drawstyle="steps-post", color=COLORS[1], linewidth=0.8)
    axes[2].set_ylabel("queue", fontsize=8)
    kv = d["kv_used_blocks"].to_numpy(float)
    if num_blocks and np.isfinite(num_blocks) and num_blocks > 0:
        axes[3].plot(t, kv / num_blocks, drawstyle="steps-post", color=COLORS[2], linewidth=0.8)
        axes[3].set_ylim(0, 1.05)
        axes[3].set_ylabel("KV used", fontsize=8)
    else:
        axes[3].plot(t, kv, drawstyle="steps-post", color=COLORS[2], linewidth=0.8)
        axes[3].set_ylabel("KV blocks", fontsize=8)
    axes[3].set_xlabel("time (s)", fontsize=8)
    for ax in axes[:3]:
        ax.sharex(axes[3])
        ax.tick_params(labelbottom=False)
    where = f" (replica 0 of {n_rep})" if n_rep > 1 else ""
    fig.set_figheight(1.7 * 4 + 0.8)
    fig.suptitle(f"Timeline{where}\n{title}", fontsize=9.5)
    fig.subplots_adjust(left=0.08, right=0.98, top=1 - 0.7 / 7.6, bottom=0.5 / 7.6,
                        hspace=0.15)
    atomic_write(path, lambda p: fig.savefig(p, format="png", dpi=DPI))
    return path
