"""A Python policy's plans carried out on the compiled interpreter's arrays.

The general engine asks its policy for a ``Plan`` at every scheduling point; what it then does
with the plan — check it, admit, preempt, grow the KV, cost the step, commit the tokens, log
the step — is the same for every policy. ``PlannedReplica`` keeps a replica's state in the
arrays of ``sim.engine.compiled.CompiledReplica`` and does that part in one compiled call a
scheduling point (``compiled_loop.apply_plan``: ``validate_plan``'s rules, then the loop's own
``carry_out`` and ``steady_stretch``), so the only Python left per step is the policy's own
``schedule``, the ``View`` it is shown (the running requests' ``SeqView``s built in one pass
from the arrays; the queue's kept until it changes) and reading its ``Plan`` into rows.

It covers what those arrays hold — one replica on its own arrival list, paged KV with recompute
preemption and no prefix cache, a cost model the interpreter costs itself, no per-step checks
— and plans without padding rows (``sim.engine.coverage.planned_blocker`` decides before the
run). A plan it does not carry out (padding rows, a value of a kind the reference would refuse,
any broken rule) raises ``NotCovered``: ``simulate`` then runs the whole simulation again on
the reference (``sim.engine.replica``), with fresh policies, which names the broken rule or
carries the plan out, and the run says so. Steady plans repeat in compiled stretches that stop
before a finish or an arrival; the policy is asked again there, which its ``steady`` promise
says gives the same results as the reference's stretches (the tests check it).
"""
from __future__ import annotations

import math
import time
from itertools import chain, repeat
from typing import Any

import numpy as np

from policies.registry import Policy
from sim.core.rules import as_limit
from sim.core.scheduling import SchedulingSpec
from sim.core.types import ON_FINISH, KVView, Plan, SeqView, View
from sim.engine import compiled_slots as slots
from sim.engine.compiled import CompiledReplica, Outcomes
from sim.engine.compiled_cache import direct
from sim.engine.compiled_plan import (
    RF_FINISH,
    RI_GENERATED,
    RI_ID,
    RI_NPRE,
    RI_REASON,
    RI_STATUS,
)
from sim.engine.coverage import NotCovered
from sim.kv.config import KVConfig
from sim.metrics.live import LiveLogs
from sim.metrics.steplog import StepLog

_NEW = tuple.__new__
_EMPTY = np.empty(0, dtype=np.int64)


class QueueViews:
    """The waiting queue as a policy is shown it — preempted requests newest first, then the
    others in arrival order — as one tuple of views with the rows beside it. A change at an end
    (arrivals join the back, a preempted request the front, requests leave from the front in
    queue order) is a tuple operation in C; any other leaves rebuild the tuple. A long queue
    therefore costs a copy in C per change instead of a view lookup a request."""

    def __init__(self) -> None:
        self.views: tuple[SeqView, ...] = ()
        self.rows: list[int] = []

    def __len__(self) -> int:
        return len(self.rows)

    def arrive(self, rows: list[int], views: list[SeqView]) -> None:
        """New requests join the back, in arrival order."""
        self.views += tuple(views)
        self.rows += rows

    def preempted(self, row: int, view: SeqView) -> None:
        """A request just preempted joins the front (the newest preempted leads)."""
        self.views = (view, *self.views)
        self.rows.insert(0, row)

    def leave(self, rows: list[int]) -> None:
        """``rows`` left the queue (admitted or rejected)."""
        k = len(rows)
        # the front, in any order (the list test first: the usual case, and cheaper)
        if self.rows[:k] == rows or set(self.rows[:k]) == set(rows):
            self.views = self.views[k:]
            del self.rows[:k]
            return
        gone = set(rows)
        keep = [i for i, r in enumerate(self.rows) if r not in gone]
        self.views = tuple(map(self.views.__getitem__, keep))
        self.rows = list(map(self.rows.__getitem__, keep))


