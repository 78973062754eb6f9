"""Request-trace loaders: Azure 2023 CSV, Vidur/Splitwise CSV and batchsim's native CSV.

A trace is read into a columnar ``TraceArrays`` (numpy arrays, vectorised checks) so a
million-row file loads in about a second; ``to_requests()`` turns it into the ``Request`` list
the engine consumes. The format is detected from the header line. Every problem with a file —
wrong columns, bad numbers, unsorted times, undecodable bytes — is a ``TraceError`` whose
one-line message names the file, the 1-based data row (header = line 1, row 1 = line 2) and
the column, so the CLI can print it and exit 2 instead of leaking a pandas traceback.
"""
from __future__ import annotations

import csv
import importlib.resources
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from sim.types import Request

#: Built-in trace names -> file names in ``traces/`` (shipped as package ``sim._traces``).
BUILTIN_TRACES: dict[str, str] = {
    "azure-conv": "AzureLLMInferenceTrace_conv.csv",
    "azure-code": "AzureLLMInferenceTrace_code.csv",
    "sample": "sample_native.csv",
}

#: Largest token count accepted for one request; larger values are data errors, not workloads.
MAX_TOKENS = 10_000_000
#: Largest arrival time accepted (about 31 years); beyond it float seconds lose precision.
MAX_ARRIVAL_S = 1e9

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
VIDUR_COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")
NATIVE_COLUMNS = ("arrival_s", "num_prompt_tokens", "num_output_tokens")
NATIVE_OPTIONAL = ("priority", "tenant", "prefix_id", "num_prefix_tokens")


class TraceError(ValueError):
    """A trace file cannot be used; the message is one line naming file, row and column."""


