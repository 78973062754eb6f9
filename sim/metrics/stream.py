"""The step table folded as it grows: fixed time buckets for plots, exact sums for the summary.

A million-request run at low load makes tens of millions of short steps; keeping every row
costs ~160 bytes a step. ``StepStream`` takes the rows in chunks (``StepLog`` hands them over
every ``FOLD_ROWS`` steps, the compiled kernel every time its log buffer fills) and keeps:

- **buckets** — per replica and fixed time bucket (``bucket_s`` wide, by step start): the
  number of steps, the sum of every numeric step column and the max of a few; what the
  timeline plots draw (``timeline_frame`` turns them into per-step means);
- **summary sums** — for the steps inside the measurement window, the very per-step products
  the summary takes from a full table (``step_sums``), summed per chunk and added exactly
  (``math.fsum``) at the end; and the multiset of step durations weighted by their regular
  inter-token gaps, kept as sorted per-chunk pieces, so ITL percentiles are exact. Summaries
  are therefore computed from every step, never from the buckets: counts, maxima and
  percentiles equal the full table's bit for bit, sums agree to floating-point summation
  order (~1e-15 relative).

The window's end (the last finish of a request inside it) is known only at the end, so steps
that start after the latest such finish seen so far (``bound_s``, advanced by the engine) are
held back as rows until the summary decides: usually a handful, at most the steps of the
cool-down tail.
"""
from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from sim.metrics.sorted_merge import compiled_merge_sorted, merge_sorted

#: Steps the general engine's log gathers before folding them (bucketed tables).
FOLD_ROWS = 1 << 16
#: The ITL pieces are merged into one when there are more than this many (while it pays).
MERGE_PIECES = 64
#: ``step_table="auto"`` keeps the full table up to this many steps, then folds.
AUTO_MAX_STEPS = 2_000_000
#: About this many buckets span the arrivals (the width is rounded to 1, 2 or 5 × 10^k s).
TARGET_BUCKETS = 2000
STEP_TABLE_CHOICES = ("auto", "full", "buckets")

#: Numeric step columns summed per bucket, and those whose maximum is kept too.
SUM_COLUMNS = ("duration_s", "num_seqs", "num_prefill_tokens", "num_decode_tokens",
               "num_padding_tokens", "num_padding_rows", "num_waiting", "kv_used_blocks",
               "flops", "bytes", "num_regular_itl", "kv_live_tokens", "kv_cached_blocks",
               "num_recomputed_tokens", "swap_s", "swapped_bytes")
MAX_COLUMNS = ("duration_s", "num_seqs", "num_waiting", "kv_used_blocks")
BUCKET_COLUMNS = ("replica", "start_s", "bucket_s", "num_steps",
                  *(f"{c}_sum" for c in SUM_COLUMNS), *(f"{c}_max" for c in MAX_COLUMNS))


def bucket_width(first_arrival_s: float, last_arrival_s: float) -> float:
    """A round bucket width giving about ``TARGET_BUCKETS`` buckets over the arrivals."""
    raw = max(last_arrival_s - first_arrival_s, 1e-3) / TARGET_BUCKETS
    scale = 10.0 ** math.floor(math.log10(raw))
    return next(m * scale for m in (1, 2, 5, 10) if m * scale >= raw)


