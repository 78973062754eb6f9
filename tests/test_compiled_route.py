"""The compiled routing loop (``sim.engine.compiled_route``) and the load rules it compiles.

- every whole rule of ``sim.core.load_arrays`` picks, compiled, what it picks in Python, and
  what the router interface's definition (the lightest ``ReplicaLoad`` by its metric, ties to
  the lowest index) picks;
- ``Loads`` is the ``Sequence[ReplicaLoad]`` a router was promised;
- the loop's returns to Python (a replica's arrays out of room, its log buffers full, a
  router that is not a whole rule, a user's subclass of a built-in router) change nothing:
  the run equals the general engine's, every routing decision included;
- and it equals driving ``DrivenCompiled`` replicas one arrival at a time (the drive API it
  replaces in routed runs, kept for other drivers).
"""
from __future__ import annotations

import re
import tokenize
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim
from routers.balance import LeastOutstandingTokens
from sim.core import load_arrays as la
from sim.core import load_rules
from sim.core.routing import Arrival, ReplicaLoad
from sim.engine import compiled
from sim.engine import compiled_route as cr
from sim.engine.compiled_drive import DrivenCompiled
from tests.test_fastpath import assert_same_run

REPO = Path(__file__).resolve().parents[1]

replica_loads = st.lists(st.builds(
    ReplicaLoad, index=st.just(0), num_waiting=st.integers(0, 9), num_running=st.integers(0, 9),
    outstanding_prefill_tokens=st.integers(0, 50), num_decoding=st.integers(0, 9),
    kv_used_blocks=st.integers(0, 20), kv_total_blocks=st.sampled_from([0, 20, 40]),
    weight=st.sampled_from([0.5, 1.0, 2.0, 3.0])), min_size=1, max_size=6)


def _definition(loads: list[ReplicaLoad], rule: int) -> int:
    """What each rule means, written from ``ReplicaLoad``'s properties."""
    keys = {la.REQUESTS: lambda s: (s.num_outstanding / s.weight,),
            la.TOKENS: lambda s: (s.outstanding_tokens / s.weight,),
            la.KV: lambda s: (s.kv_usage,),
            la.EMPTIEST_KV: lambda s: (s.kv_usage, s.num_outstanding / s.weight)}[rule]
    return min(range(len(loads)), key=lambda i: (*keys(loads[i]), i))


@settings(max_examples=200, deadline=None)
@given(loads=replica_loads, rule=st.sampled_from([la.REQUESTS, la.TOKENS, la.KV,
                                                  la.EMPTIEST_KV]))
def test_each_rule_picks_the_same_replica_in_python_compiled_and_by_definition(loads, rule):
    arrays = la.Loads.of(loads)
    everyone = np.arange(len(loads), dtype=np.int64)
    python = la.choose(rule, arrays.counts, arrays.weight, arrays.kv_total, everyone)
    assert python == _definition(loads, rule)
    assert cr.choose(rule, arrays.counts, arrays.weight, arrays.kv_total, everyone) == python


@settings(max_examples=50, deadline=None)
@given(loads=replica_loads)
def test_loads_is_the_sequence_of_replica_loads_a_router_reads(loads):
    loads = [ReplicaLoad(**{**{f: getattr(s, f) for f in s.__dataclass_fields__}, "index": i,
                            "measured_s": 1.5}) for i, s in enumerate(loads)]
    view = la.Loads.of(loads)
    assert len(view) == len(loads)
    assert list(view) == loads and view[-1] == loads[-1] and list(view[1:]) == loads[1:]
    with pytest.raises(IndexError):
        view[len(loads)]



@settings(max_examples=100, deadline=None)
@given(loads=replica_loads)
def test_each_load_signal_is_one_formula_wherever_it_is_read(loads):
    # ``sim.core.load_rules``: the router's values, the arrays' measures, the routing log's
    # outstanding requests and their compiled forms all read the same three formulas
    arrays = la.Loads.of(loads)
    outstanding = la.outstanding_of(arrays.counts)
    for i, s in enumerate(loads):
        counts = arrays.counts[i]
        requests = load_rules.outstanding_requests(s.num_waiting, s.num_running)
        tokens = load_rules.outstanding_tokens(s.outstanding_prefill_tokens, s.num_decoding)
        share = load_rules.kv_share(s.kv_used_blocks, s.kv_total_blocks)
        assert (s.num_outstanding, s.outstanding_tokens, s.kv_usage) == (requests, tokens, share)
        assert outstanding[i] == requests
        assert cr._outstanding(counts[la.WAITING], counts[la.RUNNING]) == requests
        for metric, value in ((la.REQUESTS, requests / s.weight),
                              (la.TOKENS, tokens / s.weight), (la.KV, share)):
            python = la.measure_at(arrays.counts, arrays.weight, arrays.kv_total, i, metric)
            assert python == value
            assert cr._measure_at(arrays.counts, arrays.weight, arrays.kv_total, i,
                                  metric) == python


def _code_lines(path: Path) -> dict[int, str]:
    """Each line's code of the file at ``path``, its strings and comments left out."""
    lines: dict[int, list[str]] = {}
    with path.open(encoding="utf-8") as f:
        for tok in tokenize.generate_tokens(f.readline):
            if tok.type in (tokenize.NAME, tokenize.OP, tokenize.NUMBER):
                lines.setdefault(tok.start[0], []).append(tok.string)
    return {n: " ".join(words) for n, words in lines.items()}


