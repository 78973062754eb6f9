"""``sim.simulate`` with a router: identical replicas behind one router, on one clock.

``cluster`` runs groups of different replicas (``sim.cluster.groups``). Without ``router``
(or with a plain ``round_robin`` that has no latency or staleness, which is
the static split the engine does anyway) this is the engine's ``simulate``, bit for bit. With
any other router the replicas run on the general engine, driven from outside
(``sim.cluster.routed``), and the result carries the routing metrics
(``sim.cluster.metrics``) and a per-replica table (``SimResult.replicas``).
"""
from __future__ import annotations

import inspect
import warnings
from collections.abc import Mapping, Sequence, Sized
from typing import Any

import numpy as np

from policies import DEFAULT_POLICY
from routers import Router, make_router
from routers.balance import RoundRobin
from sim.cluster.deployment import simulate_groups
from sim.cluster.groups import decode_router, is_disaggregated, parse_groups
from sim.cluster.metrics import imbalance, per_replica
from sim.cluster.routed import RoutingLog, run_routed
from sim.core.arrays import TraceArrays
from sim.core.errors import InputError
from sim.core.types import Request
from sim.engine.inputs import check_run_args
from sim.engine.replica import Replica
from sim.engine.simulate import SimResult
from sim.engine.simulate import simulate as simulate_replicas

#: Spawn key of the router's random stream: independent of any other use of the seed.
ROUTER_STREAM = 0x524F5554
#: Spawn key of a disaggregated cluster's decode router.
DECODE_ROUTER_STREAM = 0x44524F55


class RoutedDriver:
    """Feeds the engine's replicas through a router; keeps the routing log."""

    def __init__(self, router: Router, seed: int) -> None:
        self.router = router
        self.seed = seed
        self.log = RoutingLog()

    @property
    def compiled_blocker(self) -> str:
        """Why the replicas cannot be compiled ones ('' when they can: the engine then takes
        ``sim.engine.compiled_drive`` where its allow-list covers the run)."""
        return "a routing latency (requests in transit)" if self.router.latency_s > 0 else ""

    def __call__(self, reqs: list[Request], replicas: list[Replica]) -> None:
        """Route every request and run the replicas to the end."""
        rng = router_rng(self.seed)
        block = (getattr(replicas[0], "block_size", None) or replicas[0].pool.config.block_size
                 if replicas else 16)
        self.log = run_routed(reqs, replicas, self.router, rng, hash_block_tokens=block)


def is_static(router: Router) -> bool:
    """True for the router the engine's fixed split already is (round robin, no latency or
    staleness): such runs keep every fast path and today's exact results."""
    return type(router) is RoundRobin and router.latency_s == 0


#: ``simulate``'s own arguments, and the engine's that it passes on (``**options``; the
#: driver is the router's, never a caller's).
PUBLIC_ARGUMENTS = frozenset({"requests", "policy", "cost", "kv", "seed", "num_replicas",
                              "router", "cluster"})
ENGINE_OPTIONS = (frozenset(inspect.signature(simulate_replicas).parameters)
                  - PUBLIC_ARGUMENTS - {"driver"}) | {"cost_keys"}


def simulate(requests: Sequence[Request] | TraceArrays, policy: Any = None, cost: Any = None,
             kv: Any = "auto", seed: int = 0, *, num_replicas: int = 1,
             router: str | Mapping[str, Any] | Router | None = None,
             cluster: Mapping[str, Any] | None = None, **options: Any) -> SimResult:
    """``sim.engine.simulate.simulate`` behind ``router`` (see the module docstring).

    ``router`` is a router spec such as ``{"name": "least_outstanding_tokens"}`` (see
    ``routers``). ``cluster`` (``{"groups": [...]}``, the YAML ``cluster:`` block) makes a
    heterogeneous deployment (``sim.cluster.groups``): ``policy`` (``None``: ``DEFAULT_POLICY``,
    as a YAML without ``policy:``), ``cost`` and ``kv`` are
    then the defaults of groups that leave them out, and ``num_replicas`` is not used (a
    value other than 1 is noted, a ``UserWarning``).
    Every other argument is the engine's.
    """
    unknown = sorted(set(options) - ENGINE_OPTIONS)
    if unknown:
        raise InputError(f"unknown argument {unknown[0]!r}; accepted: "
                         f"{', '.join(sorted(ENGINE_OPTIONS | PUBLIC_ARGUMENTS))}",
                         field=unknown[0])
    if isinstance(requests, Sized) and not len(requests):
        raise InputError("no requests to simulate (an empty list)", field="requests")
    if policy is None:  # what a YAML without ``policy:`` runs
        policy = DEFAULT_POLICY
    if cluster is not None:
        # checked here as the engine checks them: the cluster path seeds its routers itself
        # (``router_rng``), and a negative seed was numpy's ValueError, not an InputError
        check_run_args(seed, num_replicas)
        if num_replicas != 1:  # as the YAML's parallelism.replicas beside a cluster block
            warnings.warn(f"num_replicas ({num_replicas!r}) is not used: the cluster's groups "
                          "set the replicas", UserWarning, stacklevel=2)
        return _simulate_cluster(requests, policy, cost, kv, seed, router, cluster,
                                 options.pop("cost_keys", None), options)
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


def router_rng(seed: int, stream: int = ROUTER_STREAM) -> np.random.Generator:
    """The router's random stream of a run with ``seed`` (``stream``: another router's)."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(stream,)))


def _simulate_cluster(requests: Sequence[Request] | TraceArrays, policy: Any, cost: Any,
                      kv: Any, seed: int, router: Any, cluster: Mapping[str, Any],
                      cost_keys: Mapping[str, Any] | None, options: dict[str, Any]
                      ) -> SimResult:
    """A heterogeneous deployment (``sim.cluster.deployment``)."""
    # groups of mixed replicas take the general engine; disaggregated pools the compiled
    # interpreter where it covers them (``sim.cluster.disagg_run.engine_blocker``)
    fast_path = options.pop("fast_path", True)
    chosen = make_router(router if router is not None else "round_robin")
    groups = parse_groups(cluster, policy=policy, kv=kv, cost=cost, cost_keys=cost_keys,
                          router=chosen)
    disagg = None
    if is_disaggregated(groups):
        disagg = {"decode_router": decode_router(cluster), "network": cluster.get("network"),
                  "decode_rng": router_rng(seed, DECODE_ROUTER_STREAM), "fast_path": fast_path}
    return simulate_groups(requests, groups, chosen, seed, rng=router_rng(seed), disagg=disagg,
                           **options)
