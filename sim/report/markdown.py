"""An experiment's plots and ``report.md``, drawn at the end of a run or again by ``batchsim plot``.

``write_outputs`` names each run's series (its policy label plus any varying non-load swept
value), draws ``plots/*.png`` and writes ``report.md`` (setup, a summary table, the figures,
failed runs). ``regenerate`` rebuilds the same from an output folder alone.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from sim.core.errors import InputError
from sim.experiments.config import ConfigError, RunSpec, expand_runs, policy_label
from sim.experiments.results import read_table, write_text
from sim.experiments.runner import engine_profile_of, pin_inputs, run_id
from sim.report import plots as P

#: Report table columns (summary.csv names) and their headers.
TABLE = {"series": "policy", "completed": "done", "request_throughput": "req/s",
         "output_throughput": "out tok/s", "median_ttft_ms": "p50 TTFT ms",
         "p99_ttft_ms": "p99 TTFT ms", "median_tpot_ms": "p50 TPOT ms",
         "p99_tpot_ms": "p99 TPOT ms", "median_e2el_ms": "p50 E2E ms",
         "p99_e2el_ms": "p99 E2E ms", "busy_fraction": "busy", "slot_utilization": "slot util",
         "padding_fraction": "padding", "mfu": "MFU", "mbu": "MBU",
         "num_preemptions": "preempt", "max_kv_usage": "max KV", "slo_attainment": "SLO att.",
         "request_goodput": "goodput req/s"}
MAX_TIMELINES = 4


def fmt(value: Any) -> str:
    """A table cell: integers as is, floats to 3 significant digits (≥ 1000: no decimals)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value).replace("|", "\\|").replace("\n", " ")
    if isinstance(value, int) or float(value).is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    v = float(value)
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"


def markdown_table(df: pd.DataFrame, columns: list[str],
                   headers: dict[str, str] | None = None) -> str:
    """A GitHub-markdown table of ``columns`` of ``df`` (missing columns skipped)."""
    cols = [c for c in columns if c in df.columns]
    names = [(headers or {}).get(c, c) for c in cols]
    numeric = [pd.api.types.is_numeric_dtype(df[c]) for c in cols]
    lines = ["| " + " | ".join(names) + " |",
             "|" + "|".join("---:" if n else ":---" for n in numeric) + "|"]
    for row in df[cols].itertuples(index=False):
        lines.append("| " + " | ".join(fmt(v.item() if hasattr(v, "item") else v)
                                       for v in row) + " |")
    return "\n".join(lines) + "\n"


def load_key(base: dict[str, Any], runs: list[RunSpec]) -> str | None:
    """``output.load_key``, else the first swept key that is not ``seed``."""
    key = (base.get("output") or {}).get("load_key")
    if key:
        return key
    for spec in runs:
        for k in spec.swept:
            if k != "seed":
                return k
    return None


def _policy_params(spec: RunSpec | None) -> dict[str, Any]:
    pol = dict(spec.config.get("policy") or {}) if spec else {}
    pol.pop("label", None)
    return pol


def series_names(summary: pd.DataFrame, runs: list[RunSpec], key: str | None) -> list[str]:
    """A legend name per summary row: label, varying non-load swept values, and the policy
    parameters that tell apart two policies sharing a label."""
    specs = {run_id(s.config): s for s in runs}
    extra = [c for c in {k: 0 for s in runs for k in s.swept} if c not in (key, "seed")
             and c in summary and summary[c].nunique(dropna=False) > 1]
    names = []
    for _, row in summary.iterrows():
        bits = [f"{c.rsplit('.', 1)[-1]}={row[c]}" for c in extra]
        names.append(" ".join([str(row["label"]), *bits]))
    params = [_policy_params(specs.get(str(r))) for r in summary["run_id"]]
    out = list(names)
    for name in set(names):
        idx = [i for i, n in enumerate(names) if n == name]
        distinct = {json.dumps(params[i], sort_keys=True, default=str) for i in idx}
        if len(distinct) < 2:
            continue
        keys = sorted({k for i in idx for k in params[i] if k != "name"})
        differ = [k for k in keys if len({json.dumps(params[i].get(k), default=str)
                                          for i in idx}) > 1]
        for i in idx:
            shown = [f"{k}={params[i][k]}" for k in differ if k in params[i]]
            out[i] = f"{name} ({', '.join(shown)})" if shown else name
    return out


