"""Request-trace loaders: Azure 2023 CSV, Vidur/Splitwise CSV, batchsim's native CSV and
Mooncake JSONL (``sim.workload.mooncake``, recognised by a first line that is a JSON object).

A trace is read into a columnar ``TraceArrays`` (numpy arrays, vectorised checks) so a
million-row file loads in about a second; ``to_requests()`` turns it into the ``Request`` list
the engine consumes. The format is detected from the header line. The body is parsed
``CHUNK_ROWS`` rows at a time and each chunk is checked and reduced to numpy arrays before the
next is read, so memory holds the final arrays plus one chunk's DataFrame, never the whole
file's. Every problem with a file — wrong columns, bad numbers, unsorted times, undecodable
bytes — is a ``TraceError`` whose one-line message names the file, the 1-based data row
(header = line 1, row 1 = line 2) and the column, so the CLI can print it and exit 2 instead of
leaking a pandas traceback. Row numbers count from the top of the file whichever chunk a row
fell in, and a file with several problems reports the one a whole-file read would.

Numeric cells must be numbers: pandas reads ``true``/``TRUE``/``False`` as booleans (1 and
0), which are refused. Azure stamps with a UTC offset count in UTC; mixing stamps with and
without one is refused at the first row that differs, and stamps more than ``MAX_ARRIVAL_S``
from the first row's are refused (as arrival times of the other formats are).

A gzip-compressed trace (recognised by its magic bytes, whatever its name; ``.csv.gz``) loads
exactly like the CSV it holds, with the same results and messages; a corrupt one is a
``TraceError`` naming the file.
"""
from __future__ import annotations

import csv
import difflib
import gzip
import importlib.resources
import io
import re
import warnings
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import BinaryIO, cast

import numpy as np
import pandas as pd

from sim.core.arrays import TraceArrays
from sim.core.blocks import HASH_BLOCK_TOKENS, MAX_HASH_ID
from sim.core.errors import InputError
from sim.core.paths import checkout_root, is_gzip  # is_gzip: also this module's API
from sim.core.types import Request
from sim.workload.mooncake import is_mooncake, load_mooncake

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
NATIVE_OPTIONAL = ("priority", "tenant", "prefix_id", "num_prefix_tokens", "hash_ids")

#: Data rows parsed at a time: 2^17 rows, about 3.5 MB of native CSV. Per-chunk overhead is
#: lost in the noise at this size, and the parser's working set stays a few tens of MB for any
#: file length (2^18 loaded no faster and peaked 13-55 MB higher on 1M-row traces). A file
#: shorter than this is read in one piece, as it was before chunking.
CHUNK_ROWS = 1 << 17

# What reading a damaged gzip stream raises (BadGzipFile is an OSError: caught before those).
_GZIP_ERRORS = (gzip.BadGzipFile, EOFError, zlib.error)

# Columns read as text, never inferred: a tenant called "1" stays the string "1".
_TEXT_COLUMNS = ("TIMESTAMP", "tenant", "prefix_id", "hash_ids")
# Check stages after the per-column ones, in the order a whole-file read runs them.
_PREFIX_STAGE = 1_000
_ORDER_STAGE = 1_001


class TraceError(InputError):
    """A trace file cannot be used; the message is one line naming file, row and column."""


