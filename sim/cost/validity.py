"""Validity flags: which simulated steps fall inside the shapes the cost model was fitted on.

A GPU profile's ``calibration.fit.range`` and an engine profile's ``calibration.range`` state
the shapes their data covered (``max_tokens`` per step, ``max_rows`` sequences per step,
``max_context_tokens`` mean context per sequence, ``max_tp``, ``dtypes``). A step is
*calibrated* when every bound holds, *extrapolated* when one does not, and every step of a run on
a ``datasheet-only`` GPU counts as *datasheet-only* whatever its shape. Analytic cost models
(``constant``, ``linear``) count no step. The context check reads the mean context of a step
(``kv_live_tokens / num_seqs``, the only context the steps table keeps), so a batch that mixes
one very long sequence with short ones can pass it.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

#: The summary columns this module adds.
VALIDITY_COLUMNS = ("steps_calibrated", "steps_extrapolated", "steps_datasheet_only")
#: The step columns ``validity_counts`` reads (a caller may hand it just these).
VALIDITY_INPUTS = ("num_seqs", "num_prefill_tokens", "num_decode_tokens", "kv_live_tokens")


@dataclass(frozen=True)
class CalibratedRange:
    """The step shapes a cost model's data covered (``inf`` = no bound known)."""

    max_tokens: float = math.inf
    max_rows: float = math.inf
    max_context_tokens: float = math.inf
    whole_run_extrapolated: bool = False  # TP or dtype outside the fitted range
    datasheet_only: bool = False


def _bound(ranges: Sequence[Mapping[str, Any]], key: str) -> float:
    """The tightest ``key`` bound of ``ranges`` (``inf`` when none gives it)."""
    values = [float(r[key]) for r in ranges if r.get(key) is not None]
    return min(values) if values else math.inf


def calibrated_range(cost: Any) -> CalibratedRange | None:
    """The fitted range of a roofline cost model (``None`` for any other cost model)."""
    gpu, engine = getattr(cost, "gpu", None), getattr(cost, "engine", None)
    if gpu is None or engine is None or not hasattr(gpu, "calibration_status"):
        return None
    gpu_range = dict(gpu.calibration.fit.get("range") or {})
    eng_range = dict(engine.calibration.get("range") or {})
    ranges = [gpu_range, eng_range]
    dtypes = gpu_range.get("dtypes")
    off_dtype = dtypes is not None and (cost.weight_dtype not in dtypes
                                        or cost.kv_dtype not in dtypes)
    return CalibratedRange(
        max_tokens=_bound(ranges, "max_tokens"), max_rows=_bound(ranges, "max_rows"),
        max_context_tokens=_bound(ranges, "max_context_tokens"),
        whole_run_extrapolated=bool(cost.tp > _bound(ranges, "max_tp") or off_dtype),
        datasheet_only=gpu.calibration_status == "datasheet-only")


def validity_counts(steps: pd.DataFrame | Mapping[str, np.ndarray], cost: Any
                    ) -> dict[str, int]:
    """The ``VALIDITY_COLUMNS`` of a run's steps (a steps table, or a chunk of its columns as
    arrays, as a bucketed table folds them) under ``cost``."""
    n = len(steps["num_seqs"]) if len(steps) else 0
    rng = calibrated_range(cost)
    if rng is None or n == 0:
        return dict.fromkeys(VALIDITY_COLUMNS, 0)
    if rng.datasheet_only:
        return {"steps_calibrated": 0, "steps_extrapolated": 0, "steps_datasheet_only": n}
    if rng.whole_run_extrapolated:
        return {"steps_calibrated": 0, "steps_extrapolated": n, "steps_datasheet_only": 0}
    tokens = (np.asarray(steps["num_prefill_tokens"], dtype=np.int64)
              + np.asarray(steps["num_decode_tokens"], dtype=np.int64))
    rows = np.asarray(steps["num_seqs"], dtype=np.int64)
    context = np.asarray(steps["kv_live_tokens"], dtype=float) / np.maximum(rows, 1)
    inside = ((tokens <= rng.max_tokens) & (rows <= rng.max_rows)
              & (context <= rng.max_context_tokens))
    k = int(inside.sum())
    return {"steps_calibrated": k, "steps_extrapolated": n - k, "steps_datasheet_only": 0}


def validity_line(summary: pd.DataFrame) -> str:
    """One sentence for a report: the steps of all runs inside the calibrated range, outside
    it and on datasheet-only profiles (empty when the summary has no such columns)."""
    if not set(VALIDITY_COLUMNS) <= set(summary.columns):
        return ""
    total = {c: int(pd.to_numeric(summary[c], errors="coerce").fillna(0).sum())
             for c in VALIDITY_COLUMNS}
    n = sum(total.values())
    if n == 0:
        return "no step on a calibrated roofline"
    pct = {c: 100.0 * v / n for c, v in total.items()}
    return (f"{pct['steps_calibrated']:.0f} % of steps inside the calibrated range, "
            f"{pct['steps_extrapolated']:.0f} % extrapolated, "
            f"{pct['steps_datasheet_only']:.0f} % on datasheet-only profiles")
