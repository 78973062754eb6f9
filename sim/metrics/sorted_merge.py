"""Merging two sorted multisets in one pass: the step stream's inter-token latencies.

A bucketed run keeps the durations of its steps with their regular inter-token gap counts as
sorted arrays of distinct values (``sim.metrics.stream``), one a chunk, merged while merging
saves memory (durations that repeat across chunks). Merging two sorted arrays is one linear
pass, ``merge_sorted``. It is written once, in plain Python; ``compiled_merge_sorted`` is the
same function compiled with numba (cached on disk), which the stream takes for large merges
(64 chunks of a static batching run hold about 4M distinct durations), while a small merge
runs it as Python and never loads numba. Both give the
one canonical form: each distinct value once, in order, with its counts summed.
"""
from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np


def merge_sorted(av: np.ndarray, aw: np.ndarray, bv: np.ndarray, bw: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The multisets ``(av, aw)`` and ``(bv, bw)`` (sorted distinct values, integer counts)
    as one: sorted distinct values, the counts of a value in both summed. Values are
    compared as numbers (step durations: never NaN)."""
    na, nb = len(av), len(bv)
    values = np.empty(na + nb, dtype=av.dtype)
    weights = np.empty(na + nb, dtype=aw.dtype)
    i = j = k = 0
    while i < na and j < nb:
        a, b = av[i], bv[j]
        if a < b:
            values[k], weights[k] = a, aw[i]
            i += 1
        elif b < a:
            values[k], weights[k] = b, bw[j]
            j += 1
        else:
            values[k], weights[k] = a, aw[i] + bw[j]
            i += 1
            j += 1
        k += 1
    while i < na:
        values[k], weights[k] = av[i], aw[i]
        i += 1
        k += 1
    while j < nb:
        values[k], weights[k] = bv[j], bw[j]
        j += 1
        k += 1
    return values[:k], weights[:k]


@cache
def compiled_merge_sorted() -> Any:
    """``merge_sorted`` compiled with numba (imported here, on the first large merge)."""
    from numba import njit

    return njit(cache=True, error_model="numpy")(merge_sorted)
