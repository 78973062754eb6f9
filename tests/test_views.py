"""What a policy is shown and what it answers: ``SeqView``'s derived field, the ``View`` and
``Plan`` constructors, and the engines agreeing on every view they build."""
from __future__ import annotations

import copy
import dataclasses
import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import sim
from policies.registry import Policy
from sim.core.rules import uncomputed_tokens
from sim.core.types import KVView, Plan, SeqView, View
from sim.engine import compiled_cache
from tests.test_fastpath import ROOFLINE

counts = st.integers(0, 10**6)


@given(counts, counts, counts, counts, counts, st.integers(-3, 3))
def test_num_uncomputed_is_derived_from_the_token_counts(prompt, generated, computed,
                                                         preempted, blocks, priority):
    s = SeqView(7, 1.5, prompt, generated, computed, preempted, blocks, priority)
    assert s.num_uncomputed == prompt + generated - computed
    assert s.num_uncomputed == uncomputed_tokens(prompt, generated, computed)
    assert s.num_tokens == prompt + generated
    assert s.is_prefill == (s.num_uncomputed > 1 or generated == 0)
    again = s._replace(num_computed_tokens=computed + 1)
    assert again.num_uncomputed == s.num_uncomputed - 1
    assert again.id == 7 and again.priority == priority
    for twin in (copy.copy(s), copy.deepcopy(s), pickle.loads(pickle.dumps(s))):
        assert twin == s and type(twin) is SeqView


def test_num_uncomputed_cannot_be_given():
    with pytest.raises(TypeError):
        SeqView(1, 0.0, 10, 0, 0, num_uncomputed=3)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="derived"):
        SeqView(1, 0.0, 10, 0, 0)._replace(num_uncomputed=3)


def test_keyword_construction_and_defaults():
    s = SeqView(id=3, arrival_s=0.25, num_prompt_tokens=100, num_generated=2,
                num_computed_tokens=101)
    assert (s.num_preemptions, s.num_blocks, s.priority, s.num_uncomputed) == (0, 0, 0, 1)
    assert not s.is_prefill


def test_plan_defaults_and_immutability():
    plan = Plan()
    assert plan.run == {} and plan.reject == {} and plan.preempt == () and plan.padding == ()
    assert (plan.steady, plan.wake_at_s, plan.on_finish, plan.ignores_arrivals) == (
        False, None, "stop", False)
    assert Plan(run=None, reject=None) == Plan()
    assert Plan().run is not Plan().run  # a fresh mapping each time, as a factory gives
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.steady = True  # type: ignore[misc]
    changed = dataclasses.replace(Plan(run={1: 4}), steady=True)
    assert changed == Plan(run={1: 4}, steady=True)
    assert [f.name for f in dataclasses.fields(Plan)] == [
        "run", "preempt", "reject", "steady", "padding", "wake_at_s", "on_finish",
        "ignores_arrivals"]


def test_view_holds_what_it_is_given():
    kv = KVView(10, 4, 16)
    view = View(now_s=2.0, waiting=(), running=(), kv=kv, more_arrivals=True)
    assert (view.now_s, view.waiting, view.running, view.kv, view.more_arrivals) == (
        2.0, (), (), kv, True)
    assert dataclasses.replace(view, now_s=3.0) == View(3.0, (), (), kv, True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.now_s = 1.0  # type: ignore[misc]


class Auditor(Policy):
    """A decode-first packer that checks, at every step, that every view it is shown holds
    ``num_uncomputed`` as its counts give it, and records them all."""

    name = "auditor"

    def __init__(self) -> None:
        self.max_num_seqs, self.max_num_batched_tokens = 16, 256
        self.seen: list[tuple[object, ...]] = []

    def schedule(self, view: View) -> Plan:
        run: dict[int, int] = {}
        tokens, free = self.max_num_batched_tokens, view.kv.free_blocks
        for s in (*view.running, *view.waiting):
            assert type(s) is SeqView
            assert s.num_uncomputed == s.num_prompt_tokens + s.num_generated \
                - s.num_computed_tokens
            self.seen.append(tuple(s))
            if tokens < 1 or len(run) >= self.max_num_seqs:
                continue
            n = min(s.num_uncomputed, tokens)
            need = view.kv.blocks_needed(s, n)
            if need > free:
                continue
            run[s.id], tokens, free = n, tokens - n, free - need
        return Plan(run=run)


def test_both_engines_show_the_same_views():
    rng = np.random.default_rng(4)
    reqs = [sim.Request(i, float(t), int(p), int(o)) for i, (t, p, o) in enumerate(zip(
        np.cumsum(rng.exponential(0.05, 300)), rng.integers(1, 400, 300),
        rng.integers(1, 60, 300), strict=True))]
    kv = {"num_blocks": 600, "block_size": 16}  # room for 16 of the longest: no stall
    fast, slow = Auditor(), Auditor()
    a = sim.simulate(reqs, policy=fast, cost=ROOFLINE, kv=kv, fast_path="compiled")
    b = sim.simulate(reqs, policy=slow, cost=ROOFLINE, kv=kv, checks=True)
    assert a.step_engine == "compiled" and b.step_engine == "python"
    assert fast.seen == slow.seen and len(fast.seen) > 1000


def test_direct_is_the_compiled_overload_for_those_types():
    from numba import njit

    @njit
    def add(a, b):  # noqa: ANN001, ANN202
        return a + b

    assert compiled_cache.direct(add, (1, 2)) is add  # not compiled yet: the dispatcher
    assert add(1, 2) == 3
    call = compiled_cache.direct(add, (1, 2))
    assert call is not add and call(3, 4) == 7
    assert compiled_cache.direct(add, (1.0, 2.0)) is add  # no float overload
    assert compiled_cache.direct(object(), (1,)) is not None  # not a dispatcher: itself