class PlannedReplica:
    """One replica: a Python policy's plans on compiled arrays (see the module docstring)."""

    def __init__(self, policy: Policy, cost: Any, kv: KVConfig, ids: np.ndarray,
                 arrival: np.ndarray, prompt: np.ndarray, out: np.ndarray,
                 priority: np.ndarray | None, *, max_model_len: int | None,
                 horizon_s: float | None, deadline: float | None, skip: bool) -> None:
        from sim.engine import compiled_loop
        from sim.engine.compiled_state import pack

        n = len(arrival)
        self.policy, self.kv = policy, kv
        # the batch rows the arrays need: the policy's limit, or every request (a plan over
        # them, from a limit raised later, goes to the reference)
        limit = policy.max_num_seqs
        rows = max(1, n if limit is None else min(int(limit), n))
        sizes = SchedulingSpec(max_num_seqs=rows, max_num_batched_tokens=rows)
        self.rep = rep = CompiledReplica(sizes, cost, kv, max_model_len=max_model_len,
                                         horizon_s=horizon_s, name=policy.name)
        rep.append(arrival, prompt, out, priority)
        rep.close()
        self._pack = pack
        self._apply = compiled_loop.apply_plan
        self.horizon_s, self.deadline, self.skip = horizon_s, deadline, skip
        self.ids: list[int] = ids.tolist()
        self.row_of: dict[int, int] = {r: i for i, r in enumerate(self.ids)}
        # ids ``id_base + id_step * row`` (a trace's row numbers, dealt round robin): the
        # compiled call finds the rows itself; any others are looked up here (``id_step`` 0)
        self.id_base, self.id_step = affine(np.asarray(ids, dtype=np.int64))
        self.arrival: list[float] = np.asarray(arrival, dtype=np.float64).tolist()
        self.priority: list[int] = ([0] * n if priority is None else
                                    np.asarray(priority, dtype=np.int64).tolist())
        self.prompt: list[int] = np.asarray(prompt, dtype=np.int64).tolist()
        self.policy_reason: dict[int, str] = {}  # row -> a policy's words for its rejection
        self.queue = QueueViews()
        self._admitted = np.empty(rows + 1, dtype=np.int64)
        # the running requests' view columns, as ``compiled_loop.view_columns`` writes them
        width, fields = len(rep.running), compiled_loop.VIEW_FIELDS
        self._out = np.zeros(fields * width, dtype=np.int64)
        self._view_ints = self._out.reshape(fields, width)[:-1]
        self._view_arrival = self._out.view(np.float64)[(fields - 1) * width:]
        rep.req_i[:n, RI_ID] = ids
        self._packed: Any = None
        self._layout = -1

    # -- the loop ----------------------------------------------------------------------------
    def run(self) -> None:  # noqa: C901 - one scheduling point, read as Replica.begin
        """Run the replica to its end (``NotCovered`` when a plan needs the reference)."""
        rep, policy, kv = self.rep, self.policy, self.kv
        st_i, st_f, ri = rep.st_i, rep.st_f, rep.req_i
        ids, arrival, row_of = self.ids, self.arrival, self.row_of
        n, nxt = len(arrival), 0
        total_blocks, bs = kv.num_blocks, kv.block_size
        horizon, deadline = self.horizon_s, self.deadline
        queue = self.queue
        kv_views: dict[int, KVView] = {}
        steady_ok = self.skip
        admitted = self._admitted
        id_base, id_step = self.id_base, self.id_step
        entry = rep.entry_reason
        apply = self._apply
        # the clock, running count and blocks used, as the last compiled call left them
        now, n_run, used = float(st_f[0]), int(st_i[slots.S_N_RUN]), int(st_i[slots.S_USED])
        while True:
            if horizon is not None and now >= horizon:
                return
            if deadline is not None and time.perf_counter() > deadline:
                return
            # -- ``_take_arrivals`` ---------------------------------------------------------
            if nxt < n and arrival[nxt] <= now:
                rows, joining = [], []
                while nxt < n and arrival[nxt] <= now:
                    if nxt in entry:  # never fits: rejected as it arrives
                        ri[nxt, RI_STATUS], ri[nxt, RI_REASON] = slots.REJECTED, slots.ON_ARRIVAL
                        rep.req_f[nxt, RF_FINISH] = now
                    else:
                        rows.append(nxt)
                        joining.append(SeqView(ids[nxt], arrival[nxt], self.prompt[nxt], 0, 0,
                                               0, 0, self.priority[nxt]))
                    nxt += 1
                queue.arrive(rows, joining)
                st_i[slots.S_NXT] = nxt
            if not (queue.rows or n_run):
                if nxt < n:  # idle until the next arrival
                    st_f[0] = now = arrival[nxt]
                    continue
                return
            # -- the view -------------------------------------------------------------------
            if n_run:  # the columns the last call wrote, zipped into named tuples
                ints = self._view_ints[:, :n_run].tolist()
                running = tuple(map(_NEW, repeat(SeqView), zip(
                    ints[0], self._view_arrival[:n_run].tolist(), *ints[1:], strict=True)))
            else:
                running = ()
            kv_view = kv_views.get(used)
            if kv_view is None:  # immutable: one per count of blocks in use, kept
                kv_view = kv_views[used] = KVView(total_blocks, total_blocks - used, bs)
            view = View(now, queue.views, running, kv_view, nxt < n)
            plan = policy.schedule(view)
            # -- the plan as rows -----------------------------------------------------------
            if plan.__class__ is not Plan:  # the reference says what it makes of it
                raise NotCovered(f"policy {policy.name!r} returned a {type(plan).__name__}")
            if plan.padding or plan.on_finish not in ON_FINISH:
                raise NotCovered(f"policy {policy.name!r} at t={now:.6f}s made a plan with "
                                 + ("padding rows" if plan.padding
                                    else f"on_finish={plan.on_finish!r}"))
            run = plan.run
            # the requests then their tokens, in one array; ids and counts must be ints (bools
            # too, as ``validate_plan`` has it): a float, numpy scalar or any other number
            # makes their sum another type
            try:
                if id_step:  # by id: the compiled call finds the rows
                    if type(sum(chain(run, run.values()))) is not int:
                        raise TypeError
                    flat = np.fromiter(chain(run, run.values()), np.int64, 2 * len(run))
                else:
                    if type(sum(run.values())) is not int:
                        raise TypeError
                    flat = np.fromiter(chain(map(row_of.__getitem__, run), run.values()),
                                       np.int64, 2 * len(run))
                pre_rows = (np.fromiter(map(row_of.__getitem__, plan.preempt), np.int64,
                                        len(plan.preempt)) if plan.preempt else _EMPTY)
                rej_rows = (np.fromiter(map(row_of.__getitem__, plan.reject), np.int64,
                                        len(plan.reject)) if plan.reject else _EMPTY)
            except (KeyError, TypeError, OverflowError, AttributeError):
                raise NotCovered(f"policy {policy.name!r} at t={now:.6f}s named a request "
                                 "it was not shown or gave a count that is not an int"
                                 ) from None
            queued = len(queue)
            # the limits as they are now (``validate_plan`` reads them at every plan)
            max_seqs = as_limit(policy.max_num_seqs)
            max_tokens = as_limit(policy.max_num_batched_tokens)
            if max_seqs.__class__ is not int or max_tokens.__class__ is not int:
                # (a float or numpy limit would also make numba compile another version)
                raise NotCovered(f"policy {policy.name!r} has a limit that is not an int")
            steady = bool(steady_ok and plan.steady)
            while True:
                if rep.layout != self._layout:
                    self._packed = self._pack(rep, self._out)
                    self._layout = rep.layout
                args = (self._packed, flat, id_base, id_step, pre_rows, rej_rows, max_seqs,
                        max_tokens, queued, steady, admitted)
                try:
                    code, n_adm, n_run, used, now = apply(*args)
                except OverflowError:  # a limit past int64 (the dispatcher would compile anew)
                    raise NotCovered(f"policy {policy.name!r} has a limit past int64") from None
                if apply is self._apply:  # the same types at every call from here on
                    apply = direct(self._apply, args)
                if code != slots.LOG_FULL and code != slots.IRR_FULL:
                    break
                rep.make_room(code)
            if code == slots.INVALID:
                raise NotCovered(f"policy {policy.name!r} at t={now:.6f}s made a plan that "
                                 "breaks a rule")
            # -- the queue after the plan ---------------------------------------------------
            if plan.reject or n_adm:
                gone = rej_rows.tolist() if plan.reject else []
                for r, reason in zip(gone, plan.reject.values(), strict=True):
                    self.policy_reason[r] = reason
                queue.leave(gone + admitted[:n_adm].tolist())
            if plan.preempt:
                for r in pre_rows.tolist():
                    if ri[r, RI_STATUS] == slots.WAITING:  # else rejected (preempted too often)
                        queue.preempted(r, SeqView(
                            ids[r], arrival[r], self.prompt[r], int(ri[r, RI_GENERATED]), 0,
                            int(ri[r, RI_NPRE]), 0, self.priority[r]))
            if code == slots.IDLE:  # nothing to run: until the wake-up or the next arrival
                wake = plan.wake_at_s
                if wake is None:
                    if nxt >= n:
                        if queue.rows or n_run:
                            raise NotCovered("the policy stalled")  # the reference says so
                        return
                    wake = math.inf
                elif wake <= now:
                    raise NotCovered("a wake-up that is not in the future")
                if nxt < n:
                    wake = min(wake, arrival[nxt])
                st_f[0] = now = wake


