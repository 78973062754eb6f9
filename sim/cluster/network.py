"""Links that KV transfers share: bandwidth, latency and max-min fair sharing, on SimPy's clock.

A transfer crosses a path of links (a GPU's NIC out, the peer's NIC in; an NVLink switch
inside a node). It first waits out the path's latency (the sum of its links' latencies), then
its bytes flow. While several transfers flow, each link's bandwidth is divided max-min fairly
among the flows crossing it (progressive filling: the most constrained link fixes the rate of
its flows, the rest share what is left), the standard model of fair TCP/RDMA flows; rates are
recomputed whenever a flow starts or ends, and are constant in between, so a transfer's end
time is exact: alone on its path, ``start + latency + bytes / bandwidth``; two equal transfers
started together on one link each take twice the bandwidth time.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import simpy
from simpy.core import URGENT

from sim.core.errors import InputError

#: Bytes below which a flow counts as delivered (float rounding of rate x time).
_DONE_BYTES = 1e-6


@dataclass(frozen=True)
class LinkSpec:
    """One link: its bandwidth in bytes per second and its latency in seconds."""

    name: str
    bandwidth_bytes_per_s: float
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        if not (self.bandwidth_bytes_per_s > 0 and math.isfinite(self.bandwidth_bytes_per_s)):
            raise InputError(f"must be a finite number > 0, got {self.bandwidth_bytes_per_s!r}",
                             field=f"links.{self.name}.bandwidth")
        if not (self.latency_s >= 0 and math.isfinite(self.latency_s)):
            raise InputError(f"must be a finite number >= 0, got {self.latency_s!r}",
                             field=f"links.{self.name}.latency_s")


@dataclass
class Flow:
    """A transfer in progress: its path, the bytes left, its current rate and its event."""

    path: tuple[str, ...]
    nbytes: float
    remaining: float
    done: simpy.Event
    started_s: float
    rate: float = 0.0


@dataclass
class LinkUsage:
    """What one link carried: bytes, and seconds during which at least one flow crossed it."""

    bytes: float = 0.0
    busy_s: float = 0.0


@dataclass
class Network:
    """Links and the transfers crossing them, on ``env``'s clock."""

    env: simpy.Environment
    links: Mapping[str, LinkSpec]
    flows: list[Flow] = field(default_factory=list)
    usage: dict[str, LinkUsage] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.usage = {name: LinkUsage() for name in self.links}
        self._latency: dict[tuple[str, ...], float] = {}  # of each path used so far
        self._last_s = self.env.now
        # its first round now: a process would run it on its start event, at this instant,
        # with no flow yet to rate either way
        self._control()

    def transfer(self, path: Sequence[str], nbytes: float) -> simpy.Event:
        """Start moving ``nbytes`` over ``path`` now; the event fires when the last byte lands
        (its value: the landing time)."""
        for name in path:
            if name not in self.links:
                raise InputError(f"unknown link {name!r}; known: {', '.join(self.links)}",
                                 field="links")
        done = self.env.event()
        hops, size = tuple(path), float(nbytes)
        # the start is taken up as a process's first step would be (an urgent event now),
        # without a process: the same events in the same order, less a generator's
        start = simpy.Event(self.env)
        start._ok, start._value = True, None
        start.callbacks.append(lambda _: self._start(hops, size, done))
        self.env.schedule(start, URGENT)
        return done

    def _start(self, path: tuple[str, ...], nbytes: float, done: simpy.Event) -> None:
        """Wait out the path's latency, then let the bytes flow."""
        latency = self._latency.get(path)
        if latency is None:  # the same sum, once per path
            latency = self._latency[path] = sum(self.links[name].latency_s for name in path)
        if latency > 0:
            wait = self.env.timeout(latency)
            wait.callbacks.append(lambda _: self._flow(path, nbytes, done))
        else:
            self._flow(path, nbytes, done)

    def _flow(self, path: tuple[str, ...], nbytes: float, done: simpy.Event) -> None:
        """The bytes start flowing now (none to move: delivered at once)."""
        if nbytes <= 0 or not path:
            done.succeed(self.env.now)
            return
        self._advance()
        self.flows.append(Flow(path, nbytes, nbytes, done, self.env.now))
        self._wake()

    def _wake(self) -> None:
        if not self._changed.triggered:
            self._changed.succeed()

    def _advance(self) -> None:
        """Move every flow on by its rate over the time since the last change."""
        now = self.env.now
        dt = now - self._last_s
        if dt > 0:
            busy: set[str] = set()
            for f in self.flows:
                moved = min(f.remaining, f.rate * dt)
                f.remaining -= moved
                for name in f.path:
                    self.usage[name].bytes += moved
                busy.update(f.path)
            for name in busy:
                self.usage[name].busy_s += dt
        self._last_s = now

    def _control(self, _: simpy.Event | None = None) -> None:
        """The controller: re-rate the flows at each start or end, wake at the next end. A
        callback of the event it waits on, which runs it where a process waiting on that
        event would resume (the same events, without a generator's resumes)."""
        self._advance()
        for f in [f for f in self.flows if f.remaining <= _DONE_BYTES * max(1.0, f.nbytes)]:
            self.flows.remove(f)
            f.done.succeed(self.env.now)
        fair_rates(self.flows, self.links)
        self._changed = self.env.event()
        waits: list[simpy.Event] = [self._changed]
        if self.flows:
            dt = min(f.remaining / f.rate for f in self.flows)
            waits.append(self.env.timeout(dt))
        # ``env.any_of(waits)`` without a condition's bookkeeping: an event the first of them
        # triggers (scheduled then, as the condition would be), whose callback is the next
        # round
        wake = self.env.event()

        def first(_: simpy.Event) -> None:
            if not wake.triggered:
                wake.succeed()
        for w in waits:
            w.callbacks.append(first)
        wake.callbacks.append(self._control)


def fair_rates(flows: Sequence[Flow], links: Mapping[str, LinkSpec]) -> None:
    """Set each flow's max-min fair rate (progressive filling over the links they cross)."""
    # the bandwidth left on each link the flows cross (no other link is read)
    left = {name: links[name].bandwidth_bytes_per_s for f in flows for name in f.path}
    pending = list(flows)
    while pending:
        users: dict[str, int] = {}
        for f in pending:
            for name in f.path:
                users[name] = users.get(name, 0) + 1
        share, bottleneck = min((left[name] / n, name) for name, n in users.items())
        fixed = [f for f in pending if bottleneck in f.path]
        for f in fixed:
            f.rate = share
            for name in f.path:
                left[name] -= share
        pending = [f for f in pending if bottleneck not in f.path]
