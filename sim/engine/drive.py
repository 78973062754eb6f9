"""Driving a replica from outside: ``advance_until``, ``admit``, ``state`` and events out.

A cluster (replicas sharing one clock, a router deciding where each request goes) cannot use
a replica that pulls its arrivals from a list it owns. The replica core (``sim.engine.replica``)
therefore works in two moves — *begin* (plan and launch a step at a scheduling point) and
*land* (commit it at its end) — and can be driven in two ways that give the same results:

- ``Replica.process(env)``: the SimPy process ``sim.simulate`` runs, fed from the replica's
  own arrival list;
- ``advance_until(t)`` / ``admit(request)`` / ``close()``: a driver owns the clock and the
  arrivals. Advancing to each arrival time, admitting the request and advancing on gives
  tables identical to ``sim.simulate`` (tests/test_drive.py).

What ``advance_until(t)`` does, exactly:

- every step that ends at or before ``t`` is committed at its end; a step that **straddles**
  ``t`` (starts before, ends after) stays *in flight*: ``state()`` shows its requests running
  and its tokens are committed when a later ``advance_until`` passes its end, as on a GPU;
- a plan is made only at scheduling points strictly before ``t``: a request admitted at
  ``t`` is therefore seen by the plan made at ``t`` (or at the end of the straddling step),
  the engine's same-time rule;
- an idle replica (nothing to run, or a policy waiting for ``wake_at_s``) moves its clock to
  ``t``; a wake time before ``t`` is honoured on the way;
- skipping (``sim.engine.skipping``) stops at the first step ending at or after ``t``.

``admit(request)`` puts a request in the replica's arrival buffer at the current time; it
joins the waiting queue (or is rejected if it can never fit) at the next scheduling point.
Policies see ``more_arrivals=True`` until ``close()`` says nothing more will come.
``state()`` is a frozen ``ReplicaState``; ``listener`` receives ``ReplicaEvent`` values.

Disaggregated serving (``sim.cluster.disagg``) adds three calls: ``reserve_kv`` (blocks for a
request whose prompt was computed elsewhere, held while its KV is in transit), ``land_kv``
(the KV arrived: the request waits for its first decode step) and, on the sending replica,
``release_held`` (with ``hold_kv`` set, a finished request keeps its blocks until then).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sim.core.state import Seq
from sim.core.types import Request

if TYPE_CHECKING:
    from sim.engine.replica import Replica
    from sim.engine.steps import ReplicaSteps

#: Kinds of ``ReplicaEvent``: the step that computed a prompt's last token also samples the
#: first output token, so ``prefill_done`` and ``first_token`` come together (once per request:
#: a recompute after preemption does not repeat them).
EVENT_KINDS = ("prefill_done", "first_token", "finish", "rejected")


@dataclass(frozen=True, slots=True)
class ReplicaEvent:
    """Something that happened to one request on one replica, at ``time_s``."""

    kind: str
    request_id: int
    replica: int
    time_s: float


@dataclass(frozen=True, slots=True)
class ReplicaState:
    """A replica at one moment, as a router may read it.

    ``num_waiting`` counts queued requests (preempted and admitted-not-yet-planned included),
    ``num_running`` those holding a batch slot (the step in flight included).
    ``num_prefill_tokens``: prompt or recompute tokens still to compute before the next token
    of every unfinished request. ``num_decode_tokens``: output tokens still to generate — the
    engine's knowledge of true output lengths, an oracle signal a real router does not have.
    ``cached_prefixes`` maps a ``prefix_id`` to its blocks in the prefix cache.
    """

    clock_s: float
    num_waiting: int
    num_running: int
    num_prefill_tokens: int
    num_decode_tokens: int
    kv_used_blocks: int
    kv_total_blocks: int
    cached_prefixes: tuple[tuple[str, int], ...]
    step_end_s: float | None  # end of the step in flight (None: idle)


def advance_until(rep: Replica, t: float) -> None:
    """Run ``rep`` until its clock reaches ``t`` or nothing is left (see the module doc)."""
    if t < rep.advanced_s:
        raise ValueError(f"replica {rep.index}: cannot go back from t={rep.advanced_s} to {t}")
    while not rep.done:
        flight = rep.flight
        if flight is not None:
            if flight.end_s > t:
                break  # straddles t: still in flight
            rep.clock = flight.end_s
            rep.land(t)
            continue
        if rep.idle:
            if rep.wake_s >= t:
                break
            rep.clock, rep.idle = rep.wake_s, False
        elif rep.clock >= t:
            break  # a scheduling point at t: admissions at t come first
        rep.begin(t)
    rep.advanced_s = max(rep.advanced_s, t)


def admit(rep: Replica, request: Request) -> None:
    """Hand ``request`` to ``rep`` at the time it was advanced to."""
    seq = Seq(request, rep.index)
    rep.seqs[request.id] = seq
    rep.pending.append(seq)
    if rep.flight is None and rep.advanced_s > rep.clock:
        rep.clock = rep.advanced_s  # an idle replica plans again when a request comes
    if rep.flight is None:
        rep.idle = False


def reserve_kv(rep: Replica, request: Request, num_tokens: int, first_token_s: float) -> Seq:
    """Reserve the blocks of ``request``'s ``num_tokens`` computed tokens on ``rep`` before
    they are sent here (disaggregated serving): the request's prompt was computed and its
    first token sampled elsewhere at ``first_token_s``. It joins no queue until ``land_kv``;
    the caller checks that the blocks are free (``ReplicaSteps.pool.view_free``)."""
    seq = Seq(request, rep.index)
    seq.num_computed = seq.max_held = num_tokens
    seq.num_generated = 1
    seq.first_token_s = seq.last_token_s = first_token_s
    before = rep.pool.used
    rep.pool.grow(seq, num_tokens)
    _note_kv_change(rep, rep.pool.used - before)
    rep.seqs[request.id] = seq
    rep.incoming[request.id] = seq
    return seq


def land_kv(rep: Replica, request_id: int) -> None:
    """The KV of a request reserved by ``reserve_kv`` has landed at the time ``rep`` was
    advanced to: it joins the waiting queue at the next scheduling point, its prompt already
    computed (its next step is a decode step)."""
    seq = rep.incoming.pop(request_id)
    rep.pending.append(seq)
    if rep.flight is None and rep.advanced_s > rep.clock:
        rep.clock = rep.advanced_s
    if rep.flight is None:
        rep.idle = False


def drop_landed_kv(rep: Replica, request_id: int, now: float) -> None:
    """At ``now``, preempt a request that landed with its KV but was never admitted
    (``land_kv``): it gives its blocks back and recomputes its prompt on ``rep`` (recompute
    preemption). An idle ``rep`` plans again at ``now``."""
    seq = rep.waiting[request_id]
    rep._pop_waiting(request_id)  # noqa: SLF001 - the replica's own queue, changed as it does
    rep.pool.release(seq)
    seq.preempt()
    rep._add_preempted(seq)  # noqa: SLF001
    if rep.flight is None:
        rep.clock = max(rep.clock, now)
        rep.idle = False


def release_held(rep: Replica, request_id: int) -> None:
    """Free the KV a finished request kept on ``rep`` (``hold_kv``) once it has been sent, at
    the time ``rep`` was advanced to: an idle replica plans again (the blocks may admit)."""
    before = rep.pool.used
    rep.pool.release(rep.held.pop(request_id))
    _note_kv_change(rep, rep.pool.used - before)
    if rep.flight is None and rep.advanced_s > rep.clock:
        rep.clock = rep.advanced_s
    if rep.flight is None and not rep.done:
        rep.idle = False


def _note_kv_change(rep: Replica, blocks: int) -> None:
    """Remember a change of ``rep``'s blocks in use made while a skipped stretch is in flight
    (``ReplicaSteps.kv_changes``)."""
    flight = rep.flight
    if blocks and flight is not None and flight.step is None:
        rep.kv_changes.append((rep.advanced_s, blocks))


def kv_changes_after(rep: ReplicaSteps, ends: np.ndarray) -> np.ndarray | int:
    """Per step of a skipped stretch ending at ``ends``: the blocks the hand-off calls changed
    at or after its end (``_note_kv_change``), which the pool now counts but the step, had it
    been committed at its end as stepping does, would not have held; consumed here."""
    changes = rep.kv_changes
    if not changes:
        return 0
    out = np.zeros(len(ends), dtype=np.int64)
    for t, blocks in changes:
        out += blocks * (ends <= t)
    changes.clear()
    return out


@dataclass(frozen=True, slots=True)
class Outstanding:
    """What a replica still has to do, counted in one walk over its queues (the one rule that
    ``ReplicaState`` and a router's ``ReplicaLoad`` both read)."""

    num_queued: int  # waiting, preempted and admitted-not-yet-planned
    prefill_tokens: int  # prompt or recompute tokens before the next token, of every request
    num_decoding: int  # running requests past their prompt
    decode_tokens: int  # output tokens still to generate (true lengths: engine knowledge)


def outstanding(rep: Replica) -> Outstanding:
    """``rep``'s outstanding work now."""
    queued = [*rep.preempted.values(), *rep.waiting.values(), *rep.pending]
    prefill = decode = decoding = 0
    for is_running, seqs in ((False, queued), (True, rep.running.values())):
        for seq in seqs:
            left = seq.num_uncomputed
            if left > 1 or seq.num_generated == 0:
                prefill += left
            elif is_running:
                decoding += 1
            decode += seq.req.num_output_tokens - seq.num_generated
    return Outstanding(len(queued), prefill, decoding, decode)


def kv_used_blocks(rep: Replica, now_s: float) -> int:
    """KV blocks ``rep`` holds at ``now_s``: its pool's, plus, while a skipped stretch of
    decode steps is in flight (``sim.engine.skipping``), what the stretch has grown up to and
    including its step in flight at ``now_s`` — what stepping would hold then (a step takes its
    blocks when it launches)."""
    used = rep.pool.used
    flight = rep.flight
    if flight is None or flight.step is not None or flight.skip is None:
        return used
    ends = flight.skip[1]
    j = int(np.searchsorted(ends, now_s, side="right"))  # steps of the stretch done by now
    if j >= len(ends):
        return used
    bs = rep.pool.config.block_size
    if flight.batch:  # a static / dynamic batch run: its finishers release their blocks
        from sim.engine.batch_skip import run_growth

        _, _, computed, held, remaining, _ = flight.skip
        return used + int(run_growth(computed, held, remaining, len(ends), bs)[j])
    from sim.engine.skipping import stretch_grown

    _, _, computed, held, _ = flight.skip
    return used + stretch_grown(computed, held, bs, j + 1)


def replica_state(rep: Replica) -> ReplicaState:
    """The frozen ``ReplicaState`` of ``rep`` now."""
    work = outstanding(rep)
    pool = rep.pool
    cached = tuple(sorted(pool.cache.cached_blocks().items())) if pool.cache else ()
    cfg = pool.config
    flight = rep.flight
    now = max(rep.clock, rep.advanced_s)
    return ReplicaState(now, work.num_queued, len(rep.running),
                        work.prefill_tokens, work.decode_tokens, kv_used_blocks(rep, now),
                        0 if cfg.unlimited else cfg.num_blocks, cached,
                        None if flight is None else flight.end_s)


def emit_first_tokens(rep: ReplicaSteps, run: Mapping[int, int], end: float) -> None:
    """Events of the requests whose first token the step ending at ``end`` sampled."""
    listener = rep.listener
    assert listener is not None
    for sid in run:
        seq = rep.running[sid]
        if seq.num_generated == 1 and seq.first_token_s == end:
            listener(ReplicaEvent("prefill_done", sid, rep.index, end))
            listener(ReplicaEvent("first_token", sid, rep.index, end))


__all__ = ["EVENT_KINDS", "Outstanding", "ReplicaEvent", "ReplicaState", "admit",
           "advance_until", "drop_landed_kv", "kv_used_blocks", "land_kv", "outstanding",
           "release_held", "reserve_kv", "emit_first_tokens", "replica_state",
           "kv_changes_after"]