def test_no_module_restates_the_load_formulas():
    # written again elsewhere, a formula can drift from the one the compiled loop compiles
    restated = re.compile(r"WAITING \] \+ .*RUNNING \]|waiting \+ (\w+ \. )?(num_)?running\b"
                          r"|prefill(_tokens)? \+ (\w+ \. )?(num_)?decoding\b")
    found = [f"{path.relative_to(REPO)}:{n}" for folder in ("sim", "routers", "policies")
             for path in sorted((REPO / folder).rglob("*.py")) if path.name != "load_rules.py"
             for n, line in _code_lines(path).items() if restated.search(line)]
    assert found == []


class CustomTokens(LeastOutstandingTokens):
    """A user's subclass with its own rule: never mistaken for the built-in one."""

    def route(self, request: Arrival, loads: Any) -> int:
        """The heaviest replica by outstanding tokens (ties: the highest index)."""
        assert all(isinstance(s, ReplicaLoad) for s in loads)
        return max(range(len(loads)), key=lambda i: (loads[i].outstanding_tokens, i))


REQS = [sim.Request(i, (i // 3) * 0.011, 20 + (37 * i) % 90, 1 + (13 * i) % 40,
                    priority=i % 3) for i in range(90)]


@pytest.mark.parametrize("router", [
    {"name": "least_outstanding_tokens"}, {"name": "least_kv_usage"},
    {"name": "least_outstanding_requests", "refresh_s": 0.03},
    {"name": "power_of_two", "metric": "tokens", "refresh_s": 0.02},
    CustomTokens()])
def test_returns_to_python_change_nothing(router, monkeypatch):
    """Log buffers of a few rows: the interpreter returns LOG_FULL / IRR_FULL mid-routing
    over and over (``NEED_LOOP``), arrays grow one doubling at a time (``NEED_ROOM``)."""
    monkeypatch.setattr(compiled, "INITIAL_LOG_ROWS", 3)
    monkeypatch.setattr(compiled, "INITIAL_IRREGULAR_ROWS", 1)
    policy = {"name": "chunked_prefill", "token_budget": 64, "max_num_seqs": 4}
    cost = sim.LinearCost(base_s=0.004, per_token_s=1e-4)
    for num_blocks in (400, 12):  # 12: preemptions and rejections
        kw = {"policy": policy, "cost": cost, "kv": {"num_blocks": num_blocks, "block_size": 16},
              "num_replicas": 3, "router": router}
        fast = sim.simulate(REQS, **kw, fast_path="compiled")
        slow = sim.simulate(REQS, **kw, checks=True)
        assert (fast.engine, slow.engine) == ("compiled", "general")
        assert_same_run(fast, slow)
        for name in ("replica", "outstanding", "time_s", "request_id"):
            assert np.asarray(getattr(fast.routing, name)).tolist() == np.asarray(
                getattr(slow.routing, name)).tolist(), name


def test_a_subclass_keeps_its_own_route():
    assert "rule" not in CustomTokens.__dict__ and LeastOutstandingTokens.rule == la.TOKENS
    kw: dict[str, Any] = {"policy": "continuous", "cost": sim.ConstantCost(0.01),
                          "num_replicas": 2, "fast_path": "compiled"}
    mine = sim.simulate(REQS, **kw, router=CustomTokens())
    theirs = sim.simulate(REQS, **kw, router={"name": "least_outstanding_tokens"})
    assert mine.engine == theirs.engine == "compiled"
    assert not np.array_equal(mine.routing.replica, theirs.routing.replica)


@pytest.mark.parametrize("router", [{"name": "least_outstanding_tokens"},
                                    {"name": "power_of_two", "refresh_s": 0.02}])
def test_the_compiled_loop_equals_driving_the_replicas_one_arrival_at_a_time(router,
                                                                           monkeypatch):
    """``DrivenCompiled``'s own drive API (``advance_until``, ``admit``, its loads through
    ``sim.cluster.loads``), which the compiled loop replaces for routed runs, stays exact."""
    kw: dict[str, Any] = {"policy": {"name": "continuous", "max_num_seqs": 4},
                          "cost": sim.LinearCost(base_s=0.004, per_token_s=1e-4),
                          "kv": {"num_blocks": 14, "block_size": 16}, "num_replicas": 3,
                          "router": router, "fast_path": "compiled"}
    loop = sim.simulate(REQS, **kw)
    monkeypatch.setattr(DrivenCompiled, "routes_compiled", False)
    one_by_one = sim.simulate(REQS, **kw)
    assert loop.engine == one_by_one.engine == "compiled"
    assert_same_run(loop, one_by_one)
    for name in ("replica", "outstanding", "time_s", "request_id"):
        assert np.asarray(getattr(loop.routing, name)).tolist() == np.asarray(
            getattr(one_by_one.routing, name)).tolist(), name


def test_the_routing_loop_is_rebuilt_when_what_it_compiles_changes():
    # numba's cache of the routing loop only watches its own file
    assert cr.ROUTE_SHA256 == cr.route_sha256(), (
        f"one of {cr.ROUTE_SOURCES} changed: update ROUTE_SHA256 in "
        "sim/engine/compiled_route.py")