def resolve_trace(name_or_path: str | Path, base_dir: Path | None = None) -> Path:
    """Path of a built-in trace name (``azure-conv``...) or of a file, relative to ``base_dir``.

    Built-ins are looked up in the source tree first, then in the installed ``sim._traces``
    package, so they resolve from any working directory.
    """
    key = str(name_or_path)
    if key in BUILTIN_TRACES:
        fname = BUILTIN_TRACES[key]
        local = checkout_root() / "traces" / fname
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
    if path.is_dir():
        raise TraceError(f"{path}: a folder, not a trace file (give the CSV or JSONL file in it)")
    if path.exists() and not path.is_file():
        raise TraceError(f"{path}: not a regular file (a FIFO or device); expected a trace file")
    if not path.is_file():
        names = ", ".join(sorted(BUILTIN_TRACES))
        hint = difflib.get_close_matches(key, list(BUILTIN_TRACES), n=1)
        extra = f"; did you mean the built-in {hint[0]!r}?" if hint else ""
        raise TraceError(f"{path}: no such trace file (built-in names: {names}){extra}")
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
    stats), whose arrivals are then all 0: use it only for length distributions. The file is
    parsed ``CHUNK_ROWS`` rows at a time; results and errors are those of a whole-file read.
    """
    path = resolve_trace(name_or_path, base_dir)
    header = _read_header(path)
    if is_mooncake(header):
        return _load_jsonl(path, sort)
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
    fields = _layout(fmt, cols)
    scan = _scan(path, usecols, fields, fmt, sort, CHUNK_ROWS)
    if not scan.typed_alike():
        # pandas types each chunk's columns on their own; where that could differ from typing
        # whole columns (true/false words among numbers, an infinite number or an integer past
        # int64, a text column whose header has spaces so its type was inferred) — rare, and
        # all but the last are broken files — re-read in one piece for the whole-file outcome.
        scan = _scan(path, usecols, fields, fmt, sort, None)
    return scan.finish()


def _load_jsonl(path: Path, sort: bool) -> TraceArrays:
    """A Mooncake JSONL trace (``sim.workload.mooncake``), with this module's bounds and
    decoding errors."""
    try:
        with io.TextIOWrapper(_open_bytes(path), encoding="utf-8-sig", newline=None) as fh:
            return load_mooncake(path, fh, TraceError, MAX_TOKENS, MAX_ARRIVAL_S, sort)
    except UnicodeDecodeError:
        raise TraceError(f"{path}: line {_bad_utf8_row(path) + 1}: not valid UTF-8 "
                         "text") from None
    except _GZIP_ERRORS as exc:
        raise _corrupt_gzip(path, exc) from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror}") from None


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
    if trace.hash_ids is not None:
        data["hash_ids"] = [" ".join(map(str, h)) for h in trace.hash_ids]
    # repr-precision floats so a written trace reloads bit-identically.
    pd.DataFrame(data).to_csv(path, index=False, float_format="%.17g", lineterminator="\n")


def _open_bytes(path: Path) -> BinaryIO:
    """The file's bytes, decompressed when it is gzip-compressed."""
    if is_gzip(path):
        return cast(BinaryIO, gzip.open(path, "rb"))
    return open(path, "rb")


def _corrupt_gzip(path: Path, exc: BaseException) -> TraceError:
    """The one-line error for a gzip file that cannot be decompressed."""
    msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return TraceError(f"{path}: cannot decompress: corrupt or truncated gzip file ({msg})")


def _read_header(path: Path) -> str:
    """First line of the file, decoded; empty or undecodable headers are errors."""
    try:
        with _open_bytes(path) as fh:
            raw = fh.readline()
    except _GZIP_ERRORS as exc:
        raise _corrupt_gzip(path, exc) from None
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


def _read_chunks(path: Path, usecols: list[str], rows: int | None) -> Iterator[pd.DataFrame]:
    """Parse the CSV body ``rows`` rows at a time (``None``: in one piece) with pandas' C parser.

    Its errors become ``TraceError``. A row wider than the header is only a ``ParserWarning``,
    which a whole-file read raises after reading the file through, so a later undecodable byte
    wins over it: after one, keep reading (yielding nothing) and report the width at the end.
    """
    # Strings for the text columns; numbers are left to inference (fast path) and re-checked.
    dtype = {c: str for c in _TEXT_COLUMNS if c in usecols}
    wide = False
    try:
        # Only empty cells are missing: a tenant called "NA" or "null" stays a name.
        with pd.read_csv(path, dtype=dtype, encoding="utf-8-sig", index_col=False,
                         compression="gzip" if is_gzip(path) else None,
                         skip_blank_lines=False, low_memory=False, keep_default_na=False,
                         na_values=[""], iterator=True) as reader:
            while (got := _next_chunk(reader, rows)) is not None:
                chunk, warned = got
                wide = wide or warned
                if not wide:
                    yield chunk
                if rows is None:
                    break
    except UnicodeDecodeError:
        raise TraceError(f"{path}: row {_bad_utf8_row(path)}: not valid UTF-8 text") from None
    except pd.errors.EmptyDataError:
        raise TraceError(f"{path}: empty file (expected a header line)") from None
    except _GZIP_ERRORS as exc:
        raise _corrupt_gzip(path, exc) from None
    except pd.errors.ParserError:
        raise TraceError(f"{path}: {_bad_width_row(path)}") from None
    except (ValueError, OSError) as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TraceError(f"{path}: cannot parse as CSV: {msg}") from None
    if wide:
        raise TraceError(f"{path}: {_bad_width_row(path)}")