@dataclass(frozen=True)
class TraceArrays:
    """A trace in columnar form: one numpy array per field, rows sorted by ``arrival_s``.

    ``priority``, ``tenant`` and ``prefix_id`` are ``None`` when the trace has no such column
    (every request then takes the ``Request`` default).
    """

    arrival_s: np.ndarray
    num_prompt_tokens: np.ndarray
    num_output_tokens: np.ndarray
    priority: np.ndarray | None = None
    tenant: np.ndarray | None = None
    prefix_id: np.ndarray | None = None
    source: str = "<memory>"
    num_prefix_tokens: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.arrival_s.shape[0])

    def take(self, index: np.ndarray | slice) -> TraceArrays:
        """Rows selected by a slice, boolean mask or integer index array (order as given)."""
        def pick(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else a[index]
        return TraceArrays(self.arrival_s[index], self.num_prompt_tokens[index],
                           self.num_output_tokens[index], pick(self.priority),
                           pick(self.tenant), pick(self.prefix_id), self.source,
                           pick(self.num_prefix_tokens))

    def with_arrivals(self, arrival_s: np.ndarray) -> TraceArrays:
        """The same rows with new arrival times (used by time slicing and scaling)."""
        return replace(self, arrival_s=np.asarray(arrival_s, dtype=np.float64))

    def to_requests(self, first_id: int = 0) -> list[Request]:
        """``Request`` objects with ids ``first_id, first_id+1, ...`` in row order."""
        n = len(self)
        arr = self.arrival_s.tolist()
        prm = self.num_prompt_tokens.tolist()
        out = self.num_output_tokens.tolist()
        pri = self.priority.tolist() if self.priority is not None else [0] * n
        ten = self.tenant.tolist() if self.tenant is not None else [None] * n
        pre = self.prefix_id.tolist() if self.prefix_id is not None else [None] * n
        if self.num_prefix_tokens is None:
            return [Request(first_id + i, arr[i], prm[i], out[i], pri[i], ten[i], pre[i])
                    for i in range(n)]
        npx = self.num_prefix_tokens.tolist()
        return [Request(first_id + i, arr[i], prm[i], out[i], pri[i], ten[i], pre[i], npx[i])
                for i in range(n)]

    @staticmethod
    def from_requests(requests: Iterable[Request]) -> TraceArrays:
        """Columnar form of a request list (optional columns kept only if any is set)."""
        reqs = list(requests)
        pri = np.array([r.priority for r in reqs], dtype=np.int64)
        ten = np.array([r.tenant for r in reqs], dtype=object)
        pre = np.array([r.prefix_id for r in reqs], dtype=object)
        npx = np.array([r.num_prefix_tokens for r in reqs], dtype=np.int64)
        return TraceArrays(
            np.array([r.arrival_s for r in reqs], dtype=np.float64),
            np.array([r.num_prompt_tokens for r in reqs], dtype=np.int64),
            np.array([r.num_output_tokens for r in reqs], dtype=np.int64),
            pri if pri.any() else None,
            ten if any(t is not None for t in ten) else None,
            pre if any(p is not None for p in pre) else None,
            num_prefix_tokens=npx if npx.any() else None,
        )


def resolve_trace(name_or_path: str | Path, base_dir: Path | None = None) -> Path:
    """Path of a built-in trace name (``azure-conv``...) or of a file, relative to ``base_dir``.

    Built-ins are looked up in the source tree first, then in the installed ``sim._traces``
    package, so they resolve from any working directory.
    """
    key = str(name_or_path)
    if key in BUILTIN_TRACES:
        fname = BUILTIN_TRACES[key]
        local = Path(__file__).resolve().parent.parent / "traces" / fname
        if local.is_file():
            return local
        try:
            res = importlib.resources.files("sim._traces").joinpath(fname)
            with importlib.resources.as_file(res) as p:
                if Path(p).is_file():
                    return Path(p)
        except (ModuleNotFoundError, FileNotFoundError):
            pass
        raise TraceError(f"{key}: built-in trace file {fname} is missing from the installation")
    path = Path(key).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = Path(base_dir) / path
    if not path.is_file():
        names = ", ".join(sorted(BUILTIN_TRACES))
        raise TraceError(f"{path}: no such trace file (built-in names: {names})")
    return path


def load_trace(name_or_path: str | Path, base_dir: Path | None = None,
               sort: bool = False) -> list[Request]:
    """Load a trace as ``Request`` objects sorted by arrival, ids ``0..n-1``."""
    return load_trace_arrays(name_or_path, base_dir, sort).to_requests()


def load_trace_arrays(name_or_path: str | Path, base_dir: Path | None = None,
                      sort: bool = False, lengths_only: bool = False) -> TraceArrays:
    """Load and validate a trace into columnar arrays.

    Rows must be in non-decreasing arrival order (equal times are fine): an out-of-order row is
    an error, because it usually means a corrupted or concatenated file. ``sort=True`` instead
    sorts stably by arrival (equal times keep file order). Arrival times are shifted so that
    the first request arrives at 0 for the Azure format (wall-clock stamps); Vidur and native
    times are kept as written. ``lengths_only=True`` also accepts Vidur/Sarathi length-only
    files (``num_prefill_tokens,num_decode_tokens`` without ``arrived_at``, e.g. ShareGPT
    stats), whose arrivals are then all 0: use it only for length distributions.
    """
    path = resolve_trace(name_or_path, base_dir)
    header = _read_header(path)
    # Header cells as the csv module reads them (quotes removed), then trimmed of spaces.
    try:
        cols = [c.strip() for c in next(csv.reader([header]))]
    except csv.Error as exc:
        raise TraceError(f"{path}: header: cannot parse: {exc}") from None
    if set(AZURE_COLUMNS) <= set(cols):
        usecols, fmt = list(AZURE_COLUMNS), "azure"
    elif set(VIDUR_COLUMNS) <= set(cols):
        usecols, fmt = list(VIDUR_COLUMNS), "vidur"
    elif set(NATIVE_COLUMNS) <= set(cols):
        unknown = [c for c in cols if c not in NATIVE_COLUMNS + NATIVE_OPTIONAL]
        if unknown:
            raise TraceError(f"{path}: header: unknown native column(s) {unknown}; allowed: "
                             f"{', '.join(NATIVE_COLUMNS + NATIVE_OPTIONAL)}")
        usecols, fmt = [c for c in cols], "native"
    elif lengths_only and set(VIDUR_COLUMNS[1:]) <= set(cols):
        usecols, fmt = list(VIDUR_COLUMNS[1:]), "lengths"
    else:
        raise TraceError(
            f"{path}: header: unrecognised columns {cols}; expected Azure "
            f"({','.join(AZURE_COLUMNS)}), Vidur ({','.join(VIDUR_COLUMNS)}) or native "
            f"({','.join(NATIVE_COLUMNS)}[,{','.join(NATIVE_OPTIONAL)}])")
    if len(set(cols)) != len(cols):
        raise TraceError(f"{path}: header: duplicate column names in {cols}")
    df = _read_frame(path, usecols, fmt)
    if fmt == "azure":
        arrival = _parse_timestamps(path, df["TIMESTAMP"])
        prompt = _parse_tokens(path, df["ContextTokens"], "ContextTokens")
        output = _parse_tokens(path, df["GeneratedTokens"], "GeneratedTokens")
        trace = TraceArrays(arrival, prompt, output, source=str(path))
    elif fmt in ("vidur", "lengths"):
        arrival = (_parse_arrivals(path, df["arrived_at"], "arrived_at") if fmt == "vidur"
                   else np.zeros(len(df)))
        prompt = _parse_tokens(path, df["num_prefill_tokens"], "num_prefill_tokens")
        output = _parse_tokens(path, df["num_decode_tokens"], "num_decode_tokens")
        trace = TraceArrays(arrival, prompt, output, source=str(path))
    else:
        trace = TraceArrays(
            _parse_arrivals(path, df["arrival_s"], "arrival_s"),
            _parse_tokens(path, df["num_prompt_tokens"], "num_prompt_tokens"),
            _parse_tokens(path, df["num_output_tokens"], "num_output_tokens"),
            _parse_priority(path, df["priority"]) if "priority" in df else None,
            _parse_labels(df["tenant"]) if "tenant" in df else None,
            _parse_labels(df["prefix_id"]) if "prefix_id" in df else None,
            source=str(path),
            num_prefix_tokens=(_parse_prefix(path, df["num_prefix_tokens"])
                               if "num_prefix_tokens" in df else None))
        if trace.num_prefix_tokens is not None:
            over = np.flatnonzero(trace.num_prefix_tokens > trace.num_prompt_tokens)
            if over.size:
                raise TraceError(f"{path}: row {over[0] + 1}: column num_prefix_tokens: "
                                 "longer than the row's prompt")
    back = np.flatnonzero(np.diff(trace.arrival_s) < 0)
    if back.size and not sort:
        i = int(back[0]) + 1
        tcol = {"azure": "TIMESTAMP", "vidur": "arrived_at", "native": "arrival_s"}[fmt]
        raise TraceError(f"{path}: row {i + 1}: column {tcol}: arrival earlier than the previous "
                         f"row's (rows must be in time order; set sort: true to sort them)")
    if back.size:
        trace = trace.take(np.argsort(trace.arrival_s, kind="stable"))
    return trace


def write_native(path: str | Path, requests: Iterable[Request]) -> None:
    """Write requests as a native CSV; optional columns appear only when some row sets them."""
    trace = TraceArrays.from_requests(requests)
    data: dict[str, object] = {
        "arrival_s": trace.arrival_s,
        "num_prompt_tokens": trace.num_prompt_tokens,
        "num_output_tokens": trace.num_output_tokens,
    }
    if trace.priority is not None:
        data["priority"] = trace.priority
    if trace.tenant is not None:
        data["tenant"] = trace.tenant
    if trace.prefix_id is not None:
        data["prefix_id"] = trace.prefix_id
    if trace.num_prefix_tokens is not None:
        data["num_prefix_tokens"] = trace.num_prefix_tokens
    # repr-precision floats so a written trace reloads bit-identically.
    pd.DataFrame(data).to_csv(path, index=False, float_format="%.17g", lineterminator="\n")


def _read_header(path: Path) -> str:
    """First line of the file, decoded; empty or undecodable headers are errors."""
    try:
        with open(path, "rb") as fh:
            raw = fh.readline()
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror}") from None
    if not raw.strip():
        raise TraceError(f"{path}: empty file (expected a header line)")
    try:
        text = raw.decode("utf-8-sig").strip()
    except UnicodeDecodeError:
        raise TraceError(f"{path}: header: not valid UTF-8 text (binary file?)") from None
    # A file with bare CR line endings reads as one line: keep its first line only.
    return text.splitlines()[0] if text else text


