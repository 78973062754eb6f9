"""What a disaggregated cluster keeps per handed-over request, and the rule for reserving its
blocks on a decode replica (``sim.cluster.disagg``)."""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from sim.cluster.loads import kv_total_blocks, replica_load
from sim.cluster.routed import RoutingLog
from sim.core.load_arrays import RUNNING, WAITING, Loads
from sim.core.load_rules import outstanding_requests
from sim.core.routing import ReplicaLoad
from sim.core.rules import blocks_needed, watermark_blocks
from sim.core.types import Request
from sim.engine.drive import (
    ReplicaEvent,
    drop_landed_kv,
    kv_used_blocks,
    land_kv,
    release_held,
    reserve_kv,
)

if TYPE_CHECKING:
    from sim.engine.replica import Replica
    from sim.kv.config import KVConfig

NAN = math.nan


@dataclass
class TransferLog:
    """Per request (by position in arrival order): where it went and when its KV moved."""

    prefill_replica: np.ndarray
    decode_replica: np.ndarray
    prefill_done_s: np.ndarray  # first token sampled on the prefill replica
    kv_start_s: np.ndarray  # blocks reserved, transfer started
    kv_landed_s: np.ndarray
    kv_bytes: np.ndarray
    num_transfers: np.ndarray
    reject_reason: list[str]  # '' unless no decode replica could ever hold the request

    @classmethod
    def empty(cls, n: int) -> TransferLog:
        """A log of ``n`` requests, nothing happened yet."""
        nan = np.full(n, NAN)
        return cls(np.full(n, -1, np.int64), np.full(n, -1, np.int64), nan.copy(), nan.copy(),
                   nan.copy(), np.zeros(n), np.zeros(n, np.int64), [""] * n)



def blocks_to_reserve(kv: KVConfig, watermark: float, req: Request) -> int:
    """Free blocks (as policies count them) a reservation of ``req``'s prompt KV needs on an
    otherwise empty decode replica with cache ``kv`` and a policy of this ``watermark``: its
    blocks, one block of headroom for its next token, and the watermark's blocks
    (``DisaggDriver._reserve`` adds one block per request already there)."""
    mark = watermark_blocks(watermark, kv.num_blocks)
    need = blocks_needed(req.num_prompt_tokens, kv.reserve_for(req.num_prompt_tokens), 0,
                         kv.block_size)
    return need + 1 + mark


def record(log: RoutingLog, now: float, rid: int, choice: int, loads: Sequence) -> None:
    """Log one routing decision with every replica's outstanding requests then."""
    log.time_s.append(now)
    log.request_id.append(rid)
    log.replica.append(choice)
    if isinstance(loads, Loads):  # each ``ReplicaLoad.num_outstanding``, of the arrays
        log.outstanding.append([outstanding_requests(row[WAITING], row[RUNNING])
                                for row in loads.counts.tolist()])
    else:
        log.outstanding.append([s.num_outstanding for s in loads])