def _next_chunk(reader: pd.io.parsers.TextFileReader,
                rows: int | None) -> tuple[pd.DataFrame, bool] | None:
    """The next chunk and whether parsing it warned of a too-wide row; ``None`` at the end."""
    with warnings.catch_warnings(record=True) as caught:
        # With index_col=False a row with extra fields is only a warning: record it.
        warnings.simplefilter("always", pd.errors.ParserWarning)
        try:
            chunk = reader.read(rows)
        except StopIteration:
            return None
    wide = False
    for w in caught:
        if issubclass(w.category, pd.errors.ParserWarning):
            wide = True
        else:  # recording swallowed it: pass any other warning on as pandas issued it
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return chunk, wide


def _bad_width_row(path: Path) -> str:
    """Describe the first row whose field count differs from the header's (error path only)."""
    with io.TextIOWrapper(_open_bytes(path), newline="", encoding="utf-8-sig") as fh:
        reader = csv.reader(fh)
        width = len(next(reader))
        for i, row in enumerate(reader, start=1):
            if row and len(row) != width:
                return f"row {i}: {len(row)} fields, but the header has {width}"
    return "malformed CSV (unbalanced quotes?)"


def _bad_utf8_row(path: Path) -> int:
    """1-based data row holding the first byte that is not UTF-8 (only on the error path)."""
    with _open_bytes(path) as fh:
        raw = fh.read()
    try:
        raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        return raw.count(b"\n", 0, exc.start)  # newlines before it = file line - 1 = data row
    return 0


_NO_RAW = object()  # marks a _CheckFailed whose message is complete as it stands


class _CheckFailed(Exception):
    """One failed check in one chunk, ranked in the order a whole-file read runs its checks.

    ``rank`` is (stage, check): the stage is the column's place in the check order (or one of
    the cross-column stages), the check its place among that column's checks. Over the whole
    file the lowest rank wins, then the earliest row: what checking column by column finds.
    """

    def __init__(self, message: str, check: int = 0, stage: int = 0, column: str = "",
                 raw: object = _NO_RAW) -> None:
        super().__init__(message)
        self.rank = (stage, check)
        self.column = column
        self.raw = raw

    def message(self, kinds: dict[str, set[str]]) -> str:
        """The final message; a cell quoted with ``repr`` is shown as the whole column types it."""
        if self.raw is _NO_RAW:
            return str(self)
        raw = self.raw
        seen = kinds.get(self.column, set())
        # A whole-file read types the column float64 if any chunk was (a blank or fractional
        # cell), so an int64 cell of an all-integer chunk reads as float64 there.
        if isinstance(raw, np.integer) and seen <= {"int", "float", "blank"} and seen - {"int"}:
            raw = np.float64(raw)
        return f"{self}{raw!r}"


@dataclass(frozen=True)
class _Rows:
    """Where a chunk sits: its file and how many data rows come before it."""

    path: Path
    offset: int

    def fail(self, i: int, name: str, text: str, check: int = 0, stage: int = 0,
             raw: object = _NO_RAW) -> _CheckFailed:
        """The failure of the chunk's 0-based row ``i``, numbered as the file's 1-based row."""
        return _CheckFailed(f"{self.path}: row {self.offset + i + 1}: column {name}: {text}",
                            check, stage, name, raw)


#: A column parser: the chunk's place, the column, its name -> the validated values.
_Parser = Callable[[_Rows, pd.Series, str], np.ndarray]


@dataclass(frozen=True)
class _Field:
    """One checked file column: which ``TraceArrays`` field it fills and how it is parsed."""

    column: str
    target: str
    parse: _Parser


