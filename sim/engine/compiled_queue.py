"""The compiled interpreter's waiting queue: a binary heap of requests keyed by the order.

The reference interpreter (``policies.scheduler``) sorts the engine's queue — the preempted
requests, the most recently preempted first, then the waiting ones by arrival — stably by the
order's key. A heap of ``(key, rank)`` rows gives the same sequence: ``key`` is the order's key
(``order_key``: 0 for ``fcfs``, the prompt for ``spf``, minus the priority for ``priority``,
the TTFT deadline for ``edf``) and ``rank`` is the engine's position (``i`` for the ``i``-th
arrival, ``-s`` for the ``s``-th preemption), unique, so ties keep the engine's order. A
request's key does not change while it waits. Rows live in three arrays (``keys``, ``ranks``,
``items``: the request index) so the heap compiles with ``numba.njit``.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from sim.engine.compiled_cost import KERNEL

#: The orders (``SchedulingSpec.order``) by code.
ORDER_FCFS, ORDER_SPF, ORDER_PRIORITY, ORDER_EDF = 0, 1, 2, 3


@njit(**KERNEL, inline="always")
def order_key(order: int, uncomputed: int, priority: int, deadline_s: float) -> float:
    """A waiting request's key under ``order`` (smaller first; ties by rank)."""
    if order == ORDER_SPF:
        return float(uncomputed)
    if order == ORDER_PRIORITY:
        return -float(priority)
    if order == ORDER_EDF:
        return deadline_s
    return 0.0


@njit(**KERNEL, inline="always")
def _less(keys: np.ndarray, ranks: np.ndarray, a: int, b: int) -> bool:
    if keys[a] != keys[b]:
        return keys[a] < keys[b]
    return ranks[a] < ranks[b]


@njit(**KERNEL, inline="always")
def _swap(keys: np.ndarray, ranks: np.ndarray, items: np.ndarray, a: int, b: int) -> None:
    keys[a], keys[b] = keys[b], keys[a]
    ranks[a], ranks[b] = ranks[b], ranks[a]
    items[a], items[b] = items[b], items[a]


@njit(**KERNEL)
def push(keys: np.ndarray, ranks: np.ndarray, items: np.ndarray, size: int, key: float,
         rank: int, item: int) -> int:
    """Add ``item`` with ``(key, rank)``; returns the new size (the arrays have room)."""
    pos = size
    keys[pos], ranks[pos], items[pos] = key, rank, item
    while pos > 0:
        parent = (pos - 1) >> 1
        if not _less(keys, ranks, pos, parent):
            break
        _swap(keys, ranks, items, pos, parent)
        pos = parent
    return size + 1


@njit(**KERNEL)
def pop(keys: np.ndarray, ranks: np.ndarray, items: np.ndarray, size: int) -> int:
    """Remove the first row (``items[0]``); returns the new size."""
    size -= 1
    if size == 0:
        return 0
    keys[0], ranks[0], items[0] = keys[size], ranks[size], items[size]
    pos = 0
    while True:
        child = 2 * pos + 1
        if child >= size:
            break
        if child + 1 < size and _less(keys, ranks, child + 1, child):
            child += 1
        if not _less(keys, ranks, child, pos):
            break
        _swap(keys, ranks, items, pos, child)
        pos = child
    return size
