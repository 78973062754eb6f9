"""SLOs of the capacity search: parsing ``--slo`` and judging one probe's summary.

Two forms (DistServe's and ``vllm bench serve``'s): percentile SLOs checked against summary
columns (``ttft_p99_ms=2000`` means ``p99_ttft_ms <= 2000``), and per-request SLOs
(``ttft_ms``, ``tpot_ms``, ``e2el_ms``) met by at least an ``attainment`` share of requests.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from sim.core.errors import InputError
from sim.core.fields import is_real

PERCENTILE = re.compile(r"^(ttft|tpot|itl|e2el)_(p50|median|p90|p99|mean)_ms$")
PER_REQUEST = ("ttft_ms", "tpot_ms", "e2el_ms")


def fmt_value(v: Any) -> str:
    """Compact number for the search trace: ``36110``, ``70.75``, ``0.912``."""
    if isinstance(v, float) and math.isfinite(v):
        return f"{v:.0f}" if abs(v) >= 1e3 else f"{v:.4g}"
    return str(v)


class CapacityError(InputError):
    """Bad capacity-search input (SLO string, tolerance, workload without a rate)."""


@dataclass(frozen=True)
class Slos:
    """Percentile SLOs (summary column → limit) and per-request SLOs with an attainment goal."""

    percentiles: dict[str, float]
    per_request: dict[str, float]
    attainment: float | None

    def describe(self) -> str:
        """The pass criteria in words, for the trace header."""
        parts = [f"{c} <= {v:g}" for c, v in self.percentiles.items()]
        if self.attainment is not None:
            parts.append(f"slo_attainment >= {self.attainment:g} for " + ", ".join(
                f"{k} <= {v:g}" for k, v in self.per_request.items()))
        return ", ".join(parts)

    def columns(self) -> list[str]:
        """Summary columns the SLOs look at."""
        return list(self.percentiles) + (["slo_attainment"] if self.attainment else [])

    def check(self, s: dict[str, Any]) -> tuple[bool, str]:
        """(passed, why not) for one probe's summary."""
        why = []
        if s.get("num_unfinished", 0) or s.get("num_rejected", 0):
            why.append(f"unstable ({s.get('num_unfinished', 0)} unfinished, "
                       f"{s.get('num_rejected', 0)} rejected)")
        for col, limit in self.percentiles.items():
            v = s.get(col, math.nan)
            if not v <= limit:  # NaN fails too
                why.append(f"{col}={fmt_value(v)}>{limit:g}")
        if self.attainment is not None:
            a = s.get("slo_attainment", math.nan)
            if not a >= self.attainment:
                why.append(f"slo_attainment={a:.3f}<{self.attainment:g}")
        return not why, "; ".join(why)


    def binding(self, s: dict[str, Any]) -> str | None:
        """The SLO that a failing probe misses worst (largest value / limit), ``stability``
        when only its stability fails, ``None`` when it passes."""
        def value(col: str) -> float:
            v = s.get(col)
            return math.nan if v is None else float(v)

        ratios = {col: value(col) / limit for col, limit in self.percentiles.items()}
        if self.attainment is not None:
            a = value("slo_attainment")
            ratios["slo_attainment"] = self.attainment / a if a > 0 else math.inf
        failing = {c: r for c, r in ratios.items() if not r <= 1}
        if failing:  # NaN (no value) ranks as the worst
            return max(failing, key=lambda c: math.inf if failing[c] != failing[c]
                       else failing[c])
        return None if self.check(s)[0] else "stability"


def parse_slos(text: str, attainment: float | None = None) -> Slos:
    """Parse ``--slo`` (``ttft_p99_ms=2000,tpot_p99_ms=100``; ``ttft_ms=...`` needs
    ``attainment``) into :class:`Slos`."""
    forms = ("{ttft,tpot,itl,e2el}_{p50,p90,p99,mean}_ms=X, or with --attainment "
             "ttft_ms/tpot_ms/e2el_ms=X")
    if attainment is not None and (not is_real(attainment) or not 0 < attainment <= 1):
        raise CapacityError(f"--attainment: must be a number in (0, 1], got {attainment!r}")
    if text is not None and not isinstance(text, str):
        raise CapacityError(f"--slo: expected text such as 'ttft_p99_ms=2000', got {text!r}")
    pct: dict[str, float] = {}
    req: dict[str, float] = {}
    for item in filter(None, (t.strip() for t in (text or "").split(","))):
        name, eq, raw = (x.strip() for x in item.partition("="))
        try:
            limit = float(raw)
        except ValueError:
            limit = math.nan
        if not eq or not math.isfinite(limit) or limit <= 0:
            raise CapacityError(f"--slo {item!r}: expected NAME=LIMIT with a positive number "
                                f"({forms})")
        m = PERCENTILE.match(name)
        if not m and name not in PER_REQUEST:
            raise CapacityError(f"--slo {name!r}: unknown SLO metric; accepted: {forms}")
        if not m and attainment is None:
            raise CapacityError(f"--slo {name}: a per-request SLO needs --attainment "
                                f"(or use a percentile such as {name[:-3]}_p99_ms)")
        into, key = (pct, f"{'median' if m[2] == 'p50' else m[2]}_{m[1]}_ms") if m \
            else (req, name)
        if key in into:
            raise CapacityError(f"--slo {name}: given twice")
        into[key] = limit
    if not pct and not req:
        raise CapacityError(f"--slo: no SLO given; accepted: {forms}")
    if attainment is not None and not req:
        raise CapacityError("--attainment: needs per-request SLOs (ttft_ms, tpot_ms, e2el_ms)")
    return Slos(pct, req, attainment)