def _trace_name(runs: list[RunSpec]) -> str:
    names = []
    for spec in runs:
        w = spec.config.get("workload") or {}
        names.append(Path(str(w["trace"])).name if w.get("trace") else
                     "mix" if "mix" in w else "synthetic")
    return ", ".join(dict.fromkeys(names)) or "synthetic"


def _values(summary: pd.DataFrame, col: str) -> str:
    return ", ".join(str(v) for v in dict.fromkeys(summary[col])) if col in summary else "?"


def build_context(out: Path, base: dict[str, Any], runs: list[RunSpec],
                  summary: pd.DataFrame) -> P.PlotContext:
    """The ``PlotContext`` of an experiment's finished runs."""
    key = load_key(base, runs)
    df = summary.copy()
    df["series"] = series_names(df, runs, key)
    df["x"] = df[key] if key in df else float("nan")
    title = (f"{_values(df, 'model')} · {_values(df, 'hardware')} · TP={_values(df, 'tp')} · "
             f"{_trace_name(runs)}")
    slos = {k: v for k, v in (base.get("slos") or {}).items() if v is not None}
    return P.PlotContext(df, key if key in df else None, title, out / "runs", slos)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_")[:60] or "run"


def draw_plots(ctx: P.PlotContext, folder: Path) -> list[Path]:
    """Draw every figure into ``folder``; return the paths written."""
    paths = [P.plot_latency_vs_load(ctx, folder / "latency_vs_load.png"),
             P.plot_frontier(ctx, folder / "throughput_vs_latency.png"),
             P.plot_latency_cdf(ctx, folder / "latency_cdf.png"),
             P.plot_utilization(ctx, folder / "utilization.png")]
    good = P.plot_goodput(ctx, folder / "goodput_vs_load.png")
    paths += [good] if good else []
    for _, row in ctx.common_point().head(MAX_TIMELINES).iterrows():
        run = ctx.runs_dir / str(row["run_id"])
        try:
            steps = read_table(run / "steps")
        except (OSError, ValueError):
            continue
        where = f" @ {ctx.load_key}={row['x']}" if ctx.has_load else ""
        nb = row.get("num_blocks")
        paths.append(P.plot_timeline(steps, folder / f"timeline_{_slug(row['series'])}.png",
                                     f"{row['series']}{where} · {ctx.title}",
                                     float(nb) if nb is not None and pd.notna(nb) else None))
    return paths


def _failures(out: Path, runs: list[RunSpec], done: set[str]) -> list[str]:
    lines, seen = [], set()
    for spec in runs:
        rid = run_id(spec.config)
        if rid in done or rid in seen:
            continue
        seen.add(rid)
        err = out / "runs" / rid / "error.txt"
        what = " ".join([spec.label, *(f"{k}={v}" for k, v in spec.swept.items())])
        if err.exists():
            first = (err.read_text(encoding="utf-8").splitlines() or ["?"])[0]
            lines.append(f"- `{rid}` ({what}): {first}")
        else:
            lines.append(f"- `{rid}` ({what}): not finished")
    return lines


