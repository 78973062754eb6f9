"""The reference interpreter of the run-to-completion batch specification (``BatchSpec``).

``RunToCompletion(spec)`` is one replica's batcher: ``static`` and ``dynamic`` batching are
presets of ``sim.core.batching.BatchSpec`` and both schedule through it. A batch is taken from
the head of the waiting queue (``pick_batch``: when it is full, when its oldest request has
waited ``wait_s``, or when no more requests will arrive; per prompt bucket when the spec has
buckets), prefilled in one step padded to its longest prompt, then decoded step after step
until every member has finished; nobody joins meanwhile (FasterTransformer-style
request-level batching). The two costs of that design are made visible to the metrics as
padding rows:

- prompt padding: a member shorter than the longest prompt computes ``P_max - p`` wasted tokens;
- finished slots: a member that is done keeps its row and is computed as one padding token a
  step, at the context length it would have had, until the last member finishes.

KV limits: a batch takes the longest prefix that fits in the free blocks. When decode growth
runs out of blocks (paged allocation) the newest member is preempted (``grow_running``) and
rejoins the same batch with a recompute prefill, padded like a fresh prompt, as soon as its
blocks fit with one block of headroom per running member (so the next decode step does not
evict it straight away). Decoding members wait while rejoiners recompute.

The scalar rules (when a batch is ready, which bucket a prompt joins, the room to rejoin) are
``sim.core.rules``; the compiled interpreter (``sim.engine.compiled_batch``) calls the same
ones.
"""
from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from operator import attrgetter

from policies.ordering import order_queue
from policies.packing import budget_for, fitting_prefix, grow_running
from policies.registry import Policy
from sim.core.batching import BatchSpec
from sim.core.rules import batch_due_s, batch_ready, prompt_bucket, rejoin_free_blocks
from sim.core.types import PaddingRow, Plan, SeqView, View

_CONTEXT = attrgetter("context_len")
_ARRIVAL = attrgetter("arrival_s")
_INF = float("inf")

#: A request's prompt-length bucket (``None``: the spec has no buckets, one group).
BucketKey = Callable[[SeqView], Hashable] | None


def bucket_key(spec: BatchSpec) -> BucketKey:
    """The bucket of a waiting request under ``spec`` (``rules.prompt_bucket`` of the tokens it
    would prefill now), or ``None`` when the spec has no buckets."""
    if spec.bucket_by_prompt is None:
        return None
    width, bounds = spec.bucket_width, spec.bucket_upper_bounds
    return lambda s: prompt_bucket(s.num_uncomputed, width, bounds)


def pick_batch(queue: Sequence[SeqView], now_s: float, spec: BatchSpec, more_arrivals: bool,
               key: BucketKey = None) -> tuple[list[SeqView], float | None]:
    """Choose the batch to dispatch now, or say when to look again.

    The ordered ``queue`` is grouped by ``key`` (a single group when ``None``), keeping queue
    order. The first group that is ready (``rules.batch_ready``: ``spec.batch_size`` requests,
    its oldest request waited ``spec.wait_s``, or no more requests will arrive) goes, cut to
    the batch size; otherwise the earliest time a group falls due is returned as the time to
    look again (``None``: at the next arrival).
    """
    groups: dict[Hashable, Sequence[SeqView]] = {}
    if key is None:  # one group: the queue itself
        if queue:
            groups[None] = queue
    else:
        for seq in queue:
            groups.setdefault(key(seq), []).append(seq)  # type: ignore[attr-defined]
    size, wait = spec.batch_size, spec.wait_or_inf_s
    wake = _INF
    for group in groups.values():
        count = len(group)
        # only a group short of the batch size, while more may come, is timed
        due = (_INF if count >= size or not more_arrivals or wait == _INF
               else batch_due_s(min(map(_ARRIVAL, group)), wait))
        if batch_ready(count, size, more_arrivals, now_s, due):
            return list(group[:size]), None
        if due < wake:
            wake = due
    return [], (None if wake == _INF else wake)


def check_wait(policy: Policy, field: str, value: float | None, optional: bool) -> None:
    """Validate a waiting time: a number of seconds >= 0 (or ``None`` when ``optional``)."""
    if value is None and optional:
        return
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
    policy._require(ok, field, f"must be a number of seconds >= 0, got {value!r}")