def _read_frame(path: Path, usecols: list[str], fmt: str) -> pd.DataFrame:
    """Parse the CSV body with pandas' C parser, translating its errors into ``TraceError``."""
    # Strings for the text columns; numbers are left to inference (fast path) and re-checked.
    dtype = {c: str for c in ("TIMESTAMP", "tenant", "prefix_id") if c in usecols}
    try:
        with warnings.catch_warnings():
            # A row with extra fields is only a warning (or silently dropped with usecols).
            warnings.simplefilter("error", pd.errors.ParserWarning)
            # Only empty cells are missing: a tenant called "NA" or "null" stays a name.
            df = pd.read_csv(path, dtype=dtype, encoding="utf-8-sig", index_col=False,
                             skip_blank_lines=False, low_memory=False,
                             keep_default_na=False, na_values=[""])
    except UnicodeDecodeError:
        raise TraceError(f"{path}: row {_bad_utf8_row(path)}: not valid UTF-8 text") from None
    except pd.errors.EmptyDataError:
        raise TraceError(f"{path}: empty file (expected a header line)") from None
    except (pd.errors.ParserError, pd.errors.ParserWarning):
        raise TraceError(f"{path}: {_bad_width_row(path)}") from None
    except (ValueError, OSError) as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TraceError(f"{path}: cannot parse as CSV: {msg}") from None
    df = df.rename(columns=lambda c: c.strip() if isinstance(c, str) else c)[usecols]
    # Blank lines at the very end are harmless; blank lines inside are reported as missing.
    empty = df.isna().all(axis=1).to_numpy()
    keep = len(df)
    while keep and empty[keep - 1]:
        keep -= 1
    if keep == 0:
        raise TraceError(f"{path}: no data rows (header only)")
    return df.iloc[:keep]