def step_sums(c: Mapping[str, np.ndarray], slot_capacity: int | np.ndarray | None,
              block_size: int | None) -> dict[str, float]:
    """The sums the summary's step metrics are made of, over the steps ``c`` (numpy columns).

    The one definition of each per-step quantity (``sim.metrics.summary`` and
    ``sim.metrics.kv`` turn the sums into metrics); a full table is one chunk. Temporaries are
    dropped as soon as they are summed: a multi-million-step table's columns are tens of MB
    each. ``slot_capacity`` is the policy's batch rows (``None``: unbounded, a step's own rows
    and padding rows), or an array of each step's own (a fleet whose policies differ; 0 for
    an unbounded one)."""
    out: dict[str, float] = {}
    dur = c["duration_s"].astype(float, copy=False)
    out["busy_s"] = float(dur.sum())
    real = (c["num_prefill_tokens"] + c["num_decode_tokens"]).astype(float)
    pad = c["num_padding_tokens"].astype(float)
    tokens = real + pad
    useful = np.divide(real, tokens, out=np.zeros_like(real), where=tokens > 0)
    del real
    out["useful_flops"] = float((c["flops"].astype(float, copy=False) * useful).sum())
    del useful
    out["bytes"] = float(c["bytes"].astype(float, copy=False).sum())
    out["padding_tokens"], out["tokens"] = float(pad.sum()), float(tokens.sum())
    del pad
    rows = c["num_seqs"].astype(float)
    slots: int | np.ndarray
    if isinstance(slot_capacity, np.ndarray):  # each step against its own replica's slots
        slots = np.where(slot_capacity > 0, slot_capacity,
                         np.maximum(rows + c["num_padding_rows"].astype(float), 1))
    else:
        slots = slot_capacity if slot_capacity else np.maximum(
            rows + c["num_padding_rows"].astype(float), 1)
    out["slot_s"] = float((dur * rows / slots).sum())
    out["rows"] = float(rows.sum())
    del rows, slots
    kv = c["kv_used_blocks"].astype(float)
    out["kv_block_s"] = float((kv * dur).sum())
    out["swapped_bytes"] = float(c["swapped_bytes"].astype(float, copy=False).sum())
    swap_s = c["swap_s"].astype(float, copy=False)
    out["swap_s"] = float(swap_s.sum())
    recomputed = c["num_recomputed_tokens"].astype(float)
    share = np.divide(recomputed, tokens, out=np.zeros_like(tokens), where=tokens > 0)
    del recomputed, tokens
    out["recompute_s"] = float(((dur - swap_s) * share).sum())
    del share, swap_s
    if block_size:
        live = c["kv_live_tokens"].astype(float)
        held = kv * block_size
        out["live_token_s"] = float((dur * live).sum())
        out["held_token_s"] = float((dur * held).sum())
        held -= live  # empty token slots, in place
        out["empty_token_s"] = float((dur * held).sum())
    return out


