"""What every report output is drawn from: the finished runs, their series and the sweep's shape.

``build_context`` turns an experiment's ``summary.csv`` rows into a ``ReportContext``: each
row gets a ``series`` (its ``label`` column, else the policy name, plus any swept value that
neither is the x axis nor moves with it) and an ``x`` (the value of the x-axis key). The
sweep's *shape* decides which plots fit the question (``sim.report.plots.plan``):

- ``load``: the x key is the workload's arrival rate (``workload.rate`` or
  ``workload.arrival.rate``), more than one value;
- ``other``: another swept key with more than one value (drawn on x with its unit);
- ``seeds``: no x axis, but ``seed`` is swept (means with 95% intervals);
- ``single``: one run per series.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.experiments.capacity import rate_key
from sim.experiments.config import RunSpec
from sim.experiments.run import ci95_half
from sim.experiments.runner import run_id
from sim.experiments.schema import lookup
from sim.experiments.slo import CapacityError

#: Units of swept keys that the config schema does not carry (workload and policy keys), by the
#: last part of the dotted key; ``_ms``/``_s``/``_gb`` suffixes are read from the name itself.
UNITS = {"max_num_seqs": "sequences", "batch_size": "sequences", "tp": "GPUs",
         "max_num_batched_tokens": "tokens", "token_budget": "tokens", "block_size": "tokens",
         "reserve_tokens": "tokens", "gpu_memory_utilization": "fraction",
         "num_requests": "requests", "time_scale": "×"}


def unit_of(key: str) -> str:
    """The unit of a dotted config key ('' when unknown)."""
    entry = lookup(key)
    unit = getattr(entry, "unit", "")
    if unit:
        return str(unit)
    last = key.rsplit(".", 1)[-1]
    for suffix, name in (("_ms", "ms"), ("_s", "s"), ("_gb", "GB")):
        if last.endswith(suffix):
            return name
    if last in UNITS:
        return UNITS[last]
    if any("tokens" in part for part in key.split(".")):
        return "tokens"  # workload.output_tokens.max, ...
    return ""


def fmt(value: Any) -> str:
    """A number as the tables show it: integers as is, floats to 3 significant digits (≥ 1000:
    no decimals), NaN as ``–``; anything else as its text."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int) or float(value).is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    v = float(value)
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"


def error_bars(mean: pd.DataFrame, half: pd.DataFrame, col: str) -> np.ndarray | None:
    """(2, n) error-bar lengths for ``col``: the seeds' 95% half-width, else the distance to
    ``COL_lo``/``COL_hi`` when those columns exist; ``None`` when neither does."""
    h = half[col].to_numpy(float) if col in half else np.full(len(mean), np.nan)
    if np.isfinite(h).any():
        return np.vstack([h, h])
    if f"{col}_lo" in mean and f"{col}_hi" in mean:
        m = mean[col].to_numpy(float)
        return np.vstack([m - mean[f"{col}_lo"].to_numpy(float),
                          mean[f"{col}_hi"].to_numpy(float) - m]).clip(min=0)
    return None


