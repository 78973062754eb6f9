"""Run-to-completion batches on the compiled interpreter: exactly the general engine's.

Specification: ``static`` and ``dynamic`` batching are presets of ``BatchSpec``; every
specification (``coverage.COMPILED_BATCH``) runs on the compiled interpreter — batch formation
on size, timeout and the end of arrivals, per prompt bucket, the padded prefill, finished
members kept as padding rows, preemption of the newest member and its padded recompute when
it fits again, ``max_preemptions`` rejections, contexts outgrowing the cache, the horizon —
and gives the same request table, step table, irregular gaps and summary, bit for bit, as the
general engine with its invariant checks on. Specifications are drawn from the fields' own
domains, so a field or value added later is exercised without anyone listing it; what is not
covered (replicas driven from outside) runs on the general engine and the result says why.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import sim
from policies.registry import make_policy
from sim.core.batching import BatchSpec, batch_domains
from sim.engine import coverage
from tests.test_coverage import (
    COSTS,
    check_drawn_run,
    covered_often,
    from_domain,
    kv_blocks,
    traces,
)
from tests.test_fastpath import assert_same_run

ROOFLINE = sim.build_cost_model(model="llama-3-8b", hardware="h100-sxm", tp=1, engine="vllm")


@st.composite
def batch_specs(draw: st.DrawFn) -> dict[str, Any]:
    """A valid ``BatchSpec``'s fields, every field drawn from its domain (mostly covered)."""
    return {name: draw(covered_often(from_domain(d), coverage.COMPILED_BATCH.get(name)),
                       label=name) for name, d in batch_domains().items()}


def preset_of(fields: dict[str, Any], static: bool) -> dict[str, Any] | None:
    """The built-in preset whose specification ``fields`` is: ``static`` where it can be (no
    buckets) and ``static`` asks for it or there is no wait, else ``dynamic``; ``None`` for
    buckets without a wait, which no preset has."""
    if fields["bucket_by_prompt"] is None and (static or fields["wait_s"] is None):
        return {"name": "static", "batch_size": fields["batch_size"],
                "timeout_s": fields["wait_s"], "ordering": fields["order"]}
    if fields["wait_s"] is None:
        return None
    return {"name": "dynamic", "max_batch_size": fields["batch_size"],
            "max_wait_s": fields["wait_s"],
            "bucket_by_prompt": (list(fields["bucket_by_prompt"])
                                 if isinstance(fields["bucket_by_prompt"], tuple)
                                 else fields["bucket_by_prompt"]),
            "ordering": fields["order"]}


@pytest.mark.parametrize("name", sorted(batch_domains()))
def test_every_batch_spec_field_is_validated_from_its_domain(name):
    from sim.core.errors import InputError

    bad = {"choice": "nonsense", "int": 0, "float": -1.0, "buckets": [64, 8]}
    with pytest.raises(InputError, match=f"policy.{name}: "):
        BatchSpec(**{name: bad[batch_domains()[name].kind]})


def test_the_documented_batch_table_is_the_generated_one():
    from pathlib import Path

    from sim.core.scheduling import spec_table

    text = (Path(__file__).resolve().parents[1] / "docs" / "policies.md").read_text()
    begin, end = "<!-- batch-spec-table:begin -->\n", "\n<!-- batch-spec-table:end -->"
    assert text[text.index(begin) + len(begin):text.index(end)] == spec_table(BatchSpec), (
        "docs/policies.md: paste sim.core.scheduling.spec_table(BatchSpec) between the "
        "batch-spec-table markers")


def test_every_batch_spec_field_is_mapped():
    assert set(coverage.COMPILED_BATCH) == {f.name for f in dataclasses.fields(BatchSpec)}
    for name, allowed in coverage.COMPILED_BATCH.items():
        if allowed is not coverage.ANY and batch_domains()[name].kind == "choice":
            assert allowed <= set(batch_domains()[name].choices), name


