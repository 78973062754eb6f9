"""Frozen values that cross module boundaries: requests, policy views and plans, batch shapes.

The engine alone owns mutable request state (see ``sim.engine.replica``); everything a policy or a
cost model sees is one of these immutable values, so a plugin can never corrupt the simulation.
Vocabulary follows vLLM: ``num_computed_tokens`` catches up with ``num_prompt_tokens +
num_generated``; when it does at the end of a step, one new token is sampled.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from sim.core.errors import InputError
from sim.core.rules import blocks_needed, slab_floor, uncomputed_tokens


@dataclass(frozen=True, slots=True, init=False)
class Request:
    """One trace row. ``num_output_tokens`` is the true output length: engine-only knowledge.

    Its ``__init__`` sets the slots through their own descriptors (``_slot_setters``): a
    million-request trace makes a million of them before its run starts."""

    id: int
    arrival_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    priority: int = 0
    tenant: str | None = None
    prefix_id: str | None = None
    #: Leading prompt tokens shared with every other request of the same ``prefix_id`` (a
    #: system prompt, a conversation's history): what prefix caching may reuse.
    num_prefix_tokens: int = 0
    #: Prefix identity by blocks: one id per 512 prompt tokens, equal leading ids = shared
    #: tokens (``sim.core.blocks``; instead of ``prefix_id``/``num_prefix_tokens``).
    hash_ids: tuple[int, ...] = ()

    def __init__(self, id: int, arrival_s: float, num_prompt_tokens: int,  # noqa: A002
                 num_output_tokens: int, priority: int = 0, tenant: str | None = None,
                 prefix_id: str | None = None, num_prefix_tokens: int = 0,
                 hash_ids: tuple[int, ...] = ()) -> None:
        _req_id(self, id)
        _req_arrival(self, arrival_s)
        _req_prompt(self, num_prompt_tokens)
        _req_output(self, num_output_tokens)
        _req_priority(self, priority)
        _req_tenant(self, tenant)
        _req_prefix(self, prefix_id)
        _req_prefix_tokens(self, num_prefix_tokens)
        _req_hash_ids(self, hash_ids)


class _SeqFields(NamedTuple):
    """``SeqView``'s fields, in order (its last one derived from three others)."""

    id: int
    arrival_s: float
    num_prompt_tokens: int
    num_generated: int
    num_computed_tokens: int
    num_preemptions: int = 0
    num_blocks: int = 0
    priority: int = 0
    num_uncomputed: int = 0