def render_report(out: Path, base: dict[str, Any], runs: list[RunSpec], ctx: P.PlotContext,
                  images: list[Path]) -> str:
    """The text of ``report.md``."""
    df = ctx.summary
    lines = [f"# {base.get('name', 'experiment')}", ""]
    if base.get("description"):
        lines += [str(base["description"]).strip(), ""]
    policies: dict[str, list[str]] = {}
    for spec in runs:
        policies.setdefault(spec.label, []).append(
            json.dumps(spec.config.get("policy"), default=str))
    pol = "; ".join(f"{k}: " + ", ".join(f"`{p}`" for p in dict.fromkeys(v))
                    for k, v in policies.items())
    slo = ", ".join(f"{k} ≤ {v:g}" for k, v in ctx.slos.items()) or "none"
    lines += ["## Setup", "", f"- model: {_values(df, 'model')}",
              f"- GPU: {_values(df, 'hardware')}", f"- TP: {_values(df, 'tp')}",
              "- engine profile: " + ", ".join(dict.fromkeys(engine_profile_of(s.config)
                                                             for s in runs)),
              f"- workload: {_trace_name(runs)}", f"- policies: {pol}", f"- SLOs: {slo}",
              f"- load axis: `{ctx.load_key}`" if ctx.load_key else "- load axis: none",
              f"- runs: {len(df)} finished of {len({run_id(s.config) for s in runs})}", ""]
    seeds = ["seed"] if "seed" in df and df["seed"].nunique() > 1 else []
    cols = ["series", *([ctx.load_key] if ctx.load_key else []), *seeds, *list(TABLE)[1:]]
    cols = [c for c in cols if c in df and (c == ctx.load_key or df[c].notna().any())]
    headers = {**TABLE, **({ctx.load_key: ctx.load_key.rsplit(".", 1)[-1]}
                           if ctx.load_key else {})}
    order = {name: i for i, name in enumerate(ctx.series)}
    table = df.assign(_o=df["series"].map(order)).sort_values(["_o", "x"], kind="stable") \
        if ctx.has_load else df
    lines += ["## Summary", "", markdown_table(table, cols, headers),
              "Latencies in ms; fractions in [0, 1]. Full metrics: `summary.csv`."
              + (" Seed means and 95% CIs: `summary_by_seed.csv`."
                 if (out / "summary_by_seed.csv").exists() else ""), ""]
    if images:
        lines += ["## Plots", ""]
        for p in images:
            rel = p.relative_to(out).as_posix() if p.is_relative_to(out) else p.as_posix()
            lines += [f"![{p.stem}]({rel})", ""]
    failed = _failures(out, runs, set(map(str, df["run_id"])))
    if failed:
        lines += ["## Failed or unfinished runs", "", *failed, ""]
    return "\n".join(lines)


def write_outputs(out: Path, base: dict[str, Any], runs: list[RunSpec], summary: pd.DataFrame,
                  plots: bool = True) -> None:
    """Draw ``out/plots/*.png`` (when ``plots``) and write ``out/report.md`` atomically."""
    out = Path(out)
    ctx = build_context(out, base, runs, summary)
    images = draw_plots(ctx, out / "plots") if plots and len(summary) else []
    write_text(out / "report.md", render_report(out, base, runs, ctx, images))


def _spec_from_folder(out: Path, row: pd.Series, swept_cols: list[str]) -> RunSpec | None:
    path = out / "runs" / str(row["run_id"]) / "config.yaml"
    if not path.exists():
        return None
    cfg = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return RunSpec(cfg, {c: row[c] for c in swept_cols}, policy_label(cfg.get("policy")))


def regenerate(out: Path) -> None:
    """Rebuild plots and ``report.md`` of an experiment output folder (``batchsim plot``)."""
    out = Path(out)
    exp, summ = out / "experiment.yaml", out / "summary.csv"
    if not (exp.is_file() and summ.is_file() and (out / "runs").is_dir()):
        raise InputError(f"{out}: not a batchsim output folder (needs experiment.yaml, "
                         "summary.csv and runs/)")
    try:
        doc = yaml.safe_load(exp.read_text(encoding="utf-8"))
        raw = doc["experiment"]
        base, runs = expand_runs(raw, doc.get("overrides") or [],
                                 source=str(doc.get("source", exp)))
        if doc.get("base_dir"):  # input files' digests are part of the run ids
            runs = [RunSpec(pin_inputs(s.config, Path(doc["base_dir"])), s.swept, s.label)
                    for s in runs]
    except (yaml.YAMLError, KeyError, TypeError, ConfigError) as e:
        raise InputError(f"{exp}: cannot rebuild the experiment: {e}") from None
    try:
        summary = pd.read_csv(summ, dtype={"run_id": str})
    except pd.errors.EmptyDataError:
        summary = pd.DataFrame()
    if summary.empty or "run_id" not in summary:
        raise InputError(f"{summ}: no finished runs to plot")
    summary["run_id"] = summary["run_id"].astype(str)
    known = {run_id(s.config) for s in runs}
    cols = list(summary.columns)
    swept = cols[cols.index("policy") + 1:cols.index("model")] if {"policy", "model"} <= set(
        cols) else []
    for _, row in summary[~summary["run_id"].isin(known)].iterrows():
        spec = _spec_from_folder(out, row, swept)
        if spec is not None:
            runs.append(spec)
    write_outputs(out, base, runs, summary, plots=True)
