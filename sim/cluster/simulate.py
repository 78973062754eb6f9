"""``sim.simulate`` with a router: identical replicas behind one router, on one clock.

Without ``router`` (or with a plain ``round_robin`` that has no latency or staleness, which is
the static split the engine does anyway) this is the engine's ``simulate``, bit for bit. With
any other router the replicas run on the general engine, driven from outside
(``sim.cluster.routed``), and the result carries the routing metrics
(``sim.cluster.metrics``) and a per-replica table (``SimResult.replicas``).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from routers import Router, make_router
from routers.balance import RoundRobin
from sim.cluster.metrics import imbalance, per_replica
from sim.cluster.routed import RoutingLog, run_routed
from sim.core.arrays import TraceArrays
from sim.core.types import Request
from sim.engine.replica import Replica
from sim.engine.simulate import SimResult
from sim.engine.simulate import simulate as simulate_replicas

#: Spawn key of the router's random stream: independent of any other use of the seed.
ROUTER_STREAM = 0x524F5554


class RoutedDriver:
    """Feeds the engine's replicas through a router; keeps the routing log."""

    def __init__(self, router: Router, seed: int) -> None:
        self.router = router
        self.seed = seed
        self.log = RoutingLog()

    def __call__(self, reqs: list[Request], replicas: list[Replica]) -> None:
        """Route every request and run the replicas to the end."""
        rng = np.random.default_rng(np.random.SeedSequence(self.seed, spawn_key=(ROUTER_STREAM,)))
        block = replicas[0].pool.config.block_size if replicas else 16
        self.log = run_routed(reqs, replicas, self.router, rng, hash_block_tokens=block)


def is_static(router: Router) -> bool:
    """True for the router the engine's fixed split already is (round robin, no latency or
    staleness): such runs keep every fast path and today's exact results."""
    return type(router) is RoundRobin and router.latency_s == 0


def simulate(requests: Sequence[Request] | TraceArrays, policy: Any, cost: Any,
             kv: Any = "auto", seed: int = 0, *, num_replicas: int = 1,
             router: str | Mapping[str, Any] | Router | None = None, **options: Any
             ) -> SimResult:
    """``sim.engine.simulate.simulate`` behind ``router`` (see the module docstring).

    ``router`` is a router spec such as ``{"name": "least_outstanding_tokens"}`` (see
    ``routers``); every other argument is the engine's.
    """
    if router is None:
        return simulate_replicas(requests, policy, cost, kv, seed, num_replicas=num_replicas,
                                 **options)
    chosen = make_router(router)
    if is_static(chosen):
        return simulate_replicas(requests, policy, cost, kv, seed, num_replicas=num_replicas,
                                 **options)
    driver = RoutedDriver(chosen, seed)
    result = simulate_replicas(requests, policy, cost, kv, seed, num_replicas=num_replicas,
                               driver=driver, **options)
    result.summary.update(imbalance(driver.log, result.steps, num_replicas))
    result.summary["router"] = chosen.name
    result.replicas = per_replica(result.requests, result.steps, num_replicas)
    result.routing = driver.log
    return result