def wait_spec(value: float | None) -> float | None:
    """A preset's waiting time as ``BatchSpec.wait_s`` takes it: ``None`` for none, as an
    infinite one is (a batch that never falls due goes only full)."""
    return None if value is None or value == _INF else float(value)


def padded_prefill(members: Sequence[SeqView]) -> Plan:
    """Every member computes all its uncomputed tokens, padded to the longest of them."""
    run = {s.id: s.num_uncomputed for s in members}
    longest = max(run.values(), default=0)
    padding = tuple(PaddingRow(longest - n, longest) for n in run.values() if n < longest)
    return Plan(run=run, padding=padding)


class RunToCompletion:
    """The reference interpreter of ``spec`` on one replica: the batch in flight, its member
    ids and each member's context length.

    ``context`` holds the length each member had (or, once finished, would have had) after the
    last step; a finished member's padded slot grows it by one per decode step. A pure decode
    plan is ``steady``: the engine may repeat it without asking (event skipping), and the
    repeats are recovered from how far the running members got.
    """

    def __init__(self, spec: BatchSpec) -> None:
        self.spec = spec
        self.key = bucket_key(spec)
        self.context: dict[int, int] = {}
        #: Members this batch's plans preempted that have not run since: the only members
        #: that can be in the queue (rejected ones stay here until the batch ends).
        self.preempted: set[int] = set()

    def schedule(self, view: View) -> Plan:
        """Continue the batch in flight, or dispatch a new one when ``pick_batch`` says so."""
        spec = self.spec
        rejoin = self._rejoining(view, spec.order)
        if view.running or rejoin:
            return self._continue(view, rejoin)
        self.context.clear()  # the previous batch is done: every member finished
        self.preempted.clear()
        queue = order_queue(view.waiting, spec.order)
        batch, wake = pick_batch(queue, view.now_s, spec, view.more_arrivals, self.key)
        members = fitting_prefix(batch, view.kv, view.kv.free_blocks)
        if not members:
            return Plan(wake_at_s=wake)
        for s in members:
            self.context[s.id] = s.num_computed_tokens + s.num_uncomputed
        return padded_prefill(members)

    def _rejoining(self, view: View, ordering: str) -> list[SeqView]:
        """The members waiting to rejoin the batch, in queue order under ``ordering``: those
        of ``view.waiting`` among the members preempted (a stable sort of them is the order
        they have in the sorted queue), found without a pass over a long queue when none is."""
        if not self.preempted:
            return []
        self.preempted.difference_update(s.id for s in view.running)
        if not self.preempted:
            return []
        members = self.preempted
        return order_queue([s for s in view.waiting if s.id in members], ordering)

    def _continue(self, view: View, rejoin: list[SeqView]) -> Plan:
        running, kv, ctx = view.running, view.kv, self.context
        # Decode steps the engine repeated since the last plan (0 without event skipping).
        skipped = max((s.num_computed_tokens - ctx[s.id] for s in running if s.id in ctx),
                      default=0)
        present = {s.id for s in running} | {s.id for s in rejoin}
        for sid in ctx:
            if sid not in present:
                ctx[sid] += skipped
        for s in running:  # adopt what runs, so the policy's view of its batch never drifts
            ctx[s.id] = s.num_computed_tokens
        fit = (fitting_prefix(rejoin, kv, rejoin_free_blocks(kv.free_blocks, len(running)))
               if rejoin else [])
        if fit:
            for s in fit:
                ctx[s.id] = s.num_uncomputed
            return padded_prefill(fit)
        if not running:
            return Plan()
        budget = budget_for(kv, None, None)
        preempt = grow_running(running, kv, budget)
        if not budget.run:
            return Plan()
        self.preempted.update(preempt)
        for s in running:
            if s.id in budget.run:
                ctx[s.id] += budget.run[s.id]
        padding = []
        for sid in ctx:
            if sid not in present:
                ctx[sid] += 1
                padding.append(PaddingRow(1, ctx[sid]))
        padding.sort(key=_CONTEXT)  # the order ``Plan.on_finish="pad"`` keeps them in
        steady = not preempt and not rejoin and all(n == 1 for n in budget.run.values())
        # Nobody joins a batch in flight: arrivals leave this plan as it is, and a finished
        # member's row turns into padding.
        return Plan(run=budget.run, preempt=preempt, padding=tuple(padding), steady=steady,
                    on_finish="pad", ignores_arrivals=True)
