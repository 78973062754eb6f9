"""One conformance suite run over every registered policy (the Gymnasium ``check_env`` idea).

Each policy, with default parameters (ordering drawn at random), must: return valid plans on
random reachable views, finish every request of random small traces under unlimited, paged and
slab KV, be deterministic, and reject unknown or invalid parameters with a ``PolicyError``.
"""
from __future__ import annotations

import math

import pandas as pd
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sim
from policies import PolicyError, make_policy, registered
from policies.ordering import ORDERINGS
from policies.registry import policy_params
from sim.core.types import KVView, Plan, SeqView, View
from sim.kv.config import UNLIMITED_BLOCKS

NAMES = sorted(registered())
# Views are cheap, so many; each trace is a whole simulation (12 policy × KV combinations).
VIEW_SETTINGS = settings(max_examples=200, deadline=None)
TRACE_SETTINGS = settings(max_examples=40, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])


def spec(name: str, data: st.DataObject) -> dict:
    """Default parameters, with the queue ordering drawn when the policy has one."""
    params: dict = {"name": name}
    if "ordering" in policy_params(registered()[name]):
        params["ordering"] = data.draw(st.sampled_from(sorted(ORDERINGS)), label="ordering")
    return params


@st.composite
def views(draw: st.DrawFn, max_running: int) -> View:
    """A view the engine could produce: conserved KV, decodes running, fitting prompts waiting.

    The cache is sized just above what the running sequences hold, so growth often preempts.
    """
    bs = draw(st.sampled_from([1, 4, 16]))
    cap = draw(st.integers(8, 10_000))  # the longest context any sequence may reach
    reserve = draw(st.one_of(st.none(), st.integers(2, cap)))
    running, held = [], 0
    for i in range(draw(st.integers(0, min(max_running, 6)))):
        # Computed tokens: often a whole number of blocks, so this decode needs a new block.
        computed = draw(st.one_of(st.integers(1, cap - 1),
                                  st.integers(1, max(1, (cap - 1) // bs)).map(lambda k: k * bs)))
        computed = min(computed, cap - 1)
        length = computed + 1  # the context after this decode step
        gen = draw(st.integers(1, computed))
        blocks = math.ceil(max(length - 1, reserve or 0) / bs)
        held += blocks
        running.append(SeqView(i, draw(st.floats(0, 5)), length - gen, gen, length - 1,
                               num_blocks=blocks, priority=draw(st.integers(0, 2))))
    total = draw(st.one_of(st.integers(0, 8), st.just(UNLIMITED_BLOCKS - held)))
    total += max(held, math.ceil(cap / bs))
    waiting = []
    for i in range(draw(st.integers(0, 8))):
        gen = draw(st.sampled_from([0, 0, 0, 1, 5]))  # > 0: preempted, will recompute
        longest = min(cap, reserve or cap) - 1 - gen
        if longest < 1:
            continue
        waiting.append(SeqView(100 + i, draw(st.floats(4.9, 5)),
                               draw(st.integers(1, longest)), gen, 0,
                               num_preemptions=int(gen > 0), priority=draw(st.integers(0, 2))))
    kv = KVView(total, total - held, bs, reserve)
    return View(5.0, tuple(waiting), tuple(running), kv, draw(st.booleans()))


def check_plan(policy, view: View, plan: Plan) -> None:
    """The engine's validation rules, restated independently."""
    waiting = {s.id: s for s in view.waiting}
    running = {s.id: s for s in view.running}
    assert set(plan.reject) <= set(waiting)
    assert set(plan.preempt) <= set(running)
    assert not set(plan.preempt) & set(plan.run)
    if not plan.run:
        assert not plan.padding and not plan.preempt  # the engine applies neither without a run
        assert plan.wake_at_s is None or plan.wake_at_s > view.now_s
        return
    blocks = 0
    for sid, n in plan.run.items():
        seq = running.get(sid) or waiting.get(sid)
        assert seq is not None and sid not in plan.reject
        assert isinstance(n, int) and 1 <= n <= seq.num_uncomputed
        blocks += view.kv.blocks_needed(seq, n)
    if policy.max_num_seqs is not None:
        assert len(plan.run) <= policy.max_num_seqs
    if policy.max_num_batched_tokens is not None:
        assert sum(plan.run.values()) <= policy.max_num_batched_tokens
    freed = sum(running[sid].num_blocks for sid in plan.preempt)
    assert blocks <= view.kv.free_blocks + freed
    for row in plan.padding:
        assert 1 <= row.num_tokens <= row.context_len
    if plan.steady:  # the event-skipping promise is only for pure decode plans
        assert not plan.preempt and not plan.reject
        assert all(sid in running and not running[sid].is_prefill and n == 1
                   for sid, n in plan.run.items())
        assert all(row.num_tokens == 1 for row in plan.padding)


@pytest.mark.parametrize("name", NAMES)
@VIEW_SETTINGS
@given(data=st.data())
def test_valid_plans_on_random_views(name: str, data: st.DataObject) -> None:
    policy = make_policy(spec(name, data))
    view = data.draw(views(policy.max_num_seqs or 256), label="view")
    check_plan(policy, view, policy.schedule(view))


@st.composite
def traces(draw: st.DrawFn) -> list[sim.Request]:
    """Small traces with ties in arrival time (a step boundary may coincide with an arrival)."""
    n = draw(st.integers(1, 12))
    return [sim.Request(i, draw(st.integers(0, 40)) * 0.005, draw(st.integers(1, 300)),
                        draw(st.integers(1, 30)), priority=draw(st.integers(0, 2)))
            for i in range(n)]


def kv_for(kind: str, reqs: list[sim.Request], data: st.DataObject) -> dict | None:
    """Unlimited, tight paged, or slab KV in which every request can run alone to its end."""
    longest = max(r.num_prompt_tokens + r.num_output_tokens for r in reqs)
    if kind == "unlimited":
        return None
    if kind == "paged":
        need = math.ceil(longest / 16)
        return {"num_blocks": data.draw(st.integers(need, need + 40)), "block_size": 16}
    per_seq = math.ceil(longest / 4)
    return {"num_blocks": per_seq * data.draw(st.integers(1, 4)), "block_size": 4,
            "allocator": "slab", "reserve_tokens": longest}


@pytest.mark.parametrize("kv_kind", ["unlimited", "paged", "slab"])
@pytest.mark.parametrize("name", NAMES)
@TRACE_SETTINGS
@given(reqs=traces(), data=st.data())
def test_every_request_finishes(name: str, kv_kind: str, reqs: list[sim.Request],
                                data: st.DataObject) -> None:
    kv = kv_for(kv_kind, reqs, data)
    res = sim.simulate(reqs, spec(name, data), sim.LinearCost(0.001, 1e-5), kv=kv, checks=True)
    table = res.requests
    assert (table["status"] == "finished").all(), table[["id", "status", "reason"]]
    assert (table["num_generated"] == table["num_output_tokens"]).all()
    assert res.summary["completed"] == len(reqs)


@pytest.mark.parametrize("name", NAMES)
def test_deterministic(name: str) -> None:
    reqs = [sim.Request(i, (i * 7 % 11) * 0.01, 20 + (i * 37) % 400, 1 + (i * 13) % 40)
            for i in range(30)]
    kv = {"num_blocks": 64, "block_size": 16}
    runs = [sim.simulate(reqs, name, sim.LinearCost(0.001, 1e-5), kv=kv, checks=True)
            for _ in range(2)]
    pd.testing.assert_frame_equal(runs[0].requests, runs[1].requests)
    pd.testing.assert_frame_equal(runs[0].steps, runs[1].steps)
    pd.testing.assert_series_equal(pd.Series(runs[0].summary), pd.Series(runs[1].summary))


@pytest.mark.parametrize("name", NAMES)
def test_unknown_parameter_lists_accepted(name: str) -> None:
    with pytest.raises(PolicyError) as err:
        make_policy({"name": name, "no_such_knob": 1})
    assert "no_such_knob" in str(err.value)
    for param in policy_params(registered()[name]):
        assert param in str(err.value)


@pytest.mark.parametrize("name", NAMES)
def test_invalid_values_rejected(name: str) -> None:
    params = policy_params(registered()[name])
    assert params, "a policy without parameters cannot be configured"
    for param, default in params.items():
        numeric = isinstance(default, (int, float)) and not isinstance(default, bool)
        bad = -1 if numeric else "nonsense"
        with pytest.raises(PolicyError, match=param):
            make_policy({"name": name, param: bad})


@pytest.mark.parametrize("name", NAMES)
def test_an_invalid_value_is_an_error_at_its_dotted_key(name: str) -> None:
    """Every parameter check names ``policy.<parameter>`` as its field (the YAML's path)."""
    for param, default in policy_params(registered()[name]).items():
        numeric = isinstance(default, (int, float)) and not isinstance(default, bool)
        with pytest.raises(PolicyError) as err:
            make_policy({"name": name, param: -1 if numeric else "nonsense"})
        assert err.value.field == f"policy.{param}", str(err.value)


def test_a_misspelt_choice_suggests_the_accepted_one() -> None:
    with pytest.raises(PolicyError, match=r"^policy\.ordering: 'fcsf' is not one of fcfs, "
                       r"spf, priority \(did you mean 'fcfs'\?\)$"):
        make_policy({"name": "continuous", "ordering": "fcsf"})


def test_a_bad_entry_of_policies_is_named_by_its_index(tmp_path, capsys) -> None:
    """In a ``policies:`` list the message names the entry (``policies[1]``), exit code 2;
    a swept parameter keeps the swept key."""
    from sim.cli.main import main
    from tests.helpers import SMALL_EXPERIMENT

    cases = [({"policies": [{"name": "continuous"}, {"name": "continuous", "max_num_seqs": 0}]},
              "policies[1].max_num_seqs: must be > 0, got 0"),
             ({"policies": [{"name": "static"}, {"name": "static", "batch_sise": 2}]},
              "policies[1].batch_sise: unknown parameter of 'static' (did you mean "
              "'batch_size'?)"),
             ({"policies": ["continuous", 5]}, "policies[1].name: must be a string"),
             ({"policies": ["static", "continuous"],
               "sweep": {"policy.batch_size": [4, 0]}},
              "policy.batch_size: must be > 0, got 0")]
    for i, (change, words) in enumerate(cases):
        exp = tmp_path / f"exp{i}.yaml"
        cfg = {k: v for k, v in SMALL_EXPERIMENT.items() if k != "policy"}
        exp.write_text(yaml.safe_dump({**cfg, **change}))
        assert main(["run", str(exp), "--out", str(tmp_path / "o"), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"batchsim: error: {exp}: {words}") and err.count("\n") == 1, err


def test_numpy_numbers_are_numbers_for_policies_and_routers_as_for_every_key() -> None:
    """``sim.core.fields``' rule of a number (numpy scalars count, bools do not) holds for
    plugin parameters too: ``np.int64(4)`` from a numpy sweep was "expected a number"."""
    import numpy as np

    from routers import make_router

    assert make_policy({"name": "continuous", "max_num_seqs": np.int64(4),
                        "watermark": np.float32(0.25)}) == make_policy(
        {"name": "continuous", "max_num_seqs": 4, "watermark": 0.25})
    assert make_router({"name": "power_of_two", "choices": np.int32(3)}).choices == 3
    with pytest.raises(PolicyError, match=r"^policy\.max_num_seqs: expected int, got bool "
                       r"True$"):
        make_policy({"name": "continuous", "max_num_seqs": True})