def affine(ids: np.ndarray) -> tuple[int, int]:
    """``(a, b)`` with ``ids == a + b * arange(len(ids))`` and ``b >= 1``, else ``(0, 0)``."""
    if len(ids) == 0:
        return 0, 0
    a = int(ids[0])
    b = int(ids[1] - ids[0]) if len(ids) > 1 else 1
    if b < 1 or not np.array_equal(ids, a + b * np.arange(len(ids), dtype=np.int64)):
        return 0, 0
    return a, b


def planned_replica(policy: Policy, cost: Any, kv: KVConfig, ids: np.ndarray,
                    arrival: np.ndarray, prompt: np.ndarray, out: np.ndarray,
                    priority: np.ndarray | None, log: StepLog, *, max_model_len: int | None,
                    horizon_s: float | None, deadline: float | None, skip: bool,
                    replica: int = 0) -> PlannedReplica:
    """A ``PlannedReplica`` for one replica's requests (arrival order) under ``policy``,
    whose full step buffer folds into ``log`` when its step table is bucketed; ``run`` it,
    then ``hand_over``."""
    from sim.engine.compiled_run import fold_when_full

    rp = PlannedReplica(policy, cost, kv, ids, arrival, prompt, out, priority,
                        max_model_len=max_model_len, horizon_s=horizon_s, deadline=deadline,
                        skip=skip)
    rp.rep.on_log_full = fold_when_full(log, replica)
    return rp