class StepStream:
    """Buckets and exact windowed summary sums of step rows folded in chunks (see module)."""

    def __init__(self, bucket_s: float, window_start_s: float, window_end_s: float,
                 slot_capacity: int | None, block_size: int | None) -> None:
        self.bucket_s = bucket_s
        self.window_start_s, self.window_end_s = window_start_s, window_end_s
        self.slot_capacity, self.block_size = slot_capacity, block_size
        #: Steps starting at or before this are inside the window for sure (the latest finish
        #: of a request arriving in the window; the window's start until one finishes).
        self.bound_s = window_start_s
        self.num_rows = 0  # every step folded
        self.max_end_s = -math.inf  # latest step end, for runs cut short
        self.num_window = 0  # steps counted by the summary
        self.max_kv_used = -math.inf
        self._sums: list[dict[str, float]] = []
        self._itl: list[tuple[np.ndarray, np.ndarray]] = []  # (duration, count), compacted
        self._merge_itl = True  # while merging the pieces saves memory (``_merge_pieces``)
        self._held: list[dict[str, np.ndarray]] = []  # window steps after ``bound_s``
        self._buckets: list[dict[str, np.ndarray]] = []  # per chunk: ``_fold_groups``
        #: Counts every folded chunk of rows into ``counts`` (the run's validity flags: a
        #: bucketed table keeps no step shapes to count them from afterwards).
        self.count_rows: Callable[[Mapping[str, np.ndarray]], dict[str, int]] | None = None
        self.counts: dict[str, int] = {}

    def finished(self, arrival_s: float, finish_s: float) -> None:
        """A request finished: if it arrived in the window, steps up to then are inside it."""
        if (self.window_start_s <= arrival_s <= self.window_end_s
                and finish_s > self.bound_s):
            self.bound_s = finish_s

    def finished_all(self, arrival_s: np.ndarray, finish_s: np.ndarray, done: np.ndarray
                     ) -> None:
        """``finished`` for every request marked in ``done`` (a fast path's outcome arrays)."""
        mask = done & (arrival_s >= self.window_start_s) & (arrival_s <= self.window_end_s)
        if mask.any():
            self.bound_s = max(self.bound_s, float(finish_s[mask].max()))

    def fold(self, c: Mapping[str, np.ndarray]) -> None:
        """Take a chunk of rows: every numeric step column as a numpy array."""
        start = c["start_s"]
        if not len(start):
            return
        self.num_rows += len(start)
        if self.count_rows is not None:
            for key, value in self.count_rows(c).items():
                self.counts[key] = self.counts.get(key, 0) + value
        self.max_end_s = max(self.max_end_s, float((start + c["duration_s"]).max()))
        self._bucket(c)
        inside = start >= self.window_start_s
        later = inside & (start > self.bound_s)
        if later.any():  # decided at the end, once the window's last finish is known
            self._held.append(_rows(c, later, copy=True))
            inside &= ~later
        self._count(c if inside.all() else _rows(c, inside, copy=False))

    def close(self, end_s: float) -> None:
        """The window ends at ``end_s``: count the held-back steps that start by then."""
        held, self._held = self._held, []
        for c in held:
            keep = c["start_s"] <= end_s
            self._count({k: v[keep] for k, v in c.items()})

    def _count(self, c: Mapping[str, np.ndarray]) -> None:
        n = len(c["start_s"])
        if not n:
            return
        self.num_window += n
        self.max_kv_used = max(self.max_kv_used, float(c["kv_used_blocks"].max()))
        self._sums.append(step_sums(c, self.slot_capacity, self.block_size))
        w = c["num_regular_itl"]
        keep = w > 0
        if keep.any():
            self._itl.append(compact_multiset(c["duration_s"][keep], w[keep]))
            if self._merge_itl and len(self._itl) > MERGE_PIECES:
                self._merge_pieces()

    def _merge_pieces(self) -> None:
        """Merge the ITL pieces into one while that saves memory: once a merge leaves more
        than half the values it was given (distinct durations, as a large batch's growing
        contexts make), merging stops for the run; the summary reads the pieces as they are
        (``sim.metrics.percentiles.pieces_stats``), and merging them would only copy them."""
        given = sum(len(p[0]) for p in self._itl)
        merged = _merge_all(self._itl)
        self._itl = [merged]
        self._merge_itl = 2 * len(merged[0]) <= given

    def sums(self) -> dict[str, float]:
        """The window's ``step_sums``, each added exactly over the chunks."""
        keys = self._sums[0].keys() if self._sums else ()
        return {k: math.fsum(s[k] for s in self._sums) for k in keys}

    def itl_pieces(self, release: bool = False) -> list[tuple[np.ndarray, np.ndarray]]:
        """Durations of the window's steps with their regular inter-token gap counts, as
        pieces (``compact_multiset``'s form: each sorted, each duration once in a piece);
        ``release`` drops the stream's own reference to them."""
        pieces = list(self._itl)
        if release:
            self._itl = []
        return pieces

    def _bucket(self, c: Mapping[str, np.ndarray]) -> None:
        index = np.floor(c["start_s"] / self.bucket_s).astype(np.int64)
        self._buckets.append(_fold_groups(c["replica"].astype(np.int64, copy=False), index,
                                          {f"{k}_sum": c[k] for k in SUM_COLUMNS},
                                          {f"{k}_max": c[k] for k in MAX_COLUMNS},
                                          np.ones(len(index), dtype=np.int64)))

    def table(self) -> pd.DataFrame:
        """One row per replica and bucket that saw a step (``BUCKET_COLUMNS``)."""
        if not self._buckets:
            return pd.DataFrame({k: [] for k in BUCKET_COLUMNS}, columns=list(BUCKET_COLUMNS))
        parts = self._buckets
        if len(parts) > 1:  # chunk by chunk, in the order they came, as their rows' sums
            cols = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
            sums = {f"{k}_sum": cols[f"{k}_sum"] for k in SUM_COLUMNS}
            maxes = {f"{k}_max": cols[f"{k}_max"] for k in MAX_COLUMNS}
            self._buckets = [_fold_groups(cols["replica"], cols["bucket"], sums, maxes,
                                          cols["num_steps"])]  # merged: a second call is free
        out = dict(self._buckets[0])
        out["start_s"] = out["bucket"] * self.bucket_s
        out["bucket_s"] = np.full(len(out["bucket"]), self.bucket_s)
        table = pd.DataFrame({k: out[k] for k in BUCKET_COLUMNS})
        table.attrs["step_table"] = "buckets"
        return table


