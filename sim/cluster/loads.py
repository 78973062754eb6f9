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
from typing import TYPE_CHECKING, Any

import numpy as np

from sim.core.load_arrays import NUM_COUNTS, Loads
from sim.core.routing import ReplicaLoad
from sim.engine.drive import kv_used_blocks, outstanding

if TYPE_CHECKING:
    from sim.engine.replica import Replica
    from sim.kv.config import KVConfig


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
                       kv_total_blocks=kv_total_blocks(cfg),
                       weight=weight, group=group, measured_s=now_s)


def kv_total_blocks(cfg: KVConfig) -> int:
    """The KV size a router reads of a cache of this configuration (0: unlimited)."""
    return 0 if cfg.unlimited else cfg.num_blocks


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
        self._loads: Loads | None = None
        self._loads_at = -float("inf")
        self._kv_total: np.ndarray | None = None
        self._weight = np.zeros(0)

    def live(self, now_s: float) -> list[ReplicaLoad]:
        """Every replica's load at ``now_s``."""
        return [replica_load(rep, now_s, w, g)
                for rep, w, g in zip(self.replicas, self.weights, self.groups, strict=True)]

    def _due(self, read_at: float, now_s: float) -> bool:
        """Whether a reading taken at ``read_at`` is to be re-polled at ``now_s``."""
        return self.refresh_s <= 0 or now_s >= read_at + self.refresh_s

    def read(self, now_s: float) -> list[ReplicaLoad]:
        """The loads the router sees at ``now_s`` (re-polled once ``refresh_s`` has passed)."""
        if self._last is None or self._due(self._read_at, now_s):
            self._last = self.live(now_s)
            self._read_at = now_s
        return self._last

    def read_loads(self, now_s: float) -> Loads:
        """``read`` as arrays (``Loads``), of replicas that count their own load
        (``load_counts(now_s)`` and ``kv_total_blocks``: the hand-off sides of
        ``sim.cluster.handoff``), with no ``ReplicaLoad`` built unless a router asks for one."""
        if self._loads is None or self._due(self._loads_at, now_s):
            sides: Sequence[Any] = self.replicas
            if self._kv_total is None:
                self._kv_total = np.array([rep.kv_total_blocks for rep in sides],
                                          dtype=np.int64)
                self._weight = np.array(self.weights, dtype=np.float64)
            counts = np.array([rep.load_counts(now_s) for rep in sides],
                              dtype=np.int64).reshape(len(sides), NUM_COUNTS)
            self._loads = Loads(counts, self._weight, self._kv_total, now_s, self.groups)
            self._loads_at = now_s
        return self._loads
