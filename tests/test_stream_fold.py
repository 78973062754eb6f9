"""The bucketed step table's fold (``sim.metrics.stream``) equals a pandas group-by bit for bit.

The fold sums each bucket's rows with ``np.add.reduceat``; the table it replaced summed them
with ``DataFrame.groupby(...).sum()``. Both are compared here on random columns: floats of
wildly different magnitudes (where summation order shows), runs of one repeated value, several
chunks per bucket, and rows of several replicas interleaved (out of key order).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.metrics import stream
from sim.metrics.stream import MAX_COLUMNS, SUM_COLUMNS, StepStream

FLOATS = {"duration_s", "flops", "bytes", "swap_s", "swapped_bytes"}


def _chunk(rng: np.random.Generator, n: int, t0: float, replicas: int, constant: bool
           ) -> dict[str, np.ndarray]:
    c = {"start_s": t0 + np.cumsum(rng.exponential(0.03, n)),
         "replica": rng.integers(0, replicas, n)}
    for k in SUM_COLUMNS:
        if k in FLOATS:
            c[k] = (np.full(n, 0.0123456789) if constant
                    else rng.exponential(0.03, n) * 10.0 ** rng.integers(-3, 12, n))
        else:
            c[k] = rng.integers(0, 1000, n)
    return c


def _pandas_table(chunks: list[dict[str, np.ndarray]], bucket_s: float) -> pd.DataFrame:
    """The bucketed table as the pandas group-by built it: per chunk, then over the chunks."""
    parts = []
    for c in chunks:
        frame = pd.DataFrame({"replica": c["replica"],
                              "bucket": np.floor(c["start_s"] / bucket_s).astype(np.int64),
                              **{k: c[k] for k in SUM_COLUMNS}})
        groups = frame.groupby(["replica", "bucket"], sort=True)
        agg = groups[list(SUM_COLUMNS)].sum().add_suffix("_sum")
        agg = agg.join(groups[list(MAX_COLUMNS)].max().add_suffix("_max"))
        agg["num_steps"] = groups.size()
        parts.append(agg)
    groups = pd.concat(parts).groupby(level=["replica", "bucket"], sort=True)
    out = groups[[f"{k}_sum" for k in SUM_COLUMNS] + ["num_steps"]].sum().join(
        groups[[f"{k}_max" for k in MAX_COLUMNS]].max()).reset_index()
    out["start_s"] = out["bucket"] * bucket_s
    out["bucket_s"] = bucket_s
    return out[[c for c in StepStream(1.0, 0, 1, None, None).table().columns]]


@pytest.mark.parametrize("seed", range(12))
def test_fold_equals_pandas_group_by(seed: int) -> None:
    rng = np.random.default_rng(seed)
    replicas, constant = (1, 1, 3)[seed % 3], seed % 4 == 0
    bucket_s = float(rng.choice([0.1, 1.0, 5.0]))
    stream = StepStream(bucket_s, 0.0, 1e9, None, None)
    chunks, t = [], 0.0
    for _ in range(int(rng.integers(1, 5))):
        c = _chunk(rng, int(rng.integers(1, 5000)), t, replicas, constant)
        t = float(c["start_s"][-1])
        chunks.append(c)
        stream.fold(c)
    got, want = stream.table(), _pandas_table(chunks, bucket_s)
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    for k in want:  # bit for bit, not merely equal within pandas' tolerance
        assert (got[k].to_numpy() == want[k].to_numpy()).all(), k


# -- the inter-token latency multiset: merged in numpy or in compiled code, one form --------
@settings(max_examples=150, deadline=None)
@given(pieces=st.lists(st.lists(st.tuples(st.sampled_from([0.0, 1e-3, 0.0125, 0.02, 0.5, 3.0,
                                                             1e-3 + 1e-18, 7.25]),
                                          st.integers(1, 9)), max_size=12),
                       min_size=1, max_size=9),
       compiled=st.booleans())
def test_merged_pieces_are_the_compacted_whole(pieces, compiled) -> None:
    # each distinct duration once, in order, with its gap counts summed: whichever form of
    # the one merge ran (its Python form, or compiled, which large merges take)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(stream, "COMPILED_MERGE_VALUES", 0 if compiled else 1 << 20)
        _check_merge(pieces)


def _check_merge(pieces) -> None:
    compacted = [stream.compact_multiset(np.array([v for v, _ in p], dtype=float),
                                 np.array([w for _, w in p], dtype=np.int64)) for p in pieces]
    values = np.array([v for p in pieces for v, _ in p], dtype=float)
    counts = np.array([w for p in pieces for _, w in p], dtype=np.int64)
    want = stream.compact_multiset(values, counts)
    got = stream._merge_all(compacted)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)
    assert list(got[0]) == sorted(set(values.tolist()))


def _durations_stream(values_per_chunk) -> StepStream:
    s = StepStream(1.0, 0.0, 1e9, None, None)
    s.bound_s = 1e9
    for i, durations in enumerate(values_per_chunk):
        n = len(durations)
        c = {k: np.zeros(n, dtype=np.float64 if k in FLOATS else np.int64)
             for k in SUM_COLUMNS}
        c.update(start_s=i + np.arange(n) / (2 * n), replica=np.zeros(n, dtype=np.int64),
                 duration_s=np.asarray(durations, dtype=float),
                 num_regular_itl=np.ones(n, dtype=np.int64))
        s.fold(c)
    return s


def test_itl_pieces_are_merged_while_merging_saves_memory() -> None:
    # the same few durations in every chunk: merged every MERGE_PIECES, the pieces stay few
    repeated = _durations_stream([[0.01, 0.02, 0.03]] * (3 * stream.MERGE_PIECES))
    assert len(repeated.itl_pieces()) <= stream.MERGE_PIECES + 1
    # distinct durations: one merge shows it saves nothing, and the pieces are kept as folded
    rng = np.random.default_rng(1)
    distinct = _durations_stream([rng.random(50) for _ in range(3 * stream.MERGE_PIECES)])
    pieces = distinct.itl_pieces()
    assert len(pieces) == 2 * stream.MERGE_PIECES
    assert sum(len(v) for v, _ in pieces) == 50 * 3 * stream.MERGE_PIECES


@pytest.mark.parametrize("seed", range(6))
def test_fold_keeps_no_view_of_the_rows_it_is_given(seed: int) -> None:
    # A folding step log hands its rows over as views of its buffers and then writes them
    # again: a stream given chunks that are overwritten right after each fold ends exactly
    # as one given copies that nobody touches (buckets, window sums, ITL pieces, held rows).
    rng = np.random.default_rng(seed)
    replicas = (1, 3)[seed % 2]
    kept, scribbled = (StepStream(1.0, 0.5, 1e9, 64, 16) for _ in range(2))
    t = 0.0
    for i in range(int(rng.integers(2, 6))):
        c = _chunk(rng, int(rng.integers(1, 3000)), t, replicas, constant=seed % 3 == 0)
        c["num_regular_itl"] = rng.integers(0, 3, len(c["start_s"]))
        t = float(c["start_s"][-1])
        if i % 2:  # the window's last finish advances: earlier held rows get decided later
            finish = t * float(rng.random())
            for s in (kept, scribbled):
                s.finished(1.0, finish)
        kept.fold({k: v.copy() for k, v in c.items()})
        scribbled.fold(c)
        for v in c.values():  # the log's next chunk, written over the same buffers
            v[...] = -7 if v.dtype.kind == "i" else np.nan
    for s in (kept, scribbled):
        s.close(t * 0.9)
    pd.testing.assert_frame_equal(scribbled.table(), kept.table(), check_exact=True)
    assert scribbled.sums() == kept.sums()
    assert (scribbled.num_window, scribbled.max_kv_used) == (kept.num_window, kept.max_kv_used)
    for got, want in zip(scribbled.itl_pieces(), kept.itl_pieces(), strict=True):
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