def _bad_width_row(path: Path) -> str:
    """Describe the first row whose field count differs from the header's (error path only)."""
    with open(path, newline="", encoding="utf-8-sig") as fh:
        reader = csv.reader(fh)
        width = len(next(reader))
        for i, row in enumerate(reader, start=1):
            if row and len(row) != width:
                return f"row {i}: {len(row)} fields, but the header has {width}"
    return "malformed CSV (unbalanced quotes?)"


def _bad_utf8_row(path: Path) -> int:
    """1-based data row holding the first byte that is not UTF-8 (only on the error path)."""
    raw = path.read_bytes()
    try:
        raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        return raw.count(b"\n", 0, exc.start)  # newlines before it = file line - 1 = data row
    return 0


def _numeric(path: Path, col: pd.Series, name: str) -> np.ndarray:
    """Float64 values of a column; the first non-numeric, missing, NaN or inf cell is an error."""
    values = pd.to_numeric(col, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    bad = ~np.isfinite(values)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raw = col.iloc[i]
        what = ("missing value" if raw is None or (isinstance(raw, float) and np.isnan(raw))
                or str(raw).strip() == "" else f"not a finite number: {str(raw)[:40]!r}")
        raise TraceError(f"{path}: row {i + 1}: column {name}: {what}")
    return values


def _parse_tokens(path: Path, col: pd.Series, name: str) -> np.ndarray:
    """Token counts: integers in ``[1, MAX_TOKENS]``."""
    v = _numeric(path, col, name)
    checks = ((v < 1, "must be >= 1"), (v > MAX_TOKENS, f"out of range (> {MAX_TOKENS})"),
              (v != np.floor(v), "must be a whole number of tokens"))
    for bad, why in checks:
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise TraceError(f"{path}: row {i + 1}: column {name}: {why}, got {v[i]:g}")
    return v.astype(np.int64)


def _parse_arrivals(path: Path, col: pd.Series, name: str) -> np.ndarray:
    """Arrival times in seconds: finite and in ``[0, MAX_ARRIVAL_S]``."""
    v = _numeric(path, col, name)
    bad = (v < 0) | (v > MAX_ARRIVAL_S)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise TraceError(f"{path}: row {i + 1}: column {name}: must be in "
                         f"[0, {MAX_ARRIVAL_S:g}] seconds, got {v[i]:g}")
    return v


def _parse_timestamps(path: Path, col: pd.Series) -> np.ndarray:
    """Azure wall-clock stamps -> seconds since the first row (nanosecond-exact arithmetic)."""
    ts = pd.to_datetime(col, format="ISO8601", errors="coerce")
    bad = ts.isna().to_numpy()
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raw = col.iloc[i]
        what = ("missing value" if not isinstance(raw, str) or not raw.strip()
                else f"not a timestamp like 2023-11-16 18:15:46.6800000: {raw[:40]!r}")
        raise TraceError(f"{path}: row {i + 1}: column TIMESTAMP: {what}")
    ns = ts.to_numpy().astype("datetime64[ns]").astype(np.int64)
    return (ns - ns[0]) / 1e9


def _parse_priority(path: Path, col: pd.Series) -> np.ndarray:
    """Optional native ``priority``: integers (empty cells default to 0)."""
    v = _numeric(path, col.where(col.notna(), 0), "priority")
    bad = (v != np.floor(v)) | (np.abs(v) > 2**31)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise TraceError(f"{path}: row {i + 1}: column priority: must be an integer, got {v[i]:g}")
    return v.astype(np.int64)


def _parse_prefix(path: Path, col: pd.Series) -> np.ndarray:
    """Optional ``num_prefix_tokens``: whole numbers >= 0 (empty cells mean 0)."""
    values = _numeric(path, col.fillna(0), "num_prefix_tokens")
    bad = np.flatnonzero((values < 0) | (values != np.round(values)) | (values > MAX_TOKENS))
    if bad.size:
        raise TraceError(f"{path}: row {bad[0] + 1}: column num_prefix_tokens: must be a whole "
                         f"number in [0, {MAX_TOKENS:,}], got {col.iloc[bad[0]]!r}")
    return values.astype(np.int64)


def _parse_labels(col: pd.Series) -> np.ndarray:
    """Optional native string labels (``tenant``, ``prefix_id``); empty cells become ``None``."""
    text = col.astype(object)
    empty = text.isna() | (text.astype(str).str.strip() == "")
    return text.where(~empty, None).to_numpy(dtype=object)
