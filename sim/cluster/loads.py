"""What a router reads of each replica: ``ReplicaLoad`` values, live or as of the last poll.

A replica's load is counted from its queues at the routing instant: waiting requests (the
preempted and the just-admitted included), running ones (the step in flight included), their
uncomputed prefill tokens and how many are decoding, and its KV blocks in use. Real routers
poll a metrics endpoint; ``LoadBoard`` re-reads every replica at most every ``refresh_s`` and
otherwise hands out the last reading, so a stale picture (and the herding it causes) is
simulated rather than assumed away.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from sim.core.routing import ReplicaLoad
from sim.engine.drive import kv_used_blocks, outstanding

if TYPE_CHECKING:
    from sim.engine.replica import Replica


def replica_load(rep: Replica, now_s: float, weight: float = 1.0, group: str = ""
                 ) -> ReplicaLoad:
    """``rep``'s load signals now (``sim.engine.drive.outstanding``, less the true output
    lengths a router cannot know); a compiled replica counts its own
    (``sim.engine.compiled_drive``)."""
    counted = getattr(rep, "router_load", None)
    if counted is not None:
        return counted(now_s, weight, group)
    work = outstanding(rep)
    cfg = rep.pool.config
    return ReplicaLoad(index=rep.index, num_waiting=work.num_queued,
                       num_running=len(rep.running),
                       outstanding_prefill_tokens=work.prefill_tokens,
                       num_decoding=work.num_decoding,
                       kv_used_blocks=kv_used_blocks(rep, now_s),
                       kv_total_blocks=0 if cfg.unlimited else cfg.num_blocks,
                       weight=weight, group=group, measured_s=now_s)


class LoadBoard:
    """Every replica's load as the router sees it: live, or polled every ``refresh_s``."""

    def __init__(self, replicas: Sequence[Replica], refresh_s: float,
                 weights: Sequence[float] | None = None,
                 groups: Sequence[str] | None = None) -> None:
        self.replicas = replicas
        self.refresh_s = refresh_s
        self.weights = list(weights) if weights is not None else [1.0] * len(replicas)
        self.groups = list(groups) if groups is not None else [""] * len(replicas)
        self._last: list[ReplicaLoad] | None = None
        self._read_at = -float("inf")

    def live(self, now_s: float) -> list[ReplicaLoad]:
        """Every replica's load at ``now_s``."""
        return [replica_load(rep, now_s, w, g)
                for rep, w, g in zip(self.replicas, self.weights, self.groups, strict=True)]

    def read(self, now_s: float) -> list[ReplicaLoad]:
        """The loads the router sees at ``now_s`` (re-polled once ``refresh_s`` has passed)."""
        if self._last is None or self.refresh_s <= 0 or now_s >= self._read_at + self.refresh_s:
            self._last = self.live(now_s)
            self._read_at = now_s
        return self._last
