"""The step log: per-iteration records appended in the engine's hot loop.

The log writes plain Python numbers (a step) or numpy slices (a skipped stretch) into numpy
column buffers inside the loop (no DataFrame work on the hot path); the table is built once at
the end. Inter-token latencies are kept exactly
without per-token objects: a token produced one step after its predecessor has an ITL equal to
that step's duration, so each step stores a count of such tokens, and only the irregular gaps
(after a stall or a preemption) are stored individually.

With a ``StepStream`` attached (``step_table="buckets"``, or ``"auto"`` past
``AUTO_MAX_STEPS``) the rows are handed to it every ``FOLD_ROWS`` steps and the buffers written
again from the top, so memory stays flat however long the run (see ``sim.metrics.stream``).
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from sim.metrics.stream import AUTO_MAX_STEPS, FOLD_ROWS, StepStream, bucket_width

STEP_COLUMNS = ("replica", "start_s", "duration_s", "num_seqs", "num_prefill_tokens",
                "num_decode_tokens", "num_padding_tokens", "num_padding_rows", "num_waiting",
                "kv_used_blocks", "flops", "bytes", "bound", "num_regular_itl",
                "kv_live_tokens", "kv_cached_blocks", "num_recomputed_tokens", "swap_s",
                "swapped_bytes")

#: Step columns stored as C doubles; every other column but ``bound`` is a C int64.
FLOAT_COLUMNS = frozenset({"start_s", "duration_s", "flops", "bytes", "swap_s", "swapped_bytes"})


#: A count of ``extend``: one value for every step, or one per step (an array, or a list).
PerStep = int | np.ndarray | list[int]

#: The numeric step columns (``bound`` is a list of names).
NUMERIC_COLUMNS = tuple(c for c in STEP_COLUMNS if c != "bound")
#: Rows a log's column buffers hold at first; they double whenever full.
FIRST_ROWS = 1024


def _new_columns() -> dict[str, Any]:
    return {"bound": []}


def _put(col: np.ndarray, n: int, values: Any, k: int) -> None:
    """Write ``k`` values (a scalar repeated, an array of at least ``k``, or a list of exactly
    ``k`` Python numbers: a short skipped stretch's) into a column buffer from row ``n``."""
    col[n:n + k] = values[:k] if type(values) is np.ndarray else values


def _numpy(a: array) -> np.ndarray:
    """A typed column as numpy: a view of its buffer (an empty array when it has none)."""
    dtype = np.float64 if a.typecode == "d" else np.int64
    return np.frombuffer(a, dtype=dtype) if a else np.empty(0, dtype=dtype)


@dataclass
class StepLog:
    """Typed column arrays of per-step records plus the irregular inter-token gaps.

    Numeric columns are numpy buffers with room to grow (8 bytes a value, not a boxed Python
    number: a 5M-step run stays well under a gigabyte), written in place: a skipped stretch's
    steps are 18 slice writes, not one append a value. ``table()`` views them without copying.
    A folding log hands its rows over as views and then writes the same buffers again (the
    stream keeps none of them: ``tests/test_stream_fold.py``): memory already paged in, instead
    of fresh pages faulted in value by value each chunk.
    Irregular gaps are run-length encoded: consecutive tokens with the same gap at the same
    time (every running decode after one prefill step, say) share one ``(at, gap, count)`` entry.
    """

    #: ``bound`` (a list, one name a step, whose length is the log's) and the numeric column
    #: buffers, each ``capacity`` rows long; the rows held are the first ``len(self)``.
    cols: dict[str, Any] = field(default_factory=_new_columns)
    capacity: int = 0
    #: Columns that are 0 in every row and so never appended to (a fast path's padding and
    #: swap columns): ``table()`` makes them with ``np.zeros``, whose pages stay unallocated.
    zero_columns: frozenset[str] = frozenset()
    #: The replica of every step, when the log holds one replica's steps only (as zero_columns)
    replica: int = 0
    #: Columns stored row-interleaved instead (one ``extend`` of a tuple per step instead of
    #: one ``append`` per column: a fast path's hot loop); ``table()`` views them strided.
    packed_int_columns: tuple[str, ...] = ()
    packed_float_columns: tuple[str, ...] = ()
    #: The packed rows: ``array``s a run appends to, or numpy rows a compiled run hands over.
    packed_ints: array | np.ndarray = field(default_factory=lambda: array("q"))
    packed_floats: array | np.ndarray = field(default_factory=lambda: array("d"))
    irregular_itl: array = field(default_factory=lambda: array("d"))
    irregular_itl_at: array = field(default_factory=lambda: array("d"))
    irregular_itl_count: array = field(default_factory=lambda: array("q"))
    irregular_itl_replica: array = field(default_factory=lambda: array("q"))
    #: Folds the rows every ``fold_at`` steps when set (a bucketed step table); with
    #: ``always_fold`` False (``step_table="auto"``) only once ``fold_at`` is first reached.
    stream: StepStream | None = None
    fold_at: int = 0
    always_fold: bool = False

    def add_irregular_itl(self, at_s: float, gap_s: float, count: int = 1,
                          replica: int = 0) -> None:
        """Record ``count`` tokens of ``replica`` whose gap to their predecessor is not one
        step's duration."""
        at, gaps, reps = self.irregular_itl_at, self.irregular_itl, self.irregular_itl_replica
        if at and at[-1] == at_s and gaps[-1] == gap_s and reps[-1] == replica:
            self.irregular_itl_count[-1] += count
        else:
            at.append(at_s)
            gaps.append(gap_s)
            self.irregular_itl_count.append(count)
            reps.append(replica)

    def irregular_runs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(gaps, token times, counts, replicas)`` of the irregular gaps, as numpy."""
        return (_numpy(self.irregular_itl), _numpy(self.irregular_itl_at),
                _numpy(self.irregular_itl_count), _numpy(self.irregular_itl_replica))

    def record(self, replica: int, start: float, duration: float, num_seqs: int,
               num_prefill: int, num_decode: int, num_padding: int, num_padding_rows: int,
               num_waiting: int, kv_used: int, step: Any, regular_itl: int, *,
               kv_live_tokens: int = 0, kv_cached_blocks: int = 0,
               num_recomputed_tokens: int = 0, swap_s: float = 0.0,
               swapped_bytes: float = 0.0) -> None:
        """Append one step (the keyword columns are the KV cache's, see ``sim.metrics.kv``)."""
        c = self.cols
        bound = c["bound"]
        n = len(bound)
        if n == self.capacity:
            self._reserve(1)
        c["kv_live_tokens"][n] = kv_live_tokens
        c["kv_cached_blocks"][n] = kv_cached_blocks
        c["num_recomputed_tokens"][n] = num_recomputed_tokens
        c["swap_s"][n] = swap_s
        c["swapped_bytes"][n] = swapped_bytes
        c["replica"][n] = replica
        c["start_s"][n] = start
        c["duration_s"][n] = duration
        c["num_seqs"][n] = num_seqs
        c["num_prefill_tokens"][n] = num_prefill
        c["num_decode_tokens"][n] = num_decode
        c["num_padding_tokens"][n] = num_padding
        c["num_padding_rows"][n] = num_padding_rows
        c["num_waiting"][n] = num_waiting
        c["kv_used_blocks"][n] = kv_used
        c["flops"][n] = step.flops
        c["bytes"][n] = step.bytes
        c["num_regular_itl"][n] = regular_itl
        bound.append(step.bound)  # last: ``len`` counts complete rows (``latest``)
        if self.fold_at and n >= self.fold_at - 1:
            self.fold()

    def extend(self, replica: int, starts: np.ndarray | list[float],
               durations: np.ndarray | list[float], num_seqs: PerStep,
               num_decode: PerStep, num_padding: PerStep, num_padding_rows: PerStep,
               num_waiting: PerStep, kv_used: np.ndarray | list[int], series: Any,
               regular_itl: PerStep, *, kv_live_tokens: np.ndarray | list[int] | None = None,
               kv_cached_blocks: PerStep | None = None) -> None:
        """Append ``len(starts)`` skipped decode steps in one go (no recompute, no swaps); each
        count is one value for every step or an array of one per step (or a list of one per
        step: a short stretch's). Column by column, without a loop over (name, value) pairs:
        a short stretch of a few steps is logged thousands of times a run."""
        c, k = self.cols, len(starts)
        bound = c["bound"]
        n = len(bound)
        if n + k > self.capacity:
            self._reserve(k)
        put = _put
        put(c["kv_live_tokens"], n, 0 if kv_live_tokens is None else kv_live_tokens, k)
        put(c["kv_cached_blocks"], n, 0 if kv_cached_blocks is None else kv_cached_blocks, k)
        end = n + k
        c["num_recomputed_tokens"][n:end] = 0
        c["swap_s"][n:end] = 0.0
        c["swapped_bytes"][n:end] = 0.0
        c["replica"][n:end] = replica
        put(c["start_s"], n, starts, k)
        put(c["duration_s"], n, durations, k)
        put(c["num_seqs"], n, num_seqs, k)
        c["num_prefill_tokens"][n:end] = 0
        put(c["num_decode_tokens"], n, num_decode, k)
        put(c["num_padding_tokens"], n, num_padding, k)
        put(c["num_padding_rows"], n, num_padding_rows, k)
        put(c["num_waiting"], n, num_waiting, k)
        put(c["kv_used_blocks"], n, kv_used, k)
        put(c["flops"], n, series.flops, k)
        put(c["bytes"], n, series.bytes, k)
        put(c["num_regular_itl"], n, regular_itl, k)
        bound.extend(series.bound[:k])
        if self.fold_at and end >= self.fold_at:
            self.fold()

    def _reserve(self, k: int) -> None:
        """Room for ``k`` more rows: every column buffer replaced by one twice as long (at
        least ``FIRST_ROWS``), the rows held copied over. A large buffer's pages are mapped
        as they are first written (``np.empty``), so its unused room is address space."""
        n = len(self.cols["bound"])
        capacity = max(FIRST_ROWS, n + k, 2 * self.capacity)
        if self.fold_at and capacity > 4 * (FOLD_ROWS + FIRST_ROWS):
            # a log this long folds at ``fold_at`` (``"auto"``'s first fold): room for that
            # at once, instead of doubling (and copying) its way there
            capacity = max(capacity, self.fold_at + FIRST_ROWS)
        for name in NUMERIC_COLUMNS:
            new = np.empty(capacity, dtype=np.float64 if name in FLOAT_COLUMNS else np.int64)
            if n:
                new[:n] = self.cols[name][:n]
            self.cols[name] = new
        self.capacity = capacity

    def __len__(self) -> int:
        return len(self.cols["bound"])

    def latest(self, names: tuple[str, ...] = ("start_s", "duration_s", "num_waiting",
                                                "num_seqs")) -> tuple[float, ...] | None:
        """The last step's values of ``names`` (``None`` before the first step), whatever the
        layout. Safe to call from another thread while a run appends (a progress display
        reads it): it only reads the last complete row."""
        n = len(self)
        if not n:
            return None
        out = []
        for name in names:
            for packed_names, packed in ((self.packed_int_columns, self.packed_ints),
                                         (self.packed_float_columns, self.packed_floats)):
                if name in packed_names:
                    width = len(packed_names)
                    rows = len(packed) // width  # complete rows only
                    out.append(float(packed[(rows - 1) * width + packed_names.index(name)])
                               if rows else 0.0)
                    break
            else:
                col = self.cols.get(name)
                out.append(float(col[n - 1]) if col is not None and len(col) >= n and
                           name not in self.zero_columns else 0.0)
        return tuple(out)

    def fold(self) -> None:
        """Hand the rows gathered so far to ``stream`` and start afresh."""
        assert self.stream is not None
        if len(self):
            data = self._arrays()
            del data["bound"]
            self.stream.fold(data)
            del data
        # The buffers are written again from row 0: the stream kept no view of them. A log
        # that folds first at ``AUTO_MAX_STEPS`` lets its long buffers go for chunk-sized ones.
        self.cols["bound"] = []
        if self.capacity > 4 * (FOLD_ROWS + FIRST_ROWS):
            self.cols, self.capacity = _new_columns(), 0
            self._reserve(FOLD_ROWS + FIRST_ROWS)
        self.packed_ints, self.packed_floats = array("q"), array("d")
        self.fold_at = FOLD_ROWS

    @property
    def bucketed(self) -> bool:
        """Is (or will) this log's table be the buckets of ``stream``?"""
        return self.stream is not None and (self.always_fold or self.stream.num_rows > 0
                                            or len(self) >= self.fold_at)

    def table(self) -> pd.DataFrame:
        """The per-iteration table (the buckets, when rows are folded: ``StepStream.table``)."""
        if self.bucketed:
            assert self.stream is not None
            self.fold()
            return self.stream.table()
        if not len(self):  # keep the dtypes an empty table always had
            return pd.DataFrame({k: [] for k in STEP_COLUMNS}, columns=list(STEP_COLUMNS))
        # copy=False: the columns stay views of the log's arrays (no second copy of a
        # multi-million-step table); the log is not appended to once its table exists
        return pd.DataFrame(self._arrays(), columns=list(STEP_COLUMNS), copy=False)

    def _arrays(self) -> dict[str, Any]:
        """Every column as an array over the rows held: views of the log's buffers."""
        c = self.cols
        n = len(self)
        data: dict[str, Any] = {"bound": c["bound"]}
        for k in NUMERIC_COLUMNS:
            dtype = np.float64 if k in FLOAT_COLUMNS else np.int64
            if k == "replica" and k in self.zero_columns and self.replica:
                data[k] = np.full(n, self.replica, dtype=np.int64)
            elif k in self.zero_columns:
                data[k] = np.zeros(n, dtype=dtype)
            elif k in c:
                data[k] = c[k][:n]
            elif n == 0:
                data[k] = np.empty(0, dtype=dtype)
        for names, packed, dtype in ((self.packed_int_columns, self.packed_ints, np.int64),
                                     (self.packed_float_columns, self.packed_floats,
                                      np.float64)):
            if names:
                rows = np.frombuffer(packed, dtype=dtype).reshape(n, len(names))
                data.update({name: rows[:, i] for i, name in enumerate(names)})
        return data




def make_step_log(step_table: str, arrival_s: np.ndarray, warmup_s: float, cooldown_s: float,
                  slot_capacity: int | None, block_size: int | None) -> StepLog:
    """A step log for ``step_table`` ("full", "buckets" or "auto": full up to
    ``AUTO_MAX_STEPS`` steps, then folded); the measurement window is the summary's
    (``sim.metrics.summary.summarize``) over the run's arrivals."""
    if step_table == "full":
        return StepLog()
    first, last = ((float(arrival_s.min()), float(arrival_s.max())) if len(arrival_s)
                   else (0.0, 0.0))
    t0 = first + warmup_s if len(arrival_s) else 0.0
    stream = StepStream(bucket_width(first, last), t0, last - cooldown_s, slot_capacity,
                        block_size)
    if step_table == "buckets":
        return StepLog(stream=stream, fold_at=FOLD_ROWS, always_fold=True)
    return StepLog(stream=stream, fold_at=AUTO_MAX_STEPS)


def merged_table(logs: list[StepLog]) -> pd.DataFrame:
    """The tables of ``logs`` as one, ordered by start time, then replica, then each log's
    own order (``pd.concat`` of their tables, ``sort_values(["start_s", "replica"],
    kind="stable")``, a fresh index): built from their columns at once, without the
    concatenated frame and its sorted copy (two passes over every column of a
    million-step table)."""
    full = [log for log in logs if len(log)]
    if len(full) < 2 or any(log.bucketed for log in full):  # tables of their own
        tables = [log.table() for log in full]
        steps = pd.concat(tables, ignore_index=True) if len(tables) > 1 else (
            tables[0] if tables else logs[0].table())
        if len(steps):
            steps = steps.sort_values(["start_s", "replica"], kind="stable").reset_index(
                drop=True)
        return steps
    parts = [log._arrays() for log in full]
    # ``np.lexsort`` is stable: ties keep the concatenated order, as a stable sort does
    order = np.lexsort((np.concatenate([p["replica"] for p in parts]),
                        np.concatenate([p["start_s"] for p in parts])))
    data = {k: np.concatenate([np.asarray(p[k], dtype=object) if k == "bound" else p[k]
                               for p in parts])[order] for k in STEP_COLUMNS}
    return pd.DataFrame(data, columns=list(STEP_COLUMNS), copy=False)