class SeqView(_SeqFields):
    """What a policy may know about one request: everything but its true output length.

    ``num_uncomputed`` — the tokens still to compute before the next token can be sampled (1
    for a decode; ``sim.core.rules.uncomputed_tokens``) — is derived from the prompt, generated
    and computed counts when the view is made, and cannot be given: it is stored rather than a
    property because a policy reads it for every request at every step, and a stored field
    reads several times faster.

    A named tuple rather than a frozen dataclass: immutable all the same, and the engine
    builds one per running request per step (its most frequent allocation), which a tuple
    makes about three times cheaper. The engine builds its views from complete rows
    (``_make``, or ``tuple.__new__``, the derived field included); ``SeqView(...)`` and
    ``_replace`` derive it."""

    __slots__ = ()

    def __new__(cls, id: int, arrival_s: float, num_prompt_tokens: int,  # noqa: A002
                num_generated: int, num_computed_tokens: int, num_preemptions: int = 0,
                num_blocks: int = 0, priority: int = 0) -> SeqView:
        """A view of these counts, its ``num_uncomputed`` derived from them."""
        return tuple.__new__(cls, (
            id, arrival_s, num_prompt_tokens, num_generated, num_computed_tokens,
            num_preemptions, num_blocks, priority,
            uncomputed_tokens(num_prompt_tokens, num_generated, num_computed_tokens)))

    def _replace(self, **changes: Any) -> SeqView:
        """A copy with ``changes`` to its given fields, ``num_uncomputed`` derived again."""
        if "num_uncomputed" in changes:
            raise TypeError("SeqView.num_uncomputed is derived from the token counts; "
                            "change those instead")
        fields: dict[str, Any] = dict(zip(self._fields[:-1], self, strict=False))
        fields.update(changes)
        return SeqView(**fields)

    def __getnewargs__(self) -> tuple[Any, ...]:
        """``__new__``'s arguments (for pickling and copying): the fields but the derived."""
        return tuple(self)[:-1]

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens: the length ``num_computed_tokens`` must catch up with."""
        return self.num_prompt_tokens + self.num_generated

    @property
    def is_prefill(self) -> bool:
        """True while prompt (or recomputed) tokens remain; a pure decode has exactly one left."""
        return self.num_uncomputed > 1 or self.num_generated == 0


@dataclass(frozen=True, slots=True)
class KVView:
    """The KV cache as a policy sees it: block counts and how many blocks a step would need.

    ``reserve_tokens`` is set for slab allocation: a sequence's first allocation reserves blocks
    for that many tokens at once (Orca/FasterTransformer); ``None`` means paged, on demand.
    ``reserve_output_tokens`` is the other slab rule: reserve the prompt plus that many output
    tokens per sequence. ``cached_blocks`` (informational) are prefix-cache blocks no sequence
    holds; they are reclaimed on demand and already counted in ``free_blocks``.
    """

    total_blocks: int
    free_blocks: int
    block_size: int
    reserve_tokens: int | None = None
    reserve_output_tokens: int | None = None
    cached_blocks: int = 0

    def blocks_needed(self, seq: SeqView, num_new_tokens: int) -> int:
        """Extra blocks ``seq`` must be given to hold ``num_new_tokens`` more computed tokens
        (``sim.core.rules.blocks_needed``)."""
        if self.reserve_tokens is None and self.reserve_output_tokens is None:
            floor = 0  # paged: no reservation (the common case, without a call)
        else:
            floor = self.floor_tokens(seq)
        return blocks_needed(seq.num_computed_tokens + num_new_tokens, floor, seq.num_blocks,
                             self.block_size)

    def floor_tokens(self, seq: SeqView) -> int:
        """Tokens a slab reserves for ``seq`` at its first allocation (0 when paged):
        ``sim.core.rules.slab_floor``."""
        per_seq = self.reserve_output_tokens
        return slab_floor(seq.num_prompt_tokens, self.reserve_tokens or 0,
                          -1 if per_seq is None else per_seq)

    @property
    def used_fraction(self) -> float:
        """Share of blocks in use (0 for an unlimited cache)."""
        return 1.0 - self.free_blocks / self.total_blocks if self.total_blocks else 0.0


def _slot_setters(cls: type, *names: str) -> tuple[Callable[[Any, Any], None], ...]:
    """The ``__set__`` of each named slot of ``cls``: how the ``__init__`` of a frozen
    dataclass made at every step (``View``, ``Plan``) or for every request (``Request``) sets
    its fields. The generated one calls ``object.__setattr__`` by name for each, about twice
    as slow, and a Python policy's run makes a ``View`` and a ``Plan`` a step."""
    return tuple(cls.__dict__[name].__set__ for name in names)


(_req_id, _req_arrival, _req_prompt, _req_output, _req_priority, _req_tenant, _req_prefix,
 _req_prefix_tokens, _req_hash_ids) = _slot_setters(
    Request, "id", "arrival_s", "num_prompt_tokens", "num_output_tokens", "priority", "tenant",
    "prefix_id", "num_prefix_tokens", "hash_ids")


@dataclass(frozen=True, slots=True, init=False)
class View:
    """Everything a policy sees at one scheduling point."""

    now_s: float
    waiting: tuple[SeqView, ...]
    running: tuple[SeqView, ...]
    kv: KVView
    more_arrivals: bool

    def __init__(self, now_s: float, waiting: tuple[SeqView, ...],
                 running: tuple[SeqView, ...], kv: KVView, more_arrivals: bool) -> None:
        _view_now(self, now_s)
        _view_waiting(self, waiting)
        _view_running(self, running)
        _view_kv(self, kv)
        _view_more(self, more_arrivals)


_view_now, _view_waiting, _view_running, _view_kv, _view_more = _slot_setters(
    View, "now_s", "waiting", "running", "kv", "more_arrivals")


@dataclass(frozen=True, slots=True)
class PaddingRow:
    """A batch row the GPU computes but whose output is discarded (static batching's waste)."""

    num_tokens: int
    context_len: int


