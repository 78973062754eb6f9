"""Fit engine-level parameters to measured forward-pass (iteration) times of a user's engine.

CSV format (one row per measured forward pass; header required, extra columns ignored)::

    model,hardware,tp,batch_size,new_tokens,context_tokens,measured_ms
    llama-3-8b,a100-80gb,1,32,1,512,13.2

A row is ``batch_size`` uniform sequences, each computing ``new_tokens`` tokens (1 = decode)
against ``context_tokens`` of KV context, the new tokens included; ``model`` and ``hardware``
are built-in profile names (or paths), ``measured_ms`` the wall time of that step. The fit
keeps the GPU profile's kernel calibration and solves, by bounded linear least squares on
relative error, ``measured = scale · roofline_gpu_time + per_step + per_seq · batch_size +
per_layer_launch · num_layers``: an overall efficiency ``scale`` and the three engine
overheads of ``hardware_profiles/engines/*.yaml``. Every third row (in file order after a
stable sort by shape) is held out; the report gives held-out and train MdAPE.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from sim.core.types import BatchShape
from sim.cost.calibration_input import CalibrationError, check_columns, read_csv
from sim.cost.profiles import ProfileError

if TYPE_CHECKING:  # for annotations; ``_design`` imports it where it builds models
    from sim.cost.roofline import RooflineCost

#: Columns an iteration CSV must have.
ITERATION_COLUMNS = ("model", "hardware", "tp", "batch_size", "new_tokens", "context_tokens",
                     "measured_ms")
#: Fitted parameter names, in the order of the least-squares vector.
ITERATION_PARAMS = ("efficiency_scale", "per_step_s", "per_seq_s", "per_layer_launch_s")


@dataclass(frozen=True)
class IterationReport:
    """Outcome of an iteration-level fit: parameters, MdAPE (%) and the points behind it."""

    source: str
    params: dict[str, float]
    heldout_mdape_pct: float
    train_mdape_pct: float
    n_train: int
    n_heldout: int
    predicted_ms: np.ndarray
    measured_ms: np.ndarray
    heldout: np.ndarray
    groups: np.ndarray

    def table(self) -> str:
        """Markdown summary: error and fitted parameters."""
        p = self.params
        return "\n".join([
            f"Iteration-level fit of `{self.source}`",
            "",
            "| rows (held-out / train) | MdAPE % held-out | MdAPE % train | efficiency_scale "
            "| per_step_ms | per_seq_ms | per_layer_launch_us |",
            "|---|---|---|---|---|---|---|",
            f"| {self.n_heldout} / {self.n_train} | {self.heldout_mdape_pct:.1f} "
            f"| {self.train_mdape_pct:.1f} | {p['efficiency_scale']:.3f} "
            f"| {p['per_step_s'] * 1e3:.3f} | {p['per_seq_s'] * 1e3:.4f} "
            f"| {p['per_layer_launch_s'] * 1e6:.2f} |"])

    def engine_yaml(self, name: str = "fitted") -> str:
        """An engine profile YAML with the fitted overheads (``efficiency_scale`` goes in a
        comment: apply it through the GPU calibration, not the engine)."""
        p = self.params
        return (f"# fitted by `batchsim calibrate --data {self.source}`; held-out MdAPE "
                f"{self.heldout_mdape_pct:.1f}%; efficiency_scale {p['efficiency_scale']:.4g}\n"
                f"name: {name}\nper_step_s: {p['per_step_s']:.6g}\n"
                f"per_seq_s: {p['per_seq_s']:.6g}\n"
                f"per_layer_launch_s: {p['per_layer_launch_s']:.6g}\n")


def is_iteration_csv(path: str | Path) -> bool:
    """True when ``path`` is a file whose header has every iteration column."""
    p = Path(path)
    if not p.is_file():
        return False
    try:
        header = read_csv(p, nrows=0).columns
    except CalibrationError:
        return False
    return set(ITERATION_COLUMNS) <= {str(c).strip() for c in header}


def load_iteration_csv(path: str | Path) -> pd.DataFrame:
    """Read and validate an iteration CSV; raises ``CalibrationError`` naming the problem."""
    p = Path(path)
    df = read_csv(p, "iteration CSV")
    df.columns = [str(c).strip() for c in df.columns]
    missing = [c for c in ITERATION_COLUMNS if c not in df.columns]
    if missing:
        raise CalibrationError(f"{p}: missing column(s) {missing}; expected "
                               f"{','.join(ITERATION_COLUMNS)}")
    if df.empty:
        raise CalibrationError(f"{p}: no data rows")
    # sizes whole numbers >= 1, the step time finite and in (0, MAX_LATENCY_MS] ms
    df = check_columns(df, p, ITERATION_COLUMNS[2:-1], "measured_ms", open_min=True)
    if (df["context_tokens"] < df["new_tokens"]).any():
        row = int(np.flatnonzero((df["context_tokens"] < df["new_tokens"]).to_numpy())[0])
        raise CalibrationError(f"{p}: row {row + 2}: context_tokens must include the "
                               "new_tokens (context_tokens >= new_tokens)")
    return df


def _design(df: pd.DataFrame, path: str | Path) -> np.ndarray:
    """Columns of the linear model per row: roofline GPU seconds, 1, batch size, layers."""
    from sim.cost.roofline import build_cost_model

    models: dict[tuple[str, str, int], RooflineCost] = {}
    cols = np.empty((len(df), 4))
    # namedtuples whose field types pandas cannot know: load_iteration_csv checked them
    rows: Iterator[Any] = df.itertuples(index=False)
    for i, r in enumerate(rows):
        key = (str(r.model), str(r.hardware), int(r.tp))
        if key not in models:
            try:
                models[key] = build_cost_model(key[0], key[1], key[2], engine="ideal")
            except ProfileError as e:
                raise CalibrationError(str(e), source=str(path), field=f"row {i + 2}") from e
        cm = models[key]
        b = int(r.batch_size)
        shape = BatchShape(np.full(b, int(r.new_tokens), np.int64),
                           np.full(b, int(r.context_tokens), np.int64))
        cols[i] = (cm.step(shape).seconds, 1.0, b, cm.model.num_layers)
    return cols


def _split(df: pd.DataFrame) -> np.ndarray:
    """Deterministic held-out mask: every third row after a stable sort by shape."""
    keys = ["model", "hardware", "tp", "new_tokens", "batch_size", "context_tokens"]
    order = df.sort_values(keys, kind="stable").index.to_numpy()
    held = np.zeros(len(df), bool)
    held[order[2::3]] = True
    return held


def fit_iterations(path: str | Path) -> IterationReport:
    """Fit ``ITERATION_PARAMS`` to the iteration CSV at ``path`` (see the module docstring)."""
    from scipy.optimize import lsq_linear

    df = load_iteration_csv(path)
    if len(df) < 6:
        raise CalibrationError(f"{path}: need at least 6 rows to fit 4 parameters and hold out "
                               f"a third, got {len(df)}")
    x = _design(df, path)
    meas = df["measured_ms"].to_numpy(float) * 1e-3
    held = _split(df)
    tr = ~held
    a = x[tr] / meas[tr, None]  # relative residuals: (x·θ − m) / m
    sol = lsq_linear(a, np.ones(tr.sum()), bounds=([0.0, 0.0, 0.0, 0.0],
                                                   [np.inf, np.inf, np.inf, np.inf]))
    pred = x @ sol.x
    err = np.abs(pred - meas) / meas * 100
    groups = (df["model"].astype(str) + " / " + df["hardware"].astype(str) + " / tp"
              + df["tp"].astype(int).astype(str)).to_numpy()
    return IterationReport(
        source=str(path), params=dict(zip(ITERATION_PARAMS, map(float, sol.x), strict=True)),
        heldout_mdape_pct=float(np.median(err[held])), train_mdape_pct=float(np.median(err[tr])),
        n_train=int(tr.sum()), n_heldout=int(held.sum()), predicted_ms=pred * 1e3,
        measured_ms=meas * 1e3, heldout=held, groups=groups)