def _layout(fmt: str, cols: list[str]) -> tuple[_Field, ...]:
    """The checked columns of a format, in the order a whole-file read checks them."""
    if fmt == "azure":
        return (_Field("TIMESTAMP", "arrival_s", _parse_timestamps),
                _Field("ContextTokens", "num_prompt_tokens", _parse_tokens),
                _Field("GeneratedTokens", "num_output_tokens", _parse_tokens))
    lengths = (_Field("num_prefill_tokens", "num_prompt_tokens", _parse_tokens),
               _Field("num_decode_tokens", "num_output_tokens", _parse_tokens))
    if fmt == "lengths":
        return lengths
    if fmt == "vidur":
        return (_Field("arrived_at", "arrival_s", _parse_arrivals), *lengths)
    optional = (_Field("priority", "priority", _parse_priority),
                _Field("tenant", "tenant", _parse_labels),
                _Field("prefix_id", "prefix_id", _parse_labels),
                _Field("num_prefix_tokens", "num_prefix_tokens", _parse_prefix),
                _Field("hash_ids", "hash_ids", _parse_hash_ids))
    return (_Field("arrival_s", "arrival_s", _parse_arrivals),
            _Field("num_prompt_tokens", "num_prompt_tokens", _parse_tokens),
            _Field("num_output_tokens", "num_output_tokens", _parse_tokens),
            *(f for f in optional if f.column in cols))


def _scan(path: Path, usecols: list[str], fields: tuple[_Field, ...], fmt: str, sort: bool,
          rows: int | None) -> _Scan:
    """Read and check the whole body, ``rows`` rows at a time (``None``: in one piece)."""
    scan = _Scan(path, usecols, fields, fmt, sort, rows)
    for chunk in _read_chunks(path, usecols, rows):
        scan.add(chunk)
    return scan


