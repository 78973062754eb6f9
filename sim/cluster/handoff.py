"""What a disaggregated cluster keeps per handed-over request, and the rule for reserving its
blocks on a decode replica (``sim.cluster.disagg``)."""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import simpy

from sim.cluster.routed import RoutingLog
from sim.core.rules import blocks_needed, watermark_blocks
from sim.core.types import Request

if TYPE_CHECKING:
    from sim.engine.replica import Replica

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



def blocks_to_reserve(rep: Replica, req: Request) -> int:
    """Free blocks (as policies count them) a reservation of ``req``'s prompt KV needs on an
    otherwise empty ``rep``: its blocks, one block of headroom for its next token, and the
    policy's watermark (``DisaggDriver._reserve`` adds one block per request already there)."""
    cfg = rep.pool.config
    mark = watermark_blocks(float(getattr(rep.policy, "watermark", 0.0)), cfg.num_blocks)
    need = blocks_needed(req.num_prompt_tokens, cfg.reserve_for(req.num_prompt_tokens), 0,
                         cfg.block_size)
    return need + 1 + mark


def trigger(event: simpy.Event) -> None:
    """Succeed ``event`` unless it already was (a wake-up several causes may trigger)."""
    if not event.triggered:
        event.succeed()


def record(log: RoutingLog, now: float, rid: int, choice: int, loads: Sequence) -> None:
    """Log one routing decision with every replica's outstanding requests then."""
    log.time_s.append(now)
    log.request_id.append(rid)
    log.replica.append(choice)
    log.outstanding.append([s.num_outstanding for s in loads])
