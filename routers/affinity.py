"""Routers that keep related requests together: by session, or by the longest cached prefix.

- ``session_affinity``: every request of a session (a conversation, a user) goes to the
  session's home replica, chosen for its first request by ``fallback``; while the home is
  overloaded (outstanding requests per unit of capacity above ``max_load_ratio`` × the mean
  plus one) the request goes where ``fallback`` says, and the session keeps its home. Requests
  without a session go to ``fallback``.
- ``prefix_affinity``: the replica believed to hold the longest leading run of the request's
  prefix block hashes wins (``routers.prefix_index``), balanced against load as production
  cache-aware routers do: when the load spread is large (most minus least outstanding requests
  above ``balance_abs`` and most above ``balance_rel`` × least), or the best match covers less
  than ``min_match`` of the request's hashes, the least loaded replica wins instead.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from routers.base import LOAD_METRICS, Router, check_metric, lightest, register
from routers.prefix_index import PrefixIndex
from sim.core.routing import Arrival, ReplicaLoad

#: Load measures a session may fall back on (the router names of ``routers.balance``).
FALLBACKS = {"least_outstanding_requests": "requests", "least_outstanding_tokens": "tokens",
             "least_kv_usage": "kv"}


@register("session_affinity")
@dataclass
class SessionAffinity(Router):
    """Sticky by session, with a load-based fallback for overloaded homes."""

    fallback: str = "least_outstanding_requests"
    max_load_ratio: float = 2.0

    def __post_init__(self) -> None:
        super().__post_init__()
        self.require(self.fallback in FALLBACKS, "fallback",
                     f"unknown {self.fallback!r}; accepted: {', '.join(FALLBACKS)}")
        self.require(self.max_load_ratio >= 1, "max_load_ratio",
                     f"must be >= 1, got {self.max_load_ratio!r}")
        self._home: dict[str, int] = {}

    def start(self, num_replicas: int, rng: np.random.Generator) -> None:
        """No session has a home yet: a router object passed to several runs routes each
        alike (a home kept from a run over more replicas was an IndexError)."""
        super().start(num_replicas, rng)
        self._home = {}

    def route(self, request: Arrival, loads: Sequence[ReplicaLoad]) -> int:
        """The session's home unless it is overloaded; else the fallback's choice."""
        metric = FALLBACKS[self.fallback]
        fallback = lightest(loads, metric)
        if request.session is None:
            return fallback
        home = self._home.setdefault(request.session, fallback)
        per_capacity = LOAD_METRICS["requests"]
        mean = sum(per_capacity(s) for s in loads) / len(loads)
        if per_capacity(loads[home]) > self.max_load_ratio * mean + 1:
            return fallback
        return home


@register("prefix_affinity")
@dataclass
class PrefixAffinity(Router):
    """Longest believed-cached prefix wins, unless the load is badly unbalanced."""

    balance_abs: int = 16
    balance_rel: float = 1.5
    min_match: float = 0.0
    index_blocks: int = 65536
    metric: str = "requests"

    def __post_init__(self) -> None:
        super().__post_init__()
        self.require(self.balance_abs >= 0, "balance_abs", f"must be >= 0, got "
                     f"{self.balance_abs}")
        self.require(self.balance_rel >= 1, "balance_rel", f"must be >= 1, got "
                     f"{self.balance_rel!r}")
        self.require(0 <= self.min_match <= 1, "min_match", f"must be in [0, 1], got "
                     f"{self.min_match!r}")
        self.require(self.index_blocks >= 1, "index_blocks", f"must be >= 1, got "
                     f"{self.index_blocks}")
        check_metric(self, "metric", self.metric)
        self.index = PrefixIndex(0, self.index_blocks)

    def start(self, num_replicas: int, rng: np.random.Generator) -> None:
        """A fresh, empty prefix index per run."""
        super().start(num_replicas, rng)
        self.index = PrefixIndex(num_replicas, self.index_blocks)

    def route(self, request: Arrival, loads: Sequence[ReplicaLoad]) -> int:
        """Best prefix match within the load balance; remember where the chain went."""
        choice = self._choose(request, loads)
        self.index.record(choice, request.block_hashes)
        return choice

    def _choose(self, request: Arrival, loads: Sequence[ReplicaLoad]) -> int:
        least = lightest(loads, self.metric)
        hashes = request.block_hashes
        if not hashes or self._unbalanced(loads):
            return least
        matches = [self.index.match(i, hashes) for i in range(len(loads))]
        best = max(matches)
        if best == 0 or best < self.min_match * len(hashes):
            return least
        return lightest(loads, self.metric, among=[i for i, m in enumerate(matches) if m == best])

    def _unbalanced(self, loads: Sequence[ReplicaLoad]) -> bool:
        counts = [s.num_outstanding for s in loads]
        most, fewest = max(counts), min(counts)
        return most - fewest > self.balance_abs and most > self.balance_rel * fewest
