"""Every replica's load signals as arrays, and the balance rules that read them (each once).

A router decides from one row of counts per replica (``counts[i, WAITING]`` ... ``KV_USED``),
the replicas' capacity weights and KV sizes. ``Loads`` holds them and is also the
``Sequence[ReplicaLoad]`` the router interface promises (``loads[i]`` is replica ``i``'s
``ReplicaLoad``, built when asked for), so a user's router keeps reading objects while the
built-in ones read the arrays.

The rules below are plain functions of numbers and integer arrays: the Python routers call
them as they are and the compiled router (``sim.engine.compiled_route``) compiles the same
functions with numba, so a compiled routing decision is the Python one by construction.
Ties go to the lowest index.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np

from sim.core.load_rules import kv_share, outstanding_requests, outstanding_tokens
from sim.core.routing import ReplicaLoad

#: Columns of ``Loads.counts`` (one row per replica): waiting requests (buffered arrivals
#: included), running ones, uncomputed prefill tokens, decoding requests, KV blocks in use.
WAITING, RUNNING, PREFILL, DECODING, KV_USED = range(5)
NUM_COUNTS = 5
#: The load measures a router can balance on (``router.metric``), by code.
METRICS = ("requests", "tokens", "kv")
REQUESTS, TOKENS, KV = range(3)
#: Whole routing rules (``Router.rule``): the lightest of all by a metric (the metric codes
#: above), or the emptiest KV cache (``emptiest_kv``); ``NO_RULE``: the router's own code.
EMPTIEST_KV, NO_RULE = 3, -1


def measure(waiting: int, running: int, prefill: int, decoding: int, used: int,
            kv_total: int, weight: float, metric: int) -> float:
    """One replica's load by ``metric`` (lower is lighter), per unit of capacity: outstanding
    requests, outstanding tokens (prefill left plus one per decoding request; a router cannot
    know the decodes' remaining lengths), or the share of its KV cache in use (0 unlimited):
    the formulas of ``sim.core.load_rules``."""
    if metric == REQUESTS:
        return outstanding_requests(waiting, running) / weight
    if metric == TOKENS:
        return outstanding_tokens(prefill, decoding) / weight
    return kv_share(used, kv_total)


def outstanding_of(counts: np.ndarray) -> np.ndarray:
    """Every replica's outstanding requests (``outstanding_requests`` of each row)."""
    return outstanding_requests(counts[:, WAITING], counts[:, RUNNING])


def measure_at(counts: np.ndarray, weight: np.ndarray, kv_total: np.ndarray, i: int,
               metric: int) -> float:
    """``measure`` of row ``i``."""
    return measure(counts[i, WAITING], counts[i, RUNNING], counts[i, PREFILL],
                   counts[i, DECODING], counts[i, KV_USED], kv_total[i], weight[i], metric)


def lightest_among(counts: np.ndarray, weight: np.ndarray, kv_total: np.ndarray, metric: int,
                   among: np.ndarray) -> int:
    """The lightest of the replicas ``among`` by ``metric`` (ties: the lowest index)."""
    best = among[0]
    best_v = measure_at(counts, weight, kv_total, best, metric)
    for k in range(1, len(among)):
        i = among[k]
        v = measure_at(counts, weight, kv_total, i, metric)
        if v < best_v or (v == best_v and i < best):
            best, best_v = i, v
    return int(best)


def emptiest_kv(counts: np.ndarray, weight: np.ndarray, kv_total: np.ndarray) -> int:
    """The replica with the smallest KV share in use, then the fewest outstanding requests
    per unit of capacity, then the lowest index (``least_kv_usage``)."""
    best = 0
    best_kv = measure_at(counts, weight, kv_total, 0, KV)
    best_q = measure_at(counts, weight, kv_total, 0, REQUESTS)
    for i in range(1, len(counts)):
        kv = measure_at(counts, weight, kv_total, i, KV)
        q = measure_at(counts, weight, kv_total, i, REQUESTS)
        if kv < best_kv or (kv == best_kv and q < best_q):
            best, best_kv, best_q = i, kv, q
    return best


def choose(rule: int, counts: np.ndarray, weight: np.ndarray, kv_total: np.ndarray,
           everyone: np.ndarray) -> int:
    """The replica ``rule`` picks (``everyone``: ``0 .. N-1``)."""
    if rule == EMPTIEST_KV:
        return emptiest_kv(counts, weight, kv_total)
    return lightest_among(counts, weight, kv_total, rule, everyone)


class Loads(Sequence[ReplicaLoad]):
    """The load signals of every replica as of ``measured_s`` (see the module docstring)."""

    __slots__ = ("counts", "groups", "kv_total", "measured_s", "weight")

    def __init__(self, counts: np.ndarray, weight: np.ndarray, kv_total: np.ndarray,
                 measured_s: float, groups: Sequence[str] | None = None) -> None:
        self.counts = counts
        self.weight = weight
        self.kv_total = kv_total
        self.measured_s = measured_s
        self.groups = groups

    @staticmethod
    def of(loads: Sequence[ReplicaLoad]) -> Loads:
        """The arrays of ``ReplicaLoad`` values (replica ``i`` at position ``i``)."""
        if isinstance(loads, Loads):
            return loads
        counts = np.array([(s.num_waiting, s.num_running, s.outstanding_prefill_tokens,
                            s.num_decoding, s.kv_used_blocks) for s in loads],
                          dtype=np.int64).reshape(len(loads), NUM_COUNTS)
        return Loads(counts, np.array([s.weight for s in loads], dtype=np.float64),
                     np.array([s.kv_total_blocks for s in loads], dtype=np.int64),
                     loads[0].measured_s if len(loads) else 0.0, [s.group for s in loads])

    def __len__(self) -> int:
        return len(self.counts)

    @overload
    def __getitem__(self, i: int) -> ReplicaLoad: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[ReplicaLoad]: ...

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[k] for k in range(len(self))[i]]
        k = range(len(self))[i]  # an IndexError past the end, as a list's
        w, r, p, d, u = self.counts[k].tolist()
        return ReplicaLoad(k, w, r, p, d, u, int(self.kv_total[k]), float(self.weight[k]),
                           self.groups[k] if self.groups is not None else "", self.measured_s)

    def __iter__(self) -> Iterator[ReplicaLoad]:
        return (self[k] for k in range(len(self)))