class GeneralSide:  # noqa: PLR0904 - the calls of the hand-off protocol
    """A general-engine replica behind the calls ``DisaggDriver`` makes of either side
    (``sim.engine.compiled_handoff.HandoffCompiled`` makes the same ones)."""

    def __init__(self, rep: Replica, hold: bool) -> None:
        self.rep = rep
        self.index = rep.index
        self.kv = rep.pool.config
        self.kv_total_blocks = kv_total_blocks(self.kv)
        self.watermark = float(getattr(rep.policy, "watermark", 0.0))
        self.slot_capacity = rep.policy.slot_capacity
        self.max_model_len = rep.max_model_len
        self._settled: list[tuple[float, int, bool]] = []
        self.num_settled = 0  # requests finished or rejected here (a progress display's)
        rep.hold_kv = hold
        rep.listener = self._on_event

    def _on_event(self, ev: ReplicaEvent) -> None:
        if ev.kind in ("finish", "rejected"):
            self._settled.append((ev.time_s, ev.request_id, ev.kind == "finish"))
            self.num_settled += 1

    def advance_until(self, t: float) -> None:
        """``Replica.advance_until``."""
        self.rep.advance_until(t)

    def plan_at(self, ahead: float) -> None:
        """Let the replica plan at the instant just before ``ahead`` when it may."""
        rep = self.rep
        if rep.flight is None and not rep.idle and not rep.done:
            rep.advance_until(ahead)

    def admit(self, request: Request) -> None:
        """``Replica.admit``."""
        self.rep.admit(request)

    def close(self) -> None:
        """``Replica.close``."""
        self.rep.close()

    @property
    def closed(self) -> bool:
        """``close`` was called: its policy sees no more arrivals."""
        return not self.rep.accepting

    def wake(self) -> None:
        """An idle replica plans again where it was advanced to (after ``close``, a policy
        that waited for more arrivals may now run what it holds), as an admission makes it."""
        rep = self.rep
        if rep.flight is None and rep.advanced_s > rep.clock:
            rep.clock = rep.advanced_s
        if rep.flight is None and not rep.done:
            rep.idle = False

    def router_load(self, now_s: float, weight: float = 1.0, group: str = "") -> ReplicaLoad:
        """``sim.cluster.loads.replica_load``."""
        return replica_load(self.rep, now_s, weight, group)

    def load_counts(self, now_s: float) -> list[int]:
        """``router_load``'s counts (``sim.core.load_arrays.Loads.counts``'s columns)."""
        return Loads.of([replica_load(self.rep, now_s)]).counts[0].tolist()

    def settled(self, t: float) -> list[tuple[float, int, bool]]:
        """``(time, request id, finished)`` of the requests that settled since the last call
        (by ``t``: a step is committed at its end)."""
        out, self._settled = self._settled, []
        return out

    def release_held(self, request_id: int) -> None:
        """``sim.engine.drive.release_held``."""
        release_held(self.rep, request_id)

    def reserve_kv(self, request: Request, num_tokens: int, first_token_s: float) -> None:
        """``sim.engine.drive.reserve_kv``."""
        reserve_kv(self.rep, request, num_tokens, first_token_s)

    def land_kv(self, request_id: int) -> None:
        """``sim.engine.drive.land_kv``."""
        land_kv(self.rep, request_id)

    def drop_landed_kv(self, now: float | None) -> bool:
        """With nothing running or in flight and requests queued, preempt the newest waiting
        request that brought its KV (``sim.engine.drive.drop_landed_kv``) at ``now`` (None:
        where the replica stopped); False when there is none."""
        rep = self.rep
        if rep.flight is None and not rep.running and (rep.preempted or rep.waiting):
            landed = [sid for sid, s in rep.waiting.items() if s.num_blocks]
            if landed:
                drop_landed_kv(rep, landed[-1], rep.clock if now is None else now)
                return True
        return False

    @property
    def incoming(self) -> dict:
        """Requests whose blocks are reserved here while their KV is in transit."""
        return self.rep.incoming

    def used_blocks(self, now_s: float) -> int:
        """KV blocks in use at ``now_s``."""
        return kv_used_blocks(self.rep, now_s)

    def num_there(self, now_s: float) -> int:
        """Requests on the replica or in transit to it (queued, running, reserved)."""
        rep = self.rep
        return (len(rep.running) + len(rep.waiting) + len(rep.preempted) + len(rep.pending)
                + len(rep.incoming))

    def has_preempted(self) -> bool:
        """A preempted request waits to be recomputed."""
        return bool(self.rep.preempted)

    def next_time(self) -> float:
        """When the replica next plans on its own (its step in flight ends, or it wakes)."""
        rep = self.rep
        if rep.flight is not None:
            return rep.flight.end_s
        return rep.wake_s if rep.idle and not rep.done else math.inf

    def is_empty(self, now_s: float) -> bool:
        """Nothing queued, running, held or in flight: a prefill replica may be closed."""
        rep = self.rep
        return rep.accepting and not (rep.held or rep.waiting or rep.running or rep.preempted
                                      or rep.pending)

    @property
    def done(self) -> bool:
        """Cut short (horizon or wall-clock budget)."""
        return self.rep.done


#: A replica on either side of the hand-off: general engine or compiled interpreter.
Side = Any