@dataclass(frozen=True, slots=True, init=False)
class Plan:
    """A policy's decision for one step.

    ``run`` maps request id to the tokens to compute this step (a prefill chunk, or 1 to decode).
    ``preempt`` lists running requests evicted before the step: their KV is dropped and later
    recomputed, or swapped to host memory and back (``kv.preemption``).
    ``padding`` are rows the batch pays for without producing tokens.
    ``wake_at_s`` asks to be called again at that time if nothing else happens first (an empty
    ``run`` with ``wake_at_s=None`` means: wait for the next arrival).
    ``reject`` maps waiting request ids the policy can never serve to a reason (e.g. a prompt
    longer than its token budget); the engine records them as rejected instead of hanging.
    ``steady`` is the policy's promise that lets the engine skip events exactly: as long as no
    request arrives, no scheduled request finishes and KV growth needs no more blocks than are
    free, every following plan would be this one again — each listed request decoding one more
    token and each padding row attending one more token. Only pure decode plans may say so.
    ``on_finish`` widens that promise past a scheduled request's finish: ``"stop"`` (none: ask
    again), ``"drop"`` (the plan without it, as a decode batch with nothing waiting goes on),
    ``"pad"`` (its row becomes a one-token padding row at the context it would have had, padding
    rows in increasing context order: a run-to-completion batch). ``ignores_arrivals`` says
    arrivals do not change the plan either (a batch in flight that nobody joins).
    """

    run: Mapping[int, int]
    preempt: tuple[int, ...]
    reject: Mapping[int, str]
    steady: bool
    padding: tuple[PaddingRow, ...]
    wake_at_s: float | None
    on_finish: str
    ignores_arrivals: bool

    def __init__(self, run: Mapping[int, int] | None = None, preempt: tuple[int, ...] = (),
                 reject: Mapping[int, str] | None = None, steady: bool = False,
                 padding: tuple[PaddingRow, ...] = (), wake_at_s: float | None = None,
                 on_finish: str = "stop", ignores_arrivals: bool = False) -> None:
        _plan_run(self, {} if run is None else run)
        _plan_preempt(self, preempt)
        _plan_reject(self, {} if reject is None else reject)
        _plan_steady(self, steady)
        _plan_padding(self, padding)
        _plan_wake(self, wake_at_s)
        _plan_on_finish(self, on_finish)
        _plan_ignores(self, ignores_arrivals)


(_plan_run, _plan_preempt, _plan_reject, _plan_steady, _plan_padding, _plan_wake,
 _plan_on_finish, _plan_ignores) = _slot_setters(
    Plan, "run", "preempt", "reject", "steady", "padding", "wake_at_s", "on_finish",
    "ignores_arrivals")


#: What a ``steady`` plan promises at a scheduled request's finish (``Plan.on_finish``).
ON_FINISH = ("stop", "drop", "pad")


@dataclass(frozen=True, slots=True)
class BatchShape:
    """All the cost model sees of a step: per-row new tokens and attended context lengths.

    ``context_lens[i]`` is the KV length row ``i`` attends in this step, its new tokens included.
    Padding rows are included in the arrays; ``num_padding_tokens`` says how many tokens are waste.
    """

    new_tokens: np.ndarray
    context_lens: np.ndarray
    num_padding_tokens: int = 0

    @staticmethod
    def of(new_tokens: list[int] | np.ndarray, context_lens: list[int] | np.ndarray,
           num_padding_tokens: int = 0) -> BatchShape:
        """Build a shape from sequences, validating that both lists align and are positive."""
        nt = _token_counts(new_tokens, "new_tokens")
        cl = _token_counts(context_lens, "context_lens")
        if nt.shape != cl.shape or nt.ndim != 1:
            raise InputError("new_tokens and context_lens must be 1-D lists of equal length")
        if nt.size and (nt.min() < 1 or (cl < nt).any()):
            raise InputError("each row needs new_tokens >= 1 and context_len >= new_tokens")
        return BatchShape(nt, cl, int(num_padding_tokens))

    @property
    def num_tokens(self) -> int:
        """Tokens computed in the step, padding included."""
        return int(self.new_tokens.sum())


def _token_counts(values: Any, name: str) -> np.ndarray:
    """``values`` as int64 token counts; anything but integers (a string, NaN, 2.5, which
    int64 would truncate to 2, and 8.0, as every integer key and the request columns refuse
    it: ``sim.core.fields.check_int``) is an ``InputError`` naming ``name``."""
    try:
        arr = np.asarray(values)
        whole = arr.dtype.kind in "iu" or arr.size == 0
    except (TypeError, ValueError):  # ragged nesting, objects numpy cannot hold
        whole = False
    if not whole:
        raise InputError(f"expected a 1-D list of integer token counts, got {values!r}"[:200],
                         field=name)
    return arr.astype(np.int64)


@dataclass(frozen=True, slots=True)
class StepCost:
    """The cost of one forward pass: seconds, work done and which resource bound it."""

    seconds: float
    flops: float = 0.0
    bytes: float = 0.0
    bound: str = "constant"
    breakdown: Mapping[str, float] = field(default_factory=dict)
