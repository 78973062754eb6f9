"""The report's summary tables: which rows and columns, and how a cell is written.

``table_layout`` is shared by ``report.md`` and ``report.html``: rows in series order then x,
a compact set of columns (label, x, seed, completed, throughputs, p99 latencies, whether the
SLOs are met) and the full set; both write numbers with ``context.fmt``.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from sim.report.context import ReportContext, fmt
from sim.report.headline import p99_slos

#: Full-table columns (summary.csv names) and their headers.
TABLE = {"series": "policy", "completed": "done", "request_throughput": "req/s",
         "output_throughput": "out tok/s", "median_ttft_ms": "p50 TTFT ms",
         "p99_ttft_ms": "p99 TTFT ms", "median_tpot_ms": "p50 TPOT ms",
         "p99_tpot_ms": "p99 TPOT ms", "median_e2el_ms": "p50 E2E ms",
         "p99_e2el_ms": "p99 E2E ms", "busy_fraction": "busy", "slot_utilization": "slot util",
         "padding_fraction": "padding", "mfu": "MFU", "mbu": "MBU",
         "num_preemptions": "preempt", "max_kv_usage": "max KV", "slo_attainment": "SLO att.",
         "request_goodput": "goodput req/s"}
#: The compact table's metric columns (a subset of ``TABLE``).
COMPACT = ("completed", "request_throughput", "output_throughput", "p99_ttft_ms",
           "p99_tpot_ms", "p99_e2el_ms")


def md_text(text: str) -> str:
    """``text`` safe inside a markdown table cell or list item: pipes escaped, ``<`` as an
    entity (so a label is never read as HTML), one line."""
    return text.replace("|", "\\|").replace("<", "&lt;").replace("\n", " ")


def interval_text(row: Mapping[str, Any] | pd.Series, col: str) -> str:
    """`` [lo, hi]``: the prediction interval of ``col`` in a summary row (its ``col_lo`` /
    ``col_hi`` columns, ``sim.experiments.intervals``), or ``""`` when it has none."""
    lo, hi = row.get(f"{col}_lo"), row.get(f"{col}_hi")
    if lo is None or hi is None or pd.isna(lo) or pd.isna(hi):
        return ""
    return f" [{fmt(float(lo))}, {fmt(float(hi))}]"


def interval_note(df: pd.DataFrame) -> str:
    """The sentence under a table whose cells carry prediction intervals ('' without any)."""
    if "interval_level" not in df or not df["interval_level"].notna().any():
        return ""
    levels = ", ".join(f"{v:.0%}" for v in dict.fromkeys(df["interval_level"].dropna()))
    draws = ", ".join(str(int(v)) for v in dict.fromkeys(df["interval_draws"].dropna()))
    return (f"Brackets: {levels} prediction intervals (calibration uncertainty and seed "
            f"noise, {draws} draws per run; see docs/cost-model.md).")


def markdown_table(df: pd.DataFrame, columns: list[str],
                   headers: dict[str, str] | None = None) -> str:
    """A GitHub-markdown table of ``columns`` of ``df`` (missing columns skipped); a cell with
    a prediction interval shows it as ``value [lo, hi]``."""
    cols = [c for c in columns if c in df.columns]
    names = [(headers or {}).get(c, c) for c in cols]
    numeric = [pd.api.types.is_numeric_dtype(df[c]) for c in cols]
    lines = ["| " + " | ".join(names) + " |",
             "|" + "|".join("---:" if n else ":---" for n in numeric) + "|"]
    for _, row in df.iterrows():
        cells = [fmt(row[c].item() if hasattr(row[c], "item") else row[c])
                 + interval_text(row, c) for c in cols]
        lines.append("| " + " | ".join(md_text(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Layout:
    """The summary tables: ``rows`` (series order, then x), the ``compact`` and ``full``
    column lists and each column's header."""

    rows: pd.DataFrame
    compact: list[str]
    full: list[str]
    headers: dict[str, str]


def table_layout(ctx: ReportContext) -> Layout:
    """The ``Layout`` of an experiment's summary tables (``report.md`` and ``report.html``);
    with SLOs, a ``slo_met`` column says whether each run meets them (``headline`` rule)."""
    df = ctx.summary
    seeds = ["seed"] if "seed" in df and df["seed"].nunique() > 1 else []
    lead = ["series", *([ctx.x_key] if ctx.x_key else []), *seeds]
    full = [c for c in [*lead, *list(TABLE)[1:]] if c in df and (c in lead or df[c].notna().any())]
    compact = [c for c in [*lead, *COMPACT] if c in full]
    headers = {**TABLE, **({ctx.x_key: ctx.x_key.rsplit(".", 1)[-1]} if ctx.x_key else {})}
    order = {name: i for i, name in enumerate(ctx.series)}
    rows = df.assign(_o=df["series"].map(order)).sort_values(["_o", "x"], kind="stable")
    if ctx.slos:
        slos = p99_slos(ctx.slos)
        rows = rows.assign(slo_met=["yes" if slos.check(dict(r))[0] else "no"
                                    for _, r in rows.iterrows()])
        compact.append("slo_met")
        headers["slo_met"] = "SLOs met"
    return Layout(rows.drop(columns="_o"), compact, full, headers)