class _Scan:
    """Checks chunks in file order and keeps their arrays, carrying what spans chunks.

    Carried across chunks: the row offset, the first Azure timestamp (times count from it),
    the last arrival (for the time-order check), a trailing run of blank rows (harmless at
    the end of the file, missing values if data follows), the best-ranked problem so far and
    how pandas typed each chunk's columns.
    """

    def __init__(self, path: Path, usecols: list[str], fields: tuple[_Field, ...], fmt: str,
                 sort: bool, chunk_rows: int | None) -> None:
        self.path, self.usecols, self.fields, self.fmt, self.sort = path, usecols, fields, fmt, sort
        self.chunk_rows = chunk_rows
        self.columns = {f.target: _Column() for f in fields}
        self.rows = 0                    # data rows (blank ones included) read so far
        self.has_data = False            # a non-blank row has been seen
        self.held: tuple[pd.DataFrame, int] | None = None  # first row of a trailing blank run
        self.problem: _CheckFailed | None = None
        self.first_ns: np.int64 | None = None
        self.first_aware = False         # the first Azure stamp has a UTC offset
        self.last_arrival = -np.inf
        self.unsorted = False
        self.chunks = 0
        self.kinds: dict[str, set[str]] = {c: set() for c in usecols}
        self.huge = False                # a number cell was infinite or past int64

    def add(self, chunk: pd.DataFrame) -> None:
        """Check one chunk (the next rows of the file) and keep its arrays."""
        if chunk.empty:
            return  # a header-only file, or the end just after a full chunk
        frame = chunk.rename(columns=lambda c: c.strip() if isinstance(c, str) else c)
        frame = frame[self.usecols]
        self.chunks += 1
        missing = frame.isna()
        # A first chunk shorter than asked for is the whole file: no typing to compare.
        alone = self.chunk_rows is None or (self.chunks == 1 and len(frame) < self.chunk_rows)
        if not alone:
            self._note_kinds(frame, missing.all(axis=0))
        blank = missing.all(axis=1).to_numpy()
        end = len(blank)
        while end and blank[end - 1]:
            end -= 1
        if end:
            # Blank rows held back from earlier chunks turn out to be inside the file.
            if self.held is not None:
                self._check(*self.held)
                self.held = None
            self._check(frame.iloc[:end], self.rows)
            self.has_data = True
        if end < len(frame) and self.held is None:
            # One row is enough: any blank row fails the first column's check the same way.
            self.held = (frame.iloc[end:end + 1].copy(), self.rows + end)
        self.rows += len(frame)
        if self.problem is not None and not self.huge:
            # Only a broken file can hold such a number (every numeric column rejects it, so
            # its chunk has a problem): valid files skip the look.
            self.huge = _has_huge_number(frame, missing.all(axis=0))

    def typed_alike(self) -> bool:
        """Whether typing chunk by chunk gave what typing whole columns would have.

        Numeric columns may mix int64, float64 and blank chunks (same values; see
        ``_CheckFailed.message``) and str chunks (a text cell makes the whole column text, but
        its bad cells fail first either way). Not alike: any other mix, a text column that was
        not read as text, or a number that is infinite or past int64 — in a text column it
        would keep its spelling ("1e999", not inf), and such an integer makes pandas type the
        column as text with its blank cells as "" instead of missing. Files where this matters
        are broken: every numeric column rejects such values.
        """
        if self.chunks <= 1:
            return True
        if self.huge:
            return False
        for column, kinds in self.kinds.items():
            typed = kinds - {"blank"}
            if column in _TEXT_COLUMNS:
                if not (typed <= {"str"} or len(kinds) == 1):
                    return False
            elif not (len(kinds) == 1 or typed <= {"int", "float", "str"}):
                return False
        return True

    def finish(self) -> TraceArrays:
        """The trace, or the ``TraceError`` a whole-file read would have raised."""
        if self.problem is not None:
            raise TraceError(self.problem.message(self.kinds))
        if not self.has_data:
            raise TraceError(f"{self.path}: no data rows (header only)")
        arrays = {target: column.values() for target, column in self.columns.items()}
        if self.fmt == "lengths":
            arrays["arrival_s"] = np.zeros(len(arrays["num_prompt_tokens"]))
        trace = TraceArrays(**arrays, source=str(self.path))
        if self.unsorted:
            trace = trace.take(np.argsort(trace.arrival_s, kind="stable"))
        return trace

    @cached_property
    def expected_rows(self) -> int:
        """About how many rows the file holds, from the line length of its first MiB."""
        with _open_bytes(self.path) as fh:
            sample = fh.read(1 << 20)
        lines = max(sample.count(b"\n"), sample.count(b"\r"), 1)
        size = self.path.stat().st_size
        if is_gzip(self.path):  # the trailer holds the uncompressed size (modulo 2^32)
            with open(self.path, "rb") as fh:
                fh.seek(-4, io.SEEK_END)
                size = max(int.from_bytes(fh.read(4), "little"), len(sample))
        # A tenth spare: a buffer's untouched tail costs address space, not memory.
        return int(size / (len(sample) / lines) * 1.1) + 1

    def _note_kinds(self, frame: pd.DataFrame, blank: pd.Series) -> None:
        """Record how pandas typed each column of this chunk (see ``typed_alike``)."""
        for column in self.usecols:
            self.kinds[column].add(_kind(frame[column], bool(blank[column])))

    def _check(self, frame: pd.DataFrame, offset: int) -> None:
        """Check rows ``offset...`` of the file, keeping their arrays or the problem found."""
        at = _Rows(self.path, offset)
        try:
            values = self._parse(at, frame)
        except _CheckFailed as failed:
            # Keep reading after a problem: a later chunk may hold one a whole-file read meets
            # first (an earlier column, or an earlier check of the same column).
            if self.problem is None or failed.rank < self.problem.rank:
                self.problem = failed
                self.columns = {target: _Column() for target in self.columns}
            return
        if self.problem is None:
            for target, array in values.items():
                self.columns[target].add(array, lambda: self.expected_rows)

    def _parse(self, at: _Rows, frame: pd.DataFrame) -> dict[str, np.ndarray]:
        """The chunk's arrays, all checks applied in whole-file order."""
        values: dict[str, np.ndarray] = {}
        for stage, field in enumerate(self.fields):
            try:
                values[field.target] = field.parse(at, frame[field.column], field.column)
            except _CheckFailed as failed:
                failed.rank = (stage, failed.rank[1])
                raise
        if "num_prefix_tokens" in values:
            over = np.flatnonzero(values["num_prefix_tokens"] > values["num_prompt_tokens"])
            if over.size:
                raise at.fail(int(over[0]), "num_prefix_tokens", "longer than the row's prompt",
                              stage=_PREFIX_STAGE)
        if "hash_ids" in values:
            self._check_hash_ids(at, values)
        if self.fmt == "azure":
            stamps = values["arrival_s"]
            aware = has_utc_offset(frame["TIMESTAMP"].iloc[0])
            if self.first_ns is None:
                self.first_ns, self.first_aware = stamps[0], aware
            elif aware != self.first_aware:  # this chunk's form against the file's first row
                raise at.fail(0, "TIMESTAMP", _mixed_zones(frame["TIMESTAMP"].iloc[0], aware, 1),
                              stage=0, check=2)
            # More than MAX_ARRIVAL_S from the first row is refused (as in the other formats),
            # which also keeps the int64 nanosecond difference below from overflowing.
            span = int(MAX_ARRIVAL_S * 1e9)
            lo = max(int(self.first_ns) - span, -2**63)
            hi = min(int(self.first_ns) + span, 2**63 - 1)
            far = np.flatnonzero((stamps < lo) | (stamps > hi))
            if far.size:
                raise at.fail(int(far[0]), "TIMESTAMP", f"more than {MAX_ARRIVAL_S:g} s from the "
                              "first row's time", stage=0, check=2)
            # Seconds since the file's first row, in exact integer nanoseconds until the end.
            values["arrival_s"] = (stamps - self.first_ns) / 1e9
        if "arrival_s" in values:
            self._check_order(at, values["arrival_s"])
        return values

    @staticmethod
    def _check_hash_ids(at: _Rows, values: dict[str, np.ndarray]) -> None:
        """At most one id per started 512 prompt tokens, and not with a prefix shorthand."""
        prompt = values["num_prompt_tokens"]
        count = np.fromiter(map(len, values["hash_ids"]), np.int64, len(prompt))
        over = np.flatnonzero(count > -(-prompt // HASH_BLOCK_TOKENS))
        if over.size:
            i = int(over[0])
            raise at.fail(i, "hash_ids", f"{count[i]} ids for a {prompt[i]}-token prompt: at "
                          f"most one per {HASH_BLOCK_TOKENS} tokens", stage=_PREFIX_STAGE)
        prefix = values.get("num_prefix_tokens")
        if prefix is not None:
            both = np.flatnonzero((count > 0) & (prefix > 0))
            if both.size:
                raise at.fail(int(both[0]), "hash_ids", "a row names its prefix by hash_ids "
                              "or by num_prefix_tokens, not both", stage=_PREFIX_STAGE)

    def _check_order(self, at: _Rows, arrival: np.ndarray) -> None:
        """Arrivals must not go back in time, across chunk boundaries too."""
        if self.problem is not None:
            return  # any problem already met ranks before a time-order one
        if arrival[0] < self.last_arrival:  # back in time across the chunk boundary
            back = 0
        else:
            later = np.flatnonzero(arrival[1:] < arrival[:-1])
            back = int(later[0]) + 1 if later.size else -1
        self.last_arrival = arrival[-1]
        if back >= 0:
            self.unsorted = True
            if not self.sort:
                tcol = {"azure": "TIMESTAMP", "vidur": "arrived_at", "native": "arrival_s"}
                raise at.fail(back, tcol[self.fmt],
                              "arrival earlier than the previous row's (rows must be in time "
                              "order; set sort: true to sort them)", stage=_ORDER_STAGE)


class _Column:
    """One output array, filled chunk by chunk without keeping the chunks' arrays around.

    A single chunk's array is used as it is (small files copy nothing). From the second chunk
    on, arrays are copied into one buffer sized for the whole file, grown by half when the
    estimate falls short: joining a list of chunk arrays at the end would hold the data twice,
    and the freed chunk arrays are too scattered for the allocator to hand back.
    """

    def __init__(self) -> None:
        self.buf: np.ndarray | None = None
        self.n = 0
        self.sized = False  # buf is a buffer of ours, not the first chunk's array

    def add(self, values: np.ndarray, expected_rows: Callable[[], int]) -> None:
        """Append one chunk's array; ``expected_rows`` sizes the buffer when one is needed."""
        if self.buf is None:
            self.buf, self.n = values, len(values)
            return
        need = self.n + len(values)
        if need > len(self.buf):
            size = max(need, len(self.buf) * 3 // 2 if self.sized else expected_rows())
            grown = np.empty(size, dtype=self.buf.dtype)
            grown[:self.n] = self.buf[:self.n]
            self.buf, self.sized = grown, True
        self.buf[self.n:need] = values
        self.n = need

    def values(self) -> np.ndarray:
        """The array of every row added (a view when the buffer has room to spare)."""
        assert self.buf is not None
        return self.buf if self.n == len(self.buf) else self.buf[:self.n]


def _has_huge_number(frame: pd.DataFrame, blank: pd.Series) -> bool:
    """Whether a numeric column of the chunk holds an infinite number or one past int64."""
    for column in frame.columns:
        col = frame[column]
        if column in _TEXT_COLUMNS or blank[column] or col.dtype.kind == "i":
            continue
        values = (col.to_numpy() if col.dtype.kind == "f"
                  else pd.to_numeric(col, errors="coerce").to_numpy(np.float64, na_value=0))
        if (np.abs(values) >= 2.0**63).any():
            return True
    return False


def _kind(col: pd.Series, blank: bool) -> str:
    """How pandas typed one chunk of a column: blank, int, float, str or another dtype."""
    if blank:
        return "blank"
    kind = {"i": "int", "f": "float"}.get(col.dtype.kind)
    if kind is not None:
        return kind
    if pd.api.types.infer_dtype(col, skipna=True) == "string":
        return "str"
    return f"other {col.dtype}"


def _numeric(at: _Rows, col: pd.Series, name: str) -> np.ndarray:
    """Float64 values of a column; the first non-numeric, missing, NaN or inf cell is an error."""
    values = pd.to_numeric(col, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    bad = ~np.isfinite(values)
    if col.dtype.kind in "bO":  # pandas reads true/TRUE/False as booleans, which are 1 and 0
        bad |= col.map(_is_bool).to_numpy(dtype=bool)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raw = col.iloc[i]
        what = ("missing value" if raw is None or (isinstance(raw, float) and np.isnan(raw))
                or str(raw).strip() == "" else
                f"not a number: {str(raw)!r} (a true/false word)" if _is_bool(raw)
                else f"not a finite number: {str(raw)[:40]!r}")
        raise at.fail(i, name, what)
    return values


def _is_bool(value: object) -> bool:
    """A cell pandas read as a boolean (``true``, ``TRUE``, ``False``...)."""
    return isinstance(value, bool | np.bool_)


def _parse_tokens(at: _Rows, col: pd.Series, name: str) -> np.ndarray:
    """Token counts: integers in ``[1, MAX_TOKENS]``."""
    v = _numeric(at, col, name)
    checks = ((v < 1, "must be >= 1"), (v > MAX_TOKENS, f"out of range (> {MAX_TOKENS})"),
              (v != np.floor(v), "must be a whole number of tokens"))
    for check, (bad, why) in enumerate(checks, start=1):
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise at.fail(i, name, f"{why}, got {v[i]:g}", check)
    return v.astype(np.int64)


def _parse_arrivals(at: _Rows, col: pd.Series, name: str) -> np.ndarray:
    """Arrival times in seconds: finite and in ``[0, MAX_ARRIVAL_S]``."""
    v = _numeric(at, col, name)
    bad = (v < 0) | (v > MAX_ARRIVAL_S)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise at.fail(i, name, f"must be in [0, {MAX_ARRIVAL_S:g}] seconds, got {v[i]:g}", 1)
    return v


def _parse_timestamps(at: _Rows, col: pd.Series, name: str) -> np.ndarray:
    """Azure wall-clock stamps as int64 nanoseconds (the caller counts from the first row).

    Stamps with a UTC offset count in UTC. Mixing stamps with and without an offset has no
    meaning (a naive time is in no zone): the first row whose form differs from the chunk's
    first row is an error (``_Scan`` compares chunks with each other the same way).
    """
    try:
        ts = pd.to_datetime(col, format="ISO8601", errors="coerce")
    except ValueError:  # "Mixed timezones detected": offsets mixed with naive times, or
        aware = col.astype(str).str.contains(_OFFSET, regex=True).to_numpy()  # two offsets
        if not aware.all():
            i = int(np.flatnonzero(aware != aware[0])[0])
            raise at.fail(i, name, _mixed_zones(col.iloc[i], bool(aware[i]),
                                                at.offset + 1)) from None
        ts = pd.to_datetime(col, format="ISO8601", errors="coerce", utc=True)
    # pandas parses some non-stamps as dates ("-1" alone is the year -1) and which ones
    # depends on the rest of the chunk, so the form is checked row by row first: a chunked
    # read then refuses exactly the rows a whole-file read refuses.
    text = col.astype("string")
    missing = (text.isna() | (text.str.strip() == "")).to_numpy(dtype=bool)
    stamp_like = text.str.fullmatch(_STAMP).fillna(False).to_numpy(dtype=bool)
    bad = missing | ~stamp_like | ts.isna().to_numpy()
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raw = str(text.iloc[i])[:40]
        what = ("missing value" if missing[i]
                else f"not a timestamp like 2023-11-16 18:15:46.6800000: {raw!r}")
        raise at.fail(i, name, what)
    if ts.dt.tz is not None:
        ts = ts.dt.tz_convert(None)  # UTC wall-clock
    return ts.to_numpy().astype("datetime64[ns]").astype(np.int64)


#: An ISO 8601 date and time as the Azure traces write them (date, optional time with
#: optional fraction, optional UTC offset), surrounding blanks allowed.
_STAMP = (r"\s*\d{4}-\d{2}-\d{2}(?:[ T]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?)?"
          r"\s*(?:Z|[+-]\d{2}(?::?\d{2})?)?\s*")
#: The end of an ISO 8601 time with a UTC offset (``Z``, ``+05:00``, ``-0800``).
_OFFSET = r"\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?\s*(?:Z|[+-]\d{2}(?::?\d{2})?)\s*$"


def has_utc_offset(stamp: object) -> bool:
    """Whether an Azure ``TIMESTAMP`` cell ends in a UTC offset."""
    return bool(re.search(_OFFSET, str(stamp)))


def _mixed_zones(raw: object, aware: bool, first_row: int) -> str:
    """The message for a stamp whose offset form differs from row ``first_row``'s."""
    has = "has a UTC offset" if aware else "has no UTC offset"
    other = "has none" if aware else "has one"
    return (f"{str(raw)[:40]!r} {has} but row {first_row} {other}; give every time an "
            "offset or none")


def _parse_priority(at: _Rows, col: pd.Series, name: str) -> np.ndarray:
    """Optional native ``priority``: integers (empty cells default to 0)."""
    v = _numeric(at, col.where(col.notna(), 0), name)
    bad = (v != np.floor(v)) | (np.abs(v) > 2**31)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise at.fail(i, name, f"must be an integer, got {v[i]:g}", 1)
    return v.astype(np.int64)


def _parse_prefix(at: _Rows, col: pd.Series, name: str) -> np.ndarray:
    """Optional ``num_prefix_tokens``: whole numbers >= 0 (empty cells mean 0)."""
    values = _numeric(at, col.fillna(0), name)
    bad = np.flatnonzero((values < 0) | (values != np.round(values)) | (values > MAX_TOKENS))
    if bad.size:
        # The offending cell is quoted as pandas typed it (rendered by _CheckFailed.message).
        raise at.fail(int(bad[0]), name, f"must be a whole number in [0, {MAX_TOKENS:,}], got ",
                      1, raw=col.iloc[bad[0]])
    return values.astype(np.int64)


def _parse_labels(at: _Rows, col: pd.Series, name: str) -> np.ndarray:
    """Optional native string labels (``tenant``, ``prefix_id``); empty cells become ``None``."""
    text = col.astype(object)
    empty = text.isna() | (text.astype(str).str.strip() == "")
    return text.where(~empty, None).to_numpy(dtype=object)


def _parse_hash_ids(at: _Rows, col: pd.Series, name: str) -> np.ndarray:
    """Optional native ``hash_ids``: whole numbers in ``[0, 2**63 - 1]`` separated by spaces,
    one per 512 prompt tokens (``sim.core.blocks``); an empty cell means none."""
    out = np.empty(len(col), dtype=object)
    for i, cell in enumerate(col.tolist()):
        words = str(cell).split() if cell is not None and cell == cell else []
        bad = next((w for w in words if not (w.isascii() and w.isdigit())), None)
        if bad is not None:
            raise at.fail(i, name, f"not a whole number: {bad[:40]!r} (ids are whole numbers "
                          "separated by spaces)")
        ids = tuple(map(int, words))
        if any(v > MAX_HASH_ID for v in ids):
            raise at.fail(i, name, f"ids must be at most 2**63 - 1, got "
                          f"{next(v for v in ids if v > MAX_HASH_ID)}", 1)
        out[i] = ids
    return out