def hand_over(rp: PlannedReplica, log: StepLog, replica: int) -> Outcomes:
    """Fill ``log`` with the steps of ``rp`` (run to its end) and return its outcomes in its
    arrival order, the policy's rejections in its own words."""
    from sim.engine import compiled_run

    outcomes = compiled_run.hand_over(rp.rep, log, replica)
    for row, reason in rp.policy_reason.items():
        outcomes.reason[row] = reason
    return outcomes


def live_logs(logs: list[StepLog], reps: list[PlannedReplica]) -> LiveLogs:
    """``logs`` (one per replica) with the run's own progress, read from the replicas' arrays
    when asked: requests finished or rejected, steps taken (folded into buckets or still in a
    buffer, which fills the log only at the end) and the furthest clock."""
    from sim.engine.compiled_plan import RI_STATUS

    def done() -> int:
        return sum(int(np.count_nonzero(rp.rep.req_i[:rp.rep.num_requests, RI_STATUS]
                                        >= slots.FINISHED)) for rp in reps)

    def steps() -> int:
        return sum(rp.rep.num_steps + (log.stream.num_rows if log.stream is not None else 0)
                   for rp, log in zip(reps, logs, strict=True))

    def reached_s() -> float:
        return max([0.0, *(rp.rep.now for rp in reps)])

    return LiveLogs(logs, done, steps, reached_s)
