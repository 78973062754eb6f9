"""The headline of a report: per series, the highest swept rate meeting the SLOs and what binds.

A run *meets the SLOs* when it is stable (no request unfinished or rejected) and the p99 of
every metric with a per-request limit in ``slos:`` is within that limit (``slos: {ttft_ms:
200}`` → ``p99_ttft_ms <= 200``); the judging is ``sim.experiments.slo.Slos.check``, the rule
``batchsim capacity`` uses. A swept point meets them when every seed's run does. The *binding
metric* is the one furthest over its limit at the lowest failing rate above the answer (or
"unstable"); when every swept rate passes, the one closest to its limit at the highest.
Without a load sweep (or without SLOs) the headline gives each series' best throughput
instead, and with SLOs whether it meets them there.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from sim.experiments.slo import Slos
from sim.report.context import ReportContext, fmt

#: Names of the p99 columns in words.
METRIC_NAMES = {"p99_ttft_ms": "p99 TTFT", "p99_tpot_ms": "p99 TPOT", "p99_e2el_ms": "p99 E2E"}


def p99_slos(slos: dict[str, float]) -> Slos:
    """The experiment's per-request limits as p99 SLOs (``ttft_ms`` → ``p99_ttft_ms``)."""
    return Slos({f"p99_{k}": v for k, v in slos.items()}, {}, None)


@dataclass(frozen=True)
class Headline:
    """One series' answer: ``best_x`` (None when no swept rate passes), what binds, a sentence."""

    series: str
    best_x: float | None
    binding: str | None
    text: str


def passes(slos: Slos, rows: pd.DataFrame) -> bool:
    """True when every run in ``rows`` meets ``slos``."""
    return all(slos.check(dict(r))[0] for _, r in rows.iterrows())


def binding(slos: Slos, rows: pd.DataFrame) -> str:
    """The metric of ``rows`` (one swept point) furthest over, or closest to, its limit."""
    if any(r.get("num_unfinished", 0) or r.get("num_rejected", 0) for _, r in rows.iterrows()):
        return "unstable (requests left unfinished)"
    ratio = {c: float(rows[c].max()) / lim for c, lim in slos.percentiles.items() if c in rows}
    ratio = {c: r for c, r in ratio.items() if not math.isnan(r)}
    if not ratio:
        return "?"
    col = max(ratio, key=lambda c: ratio[c])
    limit = slos.percentiles[col]
    return f"{METRIC_NAMES.get(col, col)} ({fmt(float(rows[col].max()))} ms vs {limit:g} ms)"


def rate_headline(ctx: ReportContext, name: str, rows: pd.DataFrame, slos: Slos) -> Headline:
    """The highest swept rate of one series that meets ``slos``."""
    xs = sorted(rows["x"].unique())
    ok = {x: passes(slos, rows[rows["x"] == x]) for x in xs}
    good = [x for x in xs if ok[x]]
    if not good:
        why = binding(slos, rows[rows["x"] == xs[0]])
        return Headline(name, None, why, f"{name}: no swept rate meets the SLOs, not even "
                        f"{ctx.x_text(xs[0])}; binding: {why}.")
    best = good[-1]
    above = [x for x in xs if x > best and not ok[x]]
    if above:
        why = binding(slos, rows[rows["x"] == above[0]])
        text = (f"{name}: {ctx.x_text(best)} is the highest swept rate meeting the SLOs; "
                f"at {ctx.x_text(above[0])} {why} binds.")
    else:
        why = binding(slos, rows[rows["x"] == best])
        text = (f"{name}: every swept rate up to {ctx.x_text(best)} meets the SLOs (sweep "
                f"higher to find the limit); closest to its limit: {why}.")
    return Headline(name, float(best), why, text)


def throughput_headline(ctx: ReportContext, name: str, rows: pd.DataFrame,
                        slos: Slos) -> Headline:
    """A series' highest mean output throughput, its p99 TTFT/TPOT there and, with SLOs,
    whether it meets them there."""
    mean = rows.select_dtypes("number").groupby(rows["x"], dropna=False).mean()
    if "output_throughput" not in mean or mean["output_throughput"].isna().all():
        return Headline(name, None, None, f"{name}: no throughput recorded.")
    x = mean["output_throughput"].idxmax()
    best = mean.loc[x]
    where = f" at {ctx.x_text(x)}" if ctx.has_x else ""
    seeds = rows["seed"].nunique() if "seed" in rows else 1
    over = f" (mean of {seeds} seeds)" if seeds > 1 else ""
    text = (f"{name}: {fmt(best['output_throughput'])} output tok/s{where}{over}, "
            f"p99 TTFT {fmt(best.get('p99_ttft_ms', math.nan))} ms, "
            f"p99 TPOT {fmt(best.get('p99_tpot_ms', math.nan))} ms")
    if not slos.percentiles:
        return Headline(name, None, None, text + ".")
    at = rows[rows["x"] == x] if ctx.has_x else rows
    why = binding(slos, at)
    verdict = ("meets the SLOs (closest to its limit" if passes(slos, at)
               else "misses the SLOs (binding")
    return Headline(name, None, why, f"{text}; {verdict}: {why}).")


def headlines(ctx: ReportContext) -> list[Headline]:
    """One ``Headline`` per series, in series order."""
    slos = p99_slos(ctx.slos)
    out = []
    for name in ctx.series:
        rows = ctx.summary[ctx.summary["series"] == name]
        if ctx.shape == "load" and slos.percentiles:
            out.append(rate_headline(ctx, name, rows, slos))
        else:
            out.append(throughput_headline(ctx, name, rows, slos))
    return out


def headline_intro(ctx: ReportContext) -> str:
    """The sentence above the headline list: what the answer means."""
    if ctx.shape == "load" and ctx.slos:
        limits = ", ".join(f"p99 {k.removesuffix('_ms').upper().replace('E2EL', 'E2E')} ≤ "
                           f"{v:g} ms" for k, v in ctx.slos.items())
        return (f"Highest swept request rate meeting the SLOs ({limits}, every request "
                "finished), per policy, and the metric that binds:")
    if ctx.shape == "load":
        return ("No SLOs are set (add `slos:` to find the highest rate meeting them); best "
                "output throughput per policy:")
    return "Best output throughput per policy" + (" and whether it meets the SLOs:"
                                                    if ctx.slos else ":")
