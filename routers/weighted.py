"""A weighted combination of scorers (the scorer/weight design of llm-d's and BLIS's routers).

Each scorer rates every replica in [0, 1], higher is better; the replica with the highest
weighted sum wins (ties: fewest outstanding requests, then lowest index). Scorers:

- ``queue``: 1 − outstanding requests / the most any replica has (per unit of capacity);
- ``tokens``: the same in outstanding tokens;
- ``kv``: 1 − KV usage;
- ``prefix``: share of the request's prefix hashes the replica is believed to hold
  (``routers.prefix_index``; the router records every chain it routes).

``scorers`` maps scorer names to weights >= 0, at least one of them > 0, e.g. ``{queue: 1,
prefix: 2}``; ``index_blocks`` sizes the prefix scorer's index (refused without that scorer).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from routers.base import LOAD_METRICS, Router, register
from routers.prefix_index import PrefixIndex
from sim.core.routing import Arrival, ReplicaLoad

SCORERS = ("queue", "tokens", "kv", "prefix")


def _relative(values: Sequence[float]) -> list[float]:
    """1 − value / max(values): the lightest scores 1, the heaviest 0 (all 1 when all are 0)."""
    top = max(values)
    return [1.0 - v / top if top > 0 else 1.0 for v in values]


@register("weighted")
@dataclass
class Weighted(Router):
    """Highest weighted sum of scorer ratings wins."""

    scorers: Mapping[str, Any] = field(default_factory=lambda: {"queue": 1.0, "prefix": 1.0})
    index_blocks: int = 65536

    def __post_init__(self) -> None:
        super().__post_init__()
        ok = isinstance(self.scorers, Mapping) and bool(self.scorers)
        self.require(ok, "scorers", f"expected a mapping of scorer -> weight, e.g. {{queue: 1, "
                     f"prefix: 2}}; got {self.scorers!r}")
        for name, weight in self.scorers.items():
            self.require(name in SCORERS, f"scorers.{name}",
                         f"unknown scorer; accepted: {', '.join(SCORERS)}")
            good = (isinstance(weight, (int, float)) and not isinstance(weight, bool)
                    and 0 <= weight < float("inf"))
            self.require(good, f"scorers.{name}", f"weight must be a number >= 0, got "
                         f"{weight!r}")
        # all weights 0: every replica scores 0 and the tie-break alone (fewest requests)
        # routes, which is least_outstanding_requests under another name
        self.require(any(w > 0 for w in self.scorers.values()), "scorers", "needs a scorer "
                     f"with a weight > 0, got {dict(self.scorers)!r}")
        self.require(self.index_blocks >= 1, "index_blocks", f"must be >= 1, got "
                     f"{self.index_blocks}")
        default = type(self).__dataclass_fields__["index_blocks"].default
        # only the prefix scorer reads the index: a size given without it would be ignored
        self.require(self.index_blocks == default or self.scorers.get("prefix", 0) > 0,
                     "index_blocks", f"has no effect: only the prefix scorer reads it, and "
                     f"scorers gives it no weight; got {self.index_blocks}")
        self.index = PrefixIndex(0, self.index_blocks)

    def start(self, num_replicas: int, rng: np.random.Generator) -> None:
        """A fresh, empty prefix index per run."""
        super().start(num_replicas, rng)
        self.index = PrefixIndex(num_replicas, self.index_blocks)

    def route(self, request: Arrival, loads: Sequence[ReplicaLoad]) -> int:
        """The best weighted score; the chosen replica now holds the request's chain."""
        total = [0.0] * len(loads)
        for name, weight in self.scorers.items():
            if weight:
                for i, score in enumerate(self._ratings(name, request, loads)):
                    total[i] += weight * score
        requests = LOAD_METRICS["requests"]
        choice = min(range(len(loads)), key=lambda i: (-total[i], requests(loads[i]), i))
        self.index.record(choice, request.block_hashes)
        return choice

    def _ratings(self, name: str, request: Arrival, loads: Sequence[ReplicaLoad]
                 ) -> list[float]:
        if name == "prefix":
            n = len(request.block_hashes)
            return [self.index.match(i, request.block_hashes) / n if n else 0.0
                    for i in range(len(loads))]
        measure: Callable[[ReplicaLoad], float] = {
            "queue": LOAD_METRICS["requests"], "tokens": LOAD_METRICS["tokens"],
            "kv": LOAD_METRICS["kv"]}[name]
        if name == "kv":
            return [1.0 - measure(s) for s in loads]
        return _relative([measure(s) for s in loads])
