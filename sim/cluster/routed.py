"""Routing on one clock: a router process hands each arrival to a replica as it comes.

The cluster owns the clock (a SimPy environment). Its router process wakes at each arrival in
arrival order (ties by id), brings every replica up to that instant (``Replica.advance_until``:
steps ending by then are committed, a step in flight stays in flight), reads their loads
(``sim.cluster.loads``), asks the router, and admits the request to the chosen replica — at
once, or ``latency_s`` later when routing takes time (the request is then in nobody's queue
meanwhile). After the last arrival every replica is closed and run to the end.

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
from typing import TYPE_CHECKING

import numpy as np
import simpy

from routers import Router
from sim.cluster.loads import LoadBoard
from sim.core.blocks import block_hashes
from sim.core.routing import Arrival, prefix_chain
from sim.core.types import Request

if TYPE_CHECKING:
    from sim.engine.replica import Replica


@dataclass
class RoutingLog:
    """One row per routing decision: when, which request, where it went, and the live
    outstanding requests of every replica at that instant (for the imbalance metrics)."""

    time_s: list[float] = field(default_factory=list)
    request_id: list[int] = field(default_factory=list)
    replica: list[int] = field(default_factory=list)
    outstanding: list[list[int]] = field(default_factory=list)


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
    board = LoadBoard(replicas, router.refresh_s, weights)
    chains = PrefixChains(hash_block_tokens)
    log = RoutingLog()
    env = simpy.Environment()
    env.process(_route_all(env, reqs, replicas, router, board, chains, log))
    env.run()
    for rep in replicas:
        rep.close()
    for rep in replicas:
        rep.advance_until(math.inf)
    return log


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
        choice = router.route(arrival_of(req, chains), loads)
        if not 0 <= choice < len(replicas):
            raise RuntimeError(f"router {router.name!r} chose replica {choice} of "
                               f"{len(replicas)}")
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
