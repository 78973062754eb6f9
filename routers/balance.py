"""Routers that ignore prefixes: round robin, random, and the load-balancing family.

- ``round_robin``: the i-th arrival goes to replica ``i mod N`` (what batchsim did before it
  had routers, so a round-robin cluster reproduces those runs exactly).
- ``random``: uniformly at random (the run's seeded generator).
- ``least_outstanding_requests``: join the shortest queue (waiting + running, per unit of
  capacity).
- ``least_outstanding_tokens``: the work-based shortest queue (uncomputed prefill tokens plus
  one per decoding request, per unit of capacity), SplitwiseSim's token-JSQ.
- ``least_kv_usage``: the replica with the smallest share of its KV cache in use.
- ``power_of_two``: sample ``choices`` distinct replicas at random, send to the lightest of them
  by ``metric`` (Mitzenmacher's power of two choices: near-JSQ balance from two probes).
Ties always go to the lowest index, so every router is deterministic given the seed.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from routers.base import Router, apply_rule, check_metric, lightest, register
from sim.core import load_arrays as la
from sim.core.routing import Arrival, ReplicaLoad


@register("round_robin")
@dataclass
class RoundRobin(Router):
    """Replicas in turn, by arrival order."""

    reads_loads: ClassVar[bool] = False

    def __post_init__(self) -> None:
        super().__post_init__()
        self._next = 0

    def start(self, num_replicas: int, rng: np.random.Generator) -> None:
        """Start at replica 0: a router object passed to several runs routes each alike."""
        super().start(num_replicas, rng)
        self._next = 0

    def route(self, request: Arrival, loads: Sequence[ReplicaLoad]) -> int:
        """The next replica in turn."""
        choice = self._next % len(loads)
        self._next += 1
        return choice


@register("random")
@dataclass
class Random(Router):
    """A uniformly random replica."""

    reads_loads: ClassVar[bool] = False

    def route(self, request: Arrival, loads: Sequence[ReplicaLoad]) -> int:
        """A replica drawn from the run's generator."""
        return int(self.rng.integers(len(loads)))


@register("least_outstanding_requests")
@dataclass
class LeastOutstandingRequests(Router):
    """Join the shortest queue, counted in requests."""

    rule: ClassVar[int] = la.REQUESTS

    def route(self, request: Arrival, loads: Sequence[ReplicaLoad]) -> int:
        """The replica with the fewest outstanding requests per unit of capacity."""
        return apply_rule(self.rule, loads)


@register("least_outstanding_tokens")
@dataclass
class LeastOutstandingTokens(Router):
    """Join the shortest queue, counted in tokens of work."""

    rule: ClassVar[int] = la.TOKENS

    def route(self, request: Arrival, loads: Sequence[ReplicaLoad]) -> int:
        """The replica with the fewest outstanding tokens per unit of capacity."""
        return apply_rule(self.rule, loads)


@register("least_kv_usage")
@dataclass
class LeastKVUsage(Router):
    """The emptiest KV cache; ties broken by outstanding requests."""

    rule: ClassVar[int] = la.EMPTIEST_KV

    def route(self, request: Arrival, loads: Sequence[ReplicaLoad]) -> int:
        """The replica with the smallest KV usage (then fewest requests)."""
        return apply_rule(self.rule, loads)


@register("power_of_two")
@dataclass
class PowerOfTwo(Router):
    """The lighter of ``choices`` randomly sampled replicas."""

    choices: int = 2
    metric: str = "requests"

    def __post_init__(self) -> None:
        super().__post_init__()
        self.require(self.choices >= 1, "choices", f"must be >= 1, got {self.choices}")
        check_metric(self, "metric", self.metric)

    def route(self, request: Arrival, loads: Sequence[ReplicaLoad]) -> int:
        """Sample distinct replicas, keep the lightest by ``metric``."""
        n = len(loads)
        if n <= self.choices:
            return lightest(loads, self.metric)
        sample = sorted(self.rng.choice(n, size=self.choices, replace=False).tolist())
        return lightest(loads, self.metric, among=sample)