def _rows(c: Mapping[str, np.ndarray], mask: np.ndarray, copy: bool) -> dict[str, np.ndarray]:
    """The rows of the columns ``c`` that ``mask`` marks: slices when they are one run of
    rows (one replica's steps in time order: a window's cut is a prefix or a suffix),
    copied when ``copy`` (rows kept beyond the fold: the caller writes its buffers again);
    else copies taken by the mask."""
    first = int(mask.argmax())
    last = len(mask) - int(mask[::-1].argmax())
    if mask[first:last].all():
        return {k: v[first:last].copy() if copy else v[first:last] for k, v in c.items()}
    return {k: v[mask] for k, v in c.items()}


def _fold_groups(replica: np.ndarray, bucket: np.ndarray, sums: Mapping[str, np.ndarray],
                 maxes: Mapping[str, np.ndarray], num_steps: np.ndarray
                 ) -> dict[str, np.ndarray]:
    """Rows grouped by ``(replica, bucket)``, groups in that order: ``sums`` and ``num_steps``
    summed, ``maxes`` maximized: what a pandas group-by gives, bit for bit.

    The rows come in key order (one replica's steps in time order, or its chunks' buckets in
    turn): each group is then a contiguous segment, and ``np.add.reduceat`` sums it as pandas
    sums a sorted group (checked against pandas by ``tests/test_stream_fold.py``). Rows out of
    key order (no engine folds them so) go through pandas itself, which sums those groups
    otherwise (compensated, row by row)."""
    step_r, step_b = np.diff(replica), np.diff(bucket)
    if not ((step_r > 0) | ((step_r == 0) & (step_b >= 0))).all():
        return _fold_groups_pandas(replica, bucket, sums, maxes, num_steps)
    new = np.ones(len(bucket), dtype=bool)
    new[1:] = (step_r != 0) | (step_b != 0)
    first = np.flatnonzero(new)
    out: dict[str, np.ndarray] = {"replica": replica[first], "bucket": bucket[first]}
    for k, v in sums.items():
        out[k] = np.add.reduceat(np.ascontiguousarray(v, dtype=_SUM_TYPE[v.dtype.kind]), first)
    for k, v in maxes.items():
        out[k] = np.maximum.reduceat(v, first)
    out["num_steps"] = np.add.reduceat(num_steps.astype(np.int64, copy=False), first)
    return out


def _fold_groups_pandas(replica: np.ndarray, bucket: np.ndarray,
                        sums: Mapping[str, np.ndarray], maxes: Mapping[str, np.ndarray],
                        num_steps: np.ndarray) -> dict[str, np.ndarray]:
    """``_fold_groups`` of rows in any order, by a pandas group-by."""
    frame = pd.DataFrame({"replica": replica, "bucket": bucket, **sums,
                          **maxes, "num_steps": num_steps})
    groups = frame.groupby(["replica", "bucket"], sort=True)
    agg = groups[[*sums, "num_steps"]].sum().join(
        groups[list(maxes)].max()).reset_index()
    return {k: agg[k].to_numpy() for k in agg.columns}


