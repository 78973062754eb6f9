"""Routing over compiled replicas in one compiled loop: no Python work per arrival.

``route_all`` does what ``sim.cluster.routed`` does per arrival for ``DrivenCompiled``
replicas with no routing latency — bring every replica up to the arrival
(``DrivenCompiled.advance_until``'s rule of when a replica must run, then
``compiled_loop.run`` and ``compiled_drive.load_now``), read the loads (live, or as of the
last poll every ``refresh_s``), choose, and hand the request to the chosen replica — inside
one numba call over the arrival arrays. The replicas' arrays travel as typed lists, one per
argument of ``compiled_loop.run``.

The choice is the router's whole rule (``Router.rule``: ``sim.core.load_arrays.choose``, the
very function the Python router calls, compiled) or, for any other router, the router
itself: the loop then returns to Python at each arrival with the loads filled in, and
resumes with the choice. It also returns to Python, and resumes where it stopped, when a
replica's arrays need room (``CompiledReplica.append`` grows them and writes the row) or
the interpreter asks for a bigger log buffer (``CompiledReplica.advance_until``). The
row it writes for a request is the one ``CompiledReplica.append`` writes, so the replicas
run, and the router decides, exactly as on the per-arrival path.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numba import njit
from numba.typed import List

from sim.core import load_arrays as la
from sim.engine import compiled_loop as loop
from sim.engine import compiled_plan as cp
from sim.engine import compiled_slots as slots
from sim.engine.compiled import entry_rejections
from sim.engine.compiled_cache import direct
from sim.engine.compiled_cost import KERNEL, jit_rule
from sim.engine.compiled_drive import (
    Q_DECODING,
    Q_PREFILL,
    Q_QUEUED,
    Q_RUNNING,
    Q_USED,
    DrivenCompiled,
    load_now,
    must_run,
)

assert (Q_QUEUED, Q_RUNNING, Q_PREFILL, Q_DECODING, Q_USED) == (
    la.WAITING, la.RUNNING, la.PREFILL, la.DECODING, la.KV_USED)

# numba's on-disk cache of a function notices changes to its own file only: the sources
# compiled into the routing loop are pinned here (tests/test_compiled_route.py recomputes
# it; compiled_loop.py pins its own rules), and updating the pin invalidates the cached loop.
ROUTE_SHA256 = "86bcaa821431db429831c354c37701c3537eb6802eb50e72cf9fc55e04893b13"
ROUTE_SOURCES = ("sim/core/load_rules.py", "sim/core/load_arrays.py",
                 "sim/engine/compiled_drive.py", "sim/engine/compiled_loop.py")


def route_sha256() -> str:
    """The hash of ``ROUTE_SOURCES`` as they are now (what ``ROUTE_SHA256`` must equal)."""
    return loop.rules_sha256(ROUTE_SOURCES)


_must_run = jit_rule(must_run, inline=True)
_outstanding = jit_rule(la.outstanding_requests, inline=True)
_measure = jit_rule(la.measure, inline=True, outstanding_requests=_outstanding,
                    outstanding_tokens=jit_rule(la.outstanding_tokens, inline=True),
                    kv_share=jit_rule(la.kv_share, inline=True))
_measure_at = jit_rule(la.measure_at, inline=True, measure=_measure)
#: ``sim.core.load_arrays.choose`` compiled: the routing loop's choice, and the one a
#: disaggregated driver over compiled replicas makes per decision (``sim.cluster.disagg``).
choose = jit_rule(la.choose, lightest_among=jit_rule(la.lightest_among, measure_at=_measure_at),
                  emptiest_kv=jit_rule(la.emptiest_kv, measure_at=_measure_at))

#: The per-replica arrays of ``compiled_loop.run``, in its argument order (``until_s`` and
#: ``max_steps`` aside).
ARRAYS = ("req_i", "req_f", "running", "hkeys", "hranks", "hitems", "pending", "plan_idx",
          "plan_n", "pre_idx", "params_i", "params_f", "analytic", "terms", "dense", "log_i",
          "log_f", "log_b", "irr", "irr_count", "st_i", "st_f", "residues", "batch")
#: How ``route_span`` returned: every arrival routed; a replica needs room; the router must
#: choose; a replica's interpreter returned another code (``pos[4]``).
ROUTED, NEED_ROOM, NEED_CHOICE, NEED_LOOP = range(4)
#: Where an arrival stands (``pos[2]``): replicas being advanced (from ``pos[1]``), or its
#: choice known (``pos[3]``) and its row to write, or written already (by Python).
ADVANCING, PLACING, PLACED = range(3)
#: Columns of the driver state ``drv_i`` / ``drv_f`` (``DrivenCompiled``'s fields).
D_IDLE, D_STRADDLE, D_BUF_N, D_BUF_PROMPT = range(4)
D_NOW, D_BUF_FIRST = range(2)
_BIG = 1 << 62


@njit(**KERNEL)
def _advance(a, drv_i, drv_f, cached, r, t):  # noqa: ANN001, ANN202
    """``DrivenCompiled.advance_until(t)`` for replica ``r``: -1, or the interpreter's code
    when it is neither PAUSED nor IDLE (Python takes over)."""
    if not _must_run(drv_i[r, D_IDLE] != 0, drv_f[r, D_BUF_FIRST], drv_f[r, D_NOW],
                     drv_i[r, D_STRADDLE] != 0, t):
        return -1
    drv_i[r, D_BUF_N] = 0
    drv_i[r, D_BUF_PROMPT] = 0
    drv_f[r, D_BUF_FIRST] = np.inf
    code = loop.run(a[0][r], a[1][r], a[2][r], a[3][r], a[4][r], a[5][r], a[6][r], a[7][r],
                    a[8][r], a[9][r], a[10][r], a[11][r], a[12][r], a[13][r], a[14][r],
                    a[15][r], a[16][r], a[17][r], a[18][r], a[19][r], a[20][r], a[21][r],
                    np.nextafter(t, -np.inf), _BIG, a[22][r], a[23][r])
    if code != slots.PAUSED and code != slots.IDLE:
        return code
    load_now(a[0][r], a[1][r], a[2][r], a[5][r], a[6][r], a[7][r], a[8][r], a[15][r],
             a[20][r], a[21][r], t, cached[r])
    now = a[21][r][0]
    drv_i[r, D_IDLE] = 1 if code == slots.IDLE else 0
    drv_f[r, D_NOW] = now
    drv_i[r, D_STRADDLE] = 1 if now > t else 0
    return -1


@njit(**KERNEL)
def _place(a, c, t, prompt, out, priority, deadline, entry):  # noqa: ANN001, ANN202
    """``CompiledReplica.append`` of one request to replica ``c`` when its arrays have room
    (False: they have not, nothing is written)."""
    ri, rf, st = a[0][c], a[1][c], a[20][c]
    k = st[slots.S_KNOWN]
    n = k + 1
    rows = min(a[10][c][slots.P_MAX_SEQS], n) + 2
    if (ri.shape[0] < n or rf.shape[0] < n or a[3][c].shape[0] < n or a[4][c].shape[0] < n
            or a[5][c].shape[0] < n or a[6][c].shape[0] < n or a[2][c].shape[0] < rows):
        return False
    ri[k, :] = 0
    ri[k, cp.RI_PROMPT], ri[k, cp.RI_OUT], ri[k, cp.RI_PRIORITY] = prompt, out, priority
    ri[k, cp.RI_STATUS] = slots.WAITING
    if entry:
        ri[k, cp.RI_ENTRY] = slots.ON_ARRIVAL
    rf[k, :] = 0.0
    rf[k, cp.RF_ARRIVAL] = t
    if not math.isnan(deadline):
        rf[k, cp.RF_DEADLINE] = deadline
    rf[k, cp.RF_FIRST_SCHED:cp.RF_FINISH + 1] = np.nan
    st[slots.S_KNOWN] = n
    return True


@njit(**KERNEL)
def route_span(l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15, l16, l17,  # noqa: ANN001, ANN201, C901, PLR0913
               l18, l19, l20, l21, l22, l23, drv_i, drv_f, cached, arrival, prompt, out,
               priority, deadline, entry, rule, weight, kv_total, refresh_s, board, read_at,
               everyone, assign, outstanding, pos):
    """Route arrivals from ``pos`` (arrival, replica, stage, choice) on (module docstring);
    returns ``ROUTED`` or why Python must step in (``pos`` says where to resume). ``l0`` ..
    ``l23``: the typed lists of ``ARRAYS`` (one argument each: a tuple of them would cost a
    slow type dispatch on every return from Python)."""
    a = (l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15, l16, l17, l18,
         l19, l20, l21, l22, l23)
    n, num = len(arrival), len(drv_i)
    j, r0, stage = pos[0], pos[1], pos[2]
    while j < n:
        t = arrival[j]
        if stage == ADVANCING:
            for r in range(r0, num):
                code = _advance(a, drv_i, drv_f, cached, r, t)
                if code >= 0:
                    pos[0], pos[1], pos[4] = j, r, code
                    return NEED_LOOP
            if refresh_s <= 0 or t >= read_at[0] + refresh_s:  # a fresh reading
                for r in range(num):
                    board[r, :] = cached[r, :]
                    board[r, la.WAITING] += drv_i[r, D_BUF_N]
                    board[r, la.PREFILL] += drv_i[r, D_BUF_PROMPT]
                read_at[0] = t
            for r in range(num):  # the live outstanding requests, for the imbalance metrics
                outstanding[j, r] = _outstanding(cached[r, la.WAITING] + drv_i[r, D_BUF_N],
                                                 cached[r, la.RUNNING])
            if rule == la.NO_RULE:
                pos[0], pos[2] = j, PLACING
                return NEED_CHOICE
            c = choose(rule, board, weight, kv_total, everyone)
            stage = PLACING
        else:
            c = pos[3]
        if stage == PLACING and not _place(a, c, t, prompt[j], out[j], priority[j],
                                           deadline[j], entry[j]):
            pos[0], pos[2], pos[3] = j, PLACED, c
            return NEED_ROOM
        drv_i[c, D_BUF_N] += 1
        drv_i[c, D_BUF_PROMPT] += prompt[j]
        if drv_i[c, D_BUF_N] == 1:
            drv_f[c, D_BUF_FIRST] = t
        assign[j] = c
        j += 1
        r0, stage = 0, ADVANCING
    pos[0] = n
    return ROUTED


def route_all(reps: Sequence[DrivenCompiled], ids: np.ndarray, arrival: np.ndarray,
              prompt: np.ndarray, out: np.ndarray, priority: np.ndarray, rule: int,
              pick: Callable[[int, la.Loads], int] | None, refresh_s: float,
              weights: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """Route the arrivals (``ids``, in arrival order) over ``reps`` by ``rule``
    (``NO_RULE``: ``pick(j, loads)`` chooses) and run every replica to the end; returns the
    replica of each arrival and every replica's outstanding requests at each arrival."""
    n, num = len(arrival), len(reps)
    arrival = np.ascontiguousarray(arrival, dtype=np.float64)
    prompt, out, priority = (np.ascontiguousarray(x, dtype=np.int64)
                             for x in (prompt, out, priority))
    comp = [rep.rep for rep in reps]
    a = tuple(_typed_list([getattr(c, name) for c in comp]) for name in ARRAYS)
    drv_i = np.zeros((num, 4), dtype=np.int64)
    drv_i[:, D_IDLE] = 1
    drv_f = np.zeros((num, 2))
    drv_f[:, D_BUF_FIRST] = math.inf
    cached = np.zeros((num, la.NUM_COUNTS), dtype=np.int64)
    board = np.zeros_like(cached)
    weight = np.asarray(weights, dtype=np.float64)
    kv_total = np.array([rep.kv_total_blocks for rep in reps], dtype=np.int64)
    read_at = np.array([-math.inf])
    assign = np.full(n, -1, dtype=np.int64)
    outstanding = np.zeros((n, num), dtype=np.int64)
    first = comp[0]
    deadline = np.full(n, math.nan)
    target = first.target_s
    if target is not None:  # as CompiledReplica.append has it
        deadline[:] = [a_ + target(int(q)) for a_, q in
                       zip(arrival.tolist(), priority.tolist(), strict=True)]
    reasons = entry_rejections(prompt, out, first.kv, first.budget, first.max_model_len)
    entry = np.zeros(n, dtype=np.bool_)
    entry[list(reasons)] = True
    pos = np.zeros(5, dtype=np.int64)
    args = (drv_i, drv_f, cached, arrival, prompt, out, priority, deadline, entry, rule,
            weight, kv_total, float(refresh_s), board, read_at, np.arange(num), assign,
            outstanding, pos)
    args = (*a, *args)
    code = route_span(*args)
    kernel = direct(route_span, args)  # arguments of the same types every time
    while True:
        if code == ROUTED:
            break
        j = int(pos[0])
        if code == NEED_CHOICE:
            assert pick is not None
            pos[3] = pick(j, la.Loads(board.copy(), weight, kv_total, float(read_at[0])))
        elif code == NEED_ROOM:
            c = int(pos[3])
            comp[c].append(arrival[j:j + 1], prompt[j:j + 1], out[j:j + 1], priority[j:j + 1])
            _refresh(a, comp[c], c)
        else:  # NEED_LOOP: what DrivenCompiled._run does with a code other than PAUSED, IDLE
            r, t = int(pos[1]), float(arrival[j])
            rep = comp[r]
            code = rep.advance_until(math.nextafter(t, -math.inf))
            _refresh(a, rep, r)
            load_now(rep.req_i, rep.req_f, rep.running, rep.hitems, rep.pending, rep.plan_idx,
                     rep.plan_n, rep.log_i, rep.st_i, rep.st_f, t, cached[r])
            drv_i[r, D_IDLE] = int(code == slots.IDLE)
            drv_f[r, D_NOW] = rep.st_f.item(0)
            drv_i[r, D_STRADDLE] = int(drv_f[r, D_NOW] > t)
            pos[1], pos[2] = r + 1, ADVANCING
        code = kernel(*args)
    _hand_back(reps, ids, assign, reasons)
    return assign, outstanding


