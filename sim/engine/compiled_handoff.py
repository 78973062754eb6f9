"""A compiled replica on either side of a KV hand-off (disaggregated prefill and decode).

``HandoffCompiled`` is ``sim.engine.compiled_drive.DrivenCompiled`` with the general engine's
hand-off calls (``sim.engine.drive``), exactly:

- a **prefill** replica is built holding (``compiled_slots.P_HOLD``): a finished request keeps
  its blocks, and every request that settles (finishes or is rejected) is chained in the
  interpreter's arrays; ``settled(t)`` reads the chain up to ``t`` (the interpreter commits a
  step as it launches it, so a step straddling ``t`` has settled requests not yet due), and
  ``release_held`` frees the blocks once the KV has been sent;
- a **decode** replica counts the blocks ``reserve_kv`` takes (no row yet: the request joins
  nothing until its KV lands) and ``land_kv`` appends the request's row with its prompt
  computed and its first token sampled elsewhere, due at the landing time, as an arrival is;
  ``drop_landed_kv`` preempts a landed request that was never admitted (recompute).

Each call made while the replica is idle moves its clock to the time it was advanced to (the
general engine plans again there). A router's load is counted when it is read
(``load_now``), as the general engine counts it; a step in flight logs the KV blocks it ends
with (``_adjust``), as the general engine logs a step when it commits it.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from sim.core.routing import ReplicaLoad
from sim.core.rules import blocks_needed
from sim.core.scheduling import SchedulingSpec
from sim.core.types import Request
from sim.engine import compiled_loop as loop
from sim.engine import compiled_plan as cp
from sim.engine import compiled_slots as slots
from sim.engine.compiled_drive import (
    Q_PREFILL,
    Q_QUEUED,
    Q_RUNNING,
    Q_USED,
    DrivenCompiled,
    any_preempted,
    count_now,
)
from sim.engine.compiled_queue import push
from sim.engine.coverage import iteration_spec_of
from sim.kv.config import KVConfig


class HandoffCompiled(DrivenCompiled):
    """A compiled replica of a disaggregated cluster (module docstring)."""

    def __init__(self, index: int, policy: Any, cost: Any, kv: KVConfig, *,
                 max_model_len: int | None, hold: bool) -> None:
        spec = iteration_spec_of(policy)
        assert spec is not None  # the allow-list admitted only presets of the specification
        super().__init__(index, spec, cost, kv, max_model_len=max_model_len,
                         name=policy.name, order=[])
        self.holds = hold  # the prefill side: its requests are of one output token
        if hold:
            self.rep.params_i[slots.P_HOLD] = 1
        self.spec: SchedulingSpec = spec
        self.kv = kv
        self.watermark = float(spec.watermark)
        self.slot_capacity = policy.slot_capacity
        self.max_model_len = max_model_len
        self.row: dict[int, int] = {}  # request id -> row in the interpreter's arrays
        self.num_held = 0
        self.incoming: dict[int, tuple[Request, int, float]] = {}  # id -> (req, blocks, t)
        self._landed: list[tuple[Request, int, float, float]] = []  # rows not appended yet
        self._cursor = 0  # the last settled row read, + 1
        # ``load_now``'s count, kept until the replica runs or a hand-off call changes it
        # (``_changed``; None: count again). Between those the count is the same at every
        # instant the driver reads it: a replica whose count would differ at ``t`` (its step
        # in flight ended by then) is run at ``t`` first (``must_run``), as the load a
        # routed ``DrivenCompiled`` hands out relies on
        self._memo: list[int] | None = None

    # -- the drive API, with the hand-off's rows ----------------------------------------------
    def admit(self, request: Request) -> None:
        """``sim.engine.drive.admit``."""
        self.row[request.id] = len(self.ids)
        super().admit(request)

    def _run(self, t: float) -> None:
        super()._run(t)  # (``_flush`` appends the landed rows)
        self._memo = self._cached  # ``_run`` counted the load at ``t``

    def _changed(self) -> None:
        """A hand-off call changed the arrays: the load is counted again when read."""
        self._memo = None

    def close(self) -> None:
        """``DrivenCompiled.close`` (the load is counted again)."""
        self._changed()
        super().close()

    def _flush(self) -> None:
        super()._flush()
        landed, self._landed = self._landed, []
        if not landed:
            return
        rep = self.rep
        for req, blocks, at, first in landed:  # one row each (mostly one a run)
            k = rep.append_one(at, req.num_prompt_tokens, req.num_output_tokens, req.priority)
            ri, rf = rep.req_i, rep.req_f  # (the rows may have grown)
            # ``reserve_kv``: the prompt computed, its first token sampled elsewhere
            ri[k, cp.RI_COMPUTED] = ri[k, cp.RI_MAX_HELD] = req.num_prompt_tokens
            ri[k, cp.RI_GENERATED] = 1
            ri[k, cp.RI_BLOCKS] = blocks
            ri[k, cp.RI_ENTRY] = slots.NO_REASON  # the driver refused what can never fit
            rep.entry_reason.pop(k, None)
            rf[k, cp.RF_FIRST_TOKEN] = rf[k, cp.RF_LAST_TOKEN] = first
            if rep.target_s is not None:  # from the arrival, not the landing
                rf[k, cp.RF_DEADLINE] = req.arrival_s + rep.target_s(req.priority)
            self.row[req.id] = k
            self.ids.append(req.id)

    @property
    def closed(self) -> bool:
        """``close`` was called: its policy sees no more arrivals."""
        return self._closed

    def wake(self) -> None:
        """``GeneralSide.wake``: an idle replica plans again where it was advanced to (once
        closed, too: ``_poke`` leaves a closed one to ``advance_until``)."""
        self._changed()
        if self._idle:
            st_f = self.rep.st_f
            st_f[0] = max(st_f[0], self.advanced_s)
            self._now = float(st_f[0])
            self._idle = self._straddle = False

    def _poke(self) -> None:
        """A hand-off call changed the replica: an idle one plans again where it was advanced
        to (``sim.engine.drive.release_held``, ``land_kv``)."""
        self._changed()
        if self._idle and not self._closed:
            st_f = self.rep.st_f
            st_f[0] = max(st_f[0], self.advanced_s)
            self._now = float(st_f[0])
            self._idle = self._straddle = False

    def _adjust(self, blocks: int) -> None:
        """``blocks`` more (or fewer) blocks in use, from a hand-off call. The general engine
        logs a step's blocks when it commits it, at its end: a step in flight (committed here
        as it launched) logs them with this change."""
        self._changed()
        rep = self.rep
        rep.st_i[slots.S_USED] += blocks
        n_log = int(rep.st_i[slots.S_N_LOG])
        if not self._idle and n_log and rep.st_f[0] > self.advanced_s:
            rep.log_i[n_log - 1, slots.L_USED] += blocks

    # -- the prefill side ---------------------------------------------------------------------
    @property
    def num_settled(self) -> int:
        """Requests finished or rejected here so far (counted from the arrays when asked: a
        progress display reads it from another thread)."""
        ri = self.rep.req_i  # one array, whatever ``append`` puts in its place meanwhile
        known = min(int(self.rep.st_i[slots.S_KNOWN]), len(ri))
        return int(np.count_nonzero(ri[:known, cp.RI_STATUS] >= slots.FINISHED))

    def settled(self, t: float) -> list[tuple[float, int, bool]]:
        """``(time, request id, finished)`` of the requests that settled by ``t`` and were not
        read before, in settling order."""
        rep = self.rep
        ri, rf = rep.req_i, rep.req_f
        out = []
        c = self._cursor
        nxt = int(ri[c - 1, cp.RI_NEXT_SETTLED]) if c else int(rep.st_i[slots.S_SETTLED_FIRST])
        while nxt:
            i = nxt - 1
            at = float(rf[i, cp.RF_FINISH])
            if at > t:
                break
            finished = int(ri[i, cp.RI_STATUS]) == slots.FINISHED
            self.num_held += finished
            out.append((at, self.ids[i], finished))
            c = nxt
            nxt = int(ri[i, cp.RI_NEXT_SETTLED])
        self._cursor = c
        return out

    def release_held(self, request_id: int) -> None:
        """``sim.engine.drive.release_held``."""
        i = self.row[request_id]
        ri = self.rep.req_i
        self._adjust(-int(ri[i, cp.RI_BLOCKS]))
        ri[i, cp.RI_BLOCKS] = 0
        self.num_held -= 1
        self._poke()

    # -- the decode side ----------------------------------------------------------------------
    def reserve_kv(self, request: Request, num_tokens: int, first_token_s: float) -> None:
        """``sim.engine.drive.reserve_kv``."""
        need = blocks_needed(num_tokens, self.kv.reserve_for(request.num_prompt_tokens), 0,
                             self.block_size)
        self.incoming[request.id] = (request, need, first_token_s)
        self._adjust(need)

    def land_kv(self, request_id: int) -> None:
        """``sim.engine.drive.land_kv``: the row is appended at the next run, due now."""
        req, need, first = self.incoming.pop(request_id)
        self._landed.append((req, need, self.advanced_s, first))
        self._poke()

    def drop_landed_kv(self, now: float | None) -> bool:
        """``DisaggDriver._break_stall`` on this replica: with nothing running or in flight and
        requests queued, preempt the newest queued request that holds landed KV
        (``sim.engine.drive.drop_landed_kv``) at ``now`` (None: where the replica stopped);
        False when there is none."""
        self._changed()
        rep = self.rep
        st_i, ri = rep.st_i, rep.req_i
        n_heap = int(st_i[slots.S_N_HEAP])
        if self._straddle or st_i[slots.S_N_RUN] or not n_heap:
            return False
        items = rep.hitems[:n_heap]
        landed = items[(rep.hranks[:n_heap] >= 0) & (ri[items, cp.RI_BLOCKS] > 0)]
        if not len(landed):
            return False
        v = int(landed.max())  # the newest to join the queue
        keys, ranks = rep.hkeys[:n_heap].copy(), rep.hranks[:n_heap].copy()
        kept = items != v
        size = 0
        for key, rank, item in zip(keys[kept].tolist(), ranks[kept].tolist(),
                                   items[kept].tolist(), strict=True):
            size = push(rep.hkeys, rep.hranks, rep.hitems, size, key, rank, item)
        st_i[slots.S_N_HEAP] = size
        st_i[slots.S_USED] -= ri[v, cp.RI_BLOCKS]
        ri[v, cp.RI_BLOCKS] = ri[v, cp.RI_COMPUTED] = 0
        loop.requeue(rep.req_i, rep.req_f, v, st_i, rep.params_i, rep.hkeys, rep.hranks,
                     rep.hitems, rep.pending)
        self._args = None
        if self._idle:  # it plans again at ``now`` (None: where it stopped)
            if now is not None:
                rep.st_f[0] = max(rep.st_f[0], now)
            self._now = float(rep.st_f[0])
            self._idle = False
        return True

    #: Plan at the instant just before ``ahead`` (when there is anything to plan):
    #: ``advance_until(ahead)`` itself (a call per replica and driver event, without a frame
    #: of its own).
    plan_at = DrivenCompiled.advance_until

    # -- what the driver reads ----------------------------------------------------------------
    def _counted(self, now_s: float) -> list[int]:
        """``load_now`` at ``now_s`` (``Q_*`` slots), counted once per state (``_memo``)."""
        if self._memo is None:  # (the run's load buffer: ``_run`` keeps a copy of its own)
            count_now(self._packed(), now_s)
            self._memo = self._load.tolist()
        return self._memo

    def used_blocks(self, now_s: float) -> int:
        """KV blocks in use at ``now_s``, as the general engine's pool counts them."""
        return self._counted(now_s)[Q_USED]

    def load_counts(self, now_s: float) -> list[int]:
        """``router_load``'s counts (``sim.core.load_arrays.Loads.counts``'s columns)."""
        counts = self._counted(now_s).copy()
        counts[Q_QUEUED] += len(self._buf) + len(self._landed)
        counts[Q_PREFILL] += self._buf_prompt
        return counts

    def router_load(self, now_s: float, weight: float = 1.0, group: str = "") -> ReplicaLoad:
        """``sim.cluster.loads.replica_load``, counted now (hand-off calls change it)."""
        queued, running, prefill, decoding, used = self.load_counts(now_s)
        return ReplicaLoad(self.index, queued, running, prefill, decoding, used,
                           self.kv_total_blocks, weight, group, now_s)

    def num_there(self, now_s: float) -> int:
        """Requests on the replica or in transit to it (queued, running, reserved)."""
        out = self._counted(now_s)
        return (out[Q_QUEUED] + out[Q_RUNNING] + len(self._buf) + len(self._landed)
                + len(self.incoming))

    def has_preempted(self) -> bool:
        """A preempted request waits to be recomputed."""
        return any_preempted(self._packed())

    @property
    def done(self) -> bool:
        """Closed with nothing left (no horizon or wall-clock budget here: the builder keeps
        such runs on the general engine)."""
        st_i = self.rep.st_i
        return bool(self._closed and not self._buf and not self._landed
                    and not st_i[slots.S_N_RUN] and not st_i[slots.S_N_HEAP]
                    and not st_i[slots.S_N_PENDING] and st_i[slots.S_NXT] == st_i[slots.S_KNOWN])

    def next_time(self) -> float:
        """When the replica next plans on its own (its step in flight ends); inf when idle
        or done."""
        return math.inf if self._idle or self.done else self._now

    def is_empty(self, now_s: float) -> bool:
        """Nothing queued, running, held or in flight: a prefill replica may be closed."""
        return (not self._closed and not self.num_held and not self._buf
                and not self._straddle and self.num_there(now_s) == 0)