@settings(max_examples=600, deadline=None)
@given(reqs=traces(), fields=batch_specs(), static=st.booleans(), kv=kv_blocks,
       cost=st.sampled_from(COSTS), horizon_s=st.sampled_from([None, None, 0.3]),
       num_replicas=st.sampled_from([1, 1, 2]), tight=st.none() | st.integers(0, 6))
def test_every_drawn_batch_spec_runs_exactly_as_the_general_engine(
        reqs, fields, static, kv, cost, horizon_s, num_replicas, tight):
    policy = preset_of(fields, static)
    assume(policy is not None)
    assert make_policy(policy).spec == BatchSpec(**fields)  # the preset is that spec
    check_drawn_run(reqs, policy, kv, cost, horizon_s, num_replicas, tight)


# -- longer runs: many batches, preemptions and rejoins, the roofline ---------------------------
def _workload(seed: int, n: int, rate: float) -> list[sim.Request]:
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate, n))
    return [sim.Request(i, float(t[i]), int(rng.integers(1, 700)), int(rng.integers(1, 120)),
                        priority=int(rng.integers(0, 3))) for i in range(n)]


@pytest.mark.parametrize(("policy", "kv", "cost"), [
    ({"name": "static", "batch_size": 16, "timeout_s": 0.5}, {"block_size": 16}, ROOFLINE),
    ({"name": "static", "batch_size": 8}, {"num_blocks": 200, "block_size": 16}, ROOFLINE),
    ({"name": "dynamic", "max_batch_size": 32, "max_wait_s": 0.05, "ordering": "spf"},
     {"num_blocks": 300, "block_size": 16, "max_preemptions": 2}, ROOFLINE),
    ({"name": "dynamic", "max_batch_size": 12, "max_wait_s": 0.2, "ordering": "priority"},
     {"num_blocks": 160, "block_size": 8}, sim.LinearCost(0.004, 2e-5, 1e-4)),
    ({"name": "static", "batch_size": 6, "timeout_s": 0.0}, {"num_blocks": 90, "block_size": 4},
     sim.ConstantCost(0.02)),
    ({"name": "dynamic", "max_batch_size": 16, "max_wait_s": 0.1, "bucket_by_prompt": [64, 256],
      "ordering": "spf"}, {"num_blocks": 200, "block_size": 16}, ROOFLINE),
    ({"name": "dynamic", "max_batch_size": 8, "max_wait_s": 0.3, "bucket_by_prompt": 100,
      "ordering": "priority"}, {"num_blocks": 120, "block_size": 8},
     sim.LinearCost(0.004, 2e-5, 1e-4)),
])
@pytest.mark.parametrize("rate", [3.0, 40.0])
def test_long_runs_with_preemptions_equal_the_general_engine(policy, kv, cost, rate):
    reqs = _workload(7, 400, rate)
    fast = sim.simulate(reqs, policy, cost, kv=kv, fast_path="compiled")
    slow = sim.simulate(reqs, policy, cost, kv=kv, checks=True)
    assert (fast.engine, fast.engine_reason) == ("compiled", "")
    assert_same_run(fast, slow)


# -- the batching story's scenarios, on both engines --------------------------------------------
SCENARIOS = [
    # (rows, policy, kv): a padded prefill, the first finisher, a full batch, a timeout,
    # a KV limit that preempts and rejoins, late joiners of a pending dynamic batch, buckets
    ([(0.0, 50, 3), (0.0, 4000, 3)], {"name": "static", "batch_size": 2}, None),
    ([(0.0, 16, 200), *[(0.0, 16, 20)] * 31], {"name": "static", "batch_size": 32}, None),
    ([(0.0, 10, 5), (0.5, 10, 5), (0.52, 10, 5)], {"name": "static", "batch_size": 2}, None),
    ([(0.0, 10, 2), (5.0, 10, 2)], {"name": "static", "batch_size": 4, "timeout_s": 0.2}, None),
    ([(0.0, 8, 12), (0.0, 8, 12), (0.001, 8, 2)], {"name": "static", "batch_size": 2},
     {"num_blocks": 6, "block_size": 4}),
    ([(0.0, 10, 1), (0.03, 10, 1), *[(0.5, 10, 1)] * 4, (2.0, 10, 1)],
     {"name": "dynamic", "max_batch_size": 4, "max_wait_s": 0.05}, None),
    ([(0.0, 10, 1), (0.01, 1000, 1), (0.02, 20, 1), (3.0, 10, 1)],
     {"name": "dynamic", "max_batch_size": 8, "max_wait_s": 0.05, "bucket_by_prompt": [64]},
     None),
]


