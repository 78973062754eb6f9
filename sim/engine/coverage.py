"""Which engine runs a simulation, decided by an allow-list: the compiled tier fails closed.

Every field of the scheduling specifications — the iteration-level ``SchedulingSpec`` and the
run-to-completion ``BatchSpec`` — and of ``KVConfig`` is mapped here to the values the compiled
interpreter (``sim.engine.compiled``) covers, ``ANY`` for all of them. A run takes it only
when its policy is a built-in preset of a specification (``continuous``, ``chunked_prefill``,
``scheduler``; ``static``, ``dynamic``: exactly those classes, not subclasses), every field's
value is allowed and the cost model is one the interpreter costs itself; anything else — a
value not listed, a field nobody mapped, a custom policy or cost model — runs on the general
engine, and ``SimResult.engine_reason`` says which setting sent it there. A test fails when a
field of any of these dataclasses is missing from the tables.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from policies.chunked_prefill import ChunkedPrefill
from policies.continuous import ContinuousBatching
from policies.dynamic import DynamicBatching
from policies.scheduler import Scheduler
from policies.static import StaticBatching
from sim.core.batching import BatchSpec
from sim.core.scheduling import SchedulingSpec
from sim.cost.base import ConstantCost, LinearCost
from sim.cost.roofline import RooflineCost
from sim.kv.config import KVConfig

#: Every value of a field is covered.
ANY = None

#: The policy classes whose ``spec`` the fast paths interpret (their exact types): presets
#: of ``SchedulingSpec``, then of ``BatchSpec``.
SPEC_POLICIES = (ContinuousBatching, ChunkedPrefill, Scheduler, StaticBatching, DynamicBatching)

#: ``SchedulingSpec`` field -> values the compiled interpreter covers: all of them.
COMPILED_SPEC: Mapping[str, frozenset[Any] | None] = {
    "composition": ANY,
    "admission": ANY,
    "chunk_size": ANY,
    "max_num_seqs": ANY,
    "max_num_batched_tokens": ANY,
    "watermark": ANY,
    "order": ANY,
    "victim": ANY,
    "ttft_target_s": ANY,
    "ttft_targets_s": ANY,
}

#: ``BatchSpec`` field -> values the compiled interpreter covers: all of them.
COMPILED_BATCH: Mapping[str, frozenset[Any] | None] = {
    "batch_size": ANY,
    "wait_s": ANY,
    "bucket_by_prompt": ANY,
    "order": ANY,
}

#: ``KVConfig`` field -> values the compiled interpreter covers.
COMPILED_KV: Mapping[str, frozenset[Any] | None] = {
    "num_blocks": ANY,
    "block_size": ANY,
    "allocator": frozenset({"paged"}),
    "reserve_tokens": ANY,  # read by the slab allocator only
    "unlimited": ANY,
    "slab_reserve": ANY,  # slab only
    "max_output_tokens": ANY,  # slab only
    "preemption": frozenset({"recompute"}),
    "swap_s_per_token": ANY,  # swap only
    "kv_bytes_per_token": ANY,  # swap only
    "max_preemptions": ANY,
    "prefix_caching": frozenset({False}),
}

#: Where ``SimResult.engine_reason`` says the allow-lists sent a run.
PATH = "compiled interpreter"
#: Where ``SimResult.step_engine_reason`` says they sent a general-engine run's plans.
STEPS_PATH = "compiled steps"
#: Policies whose plans carry padding rows (run-to-completion batches): the general engine
#: carries them out itself, a batch's steps in one event (``sim.engine.batch_skip``).
PADDING_POLICIES = (StaticBatching, DynamicBatching)


def cost_kind(cost: object) -> int:
    """The compiled interpreter's code for a cost model: 0 ``RooflineCost`` (without a sliding
    window), 1 ``ConstantCost``, 2 ``LinearCost`` (exactly those classes); -1 for any other."""
    if isinstance(cost, RooflineCost):
        return 0 if cost.model.sliding_window is None else -1
    return {ConstantCost: 1, LinearCost: 2}.get(type(cost), -1)


def spec_of(policy: object) -> SchedulingSpec | BatchSpec | None:
    """The specification a built-in preset policy interprets (``None`` for any other)."""
    if type(policy) in SPEC_POLICIES:
        return policy.spec  # type: ignore[attr-defined]  # every preset has one
    return None


def iteration_spec_of(policy: object) -> SchedulingSpec | None:
    """The iteration-level specification a built-in preset interprets (``None`` for a
    run-to-completion preset and any other policy): what replicas driven from outside run."""
    spec = spec_of(policy)
    return spec if isinstance(spec, SchedulingSpec) else None


def uncovered(value: object, table: Mapping[str, frozenset[Any] | None], prefix: str,
              path: str) -> str:
    """Every field of dataclass ``value`` whose value ``table`` does not allow, as a reason
    ('' when all are allowed); a field missing from ``table`` is not allowed."""
    reasons = []
    for f in dataclasses.fields(value):  # type: ignore[arg-type]
        v = getattr(value, f.name)
        if f.name not in table:
            reasons.append(f"{prefix}{f.name} is not mapped for the {path}")
            continue
        allowed = table[f.name]
        if allowed is not ANY and v not in allowed:
            reasons.append(f"{prefix}{f.name}={v!r} is not covered by the {path}")
    return "; ".join(reasons)


def fast_path_blocker(policy: object, kv: KVConfig, cost: object, *, checks: bool,
                      event_skipping: bool, driven: bool = False) -> str:
    """Why this run cannot take the compiled interpreter ('' when it can); ``driven``: its
    replicas are driven from outside (a router, a disaggregated cluster), which the compiled
    interpreter covers for iteration-level presets only."""
    spec = spec_of(policy)
    name = getattr(policy, "name", type(policy).__name__)
    if spec is None:
        return f"policy {name!r} is not a preset of a scheduling specification"
    if isinstance(spec, BatchSpec):
        if driven:
            return (f"policy {name!r} runs batches to completion, which replicas driven from "
                    "outside (a router or a disaggregated cluster) run on the general engine")
        why = uncovered(spec, COMPILED_BATCH, "policy.", PATH)
    else:
        why = uncovered(spec, COMPILED_SPEC, "policy.", PATH)
    if why:
        return why
    return _steps_blocker(kv, cost, checks, PATH, event_skipping)


def _steps_blocker(kv: KVConfig, cost: object, checks: bool, path: str,
                   event_skipping: bool = True) -> str:
    """Why compiled arrays cannot carry out this run's steps, whoever plans them ('' when
    they can): a KV setting outside ``COMPILED_KV``, per-step checks, event skipping off
    (asked of the interpreter, which always skips), or a cost model the interpreter does not
    cost itself."""
    why = uncovered(kv, COMPILED_KV, "kv.", path)
    if why:
        return why
    if checks:
        return "per-step invariant checks (checks=True)"
    if not event_skipping:
        return "event skipping off"
    if getattr(getattr(cost, "model", None), "sliding_window", None) is not None:
        return "a sliding-window model"
    if cost_kind(cost) < 0:
        return "the cost model is not a RooflineCost, ConstantCost or LinearCost"
    return ""


class NotCovered(Exception):
    """A plan the compiled steps (``sim.engine.planned``) do not carry out: the run goes to
    the reference engine, which carries it out or names the rule it breaks."""


def planned_blocker(policy: object, kv: KVConfig, cost: object, *, checks: bool) -> str:
    """Why the general engine cannot carry out this run's plans on compiled steps
    (``sim.engine.planned``; '' when it can): the same KV and cost-model allow-lists as the
    compiled interpreter, no per-step checks, and a policy whose plans have no padding rows."""
    if isinstance(policy, PADDING_POLICIES):
        return (f"policy {getattr(policy, 'name', type(policy).__name__)!r} pads its batches "
                "(the general engine runs them to completion in one event)")
    return _steps_blocker(kv, cost, checks, STEPS_PATH)
