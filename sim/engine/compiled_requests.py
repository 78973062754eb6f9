"""What happens to one request in the compiled interpreter outside a step: it arrives, is
preempted, settles.

``take_arrivals`` is ``Replica._take_arrivals`` over the interpreter's arrays: at a scheduling
point every request handed over that has arrived by then joins the waiting heap
(``sim.engine.compiled_queue``), or is rejected there when it can never run. ``drop_kv`` and
``mark_requeued`` are the two halves of ``Replica._preempt`` (recompute). ``settled`` chains a
request that finished or was rejected after the last one that settled, on a replica that
lists them. The step loop (``sim.engine.compiled_loop``) and run-to-completion batches
(``sim.engine.compiled_batch``, whose decode runs take arrivals at every step they skip) call
them alike.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from sim.engine.compiled_cost import KERNEL
from sim.engine.compiled_plan import (
    RF_ARRIVAL,
    RF_DEADLINE,
    RF_FINISH,
    RI_BLOCKS,
    RI_COMPUTED,
    RI_ENTRY,
    RI_GENERATED,
    RI_NEXT_SETTLED,
    RI_NPRE,
    RI_PRIORITY,
    RI_PROMPT,
    RI_REASON,
    RI_STATUS,
)
from sim.engine.compiled_queue import order_key, push
from sim.engine.compiled_slots import (
    NO_REASON,
    P_HOLD,
    P_LIMIT,
    P_ORDER,
    PREEMPTED_TOO_OFTEN,
    REJECTED,
    RUNNING,
    S_KNOWN,
    S_LIVE,
    S_N_HEAP,
    S_NXT,
    S_SETTLED_FIRST,
    S_SETTLED_LAST,
    S_USED,
    WAITING,
)


@njit(**KERNEL)
def settled(req_i: np.ndarray, st_i: np.ndarray, params_i: np.ndarray, i: int) -> None:
    """Chain request ``i``, which just finished or was rejected, after the last one that
    settled, on a replica that lists them (``P_HOLD``; ``compiled_slots``)."""
    if params_i[P_HOLD] == 0:
        return
    last = st_i[S_SETTLED_LAST]
    if last:
        req_i[last - 1, RI_NEXT_SETTLED] = i + 1
    else:
        st_i[S_SETTLED_FIRST] = i + 1
    st_i[S_SETTLED_LAST] = i + 1


@njit(**KERNEL)
def take_arrivals(req_i: np.ndarray, req_f: np.ndarray, st_i: np.ndarray, params_i: np.ndarray,
                  hkeys: np.ndarray, hranks: np.ndarray, hitems: np.ndarray, now: float
                  ) -> None:
    """Every request handed over that has arrived by ``now`` joins the waiting heap, keyed by
    the order and ranked by its arrival, or is rejected at ``now`` when it can never run
    (``RI_ENTRY``: the plan would reject it at once)."""
    nxt, order = st_i[S_NXT], params_i[P_ORDER]
    while nxt < st_i[S_KNOWN] and req_f[nxt, RF_ARRIVAL] <= now:
        entry = req_i[nxt, RI_ENTRY]
        if entry != NO_REASON:
            req_i[nxt, RI_STATUS], req_i[nxt, RI_REASON] = REJECTED, entry
            req_f[nxt, RF_FINISH] = now
            settled(req_i, st_i, params_i, nxt)
        else:  # keyed by its uncomputed tokens: a request that brought its KV has one
            st_i[S_N_HEAP] = push(hkeys, hranks, hitems, st_i[S_N_HEAP], order_key(
                order, req_i[nxt, RI_PROMPT] + req_i[nxt, RI_GENERATED]
                - req_i[nxt, RI_COMPUTED], req_i[nxt, RI_PRIORITY],
                req_f[nxt, RF_DEADLINE]), nxt, nxt)
        nxt += 1
    st_i[S_NXT] = nxt


@njit(**KERNEL)
def drop_kv(req_i: np.ndarray, req_f: np.ndarray, v: int, st_i: np.ndarray,
            params_i: np.ndarray, now: float) -> bool:
    """The first half of ``_preempt`` (recompute): drop ``v``'s KV; past
    ``kv.max_preemptions`` reject it (False), else it is to be queued again (True)."""
    st_i[S_LIVE] -= req_i[v, RI_COMPUTED]
    req_i[v, RI_COMPUTED] = 0
    st_i[S_USED] -= req_i[v, RI_BLOCKS]
    req_i[v, RI_BLOCKS] = 0
    limit = params_i[P_LIMIT]
    if limit >= 0 and req_i[v, RI_NPRE] >= limit:
        req_i[v, RI_NPRE] += 1
        req_i[v, RI_STATUS], req_i[v, RI_REASON] = REJECTED, PREEMPTED_TOO_OFTEN
        req_f[v, RF_FINISH] = now
        settled(req_i, st_i, params_i, v)
        return False
    return True


@njit(**KERNEL)
def mark_requeued(req_i: np.ndarray, v: int) -> None:
    """``Seq.preempt``'s counters: one preemption more, waiting again."""
    req_i[v, RI_NPRE] += 1
    req_i[v, RI_STATUS] = WAITING


@njit(**KERNEL)
def keep_running(req_i: np.ndarray, running: np.ndarray, n_run: int) -> int:
    """Drop the requests that left the running set (their status says so), keeping the
    admission order; returns the new count."""
    kept = 0
    for r in range(n_run):
        i = running[r]
        if req_i[i, RI_STATUS] == RUNNING:
            running[kept] = i
            kept += 1
    return kept