def _refresh(a: tuple[Any, ...], rep: Any, r: int) -> None:
    """Point the typed lists at replica ``r``'s arrays again (Python may have replaced or
    resized them)."""
    for lst, name in zip(a, ARRAYS, strict=True):
        _put(lst, r, getattr(rep, name))


# Typed lists are built and changed by compiled (and cached) functions: their Python
# methods would compile numba's list helpers anew in every process (seconds).
@njit(**KERNEL)
def _new_list(arr):  # noqa: ANN001, ANN202
    lst = List()
    lst.append(arr)
    return lst


@njit(**KERNEL)
def _push(lst, arr):  # noqa: ANN001, ANN202
    lst.append(arr)


@njit(**KERNEL)
def _put(lst, r, arr):  # noqa: ANN001, ANN202
    lst[r] = arr


def _typed_list(arrays: list[np.ndarray]) -> Any:
    """A numba typed list of ``arrays`` (all of one type)."""
    lst = _new_list(arrays[0])
    for arr in arrays[1:]:
        _push(lst, arr)
    return lst


def _hand_back(reps: Sequence[DrivenCompiled], ids: np.ndarray, assign: np.ndarray,
               reasons: dict[int, str]) -> None:
    """Each replica's admission record and rejection messages (by its own row), then its
    run to the end."""
    order = reps[0].order if reps else []
    order.extend(assign.tolist())
    rows = [np.flatnonzero(assign == k) for k in range(len(reps))]
    for g, why in reasons.items():
        k = int(assign[g])
        reps[k].rep.entry_reason[int(np.searchsorted(rows[k], g))] = why
    for k, rep in enumerate(reps):
        rep.ids = ids[rows[k]].tolist()
        rep.close()
        rep.rep.advance_until(math.inf)
