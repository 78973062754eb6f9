"""Routing on one clock: a router process hands each arrival to a replica as it comes.

The cluster owns the clock (a SimPy environment). Its router process wakes at each arrival in
arrival order (ties by id), brings every replica up to that instant (``Replica.advance_until``:
steps ending by then are committed, a step in flight stays in flight), reads their loads
(``sim.cluster.loads``), asks the router, and admits the request to the chosen replica — at
once, or ``latency_s`` later when routing takes time (the request is then in nobody's queue
meanwhile). After the last arrival every replica is closed and run to the end.

Over compiled replicas with no routing latency the whole loop runs compiled
(``sim.engine.compiled_route``): the router's rule itself when it is a whole rule of
``sim.core.load_arrays`` (``Router.rule``), else the router called per arrival with the
loads as arrays (``sim.core.load_arrays.Loads``). Same decisions, same log.

Exactness: a replica advanced to ``t`` and then given a request at ``t`` plans exactly as if
the request had been in its own arrival list (the engine's same-time rule), so the router's
choice is the only thing that differs from a static split. Replicas interact only through the
router, so advancing them lazily (all of them at each routing instant) is exact.
"""
from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy

from routers import Router
from sim.cluster.loads import LoadBoard
from sim.core import load_arrays as la
from sim.core.blocks import block_hashes
from sim.core.routing import Arrival, prefix_chain
from sim.core.types import Request

if TYPE_CHECKING:
    from sim.engine.replica import Replica


@dataclass
class RoutingLog:
    """One row per routing decision: when, which request, where it went, and the live
    outstanding requests of every replica at that instant (for the imbalance metrics).

    Lists while a Python loop appends to them; numpy arrays (``outstanding``: one row per
    decision) from the compiled router. Compare them through ``numpy.asarray``.
    """

    time_s: Any = field(default_factory=list)
    request_id: Any = field(default_factory=list)
    replica: Any = field(default_factory=list)
    outstanding: Any = field(default_factory=list)


class PrefixChains:
    """Prefix hash chains of the ``prefix_id`` shorthand, memoized per prefix id.

    Turns of one conversation share a chain that only grows, so each block is hashed once.
    """

    def __init__(self, block_tokens: int) -> None:
        self.block_tokens = block_tokens
        self._chains: dict[str, tuple[int, ...]] = {}

    def of(self, req: Request) -> tuple[int, ...]:
        """The chain of ``req``'s shared prefix (empty without a ``prefix_id``)."""
        if req.hash_ids:  # per request: hashed once per 512 tokens (``sim.core.blocks``)
            return block_hashes(req, self.block_tokens)
        if req.prefix_id is None or req.num_prefix_tokens < self.block_tokens:
            return ()
        need = req.num_prefix_tokens // self.block_tokens
        chain = self._chains.get(req.prefix_id, ())
        if len(chain) < need:
            chain = prefix_chain(req.prefix_id, need * self.block_tokens, self.block_tokens)
            self._chains[req.prefix_id] = chain
        return chain[:need]


def arrival_of(req: Request, chains: PrefixChains) -> Arrival:
    """What the router may know of ``req`` (never its output length)."""
    session = req.prefix_id if req.prefix_id is not None else req.tenant
    return Arrival(req.id, req.arrival_s, req.num_prompt_tokens, req.priority, session,
                   chains.of(req), chains.block_tokens)


def run_routed(reqs: Sequence[Request], replicas: Sequence[Replica], router: Router,
               rng: np.random.Generator, hash_block_tokens: int,
               weights: Sequence[float] | None = None) -> RoutingLog:
    """Route ``reqs`` (in arrival order) over ``replicas`` and run everything to the end."""
    router.start(len(replicas), rng)
    chains = PrefixChains(hash_block_tokens)
    if (router.latency_s == 0 and replicas
            and all(getattr(rep, "routes_compiled", False) for rep in replicas)):
        return _route_compiled(reqs, replicas, router, chains, weights)
    board = LoadBoard(replicas, router.refresh_s, weights)
    log = RoutingLog()
    env = simpy.Environment()
    env.process(_route_all(env, reqs, replicas, router, board, chains, log))
    env.run()
    for rep in replicas:
        rep.close()
    for rep in replicas:
        rep.advance_until(math.inf)
    return log


def _route_compiled(reqs: Sequence[Request], replicas: Sequence[Any], router: Router,
                    chains: PrefixChains, weights: Sequence[float] | None) -> RoutingLog:
    """``run_routed`` in one compiled loop (``sim.engine.compiled_route``)."""
    from sim.engine.compiled_route import route_all

    n, num = len(reqs), len(replicas)

    def pick(j: int, loads: la.Loads) -> int:
        return _checked(router, router.route(arrival_of(reqs[j], chains), loads), num)

    cols = getattr(reqs, "columns", None)  # ``Arrivals``: no Request read unless picked
    if cols is None:
        cols = {name: np.fromiter((getattr(r, name) for r in reqs),
                                  np.float64 if name == "arrival_s" else np.int64, n)
                for name in ("id", "arrival_s", "num_prompt_tokens", "num_output_tokens",
                             "priority")}
    assign, outstanding = route_all(
        replicas, cols["id"], cols["arrival_s"], cols["num_prompt_tokens"],
        cols["num_output_tokens"], cols["priority"],
        type(router).__dict__.get("rule", la.NO_RULE), pick, router.refresh_s,
        weights if weights is not None else [1.0] * num)
    return RoutingLog(cols["arrival_s"], cols["id"], assign, outstanding)


def _checked(router: Router, choice: int, num: int) -> int:
    """``choice``, once it is a replica's index."""
    if not 0 <= choice < num:
        raise RuntimeError(f"router {router.name!r} chose replica {choice} of {num}")
    return choice


def _route_all(env: simpy.Environment, reqs: Sequence[Request], replicas: Sequence[Replica],
               router: Router, board: LoadBoard, chains: PrefixChains, log: RoutingLog):  # noqa: ANN202 - a SimPy generator
    """The router process: one decision per arrival, admissions after ``latency_s``."""
    in_transit: list[tuple[float, int, int, Request]] = []  # (admit at, order, replica, req)
    latency = router.latency_s
    for order, req in enumerate(reqs):
        t = req.arrival_s
        yield env.timeout(max(0.0, t - env.now))
        _deliver(in_transit, replicas, until=t)
        for rep in replicas:
            rep.advance_until(t)
        loads = board.read(t)
        choice = _checked(router, router.route(arrival_of(req, chains), loads), len(replicas))
        log.time_s.append(t)
        log.request_id.append(req.id)
        log.replica.append(choice)
        log.outstanding.append([s.num_outstanding for s in board.live(t)]
                               if board.refresh_s > 0 else [s.num_outstanding for s in loads])
        if latency > 0:
            heapq.heappush(in_transit, (t + latency, order, choice, req))
        else:
            replicas[choice].admit(req)
    _deliver(in_transit, replicas, until=math.inf)


def _deliver(in_transit: list[tuple[float, int, int, Request]], replicas: Sequence[Replica],
             until: float) -> None:
    """Admit every routed request whose routing latency has elapsed by ``until``."""
    while in_transit and in_transit[0][0] <= until:
        at, _, choice, req = heapq.heappop(in_transit)
        rep = replicas[choice]
        rep.advance_until(at)
        rep.admit(req)
