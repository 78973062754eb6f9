"""The router interface and registry: one method, ``route(request, loads) -> replica index``.

Routers are small dataclasses registered by name, built from a YAML-style mapping by
``make_router`` (an unknown name or parameter is a ``RouterError`` naming ``router.<key>`` and
listing what is accepted). A router may keep state across one run (a round-robin counter, a
session table, an index of the prefixes it sent where), so every run builds its own; ``start``
hands it the number of replicas and the run's random generator before the first request.

Two parameters every router has, applied by the cluster rather than the router itself:
``refresh_s`` (load signals are re-read at most this often: real routers poll metrics, so a
decision may see a stale picture; 0 means live) and ``latency_s`` (a routing decision delays the
request by this long before it joins its replica's queue).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from sim.core import load_arrays as la
from sim.core.errors import InputError
from sim.core.plugins import Registry
from sim.core.routing import Arrival, ReplicaLoad


class RouterError(InputError):
    """A router name or parameter is unknown or invalid."""


@dataclass
class Router:
    """Base class of every router (see the module docstring for the shared parameters)."""

    name: ClassVar[str] = "router"
    #: The whole rule ``route`` applies when it is one of ``sim.core.load_arrays``'s (then a
    #: compiled router may apply it itself; read from the class that declares it, so a
    #: subclass with its own ``route`` is never mistaken for it); ``NO_RULE`` otherwise.
    rule: ClassVar[int] = la.NO_RULE
    #: Whether ``route`` reads the replicas' loads (round robin and random do not: a
    #: ``refresh_s`` then has nothing to make stale, and is refused rather than ignored).
    reads_loads: ClassVar[bool] = True
    refresh_s: float = 0.0
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        for key in ("refresh_s", "latency_s"):
            value = getattr(self, key)
            self.require(value >= 0, key, f"must be a number of seconds >= 0, got {value!r}")
        self.require(self.reads_loads or not self.refresh_s, "refresh_s",
                     f"has no effect: {self.name} reads no load signals, so there is nothing "
                     f"to refresh; drop it, got {self.refresh_s!r}")
        self.num_replicas = 0
        self.rng = np.random.default_rng(0)

    def start(self, num_replicas: int, rng: np.random.Generator) -> None:
        """Prepare for a run over ``num_replicas`` replicas (>= 1), drawing from ``rng``."""
        self.num_replicas = num_replicas
        self.rng = rng

    def route(self, request: Arrival, loads: Sequence[ReplicaLoad]) -> int:
        """The index of the replica ``request`` joins; ``loads[i].index == i``."""
        raise NotImplementedError

    def require(self, ok: bool, field: str, problem: str) -> None:
        """Raise a ``RouterError`` naming this router's parameter unless ``ok``."""
        if not ok:
            raise RouterError(problem, field=f"router.{field}")


ROUTERS: Registry[Router] = Registry("router", RouterError)
register: Callable[[str], Callable[[type[Router]], type[Router]]] = ROUTERS.register


def make_router(spec: str | Mapping[str, Any] | Router) -> Router:
    """Build a router from ``"name"`` or ``{"name": ..., **params}`` (or pass one through)."""
    return spec if isinstance(spec, Router) else ROUTERS.make(spec)


def registered() -> dict[str, type[Router]]:
    """Every registered router by name."""
    return ROUTERS.registered()


def _metric(code: int) -> Callable[[ReplicaLoad], float]:
    def of(s: ReplicaLoad) -> float:
        return la.measure(s.num_waiting, s.num_running, s.outstanding_prefill_tokens,
                          s.num_decoding, s.kv_used_blocks, s.kv_total_blocks, s.weight, code)
    return of


#: Load measures a router can balance on, each "lower is lighter" and per unit of capacity
#: (``sim.core.load_arrays.measure``).
LOAD_METRICS: dict[str, Callable[[ReplicaLoad], float]] = {
    name: _metric(code) for code, name in enumerate(la.METRICS)}


def lightest(loads: Sequence[ReplicaLoad], metric: str = "requests",
             among: Sequence[int] | None = None) -> int:
    """The index of the lightest replica by ``metric``; ties go to the lowest index
    (``sim.core.load_arrays.lightest_among``)."""
    arrays = la.Loads.of(loads)
    candidates = (np.arange(len(arrays), dtype=np.int64) if among is None
                  else np.asarray(among, dtype=np.int64))
    return la.lightest_among(arrays.counts, arrays.weight, arrays.kv_total,
                             la.METRICS.index(metric), candidates)


def apply_rule(rule: int, loads: Sequence[ReplicaLoad]) -> int:
    """The replica a whole rule of ``sim.core.load_arrays`` picks (``Router.rule``)."""
    arrays = la.Loads.of(loads)
    return la.choose(rule, arrays.counts, arrays.weight, arrays.kv_total,
                     np.arange(len(arrays), dtype=np.int64))


def check_metric(router: Router, field: str, metric: str) -> None:
    """Validate a load-metric parameter."""
    router.require(metric in LOAD_METRICS, field,
                   f"unknown load metric {metric!r}; accepted: {', '.join(LOAD_METRICS)}")