def point_errors(point: pd.DataFrame, names: list[str], columns: list[str]
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Bar heights and (series, 2, column) error lengths of ``columns`` per series at one
    point: the means over seeds with their 95% half-widths, else (one run per series) the
    distance to the ``COL_lo``/``COL_hi`` prediction interval; NaN where neither exists."""
    cols = [c for c in columns if c in point]
    g = point.groupby("series", sort=False)
    means = g[cols].mean().reindex(index=names, columns=columns)
    half = ci95_half(g[cols].sem(), g[cols].count()).reindex(index=names, columns=columns)
    err = np.repeat(half.to_numpy(float)[:, None, :], 2, axis=1)
    if not np.isfinite(err).any():
        for j, c in enumerate(columns):
            if f"{c}_lo" in point and f"{c}_hi" in point:
                lo = g[f"{c}_lo"].mean().reindex(names).to_numpy(float)
                hi = g[f"{c}_hi"].mean().reindex(names).to_numpy(float)
                m = means[c].to_numpy(float)
                err[:, 0, j], err[:, 1, j] = (m - lo).clip(min=0), (hi - m).clip(min=0)
    return means.to_numpy(float), err


def wide_range(values: np.ndarray, ratio: float = 50.0) -> bool:
    """True when the positive finite ``values`` span more than ``ratio`` (log axis then)."""
    v = values[np.isfinite(values) & (values > 0)]
    return bool(v.size and v.max() / v.min() > ratio)


@dataclass
class ReportContext:
    """An experiment's finished runs as the report sees them.

    ``summary`` has one row per finished run plus ``series`` (legend name) and ``x`` (value of
    ``x_key``, NaN without one); ``runs_dir`` holds ``<run_id>/`` folders; ``slos`` are the
    experiment's per-request SLO limits in ms (``ttft_ms``, ...).
    """

    summary: pd.DataFrame
    x_key: str | None
    title: str
    runs_dir: Path
    slos: dict[str, float] = field(default_factory=dict)
    is_rate: bool = False

    @property
    def series(self) -> list[str]:
        """Series names in first-seen order."""
        return list(dict.fromkeys(self.summary["series"]))

    @property
    def bar_meaning(self) -> str:
        """What the line plots' error bars are, in words: the seeds' 95% intervals when
        several seeds ran, else the runs' prediction intervals (``COL_lo``/``COL_hi``) with
        their level, else '' (no bars)."""
        s = self.summary
        if "seed" in s and s["seed"].nunique() > 1:
            return "95% intervals over seeds"
        if "interval_level" in s and s["interval_level"].notna().any():
            levels = "/".join(f"{v:.0%}" for v in dict.fromkeys(s["interval_level"].dropna()))
            return f"{levels} prediction intervals (calibration uncertainty and seed noise)"
        return ""

    @property
    def has_x(self) -> bool:
        """True when a numeric x axis exists with more than one value."""
        return (self.x_key is not None and pd.api.types.is_numeric_dtype(self.summary["x"])
                and self.summary["x"].nunique() > 1)

    @property
    def shape(self) -> str:
        """``load``, ``other``, ``seeds`` or ``single`` (see the module docstring)."""
        if self.has_x:
            return "load" if self.is_rate else "other"
        if "seed" in self.summary and self.summary["seed"].nunique() > 1:
            return "seeds"
        return "single"

    @property
    def x_label(self) -> str:
        """The x-axis title: ``request rate (req/s)`` for a load sweep, else key (unit)."""
        if self.is_rate:
            return "request rate (req/s)"
        unit = unit_of(self.x_key or "")
        return f"{self.x_key} ({unit})" if unit else str(self.x_key)

    def x_text(self, x: Any) -> str:
        """A point of the x axis in words: ``4 req/s``, ``workload.output_tokens.max=128``."""
        if self.is_rate:
            return f"{x:g} req/s"
        return f"{self.x_key}={x:g}" if isinstance(x, (int, float)) else f"{self.x_key}={x}"

    def by_series(self) -> list[tuple[str, pd.DataFrame, pd.DataFrame]]:
        """Per series: (name, means over seeds by ``x``, 95% CI half-widths by ``x``).

        Both frames are sorted by ``x`` and keep ``x`` as a column; a half-width is NaN where
        only one seed ran (a fidelity ``COL_lo``/``COL_hi`` pair is then used by the plots).
        """
        out = []
        for name in self.series:
            rows = self.summary[self.summary["series"] == name]
            num = rows.select_dtypes("number").drop(columns="x", errors="ignore")
            g = num.groupby(rows["x"], dropna=False)
            mean = g.mean().reset_index().sort_values("x")
            half = ci95_half(g.sem(), g.count()).reset_index().sort_values("x")
            out.append((name, mean, half))
        return out

    def common_point(self) -> pd.DataFrame:
        """One row per series at the highest x every series finished (all seeds kept)."""
        s = self.summary
        if not self.has_x:
            return s
        clean = s[s["num_unfinished"] == 0] if "num_unfinished" in s else s
        for table in (clean, s):
            loads = [set(table.loc[table["series"] == n, "x"]) for n in self.series]
            common = set.intersection(*loads) if loads else set()
            if common:
                return table[table["x"] == max(common)]
        return s.sort_values("x").drop_duplicates("series", keep="last")

    def where(self) -> str:
        """`` at <x>`` for titles of figures drawn at the common point ('' without x)."""
        point = self.common_point()
        return f" at {self.x_text(point['x'].iloc[0])}" if self.has_x and len(point) else ""

    def num_blocks(self, rid: str) -> float | None:
        """The KV block count of run ``rid`` (``None`` when unlimited or unknown)."""
        rows = self.summary[self.summary["run_id"] == rid]
        nb = rows["num_blocks"].iloc[0] if "num_blocks" in rows and len(rows) else None
        return float(nb) if nb is not None and pd.notna(nb) and float(nb) > 0 else None

    def run_rows(self) -> pd.DataFrame:
        """One row per series at the common point (its first seed): the runs drawn per run."""
        return self.common_point().drop_duplicates("series")


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def x_key(base: dict[str, Any], runs: list[RunSpec]) -> str | None:
    """``output.load_key``, else the first swept key other than ``seed`` whose values are all
    numbers (a swept name, such as ``hardware``, splits series instead)."""
    key = (base.get("output") or {}).get("load_key")
    if key:
        return str(key)
    keys = [k for k in {k: 0 for s in runs for k in s.swept} if k != "seed"]
    for k in keys:
        if all(_numeric(s.swept[k]) for s in runs if k in s.swept):
            return str(k)
    return None


def _policy_params(spec: RunSpec | None) -> dict[str, Any]:
    pol = dict(spec.config.get("policy") or {}) if spec else {}
    pol.pop("label", None)
    return pol


def _tied(summary: pd.DataFrame, col: str, key: str | None) -> bool:
    """True when ``col`` takes one value per value of ``key`` (zipped with the x axis)."""
    if key is None or key not in summary:
        return False
    return bool((summary.groupby(key, dropna=False)[col].nunique(dropna=False) <= 1).all())


def series_names(summary: pd.DataFrame, runs: list[RunSpec], key: str | None) -> list[str]:
    """A legend name per summary row: its label (else policy name), the varying swept values
    that are neither the x axis nor tied to it, and — when two policies still share a name —
    the policy parameters that tell them apart."""
    specs = {run_id(s.config): s for s in runs}
    extra = [c for c in {k: 0 for s in runs for k in s.swept} if c not in (key, "seed")
             and c in summary and summary[c].nunique(dropna=False) > 1
             and not _tied(summary, c, key)]
    base = summary["label"] if "label" in summary else summary["policy"]
    names = []
    for i, (_, row) in enumerate(summary.iterrows()):
        bits = [f"{c.rsplit('.', 1)[-1]}={row[c]}" for c in extra]
        names.append(" ".join([str(base.iloc[i]), *bits]))
    params = [_policy_params(specs.get(str(r))) for r in summary["run_id"]]
    out = list(names)
    for name in set(names):
        idx = [i for i, n in enumerate(names) if n == name]
        if len({json.dumps(params[i], sort_keys=True, default=str) for i in idx}) < 2:
            continue
        keys = sorted({k for i in idx for k in params[i] if k != "name"})
        differ = [k for k in keys if len({json.dumps(params[i].get(k), default=str)
                                          for i in idx}) > 1]
        for i in idx:
            shown = [f"{k}={params[i][k]}" for k in differ if k in params[i]]
            out[i] = f"{name} ({', '.join(shown)})" if shown else name
    return out


def trace_name(runs: list[RunSpec]) -> str:
    """The workload of an experiment in a word or two (trace file names, ``synthetic``)."""
    names = []
    for spec in runs:
        w = spec.config.get("workload") or {}
        names.append(Path(str(w["trace"])).name if w.get("trace") else
                     "mix" if "mix" in w else "synthetic")
    return ", ".join(dict.fromkeys(names)) or "synthetic"


def values(summary: pd.DataFrame, col: str) -> str:
    """The distinct values of a summary column, comma-separated."""
    return ", ".join(str(v) for v in dict.fromkeys(summary[col])) if col in summary else "?"


def build_context(out: Path, base: dict[str, Any], runs: list[RunSpec],
                  summary: pd.DataFrame) -> ReportContext:
    """The ``ReportContext`` of an experiment's finished runs."""
    key = x_key(base, runs)
    if key is not None and not (key in summary and pd.api.types.is_numeric_dtype(summary[key])):
        key = None  # not a number axis (or not swept): its values split series instead
    df = summary.copy()
    df["series"] = series_names(df, runs, key)
    df["x"] = df[key] if key in df else np.nan
    title = (f"{values(df, 'model')} · {values(df, 'hardware')} · TP={values(df, 'tp')} · "
             f"{trace_name(runs)}")
    slos = {k: float(v) for k, v in (base.get("slos") or {}).items() if v is not None}
    try:
        is_rate = key is not None and key == rate_key(base.get("workload"))
    except CapacityError:
        is_rate = False
    return ReportContext(df, key, title, out / "runs", slos, is_rate)
