"""Which engine runs a simulation, decided by an allow-list: the fast paths fail closed.

Every field of the scheduling specification (``SchedulingSpec``) and of ``KVConfig`` is mapped
here to the values the exact fast path (``sim.engine.fastpath``) covers — ``ANY`` for all of
them — and the compiled kernel (``sim.engine.fastkernel``) narrows that further. A run takes a
fast path only when its policy is a built-in preset of the specification (``continuous``,
``chunked_prefill``, ``scheduler``; exactly those classes, not subclasses) and every field's
value is allowed; anything else — a value not listed, a field nobody mapped, a custom policy —
runs on the general engine, and ``SimResult.engine_reason`` says which setting sent it there.
A test fails when a field of either dataclass is missing from these tables.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from policies.chunked_prefill import ChunkedPrefill
from policies.continuous import ContinuousBatching
from policies.scheduler import Scheduler
from sim.core.scheduling import SchedulingSpec
from sim.kv.config import KVConfig

#: Every value of a field is covered.
ANY = None

#: The policy classes whose ``spec`` the fast paths interpret (their exact types).
SPEC_POLICIES = (ContinuousBatching, ChunkedPrefill, Scheduler)

#: ``SchedulingSpec`` field -> values the exact fast path covers.
FAST_SPEC: Mapping[str, frozenset[Any] | None] = {
    "composition": frozenset({"prefill_first", "mixed"}),
    "admission": frozenset({"whole"}),
    "chunk_size": ANY,  # null with whole admission, the only kind covered
    "max_num_seqs": ANY,
    "max_num_batched_tokens": ANY,
    "watermark": ANY,
    "order": frozenset({"fcfs"}),
    "victim": frozenset({"newest"}),
    "ttft_target_s": ANY,  # read by the edf order and the deadline victim only
    "ttft_targets_s": ANY,
}

#: ``KVConfig`` field -> values the exact fast path covers.
FAST_KV: Mapping[str, frozenset[Any] | None] = {
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

#: What the compiled kernel covers beyond ``FAST_SPEC``'s restrictions (the rest as there).
COMPILED_SPEC: Mapping[str, frozenset[Any]] = {
    "composition": frozenset({"prefill_first"}),
}


def spec_of(policy: object) -> SchedulingSpec | None:
    """The specification a built-in preset policy interprets (``None`` for any other)."""
    if type(policy) in SPEC_POLICIES:
        return policy.spec  # type: ignore[attr-defined]  # every preset has one
    return None


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
                      event_skipping: bool) -> str:
    """Why this run cannot take the exact fast path ('' when it can)."""
    spec = spec_of(policy)
    if spec is None:
        return (f"policy {getattr(policy, 'name', type(policy).__name__)!r} is not a preset of "
                "the scheduling specification")
    why = (uncovered(spec, FAST_SPEC, "policy.", "fast path")
           or uncovered(kv, FAST_KV, "kv.", "fast path"))
    if why:
        return why
    if spec.composition == "mixed" and not callable(getattr(cost, "mixed_step", None)):
        return "composition 'mixed' with a cost model that has no mixed_step"
    if checks:
        return "per-step invariant checks (checks=True)"
    if not event_skipping:
        return "event skipping off"
    if not callable(getattr(cost, "decode_step", None)):
        return "the cost model has no decode_step"
    if getattr(getattr(cost, "model", None), "sliding_window", None) is not None:
        return "a sliding-window model"
    return ""


def compiled_spec_blocker(spec: SchedulingSpec) -> str:
    """Why the kernel cannot run a specification the fast path covers ('' when it can)."""
    for name, allowed in COMPILED_SPEC.items():
        value = getattr(spec, name)
        if value not in allowed:
            return f"policy.{name}={value!r} is not covered by the compiled kernel"
    return ""
