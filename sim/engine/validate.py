"""Plan validation: every rule a policy's ``Plan`` must keep, checked before the engine acts.

A broken rule raises ``EngineError`` naming the policy, the time and the rule, so a buggy
plugin fails loudly instead of corrupting the simulation. Token counts and KV needs are
checked against the very ``View`` the policy saw (a waiting request's cached prompt tokens
included), which is what makes the checks exact.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn

from sim.core.rules import as_limit, blocks_fit, blocks_needed, tokens_allowed, within_limit
from sim.core.types import ON_FINISH, Plan, View

if TYPE_CHECKING:
    from sim.engine.replica import Replica


class EngineError(RuntimeError):
    """A policy returned a plan that breaks an engine rule (names the policy and the rule)."""


def fail(rep: Replica, now: float, rule: str) -> NoReturn:
    """Raise the error for ``rule`` broken by ``rep``'s policy at ``now``."""
    raise EngineError(f"policy {rep.policy.name!r} at t={now:.6f}s broke a rule: {rule}")


def validate_plan(rep: Replica, plan: Plan, view: View) -> list[int]:
    """Check ``plan`` against ``view`` and the replica's queues; raise ``EngineError``.

    Returns the KV blocks each scheduled request needs, in ``plan.run``'s order, as counted
    against the view: what ``ReplicaSteps._launch`` gives a request that was already running
    (neither the plan's rejections nor its preemptions touch a scheduled request)."""
    now, pol = view.now_s, rep.policy
    for sid in plan.reject:
        if sid not in rep.waiting and sid not in rep.preempted:
            fail(rep, now, f"reject of request {sid}, which is not waiting")
    freed = 0
    for sid in plan.preempt:
        seq = rep.running.get(sid)
        if seq is None:
            fail(rep, now, f"preempt of request {sid}, which is not running")
        if sid in plan.run:
            fail(rep, now, f"request {sid} both preempted and scheduled")
        freed += seq.num_blocks
    if plan.wake_at_s is not None and not plan.run and plan.wake_at_s <= now:
        fail(rep, now, f"wake_at_s={plan.wake_at_s} is not in the future")
    if plan.on_finish not in ON_FINISH:
        fail(rep, now, f"on_finish={plan.on_finish!r} is not one of {', '.join(ON_FINISH)}")
    if not plan.run:
        # preempting to make room, running nothing, is a plan only when blocks are held for
        # requests whose KV was computed elsewhere: landed and waiting, or still in transit
        # (``sim.engine.drive.reserve_kv`` / ``land_kv``)
        if plan.padding or (plan.preempt and not rep.incoming
                            and not any(s.num_blocks for s in rep.waiting.values())):
            fail(rep, now, "padding rows or preemptions without any request to run")
        return []
    if not within_limit(len(plan.run), as_limit(pol.max_num_seqs)):
        fail(rep, now, f"{len(plan.run)} sequences > max_num_seqs={pol.max_num_seqs}")
    total = 0
    blocks = 0
    kv = view.kv
    bs = kv.block_size
    # ``kv.blocks_needed(seen, n)`` without its method call: paged has no floor
    paged = kv.reserve_tokens is None and kv.reserve_output_tokens is None
    running, waiting, preempted, reject = rep.running, rep.waiting, rep.preempted, plan.reject
    get = running.get
    needs: list[int] = []
    keep = needs.append
    for sid, n in plan.run.items():
        seq = get(sid) or waiting.get(sid) or preempted.get(sid)
        if seq is None or (reject and sid in reject):
            fail(rep, now, f"request {sid} is not waiting or running")
        # the view the policy saw: every running and queued request's was built for it; read
        # by name, so a field added to ``SeqView`` changes nothing here
        seen = seq.cached_view or seq.view()
        computed, left = seen.num_computed_tokens, seen.num_uncomputed
        if n.__class__ is not int and not isinstance(n, int) or not tokens_allowed(n, left):
            fail(rep, now, f"request {sid}: {n!r} tokens scheduled, 1..{left} allowed")
        total += n
        need = blocks_needed(computed + n, 0 if paged else kv.floor_tokens(seen), seen.num_blocks,
                             bs)
        keep(need)
        blocks += need
    if not within_limit(total, as_limit(pol.max_num_batched_tokens)):
        fail(rep, now, f"{total} tokens > max_num_batched_tokens={pol.max_num_batched_tokens}")
    if not blocks_fit(blocks, kv.free_blocks, freed):
        fail(rep, now, f"needs {blocks} KV blocks, only {kv.free_blocks + freed} free")
    for row in plan.padding:
        if row.num_tokens < 1 or row.context_len < row.num_tokens:
            fail(rep, now, f"invalid padding row {row}")
    return needs
