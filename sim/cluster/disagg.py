"""Disaggregated serving on one clock: prefill replicas, KV transfers over links, decode replicas.

A request is routed (the cluster's ``router``) to a prefill replica, which computes its prompt
and samples the first token (its TTFT) as a request of one output token. The finished prefill
keeps its KV there (``hold_kv``) and is routed, once, by the ``decode_router`` to a decode
replica, where it joins that replica's reservation queue (first come, first served). When the
decode replica has a batch slot and the blocks for the prompt's KV free, with headroom
(``_reserve``), it reserves them (``reserve_kv``) and the transfer starts
(``sim.cluster.network``, the paths of ``sim.cluster.kv_links``). When its last byte lands the
KV is released on the prefill replica (``release_held``) and the request joins the decode
replica's waiting queue with its prompt computed (``land_kv``): its next step is a decode step
there. So no request decodes before its KV has landed, none is lost while it waits, and a full
decode pool holds finished prefills on their prefill replicas, whose own admissions then see
less free KV (back-pressure).

A decode replica that preempts a request (recompute) recomputes its prompt and generated tokens
itself, from its own queue; the KV is never sent twice. Swap preemption there swaps as usual.

Exactness, as ``sim.cluster.routed``: replicas interact only through this driver, which wakes
at every time something can cross between them — an arrival, a prefill replica's step end (a
prefill may finish), a transfer landing, and, while a reservation waits, a decode replica's step
end (blocks may free) — advances every replica to it, applies what happened, and lets the
replicas plan at that instant after all of it (the engine's same-time rule). Decode replicas
therefore keep exact event skipping whenever no reservation waits.
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import simpy

from routers import Router
from sim.cluster.groups import check_no_latency
from sim.cluster.handoff import Side, TransferLog, blocks_to_reserve, record
from sim.cluster.kv_links import Topology
from sim.cluster.loads import LoadBoard
from sim.cluster.network import Network
from sim.cluster.routed import PrefixChains, RoutingLog, arrival_of
from sim.core import load_arrays as la
from sim.core.load_arrays import WAITING, Loads
from sim.core.types import Request
from sim.engine.replica import never_fits
from sim.engine.validate import EngineError


@dataclass
class DisaggDriver:
    """Runs requests through prefill replicas, links and decode replicas (module doc)."""

    prefill: Sequence[Side]  # general-engine or compiled replicas (``sim.cluster.handoff``)
    decode: Sequence[Side]
    router: Router
    decode_router: Router
    topology: Topology
    bytes_per_token: Sequence[float]  # of each prefill replica's KV (its model, dtype, TP)
    block_tokens: int
    weights: tuple[Sequence[float], Sequence[float]] = ((), ())
    log: RoutingLog = field(default_factory=RoutingLog)
    decode_log: RoutingLog = field(default_factory=RoutingLog)
    #: Per group (prefill groups first): why it ran on the general engine ('' compiled).
    reasons: list[str] = field(default_factory=list)
    #: Requests that ended on their prefill replica: rejected there, of one output token, or
    #: never to fit on their decode replica.
    num_ended_on_prefill: int = 0

    def run(self, reqs: Sequence[Request], rngs: tuple[np.random.Generator, np.random.Generator]
            ) -> TransferLog:
        """Serve ``reqs`` (in arrival order) to the end; return what their KV did."""
        check_no_latency(self.router, self.decode_router)  # parse_groups checked it first
        n_p, n_d = len(self.prefill), len(self.decode)
        self.router.start(n_p, rngs[0])
        self.decode_router.start(n_d, rngs[1])
        self.board = LoadBoard(self.prefill, self.router.refresh_s, self.weights[0] or None)
        self.decode_board = LoadBoard(self.decode, self.decode_router.refresh_s,
                                      self.weights[1] or None)
        self.chains = PrefixChains(self.block_tokens)
        self._pick = self._picker(self.router, self.prefill)
        self._pick_decode = self._picker(self.decode_router, self.decode)
        self.reqs = reqs
        self.pos = {r.id: k for k, r in enumerate(reqs)}
        self.admitted: dict[int, Request] = {}  # what each prefill replica was handed, by id
        self.out = TransferLog.empty(len(reqs))
        self.env = simpy.Environment()
        self.net = Network(self.env, self.topology.links)
        self.queues: list[deque[int]] = [deque() for _ in range(n_d)]  # positions
        self.finished_prefills: list[tuple[float, int]] = []  # (time, position)
        self.landed: list[int] = []
        self.in_flight = 0
        self.settled = 0  # requests whose prefill finished or was rejected
        self.num_ended_on_prefill = 0
        self._loop()
        return self.out

    def _picker(self, router: Router, sides: Sequence[Side]) -> Callable[[Request, Loads], int]:
        """How ``router`` picks one of ``sides``: ``router.route``; or, over compiled replicas
        (numba is loaded), the router's whole rule when it has one (``Router.rule``),
        compiled, as the compiled routing loop applies it (``sim.engine.compiled_route``)."""
        rule = type(router).__dict__.get("rule", la.NO_RULE)
        if rule == la.NO_RULE or not all(getattr(s, "routes_compiled", False) for s in sides):
            chains = self.chains
            return lambda req, loads: router.route(arrival_of(req, chains), loads)
        from sim.engine.compiled_route import choose

        everyone = np.arange(len(sides), dtype=np.int64)
        return lambda req, loads: choose(rule, loads.counts, loads.weight, loads.kv_total,
                                         everyone)

    def _collect(self, now: float) -> None:
        """The prefills that finished (or were rejected) by ``now``."""
        pos = self.pos
        for rep in self.prefill:
            for t, rid, finished in rep.settled(now):
                if finished:
                    self.finished_prefills.append((t, pos[rid]))
                else:
                    self.num_ended_on_prefill += 1
                self.settled += 1

    # -- the loop -----------------------------------------------------------------------------
    def _loop(self) -> None:
        reqs, nxt, now = self.reqs, 0, 0.0
        everyone = [*self.prefill, *self.decode]
        advance = [rep.advance_until for rep in everyone]  # bound once: calls per event
        plan = [rep.plan_at for rep in everyone]
        while True:
            for run in advance:
                run(now)
            self._collect(now)
            self._land(now)
            while nxt < len(reqs) and reqs[nxt].arrival_s <= now:
                self._route_prefill(nxt, now)
                nxt += 1
            closed = nxt == len(reqs)
            if closed:  # a prefill replica's policy sees no more arrivals once it is empty
                for rep in self.prefill:
                    if rep.is_empty(now):
                        rep.close()
            self._hand_over(now)
            self._reserve(now)
            if closed and self._drained():
                break
            ahead = math.nextafter(now, math.inf)
            for run in plan:  # plan at ``now``, after everything that happened at ``now``
                run(ahead)
            later = self._next_time(now, reqs[nxt].arrival_s if nxt < len(reqs) else math.inf)
            if later is None and self._break_stall(now):
                now = math.nextafter(now, math.inf)  # where the replicas were planned to
                continue  # a decode replica gave KV back: it plans again
            if later is None and closed and self._close_prefill():
                now = math.nextafter(now, math.inf)  # where the replicas were planned to
                continue  # a policy holding a partial batch for more arrivals now runs it
            if later is None and any(rep.done for rep in everyone):
                break  # cut short (limits.horizon_s or wall_clock_s): the run is partial
            if later is None:
                raise EngineError(f"disaggregated cluster stalled at t={now:.6f}s: "
                                  f"{len(reqs) - self.settled} prefills unfinished, "
                                  f"{sum(map(len, self.queues))} waiting for decode blocks")
            now = later
        # nothing more reaches the decode side: run it out, still open, so that a replica stuck
        # behind KV that landed idles (and gives it back) instead of ending
        while True:
            for rep in self.decode:
                rep.advance_until(math.inf)
            if not self._break_stall():
                break
        for rep in everyone:
            rep.close()
        for rep in everyone:
            rep.advance_until(math.inf)

    def _close_prefill(self) -> bool:
        """Close every prefill replica that is still open, at a stall after the last arrival
        was routed: one is closed above only once empty, so a policy that waits for a full
        batch while arrivals may come (``static`` without a timeout) held its last partial
        batch forever (the run ended in "stalled"). True when one was closed: it plans again
        at once, as an admission would make it. Only runs that stalled take this path."""
        opened = [rep for rep in self.prefill if not rep.closed]
        for rep in opened:
            rep.close()
            rep.wake()
        return bool(opened)

    def num_done(self) -> int:
        """Requests finished or rejected so far, wherever they ended (a progress display
        reads it from another thread)."""
        return self.num_ended_on_prefill + sum(rep.num_settled for rep in self.decode)

    def _drained(self) -> bool:
        """Every prefill has finished and been sent: the decode side can be closed."""
        return (self.settled == len(self.reqs) and not self.in_flight
                and not any(self.queues) and not self.finished_prefills)

    def _next_time(self, now: float, arrival: float) -> float | None:
        """The next instant something may cross between replicas; runs the links up to it."""
        t = arrival
        waiting = any(self.queues)
        for rep in (*self.prefill, *self.decode) if waiting else self.prefill:
            t = min(t, rep.next_time())
        env = self.env
        if not self.in_flight:
            return None if t == math.inf else max(t, math.nextafter(now, math.inf))
        # the links' events up to the first landing or to ``t``: ``env.run`` until a wake-up
        # that a landing or a timer at ``t`` triggers, without those events (they act on
        # nothing else, so the links' events are the same, in the same order). The timer's
        # time is SimPy's (its clock plus the delay), and the clock ends there as it would
        at = env.now + max(0.0, t - env.now) if t < math.inf else math.inf
        landed, step, peek = self.landed, env.step, env.peek
        while not landed and peek() <= at:
            step()
        if not landed:
            env._now = at  # the timer's instant
        while peek() <= env.now:  # every landing at this same instant
            step()
        # the links keep their own float clock: never before the instant after ``now`` (the
        # replicas may have been advanced to it to plan at ``now``)
        return max(env.now if self.landed else t, math.nextafter(now, math.inf))

    def _on_landed(self, k: int) -> None:
        self.landed.append(k)  # ``_next_time`` stops the links there
        self.in_flight -= 1

    # -- what happens at one instant ----------------------------------------------------------
    def _route_prefill(self, k: int, now: float) -> None:
        req = self.reqs[k]
        loads = self.board.read_loads(now)
        choice = self._pick(req, loads)
        if not 0 <= choice < len(self.prefill):
            raise RuntimeError(f"router {self.router.name!r} chose prefill replica {choice} "
                               f"of {len(self.prefill)}")
        record(self.log, now, req.id, choice, loads)
        self.out.prefill_replica[k] = choice
        prefill = replace(req, num_output_tokens=1)  # its prompt and first token only
        self.admitted[req.id] = prefill
        self.prefill[choice].admit(prefill)

    def _hand_over(self, now: float) -> None:
        """Route each prefill that finished by ``now`` to a decode replica's reservation
        queue (requests of one output token are done: their KV is freed)."""
        done, self.finished_prefills = sorted(self.finished_prefills), []
        for t, k in done:
            req = self.reqs[k]
            self.out.prefill_done_s[k] = t
            if req.num_output_tokens <= 1:
                self.prefill[self.out.prefill_replica[k]].release_held(req.id)
                self.num_ended_on_prefill += 1
                continue
            loads = self._decode_loads(now)
            choice = self._pick_decode(req, loads)
            if not 0 <= choice < len(self.decode):
                raise RuntimeError(f"decode router {self.decode_router.name!r} chose decode "
                                   f"replica {choice} of {len(self.decode)}")
            record(self.decode_log, now, req.id, choice, loads)
            self.out.decode_replica[k] = len(self.prefill) + choice  # replica numbers
            rep = self.decode[choice]
            cfg = rep.kv
            why = never_fits(cfg, rep.max_model_len, req.num_prompt_tokens,
                             req.num_output_tokens)
            if not why and blocks_to_reserve(cfg, rep.watermark, req) > cfg.num_blocks:
                why = (f"its prompt's {req.num_prompt_tokens} tokens of KV and the reservation "
                       f"headroom exceed the {cfg.num_blocks} blocks of the cache")
            if why:
                self._unsendable(k, f"decode replica: {why}")
            else:
                self.queues[choice].append(k)

    def _break_stall(self, now: float | None = None) -> bool:
        """Nothing can happen any more: a decode replica that runs nothing while requests
        that landed hold its blocks (its queue's head, a preempted request, needs more than is
        free) preempts the newest of them (recompute), at ``now`` (default: where it stopped).
        False when none can."""
        moved = False
        for rep in self.decode:
            moved = rep.drop_landed_kv(now) or moved
        return moved

    def _decode_loads(self, now: float) -> Loads:
        """Decode replicas' loads, counting requests queued for or in transfer as waiting."""
        read = self.decode_board.read_loads(now)
        counts = read.counts.copy()  # the board's reading may be handed out again
        counts[:, WAITING] += [len(q) + len(rep.incoming)
                               for q, rep in zip(self.queues, self.decode, strict=True)]
        return Loads(counts, read.weight, read.kv_total, read.measured_s, read.groups)

    def _reserve(self, now: float) -> None:
        """Start every transfer whose decode replica can reserve its blocks now (in order).

        A reservation needs a batch slot for the request (the policy's ``max_num_seqs``, counting
        every request on the replica and in transit to it) and leaves free one block per request
        there (itself included) plus the policy's watermark: a request that landed is then
        admitted at once rather than waiting, holding its prompt's blocks, behind a batch it
        cannot join, and whatever runs there is preempted or finishes, the requests that landed
        can always be admitted for their next token."""
        for d, queue in enumerate(self.queues):
            rep = self.decode[d]
            seats = rep.slot_capacity
            while queue and not rep.has_preempted():  # an overloaded replica recomputes first
                there = rep.num_there(now)
                if seats is not None and there >= seats:
                    break  # no batch slot: it would wait there holding blocks
                free = rep.kv.num_blocks - rep.used_blocks(now)
                if blocks_to_reserve(rep.kv, rep.watermark, self.reqs[queue[0]]) + there > free:
                    break  # back-pressure: wait for blocks, holding the KV where it is
                self._send(queue.popleft(), d, now)

    def _send(self, k: int, d: int, now: float) -> None:
        """Reserve ``k``'s blocks on decode replica ``d`` and start moving its KV."""
        req = self.reqs[k]
        p = int(self.out.prefill_replica[k])
        self.decode[d].reserve_kv(req, req.num_prompt_tokens, float(self.out.prefill_done_s[k]))
        nbytes = self.bytes_per_token[p] * req.num_prompt_tokens
        self.out.kv_start_s[k] = now
        self.out.kv_bytes[k] = nbytes
        self.out.num_transfers[k] += 1
        env = self.env
        if env.now < now:  # the links' clock catches up with the cluster's
            # ``env.run(until=now)`` without its stop event and exception: the events before
            # the stop's time (the clock plus the delay, as SimPy places it; an urgent stop
            # there precedes any timeout at that time, and starts are scheduled at the
            # clock), and the clock ends there
            at = env.now + (now - env.now)
            step, peek = env.step, env.peek
            while peek() < at:
                step()
            env._now = at
        src, dst = p, len(self.prefill) + d
        flows = self.topology.flows(src, dst, nbytes)  # one at least (TP >= 1 on both sides)
        self.in_flight += 1
        # landed with its last flow: a count, not a SimPy condition (one event fewer); the
        # landing is still taken in at the end of that instant (``_next_time``)
        left = [len(flows)]

        def flow_done(_: simpy.Event) -> None:
            left[0] -= 1
            if not left[0]:
                self._on_landed(k)
        for path, b in flows:
            self.net.transfer(path, b).callbacks.append(flow_done)

    def _land(self, now: float) -> None:
        """KV that landed by ``now``: freed on the prefill side, queued on the decode side."""
        landed, self.landed = sorted(self.landed), []
        for k in landed:
            req = self.reqs[k]
            self.out.kv_landed_s[k] = now
            self.prefill[self.out.prefill_replica[k]].release_held(req.id)
            self.decode[self.out.decode_replica[k] - len(self.prefill)].land_kv(req.id)

    def _unsendable(self, k: int, why: str) -> None:
        """A request its decode replica's cache can never hold: rejected, its KV freed."""
        req = self.reqs[k]
        self.prefill[self.out.prefill_replica[k]].release_held(req.id)
        self.out.reject_reason[k] = why
        self.num_ended_on_prefill += 1
