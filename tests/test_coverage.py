"""The compiled tier fails closed: an allow-list over every specification and KV field.

Specification: every field of ``SchedulingSpec`` and ``KVConfig`` is mapped in
``sim.engine.coverage`` (a field nobody mapped sends the run to the general engine); a run
takes the compiled interpreter exactly when the allow-list says so, and ``SimResult.engine`` /
``engine_reason`` say which engine ran and why. The differential tests draw whole
specifications (as the ``scheduler`` policy, and through the ``chunked_prefill`` preset's
parameters) and KV blocks from the field domains themselves (``Domain``, ``KV_FIELDS``), so a
field or value added later is drawn without anyone listing it, and every run must equal the
general engine with its invariant checks on, bit for bit.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st

import sim
from policies import make_policy
from policies.static import StaticBatching
from sim.core.errors import InputError
from sim.core.fields import OPT, Key
from sim.core.scheduling import Domain, SchedulingSpec, domains
from sim.engine import coverage
from sim.kv.config import KV_FIELDS, KVConfig, resolve_kv
from tests.test_fastpath import assert_same_run

SPEC_FIELDS = {f.name for f in dataclasses.fields(SchedulingSpec)}
KV_CONFIG_FIELDS = {f.name for f in dataclasses.fields(KVConfig)}


class OwnStatic(StaticBatching):
    """A policy of a user's own: a subclass of a preset is not the preset."""


def test_every_spec_and_kv_field_is_mapped():
    assert set(coverage.COMPILED_SPEC) == SPEC_FIELDS
    assert set(coverage.COMPILED_KV) == KV_CONFIG_FIELDS
    for name, allowed in coverage.COMPILED_SPEC.items():
        if allowed is not coverage.ANY and domains()[name].kind == "choice":
            assert allowed <= set(domains()[name].choices), name


def test_an_unmapped_field_sends_the_run_to_the_general_engine(monkeypatch):
    monkeypatch.setattr(coverage, "COMPILED_SPEC",
                        {k: v for k, v in coverage.COMPILED_SPEC.items() if k != "watermark"})
    reqs = [sim.Request(i, 0.1 * i, 20, 5) for i in range(5)]
    res = sim.simulate(reqs, "continuous", sim.ConstantCost(0.01), fast_path="compiled")
    assert res.engine == "general"
    assert res.engine_reason == "policy.watermark is not mapped for the compiled interpreter"


@pytest.mark.parametrize(("policy", "kv", "engine", "reason"), [
    ("continuous", None, "general", "fewer than"),
    ({"name": "scheduler", "composition": "mixed", "admission": "whole"}, None, "general",
     "5 requests on a replica, fewer than the"),
    ("chunked_prefill", None, "general", "fewer than"),
    ({"name": "scheduler", "composition": "prefill_first", "admission": "whole",
      "victim": "priority"}, None, "general", "fewer than"),
    ("continuous", {"num_blocks": 50, "prefix_caching": True}, "general",
     "kv.prefix_caching=True is not covered by the compiled interpreter"),
    ("continuous", {"num_blocks": 50, "allocator": "slab", "reserve_tokens": 64}, "general",
     "kv.allocator='slab' is not covered by the compiled interpreter"),
    ("static", None, "general", "fewer than"),
    ({"name": "dynamic", "bucket_by_prompt": 64}, None, "general", "fewer than"),
    (OwnStatic(batch_size=4), None, "general",
     "policy 'static' is not a preset of a scheduling specification"),
])
def test_the_result_says_which_engine_ran_and_why(policy, kv, engine, reason):
    reqs = [sim.Request(i, 0.1 * i, 20, 5) for i in range(5)]
    res = sim.simulate(reqs, policy, sim.ConstantCost(0.01), kv=kv)
    assert res.engine == engine and reason in res.engine_reason
    if reason == "fewer than" or "requests on a replica" in reason:  # covered: compiled
        compiled = sim.simulate(reqs, policy, sim.ConstantCost(0.01), kv=kv,
                                fast_path="compiled")
        assert (compiled.engine, compiled.engine_reason) == ("compiled", "")
    assert sim.simulate(reqs, policy, sim.ConstantCost(0.01), kv=kv,
                        fast_path=False).engine_reason == "fast_path=False"


