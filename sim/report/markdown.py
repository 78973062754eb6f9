"""An experiment's outputs — plots, ``report.md``, ``report.html`` — drawn at the end of a run
or again by ``batchsim plot``.

``write_outputs`` builds the ``ReportContext`` (series and sweep shape), draws the planned
``plots/*.png`` and writes ``report.md`` (headline, setup, a compact table linking each run's
folder, the full table folded away, the figures with a sentence each, failed runs) and the
interactive ``report.html``. ``regenerate`` rebuilds the same from an output folder alone.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from sim.core.errors import InputError
from sim.cost.profiles import calibration_notes
from sim.cost.validity import validity_line
from sim.experiments.config import ConfigError, RunSpec, expand_runs, policy_label
from sim.experiments.results import write_text
from sim.experiments.runner import engine_profile_of, pin_inputs, run_id
from sim.report.context import ReportContext, build_context, trace_name, values
from sim.report.headline import headline_intro, headlines
from sim.report.html import render_html
from sim.report.plots import Chart, draw_plots, plan
from sim.report.tables import interval_note, markdown_table, md_text, table_layout


def _setup(base: dict[str, Any], runs: list[RunSpec], ctx: ReportContext) -> list[str]:
    df = ctx.summary
    policies: dict[str, list[str]] = {}
    for spec in runs:
        policies.setdefault(spec.label, []).append(
            json.dumps(spec.config.get("policy"), default=str))
    pol = "; ".join(f"{k}: " + ", ".join(f"`{p}`" for p in dict.fromkeys(v))
                    for k, v in policies.items())
    slo = ", ".join(f"{k} ≤ {v:g}" for k, v in ctx.slos.items()) or "none"
    return ["## Setup", "", f"- model: {values(df, 'model')}",
            f"- GPU: {values(df, 'hardware')}", f"- TP: {values(df, 'tp')}",
            "- engine profile: " + ", ".join(dict.fromkeys(engine_profile_of(s.config)
                                                           for s in runs)),
            "- calibration: " + _calibration(runs, df),
            f"- workload: {trace_name(runs)}", f"- policies: {pol}", f"- SLOs: {slo}",
            f"- x axis: `{ctx.x_key}` ({ctx.shape} sweep)" if ctx.x_key
            else f"- x axis: none ({ctx.shape})",
            f"- runs: {len(df)} finished of {len({run_id(s.config) for s in runs})}", ""]


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
            lines.append(f"- `{rid}` ([error.txt](runs/{rid}/error.txt)) ({what}): {first}")
        else:
            lines.append(f"- `{rid}` ({what}): not finished")
    return lines


def render_report(out: Path, base: dict[str, Any], runs: list[RunSpec], ctx: ReportContext,
                  images: list[tuple[Chart, Path]]) -> str:
    """The text of ``report.md``."""
    lines = [f"# {base.get('name', 'experiment')}", ""]
    if base.get("description"):
        lines += [str(base["description"]).strip(), ""]
    lines += [headline_intro(ctx), "", *(f"- {md_text(h.text)}" for h in headlines(ctx)), ""]
    lines += _setup(base, runs, ctx)
    lay = table_layout(ctx)
    links = lay.rows.assign(run=[f"[{r}](runs/{r}/) · [config](runs/{r}/config.yaml)"
                                 for r in lay.rows["run_id"]])
    table = markdown_table(links, [*lay.compact, "run"], lay.headers)
    lines += ["## Summary", "", table,
              "Latencies in ms; fractions in [0, 1]; `run` links each run's folder "
              "(`config.yaml`, requests and steps tables, `summary.json`). Every metric: "
              "`summary.csv`" + (", seed means and 95% CIs: `summary_by_seed.csv`"
                                 if (out / "summary_by_seed.csv").exists() else "") + "."
              + (" " + interval_note(lay.rows) if interval_note(lay.rows) else ""), "",
              "<details><summary>All columns</summary>", "",
              markdown_table(lay.rows, lay.full, lay.headers), "</details>", ""]
    if images:
        lines += ["## Plots", ""]
        for chart, p in images:
            rel = p.relative_to(out).as_posix() if p.is_relative_to(out) else p.as_posix()
            lines += [chart.caption, "", f"![{chart.name}]({rel})", ""]
    failed = _failures(out, runs, set(map(str, ctx.summary["run_id"])))
    if failed:
        lines += ["## Failed or unfinished runs", "", *failed, ""]
    return "\n".join(lines)


def write_outputs(out: Path, base: dict[str, Any], runs: list[RunSpec], summary: pd.DataFrame,
                  plots: bool = True) -> None:
    """Draw ``out/plots/*.png`` (when ``plots``), then write ``out/report.md`` and
    ``out/report.html`` (charts only when ``plots``), each atomically."""
    out = Path(out)
    ctx = build_context(out, base, runs, summary)
    images = draw_plots(ctx, out / "plots") if plots and len(summary) else []
    write_text(out / "report.md", render_report(out, base, runs, ctx, images))
    charts = plan(ctx) if plots and len(summary) else []
    write_text(out / "report.html", render_html(base, ctx, charts))


def _spec_from_folder(out: Path, row: pd.Series, swept_cols: list[str]) -> RunSpec | None:
    path = out / "runs" / str(row["run_id"]) / "config.yaml"
    if not path.exists():
        return None
    try:
        cfg = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        cfg = (str(e).splitlines() or [type(e).__name__])[0]
    if not isinstance(cfg, dict):  # edited or damaged: the report would crash on it later
        what = cfg if isinstance(cfg, str) else f"a {type(cfg).__name__}, not a mapping"
        raise InputError(f"cannot read this run's resolved config ({what}); delete the run's "
                         "folder and re-run the experiment to redo it", source=str(path))
    # the label summary.csv recorded (automatic labels depend on the whole experiment)
    label = row.get("label")
    return RunSpec(cfg, {c: row[c] for c in swept_cols},
                   str(label) if isinstance(label, str) else policy_label(cfg.get("policy")))


def check_output_folder(out: Path) -> None:
    """Refuse a folder that is not an experiment's output folder (``experiment.yaml``,
    ``summary.csv`` and ``runs/``). ``batchsim plot`` asks before it takes the folder's lock:
    the lock file it would leave in a folder of the user's marks that folder as batchsim's
    (``outdir.check_own_folder``), and a later ``run --out`` there would replace its files."""
    out = Path(out)
    if not ((out / "experiment.yaml").is_file() and (out / "summary.csv").is_file()
            and (out / "runs").is_dir()):
        raise InputError(f"{out}: not a batchsim output folder (needs experiment.yaml, "
                         "summary.csv and runs/)")


def regenerate(out: Path) -> None:
    """Rebuild plots, ``report.md`` and ``report.html`` of an output folder (``batchsim plot``)."""
    out = Path(out)
    exp, summ = out / "experiment.yaml", out / "summary.csv"
    check_output_folder(out)
    try:
        doc = yaml.safe_load(exp.read_text(encoding="utf-8"))
        if not isinstance(doc, dict) or not isinstance(doc.get("experiment"), dict):
            raise ConfigError("expected the mapping batchsim writes, with the experiment under "
                              "'experiment:' (the file was edited or replaced)")
        raw = doc["experiment"]
        base, runs = expand_runs(raw, doc.get("overrides") or [],
                                 source=str(doc.get("source", exp)), sweeps=doc.get("sweeps"))
        if doc.get("base_dir"):  # input files' digests are part of the run ids
            runs = [RunSpec(pin_inputs(s.config, Path(doc["base_dir"])), s.swept, s.label)
                    for s in runs]
    except (OSError, UnicodeDecodeError, yaml.YAMLError, KeyError, TypeError,
            ConfigError) as e:
        raise InputError(f"{exp}: cannot rebuild the experiment: {e}") from None
    try:
        summary = pd.read_csv(summ, dtype={"run_id": str})
    except pd.errors.EmptyDataError:
        summary = pd.DataFrame()
    except (OSError, ValueError) as e:  # ParserError and UnicodeDecodeError are ValueErrors
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise InputError(f"cannot read it ({first}); re-run the experiment to rebuild it from "
                         "the finished runs", source=str(summ)) from None
    if summary.empty or "run_id" not in summary:
        raise InputError(f"{summ}: no finished runs to plot")
    summary["run_id"] = summary["run_id"].astype(str)
    _check_columns(out, summary, summ)
    known = {run_id(s.config) for s in runs}
    cols = list(summary.columns)
    swept = cols[cols.index("policy") + 1:cols.index("model")] if {"policy", "model"} <= set(
        cols) else []
    for _, row in summary[~summary["run_id"].isin(known)].iterrows():
        spec = _spec_from_folder(out, row, swept)
        if spec is not None:
            runs.append(spec)
    write_outputs(out, base, runs, summary, plots=True)


def _check_columns(out: Path, summary: pd.DataFrame, summ: Path) -> None:
    """Refuse a ``summary.csv`` that lacks columns its runs have (edited, or cut short by a
    tool): ``collect_summary`` writes every entry of every run's ``summary.json``, and the
    figures would otherwise fail on the first missing metric with a bare ``KeyError``. One
    finished run listed in the file is enough to know the columns."""
    from sim.experiments.outdir import finished_summary
    from sim.experiments.run import VOLATILE

    for rid in summary["run_id"]:
        s = finished_summary(out / "runs" / rid)
        if s is None:
            continue
        missing = [k for k in s if k not in VOLATILE and k not in summary.columns]
        if missing:
            shown = ", ".join(missing[:5]) + (f" (and {len(missing) - 5} more)"
                                               if len(missing) > 5 else "")
            raise InputError(f"lacks column(s) of its runs: {shown} (the file was edited or "
                             "replaced); re-run the experiment to rebuild it from the finished "
                             "runs", source=str(summ))
        return


def _calibration(runs: list[RunSpec], df: pd.DataFrame) -> str:
    """The setup's calibration line: how each GPU was calibrated, and the share of steps inside
    the calibrated range (``sim.cost.validity``)."""
    notes = calibration_notes([str(s.config["hardware"]) for s in runs
                               if s.config["cost"]["kind"] == "roofline"])
    return "; ".join([*(notes or ["none (analytic cost)"]), *filter(None, [validity_line(df)])])