@pytest.mark.parametrize(("rows", "policy", "kv"), SCENARIOS)
def test_the_batching_scenarios_come_out_the_same_compiled(trace, rows, policy, kv):
    reqs = trace(*rows)
    fast = sim.simulate(reqs, policy, sim.ConstantCost(0.01), kv=kv, fast_path="compiled")
    slow = sim.simulate(reqs, policy, sim.ConstantCost(0.01), kv=kv, checks=True)
    assert fast.engine == "compiled"
    assert_same_run(fast, slow)


def test_a_batch_waits_for_its_timeout_and_then_decodes_with_padding(trace):
    # exact timings, compiled: the batch goes when the oldest has waited 0.2 s; the short
    # member finishes after 2 tokens and pads the last 3 decode steps
    reqs = trace((0.0, 10, 2), (0.1, 20, 5), (9.0, 10, 1))
    res = sim.simulate(reqs, {"name": "static", "batch_size": 4, "timeout_s": 0.2},
                       sim.ConstantCost(0.01), fast_path="compiled")
    assert res.engine == "compiled"
    steps = res.steps
    assert steps["start_s"].tolist()[:5] == pytest.approx([0.2, 0.21, 0.22, 0.23, 0.24])
    assert steps["num_padding_tokens"].tolist()[:5] == [10, 0, 1, 1, 1]
    assert steps["num_seqs"].tolist()[:5] == [2, 2, 1, 1, 1]
    assert res.requests["finish_s"].tolist()[:2] == pytest.approx([0.22, 0.25])
    # the last request goes alone at once: no more will come to fill its batch
    assert res.requests["first_scheduled_s"].tolist()[2] == 9.0


# -- what it does not cover runs on the general engine, and says so -----------------------------
def test_routed_batches_run_on_the_general_engine_and_say_so():
    reqs = _workload(5, 60, 10.0)
    res = sim.simulate(reqs, {"name": "static", "batch_size": 4}, sim.ConstantCost(0.01),
                       num_replicas=2, router={"name": "least_outstanding_requests"},
                       fast_path="compiled")
    assert res.engine == "general"
    assert "runs batches to completion" in res.engine_reason


def test_batch_runs_take_the_compiled_interpreter_from_their_own_size(monkeypatch):
    # the general engine runs a batch to its end in one event, so batches repay loading the
    # interpreter only from larger runs than the iteration-level presets do
    import sim.engine.compiled_cache as compiled_cache
    import sim.engine.simulate as simulate

    assert simulate.COMPILED_BATCH_MIN_REQUESTS > simulate.COMPILED_MIN_REQUESTS
    assert simulate.COMPILED_BATCH_COLD_MIN_REQUESTS > simulate.COMPILED_COLD_MIN_REQUESTS
    monkeypatch.setattr(simulate, "COMPILED_BATCH_MIN_REQUESTS", 60)
    monkeypatch.setattr(compiled_cache, "loop_is_cached",
                        lambda *a, **k: True)
    policy = {"name": "static", "batch_size": 8, "timeout_s": 0.3}
    small = sim.simulate(_workload(11, 59, 5.0), policy, sim.ConstantCost(0.01))
    assert small.engine == "general"
    assert small.engine_reason == ("59 requests on a replica, fewer than the 60 that repay "
                                   "loading the compiled interpreter")
    large = sim.simulate(_workload(11, 60, 5.0), policy, sim.ConstantCost(0.01))
    assert (large.engine, large.engine_reason) == ("compiled", "")
    # continuous batching takes it from its own, smaller size
    cont = sim.simulate(_workload(11, 59, 5.0), "continuous", sim.ConstantCost(0.01))
    assert "fewer than the 1000" in cont.engine_reason
