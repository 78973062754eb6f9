"""Weighted percentiles over sorted pieces (``sim.metrics.percentiles``) are the whole's.

A bucketed run's inter-token latencies stay split in the sorted per-chunk pieces the step
stream compacted them into; the summary selects each percentile's value across the pieces.
The specification: whatever the split (pieces of one value or many, the same value in several
pieces, negative values, zeros, very large and tiny magnitudes), the percentiles equal those
of the one concatenated sample bit for bit, and the mean equals it to summation order.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.metrics.percentiles import pieces_stats, weighted_stats
from sim.metrics.stream import compact_multiset

VALUES = st.one_of(st.sampled_from([0.0, 1e-3, 1e-3 + 1e-18, 0.0125, 0.02, 7.25, -2.5]),
                   st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False),
                   st.floats(0, 1e-300))
PIECES = st.lists(st.lists(st.tuples(VALUES, st.integers(1, 9)), max_size=15),
                  min_size=1, max_size=10)


def _compacted(pieces: list[list[tuple[float, int]]]) -> list[tuple[np.ndarray, np.ndarray]]:
    return [compact_multiset(np.array([v for v, _ in p], dtype=float),
                             np.array([w for _, w in p], dtype=np.int64)) for p in pieces]


@settings(max_examples=300, deadline=None)
@given(pieces=PIECES)
def test_percentiles_over_pieces_equal_the_concatenated_sample(pieces) -> None:
    compacted = _compacted(pieces)
    values = np.concatenate([v for v, _ in compacted])
    counts = np.concatenate([w for _, w in compacted])
    got = pieces_stats(compacted)
    if not len(values):
        assert all(math.isnan(v) for v in got.values())
        return
    want = weighted_stats(values, counts)
    assert got.keys() == want.keys()
    for name in ("median", "p90", "p99"):
        assert got[name] == want[name], name
    assert got["mean"] == pytest.approx(want["mean"], rel=1e-12, abs=1e-300)


def test_a_split_never_changes_a_rank_value() -> None:
    # one value per piece, in reverse order of the pieces: every rank is found by selection
    values = np.linspace(0.005, 0.05, 400)
    pieces = [(values[i:i + 1], np.array([i % 7 + 1])) for i in range(399, -1, -1)]
    want = weighted_stats(values, np.array([i % 7 + 1 for i in range(400)]))
    got = pieces_stats(pieces)
    assert [got[k] for k in ("median", "p90", "p99")] == [want[k] for k in
                                                          ("median", "p90", "p99")]