def test_batchsim_run_names_the_fallback(tmp_path, capsys):
    from sim.cli.main import main
    from tests.test_cli import TINY

    exp = tmp_path / "exp.yaml"
    exp.write_text(TINY.replace("{name: continuous, max_num_seqs: 8}",
                                "{name: chunked_prefill, max_num_seqs: 8}"))
    assert main(["run", str(exp), "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if "general engine" in x)
    assert line.startswith("batchsim: general engine (slower, exact) for: ")
    assert "requests on a replica, fewer than the" in line
    assert line.endswith("(2 runs)")
    summary = (Path(tmp_path / "out") / "summary.csv").read_text()
    assert "sim_engine" not in summary  # how it ran is no result column


# -- strategies derived from the field domains ----------------------------------------------------
def covered_often(values: st.SearchStrategy[Any], allowed: Any) -> st.SearchStrategy[Any]:
    """``values``, three times in four restricted to what the compiled interpreter covers
    (``allowed``), so the differential test meets it often instead of one run in dozens; the
    allowed values in a random order, so none is favoured when examples shrink."""
    if allowed is coverage.ANY:
        return values
    covered = st.permutations(sorted(allowed, key=repr)).map(lambda p: p[0])
    return st.one_of(covered, covered, covered, values)


def from_domain(d: Domain) -> st.SearchStrategy[Any]:
    """Values of one specification field, small enough for short runs."""
    if d.kind == "choice":
        return st.sampled_from(d.choices)
    if d.kind == "targets":
        return st.none() | st.dictionaries(st.integers(0, 2), st.floats(0.01, 3.0), max_size=3)
    if d.kind == "buckets":  # a width, or increasing bounds around the prompts drawn
        return st.none() | st.integers(1, 64) | st.lists(
            st.integers(1, 120), min_size=1, max_size=3, unique=True).map(
            lambda b: tuple(sorted(b)))
    lo = d.minimum if d.minimum is not None else 0
    if d.kind == "int":  # small values, and powers of two up to thousands (limits)
        top = 1 << 62 if d.maximum is None else int(d.maximum)
        values: st.SearchStrategy[Any] = st.integers(int(lo), min(top, int(lo) + 7)) | st.integers(
            0, 12).map(lambda k: min(top, int(lo) + 2 ** k))
    else:
        hi = lo + 3.0 if d.maximum is None else min(d.maximum, lo + 3.0)
        values = st.floats(lo, hi, exclude_max=d.max_exclusive)
    return st.none() | values if d.optional else values


@st.composite
def specs(draw: st.DrawFn) -> dict[str, Any]:
    """A valid specification as ``scheduler`` policy parameters, every field drawn."""
    def value(name: str) -> Any:
        return draw(covered_often(from_domain(domains()[name]), coverage.COMPILED_SPEC.get(name)),
                    label=name)

    fields = {name: value(name) for name in domains()}
    for _ in range(4):  # redraw the field the specification names as contradicting the others
        bad = SchedulingSpec.problem(_unchecked(fields))
        if bad is None:
            return fields
        fields[bad[0]] = value(bad[0])
    assume(SchedulingSpec.problem(_unchecked(fields)) is None)
    return fields


def _unchecked(fields: dict[str, Any]) -> SchedulingSpec:
    """A ``SchedulingSpec`` built without its validation (to ask it what is wrong)."""
    spec = object.__new__(SchedulingSpec)
    for name, value in fields.items():
        object.__setattr__(spec, name, value)
    return spec


def from_key(key: Key) -> st.SearchStrategy[Any]:
    """Values of one ``kv`` key (``KV_FIELDS``), small enough for short runs."""
    if key.choices:
        base: st.SearchStrategy[Any] = st.sampled_from(key.choices)
    elif bool in key.types:
        base = st.booleans()
    elif int in key.types and float not in key.types:  # small, and powers of two
        lo = int(key.minimum or 0)
        base = st.integers(lo, lo + 7) | st.integers(0, 12).map(lambda k: lo + 2 ** k)
    else:
        lo = float(key.minimum or 0.0)
        base = st.floats(lo, lo + 50.0, exclude_min=key.exclusive_min)
    return st.none() | base if OPT in key.types else base


kv_blocks = st.none() | st.fixed_dictionaries(
    {}, optional={name: covered_often(from_key(key), coverage.COMPILED_KV.get(name))
                  for name, key in KV_FIELDS.items()})


@st.composite
def traces(draw: st.DrawFn) -> list[sim.Request]:
    """Small traces with priorities, shared prefixes and ties in arrival time."""
    n = draw(st.integers(1, 16))
    reqs = []
    for i in range(n):
        prompt = draw(st.integers(1, 90))
        prefix = draw(st.sampled_from([None, "a", "b"]))
        reqs.append(sim.Request(i, draw(st.integers(0, 10)) * 0.02, prompt,
                                draw(st.integers(1, 40)), priority=draw(st.integers(0, 2)),
                                prefix_id=prefix,
                                num_prefix_tokens=min(prompt, 32) if prefix else 0))
    return reqs


COSTS = [sim.ConstantCost(0.01), sim.LinearCost(0.002, 1e-4, 1e-3)]


def drawn_kv(reqs: list[sim.Request], kv: Any, cost: Any, tight: int | None) -> KVConfig:
    """The drawn ``kv`` block resolved; with ``tight``, a cache just big enough for the longest
    request plus ``tight`` blocks (preemptions, victims). A block the validation refuses is
    not a run (``assume``)."""
    if kv is not None and tight is not None:
        longest = max(r.num_prompt_tokens + r.num_output_tokens for r in reqs)
        kv = {**kv, "num_blocks": -(-longest // kv.get("block_size", 16)) + tight}
    try:
        return resolve_kv(kv, cost)
    except InputError:
        assume(False)
        raise  # not reached: assume(False) ends the example


def check_drawn_run(reqs: list[sim.Request], policy: dict[str, Any], kv: Any, cost: Any,
                    horizon_s: float | None, num_replicas: int, tight: int | None) -> None:
    """One drawn run: the compiled interpreter (or, where the allow-list says so, the general
    engine unchecked) equals the general engine with its invariant checks, bit for bit."""
    kv_config = drawn_kv(reqs, kv, cost, tight)
    kw = {"policy": policy, "cost": cost, "kv": kv_config, "horizon_s": horizon_s,
          "num_replicas": num_replicas}
    fast = sim.simulate(reqs, **kw, fast_path="compiled")
    slow = sim.simulate(reqs, **kw, checks=True)  # the reference interpreter, checked
    assert_same_run(fast, slow)
    event(f"engine: {fast.engine}")
    why = coverage.fast_path_blocker(make_policy(policy), kv_config, cost, checks=False,
                                     event_skipping=True)
    assert (fast.engine == "general") == bool(why) and (not why or fast.engine_reason == why)


@settings(max_examples=500, deadline=None)
@given(reqs=traces(), fields=specs(), kv=kv_blocks, cost=st.sampled_from(COSTS),
       horizon_s=st.sampled_from([None, None, 0.3]), num_replicas=st.sampled_from([1, 1, 2]),
       tight=st.none() | st.integers(0, 6))
def test_every_drawn_specification_runs_exactly_as_the_general_engine(
        reqs, fields, kv, cost, horizon_s, num_replicas, tight):
    check_drawn_run(reqs, {"name": "scheduler", **fields}, kv, cost, horizon_s, num_replicas,
                    tight)


@st.composite
def chunked_prefill_params(draw: st.DrawFn) -> dict[str, Any]:
    """``chunked_prefill`` parameters, each from the specification field it sets."""
    d = domains()
    budget = draw(from_domain(d["max_num_batched_tokens"]))
    seqs = draw(from_domain(d["max_num_seqs"]).filter(lambda s: s <= budget))
    return {"name": "chunked_prefill", "token_budget": budget, "max_num_seqs": seqs,
            "chunk_size": draw(from_domain(d["chunk_size"])),
            "watermark": draw(from_domain(d["watermark"])),
            "ordering": draw(st.sampled_from(["fcfs", "spf", "priority"]))}


@settings(max_examples=500, deadline=None)
@given(reqs=traces(), policy=chunked_prefill_params(), kv=kv_blocks,
       cost=st.sampled_from(COSTS), horizon_s=st.sampled_from([None, None, 0.3]),
       num_replicas=st.sampled_from([1, 1, 2]), tight=st.none() | st.integers(0, 6))
def test_every_drawn_chunked_prefill_runs_exactly_as_the_general_engine(
        reqs, policy, kv, cost, horizon_s, num_replicas, tight):
    check_drawn_run(reqs, policy, kv, cost, horizon_s, num_replicas, tight)


@pytest.mark.parametrize("cls", [c for c in coverage.SPEC_POLICIES if c.name != "scheduler"],
                         ids=lambda c: c.name)
def test_every_preset_parameter_reaches_the_specification(cls):
    # A parameter that the specification never sees would change nothing on either engine,
    # or (were it read by ``schedule`` directly) only on the general one: each must move it.
    # (``scheduler``'s parameters are the specification's fields themselves.)
    from policies.continuous import MODES
    from policies.ordering import ORDERINGS
    from policies.registry import PolicyError, policy_params

    words = sorted({*MODES, *ORDERINGS, *(c for d in domains().values() for c in d.choices)})
    for name, default in policy_params(cls).items():
        if isinstance(default, str):
            candidates: list[Any] = [w for w in words if w != default]
        elif default is None:
            candidates = [1, {0: 0.5}]
        else:
            candidates = [default * 2 if isinstance(default, float) else default + 1]
        for value in candidates:
            try:
                policy = make_policy({"name": cls.name, name: value})
            except PolicyError:
                continue
            assert policy.spec != make_policy(cls.name).spec, name
            break
        else:
            pytest.fail(f"no other valid value found for {cls.name}.{name}")
