"""PNG figures of single runs: latency CDFs (log axis) and the timeline of one run.

Both read a run's own tables through ``sim.report.samples``: the CDFs compare the series at
the common point, the timeline shows one run's batches, queue and KV over time in buckets.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.ticker import FuncFormatter

from sim.report.context import ReportContext
from sim.report.figures import COLORS, color, new_figure, save
from sim.report.samples import CDF_METRICS, bucket_steps, ecdf, kv_use, latency_samples


def _minor_label(value: float, _: object) -> str:
    """A minor log tick's label: shown at 2× and 5× a power of ten only."""
    mantissa = round(value / 10 ** np.floor(np.log10(value)), 6) if value > 0 else 0
    return f"{value:g}" if mantissa in (2, 5) else ""


def plot_latency_cdf(ctx: ReportContext, path: Path) -> Path | None:
    """CDFs of TTFT, TPOT, ITL and E2E per series at the common point, on log x axes;
    ``None`` (nothing written) when no run's tables can be read."""
    fig, axes = new_figure(4, width=3.6)
    for _, row in ctx.run_rows().iterrows():
        samples = latency_samples(ctx.runs_dir / str(row["run_id"]))
        if samples is None:
            continue
        for ax, (key, _, _) in zip(axes, CDF_METRICS, strict=True):
            v, p = ecdf(*samples[key])
            if v.size:
                ax.step(v, p, where="post", color=color(ctx.series.index(row["series"])),
                        label=row["series"])
    if not any(ax.has_data() for ax in axes):
        return None
    for ax, (key, name, _) in zip(axes, CDF_METRICS, strict=True):
        if ax.has_data():
            ax.set_xscale("log")
            # plain numbers; within two decades minor ticks are labelled at 2× and 5× too
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            lo, hi = ax.get_xlim()
            narrow = lo > 0 and np.log10(hi / lo) < 2
            ax.xaxis.set_minor_formatter(FuncFormatter(_minor_label if narrow else
                                                       lambda v, _: ""))
            ax.tick_params(which="minor", labelsize=7)
        limit = ctx.slos.get(f"{key}_ms")
        if limit is not None:
            ax.axvline(limit, color="k", linestyle=":", linewidth=1.0)
        ax.set_xlabel(f"{name} (ms, log scale)", fontsize=8)
        ax.set_ylabel("fraction", fontsize=8)
        ax.set_ylim(0, 1.02)
        ax.set_title(f"{name} CDF", fontsize=9)
    return save(fig, path, f"Latency CDFs{ctx.where()}", ctx.title)


def plot_timeline(steps: pd.DataFrame, path: Path, title: str,
                  num_blocks: float | None = None) -> Path:
    """Replica 0 of one run over time, in equal time buckets: decode batch size; prefill and
    decode tokens per second (separate lines, log scale, so decode work stays visible beside
    prefill spikes); queue length; KV usage."""
    n_rep = int(steps["replica"].nunique()) if len(steps) else 1
    st = steps[steps["replica"] == steps["replica"].min()] if len(steps) else steps
    d = bucket_steps(st)
    fig, axes = new_figure(1, 4, width=9.0, height=1.6)
    t = d["t_s"].to_numpy()
    axes[0].plot(t, d["decode_batch"], drawstyle="steps-post", color=COLORS[0], linewidth=0.9,
                 label="decode batch")
    axes[0].set_ylabel("decode batch", fontsize=8)
    for col, c, name in (("prefill_tok_s", COLORS[3], "prefill"),
                         ("decode_tok_s", COLORS[0], "decode"),
                         ("padding_tok_s", COLORS[7], "padding")):
        if d[col].any():
            axes[1].plot(t, d[col].where(d[col] > 0), drawstyle="steps-post", color=c,
                         linewidth=0.8, label=name)
    if axes[1].has_data():
        axes[1].set_yscale("log")
        axes[1].legend(fontsize=7, loc="upper right", ncol=3, frameon=False)
    axes[1].set_ylabel("tokens/s", fontsize=8)
    axes[2].plot(t, d["num_waiting"], drawstyle="steps-post", color=COLORS[1], linewidth=0.8)
    axes[2].set_ylabel("queue", fontsize=8)
    kv, kv_title = kv_use(d, num_blocks)
    axes[3].plot(t, kv, drawstyle="steps-post", color=COLORS[2], linewidth=0.8)
    if num_blocks:
        axes[3].set_ylim(0, 1.05)
    axes[3].set_ylabel(kv_title, fontsize=8)
    axes[3].set_xlabel("time (s)", fontsize=8)
    for ax in axes[:3]:
        ax.sharex(axes[3])
        ax.tick_params(labelbottom=False)
    where = f" (replica 0 of {n_rep})" if n_rep > 1 else ""
    return save(fig, path, f"Timeline{where}, {len(d)} time buckets", title, legend=False)