#: What a pandas group-by sum gives each kind of column: floats as float64, integers int64.
_SUM_TYPE = {"f": np.float64, "i": np.int64, "u": np.int64, "b": np.int64}


def merge_streams(streams: list[StepStream]) -> StepStream:
    """One stream of several replicas' streams (each folded on its own)."""
    if len(streams) == 1:
        return streams[0]
    first = streams[0]
    out = StepStream(first.bucket_s, first.window_start_s, first.window_end_s,
                     first.slot_capacity, first.block_size)
    out.bound_s = max(s.bound_s for s in streams)
    for s in streams:
        out.num_rows += s.num_rows
        out.max_end_s = max(out.max_end_s, s.max_end_s)
        out.num_window += s.num_window
        out.max_kv_used = max(out.max_kv_used, s.max_kv_used)
        out._sums += s._sums
        out._itl += s._itl
        out._held += s._held
        out._buckets += s._buckets
    return out


def is_bucketed(steps: pd.DataFrame) -> bool:
    """True for a bucketed step table (``StepStream.table``), False for one row per step."""
    return "num_steps" in steps.columns and "bucket_s" in steps.columns


def timeline_frame(buckets: pd.DataFrame) -> pd.DataFrame:
    """A bucketed table as step-table-like rows for plots: one per bucket, with ``start_s``,
    ``duration_s`` (busy seconds) and the per-step means of the summed columns."""
    n = buckets["num_steps"].to_numpy(float)
    out: dict[str, Any] = {"replica": buckets["replica"].to_numpy(),
                           "start_s": buckets["start_s"].to_numpy(float),
                           "duration_s": buckets["duration_s_sum"].to_numpy(float)}
    for k in SUM_COLUMNS:
        if k != "duration_s":
            out[k] = buckets[f"{k}_sum"].to_numpy(float) / np.maximum(n, 1)
    return pd.DataFrame(out)


#: Merges of at least this many values in all run compiled (``sim.metrics.sorted_merge``,
#: which loads numba then); smaller ones run its Python form.
COMPILED_MERGE_VALUES = 1 << 16


def _merge_all(pieces: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Compacted multisets (``compact_multiset``'s form) as one, always merging the two smallest
    left (each value is then copied about log(pieces) times, and the big one last)."""
    heap = [(len(p[0]), i, p) for i, p in enumerate(pieces)]
    heapq.heapify(heap)
    while len(heap) > 1:
        na, _, a = heapq.heappop(heap)
        nb, i, b = heapq.heappop(heap)
        merge = compiled_merge_sorted() if na + nb >= COMPILED_MERGE_VALUES else merge_sorted
        merged = merge(a[0], a[1], b[0], b[1])
        heapq.heappush(heap, (len(merged[0]), i, merged))
    return heap[0][2]


def compact_multiset(values: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The multiset ``values`` × ``counts`` with each distinct value once (integer counts
    summed exactly). The order of tied values is immaterial (their integer counts are
    summed, and tied values are one value), so either sort serves: the one faster on these
    values. A chunk of run-to-completion batches' durations is a few hundred ascending runs
    (a batch's steps grow longer with its contexts), which the stable sort (a merge of runs)
    takes 2-3x faster than quicksort; on durations in no order quicksort is the faster."""
    descents = np.count_nonzero(values[1:] < values[:-1])
    order = np.argsort(values, kind="stable" if descents * 64 < len(values) else "quicksort")
    v, w = values[order], counts[order].astype(np.int64)
    if not len(v):
        return v, w
    starts = np.flatnonzero(np.concatenate(([True], v[1:] != v[:-1])))
    return v[starts], np.add.reduceat(w, starts)
