"""The per-replica load figure: outstanding requests on each replica over time, per series.

A router's job is to keep replicas evenly loaded (or to trade balance for cache hits), so
runs with more than one replica get one panel per series at the common point, one line per
replica. The series is exact and costs no recording: a request is outstanding on its replica
from its arrival to its finish (a rejected one leaves at once, an unfinished one stays to the
end), so the time-mean count over each bucket is the integral of that step function, taken
from the requests table with sorted arrays — bucketed step tables change nothing.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import yaml
from plotly.subplots import make_subplots

from sim.experiments.results import read_table
from sim.report.context import ReportContext
from sim.report.figures import color, new_figure, save

#: Time buckets of one drawn series.
LOAD_BUCKETS = 200
#: At most this many panels (series) in the figure.
MAX_PANELS = 12

CAPTION = ("Outstanding requests (arrived, not finished) on each replica over time, one panel "
           "per router or series, one line per replica (time means over equal buckets): lines "
           "that stay together are a balanced fleet; a line above the others is a replica the "
           "router overloads.")


def num_replicas(run_dir: Path) -> int:
    """Replicas of the run in ``run_dir`` from its resolved ``config.yaml`` (1 if unknown)."""
    try:
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return 1
    if not isinstance(config, dict):
        return 1
    groups = (config.get("cluster") or {}).get("groups") if isinstance(
        config.get("cluster"), dict) else None
    if isinstance(groups, list):
        return sum(int(g.get("replicas", 1)) for g in groups if isinstance(g, dict))
    par = config.get("parallelism")
    return int(par.get("replicas", 1)) if isinstance(par, dict) else 1


def applies(ctx: ReportContext) -> bool:
    """Whether a run drawn per series has more than one replica."""
    return any(num_replicas(ctx.runs_dir / str(rid)) > 1
               for rid in ctx.run_rows()["run_id"].head(MAX_PANELS))


def outstanding(requests: pd.DataFrame, buckets: int = LOAD_BUCKETS
                ) -> tuple[np.ndarray, np.ndarray]:
    """Bucket starts (s) and, per replica (rows, by index), the time-mean outstanding requests
    of each bucket."""
    arrival = requests["arrival_s"].to_numpy(float)
    finish = requests["finish_s"].to_numpy(float)
    status = requests["status"].to_numpy()
    replica = requests["replica"].to_numpy(int) if "replica" in requests else np.zeros(
        len(arrival), int)
    end = float(np.nanmax(finish)) if np.isfinite(finish).any() else 0.0
    end = max(end, float(arrival.max()) if arrival.size else 0.0)
    # a rejected request leaves when it came; one not finished by the end stays to the end
    finish = np.where(np.isfinite(finish), finish, np.where(status == "rejected", arrival, end))
    t0 = float(arrival.min()) if arrival.size else 0.0
    edges = np.linspace(t0, end if end > t0 else t0 + 1.0, buckets + 1)
    n_rep = int(replica.max()) + 1 if replica.size else 1
    load = np.zeros((n_rep, buckets))
    for k in range(n_rep):
        mine = replica == k
        area = _area(np.sort(arrival[mine]), edges) - _area(np.sort(finish[mine]), edges)
        load[k] = np.diff(area) / np.diff(edges)
    return edges[:-1], load


def _area(times: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """``sum(max(0, e - t) for t in times)`` at each edge ``e``: the integral up to ``e`` of
    the count of ``times`` already passed (``times`` sorted)."""
    k = np.searchsorted(times, edges, side="right")
    before = np.concatenate([[0.0], np.cumsum(times)])
    return k * edges - before[k]


def _series(ctx: ReportContext) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(series, bucket starts, per-replica loads) of each readable multi-replica run."""
    out = []
    for _, row in ctx.run_rows().head(MAX_PANELS).iterrows():
        run_dir = ctx.runs_dir / str(row["run_id"])
        if num_replicas(run_dir) < 2:
            continue
        try:
            requests = read_table(run_dir / "requests")
        except (OSError, ValueError):
            continue
        if len(requests):
            out.append((str(row["series"]), *outstanding(requests)))
    return out


def plot_replica_load(ctx: ReportContext, path: Path) -> Path | None:
    """The PNG figure; ``None`` (nothing written) when no multi-replica run can be read."""
    series = _series(ctx)
    if not series:
        return None
    ncols = min(3, len(series))
    nrows = -(-len(series) // ncols)
    fig, axes = new_figure(ncols, nrows, width=4.0, height=2.0)
    top = max(float(load.max()) for _, _, load in series) * 1.05 or 1.0
    for ax, (name, t, load) in zip(axes, series, strict=False):
        for k, y in enumerate(load):
            ax.plot(t, y, drawstyle="steps-post", color=color(k), linewidth=0.7,
                    label=f"replica {k}")
        ax.set_title(name, fontsize=9)
        ax.set_ylim(0, top)
        ax.set_ylabel("outstanding", fontsize=8)
        ax.set_xlabel("time (s)", fontsize=8)
    for ax in axes[len(series):]:
        ax.set_visible(False)
    return save(fig, path, f"Outstanding requests per replica{ctx.where()}", ctx.title)


def replica_load_figure(ctx: ReportContext) -> go.Figure | None:
    """The plotly figure for ``report.html`` (``None`` when no multi-replica run is readable)."""
    series = _series(ctx)
    if not series:
        return None
    ncols = min(3, len(series))
    nrows = -(-len(series) // ncols)
    fig = make_subplots(nrows, ncols, subplot_titles=[s for s, _, _ in series],
                        shared_yaxes=True, vertical_spacing=0.12 if nrows > 1 else 0.1)
    for i, (_, t, load) in enumerate(series):
        r, c = divmod(i, ncols)
        for k, y in enumerate(load):
            fig.add_trace(go.Scatter(x=t, y=y, mode="lines", name=f"replica {k}",
                                     legendgroup=f"replica {k}", showlegend=i == 0,
                                     line={"shape": "hv", "color": color(k), "width": 1}),
                          row=r + 1, col=c + 1)
    fig.update_yaxes(title_text="outstanding", col=1)
    fig.update_xaxes(title_text="time (s)", row=nrows)
    fig.update_layout(height=max(380, 260 * nrows))
    return fig
