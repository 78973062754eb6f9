"""The checks every calibration input file passes: kernel tables and iteration CSVs alike.

One rule for both formats, applied row by row with the file and the row named (row = file
line; the header is line 1): size columns are whole numbers in range (``>= 1``; a decode
kernel's ``step`` and a GEMM-free count may be 0), latency columns finite and in
``[0, MAX_LATENCY_MS]`` — a negative size, an ``inf`` or a latency of days is a broken file and
would otherwise be fitted silently or end in a traceback.
"""
from __future__ import annotations

import zlib
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from sim.core.errors import InputError
from sim.core.paths import is_gzip

#: Longest latency a calibration row may report, in ms (a quarter of an hour per kernel or
#: step): beyond it the unit is wrong (µs for ms) or the measurement broken.
MAX_LATENCY_MS = 1e6
#: Largest size a calibration row may report (tokens, heads, bytes of a message).
MAX_SIZE = 2.0**53


class CalibrationError(InputError):
    """Calibration input is wrong: unknown GPU, missing data folder, malformed CSV."""


def read_csv(path: Path, what: str = "CSV", **kwargs: object) -> pd.DataFrame:
    """A calibration CSV, gzip-decompressed by its bytes (not its name: a plain ``t.zip`` is
    text), every read or parse failure one ``CalibrationError`` naming the file."""
    try:
        return pd.read_csv(path, compression="gzip" if is_gzip(path) else None,
                           **kwargs)  # type: ignore[call-overload]
    except (OSError, ValueError, UnicodeDecodeError, EOFError, zlib.error) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CalibrationError(f"cannot read {what} ({msg})", source=str(path)) from None


def check_columns(frame: pd.DataFrame, path: Path | str, sizes: Iterable[str],
                  latency: str, min_size: dict[str, int] | None = None,
                  latency_min: float = 0.0, open_min: bool = False) -> pd.DataFrame:
    """``frame`` with ``sizes`` and ``latency`` as numbers, each row checked (see the module
    docstring); ``min_size`` lowers the bound of some size columns (``{"step": 0}``), and
    ``latency_min`` / ``open_min`` set the latency's lower bound (``> 0`` for an iteration)."""
    out = frame.copy()
    for col in [*sizes, latency]:
        raw = frame[col]
        values = pd.to_numeric(raw, errors="coerce").to_numpy(np.float64, na_value=np.nan)
        if raw.dtype.kind == "b":  # true/false words are no numbers
            values = np.full(len(raw), np.nan)
        checks: tuple[tuple[np.ndarray, str], ...]
        if col == latency:
            low = values <= latency_min if open_min else values < latency_min
            rel = ">" if open_min else ">="
            checks = ((~np.isfinite(values), "must be a finite number"),
                      (low, f"must be {rel} {latency_min:g} ms"),
                      (values > MAX_LATENCY_MS, f"must be at most {MAX_LATENCY_MS:g} ms"))
        else:
            lo = (min_size or {}).get(col, 1)
            checks = ((~np.isfinite(values), "must be a finite number"),
                      (values < lo, f"must be >= {lo}"),
                      (values > MAX_SIZE, f"must be at most {MAX_SIZE:g}"),
                      (values != np.round(values), "must be a whole number"))
        for bad, why in checks:
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                cell = raw.iloc[i]
                shown = cell.item() if isinstance(cell, np.generic) else cell
                raise CalibrationError(f"{why}, got {shown!r}", source=str(path),
                                       field=f"row {i + 2}: {col}")
        out[col] = pd.to_numeric(raw)  # its own dtype kept: integer sizes stay integers
    return out
