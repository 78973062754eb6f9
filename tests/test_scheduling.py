"""The scheduling specification: presets, the ``scheduler`` policy, priority and EDF, exactly.

Specification: ``continuous`` and ``chunked_prefill`` are presets of ``SchedulingSpec`` (the
``scheduler`` policy with the same fields gives the same run, bit for bit); the field domains
validate every parameter with a ``PolicyError`` naming it; ``victim: priority`` preempts the
lowest priority value first (ties: the newest), ``victim: deadline`` the latest TTFT deadline,
and ``order: edf`` admits the earliest deadline (arrival + its class's target) first — shown on
hand-computed timelines with a one-second ``ConstantCost`` step.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import sim
from policies import PolicyError, make_policy
from sim.core import rules
from sim.core.scheduling import VICTIMS, SchedulingSpec, domains
from tests.test_fastpath import assert_same_run

STEP = sim.ConstantCost(1.0)


def requests(*rows: tuple[float, int, int, int]) -> list[sim.Request]:
    """Requests from ``(arrival_s, prompt, output, priority)`` rows; ids 0, 1, ..."""
    return [sim.Request(i, a, p, o, priority=q) for i, (a, p, o, q) in enumerate(rows)]


def by_id(res: sim.SimResult, column: str) -> list:
    """One request-table column in id order."""
    return res.requests.sort_values("id")[column].tolist()


# -- presets ------------------------------------------------------------------------------------
PRESETS = [
    ({"name": "continuous", "max_num_seqs": 4, "max_num_batched_tokens": 300},
     {"composition": "prefill_first", "admission": "whole"}),
    ({"name": "continuous", "mode": "orca", "max_num_seqs": 4, "max_num_batched_tokens": 300,
      "ordering": "spf"}, {"composition": "mixed", "admission": "whole", "order": "spf"}),
    ({"name": "chunked_prefill", "token_budget": 64, "max_num_seqs": 4, "chunk_size": 16,
      "ordering": "priority"},
     {"composition": "decode_first", "admission": "chunked", "chunk_size": 16,
      "order": "priority"}),
]


@pytest.mark.parametrize(("preset", "fields"), PRESETS)
def test_the_built_in_policies_are_presets_of_the_specification(preset, fields):
    policy = make_policy(preset)
    limits = {"max_num_seqs": 4, "max_num_batched_tokens": policy.max_num_batched_tokens}
    assert policy.spec == SchedulingSpec(**fields, **limits)
    reqs = requests(*[(0.1 * (i % 5), 20 + 37 * i % 200, 1 + 7 * i % 30, i % 3)
                      for i in range(40)])
    kw = {"cost": sim.LinearCost(0.01, 1e-4), "kv": {"num_blocks": 60, "block_size": 4},
          "checks": True}
    assert_same_run(sim.simulate(reqs, {"name": "scheduler", **fields, **limits}, **kw),
                    sim.simulate(reqs, preset, **kw))


@pytest.mark.parametrize("name", sorted(domains()))
def test_every_field_is_validated_from_its_domain(name):
    d = domains()[name]
    bad = {"choice": "nonsense", "int": 0, "float": -1.0, "targets": {0: -1.0}}[d.kind]
    with pytest.raises(PolicyError, match=f"policy.{name}: "):
        make_policy({"name": "scheduler", name: bad})


@pytest.mark.parametrize(("fields", "problem"), [
    ({"composition": "mixed", "admission": "chunked"}, "admission"),
    ({"admission": "whole", "chunk_size": 8}, "chunk_size"),
    ({"max_num_seqs": 64, "max_num_batched_tokens": 32}, "max_num_seqs"),
])
def test_fields_that_contradict_each_other_are_refused(fields, problem):
    with pytest.raises(PolicyError, match=f"{problem}: "):
        make_policy({"name": "scheduler", **fields})


def test_victim_codes_are_the_rules_constants():
    assert [VICTIMS.index(v) for v in ("newest", "priority", "deadline")] == [
        rules.VICTIM_NEWEST, rules.VICTIM_PRIORITY, rules.VICTIM_DEADLINE]
    spec = SchedulingSpec(victim="deadline")
    assert spec.code("victim") == rules.VICTIM_DEADLINE and spec.code("composition") == 2


def test_the_specification_is_plain_numeric_data_once_coded():
    # what a compiled interpreter needs: every field an int, a float, null or a small mapping
    for f in dataclasses.fields(SchedulingSpec):
        assert f.metadata["domain"].kind in ("choice", "int", "float", "targets"), f.name


# -- victim rules: who is preempted --------------------------------------------------------------
# Three 4-token prompts arrive together with priorities 2, 0, 1 (block size 1). After their
# prefill (token 1 at t=1) every decode needs one block each, and the cache is two short.
THREE = requests((0.0, 4, 4, 2), (0.0, 4, 4, 0), (0.0, 4, 4, 1))


@pytest.mark.parametrize(("victim", "targets", "loser"), [
    ("newest", None, 2),  # the last admitted
    ("priority", None, 1),  # the lowest priority value
    ("deadline", {0: 9.0, 1: 0.1, 2: 5.0}, 1),  # the latest deadline: 0 + 9 s
])
def test_prefill_first_preempts_by_the_victim_rule(victim, targets, loser):
    # t=1: 3 blocks needed, 2 free: one victim; the other two decode to their end at t=4
    # (tokens at 2, 3, 4). The victim recomputes 4 + 1 tokens from t=4 (14 blocks, all
    # free again): tokens at 5, 6, 7.
    policy = {"name": "scheduler", "composition": "prefill_first", "admission": "whole",
              "watermark": 0.0, "victim": victim, "ttft_targets_s": targets}
    res = sim.simulate(THREE, policy, STEP, kv={"num_blocks": 14, "block_size": 1},
                       checks=True)
    assert by_id(res, "num_preemptions") == [int(i == loser) for i in range(3)]
    assert by_id(res, "finish_s") == [7.0 if i == loser else 4.0 for i in range(3)]
    assert by_id(res, "first_token_s") == [1.0, 1.0, 1.0]


@pytest.mark.parametrize(("victim", "loser"), [("newest", 2), ("priority", 1)])
def test_decode_first_preempts_by_the_victim_rule(victim, loser):
    # 12 blocks: none free at t=1. Request 0 decodes first and needs a block: a victim among
    # the requests not yet scheduled this step (1 and 2) is preempted. The other two finish
    # at t=3 (3 tokens); the victim recomputes 5 tokens from t=3: tokens at 4 and 5.
    policy = {"name": "scheduler", "composition": "decode_first", "watermark": 0.0,
              "victim": victim}
    three = requests((0.0, 4, 3, 2), (0.0, 4, 3, 0), (0.0, 4, 3, 1))
    res = sim.simulate(three, policy, STEP, kv={"num_blocks": 12, "block_size": 1},
                       checks=True)
    assert by_id(res, "num_preemptions") == [int(i == loser) for i in range(3)]
    assert by_id(res, "finish_s") == [5.0 if i == loser else 3.0 for i in range(3)]


def test_priority_victim_ties_go_to_the_newest():
    same = requests((0.0, 4, 4, 1), (0.0, 4, 4, 0), (0.0, 4, 4, 0))
    res = sim.simulate(same, {"name": "scheduler", "composition": "prefill_first",
                              "admission": "whole", "watermark": 0.0, "victim": "priority"},
                       STEP, kv={"num_blocks": 14, "block_size": 1}, checks=True)
    assert by_id(res, "num_preemptions") == [0, 0, 1]


# -- EDF: who is admitted first -----------------------------------------------------------------
@pytest.mark.parametrize("composition", ["prefill_first", "mixed", "decode_first"])
@pytest.mark.parametrize("order", ["fcfs", "edf"])
def test_edf_admits_the_earliest_deadline_first(composition, order):
    # One slot. Request 0 runs t=0..3 (prefill, two decodes). Request 1 (class 0: 10 s target,
    # deadline 10.1) and request 2 (class 1: 0.5 s, deadline 0.7) wait: EDF serves 2 at t=3
    # (first token at 4, done at 6) and then 1 (first token at 7); FCFS the other way round.
    reqs = requests((0.0, 4, 3, 0), (0.1, 4, 3, 0), (0.2, 4, 3, 1))
    policy = {"name": "scheduler", "composition": composition, "max_num_seqs": 1,
              "order": order, "ttft_targets_s": {0: 10.0, 1: 0.5}}
    if composition != "decode_first":
        policy["admission"] = "whole"
    res = sim.simulate(reqs, policy, STEP, kv=None, checks=True)
    first = [1.0, 4.0, 7.0] if order == "fcfs" else [1.0, 7.0, 4.0]
    assert by_id(res, "first_token_s") == first
    assert by_id(res, "first_scheduled_s") == [0.0, first[1] - 1, first[2] - 1]


def test_edf_default_target_applies_to_unlisted_classes():
    # class 5 is not listed: its target is ttft_target_s (0.05 s), earlier than class 0's 10 s
    reqs = requests((0.0, 4, 3, 0), (0.1, 4, 3, 0), (0.2, 4, 3, 5))
    res = sim.simulate(reqs, {"name": "scheduler", "max_num_seqs": 1, "order": "edf",
                              "ttft_target_s": 0.05, "ttft_targets_s": {0: 10.0}},
                       STEP, kv=None, checks=True)
    assert by_id(res, "first_token_s") == [1.0, 7.0, 4.0]


def test_the_compiled_interpreter_is_rebuilt_when_the_rules_change():
    # numba's cache of the compiled loop only watches its own file: it records the hash of
    # every rule and cost formula compiled into it
    from sim.engine import compiled_loop

    assert compiled_loop.RULES_SHA256 == compiled_loop.rules_sha256(), (
        f"one of {compiled_loop.RULE_SOURCES} changed: update RULES_SHA256 in "
        "sim/engine/compiled_loop.py")


def test_the_compiled_stretches_are_rebuilt_when_the_rules_change():
    # compiled_skip's functions are called from Python too (the general engine's stretch
    # costs, sim.engine.compiled_series): their cache records the rules they compile in
    from sim.engine import compiled_loop, compiled_skip

    assert compiled_skip.SKIP_SHA256 == compiled_loop.rules_sha256(
        compiled_skip.SKIP_SOURCES), (
        f"one of {compiled_skip.SKIP_SOURCES} changed: update SKIP_SHA256 in "
        "sim/engine/compiled_skip.py")


def test_the_driven_interpreter_is_rebuilt_when_the_loop_changes():
    # compiled_drive's compiled function holds its own copy of the loop (a stale copy once
    # ran a loop without a fix made to compiled_loop.py)
    from sim.engine import compiled_drive, compiled_loop

    assert compiled_drive.LOOP_SHA256 == compiled_loop.rules_sha256(
        compiled_loop.LOOP_SOURCES), (
        f"one of {compiled_loop.LOOP_SOURCES} changed: update LOOP_SHA256 in "
        "sim/engine/compiled_drive.py")


def test_the_batch_loop_is_rebuilt_when_the_loop_changes():
    from sim.engine import compiled_batch, compiled_loop

    assert compiled_batch.BATCH_SHA256 == compiled_loop.rules_sha256(
        compiled_loop.LOOP_SOURCES), (
        f"one of {compiled_loop.LOOP_SOURCES} changed: update BATCH_SHA256 in "
        "sim/engine/compiled_batch.py")


def test_the_documented_table_is_the_generated_one():
    from sim.core.scheduling import spec_table

    text = (Path(__file__).resolve().parents[1] / "docs" / "policies.md").read_text()
    begin, end = "<!-- spec-table:begin -->\n", "\n<!-- spec-table:end -->"
    assert text[text.index(begin) + len(begin):text.index(end)] == spec_table(), (
        "docs/policies.md: paste sim.core.scheduling.spec_table() between the spec-table markers")


def test_ttft_targets_take_integer_or_decimal_text_keys():
    # YAML mapping keys are strings: "1" names priority class 1, as the integer 1 does
    for targets in ({1: 0.5}, {"1": 0.5}):
        policy = make_policy({"name": "scheduler", "ttft_target_s": 3.0,
                              "ttft_targets_s": targets})
        assert (policy.target_s(1), policy.target_s(0)) == (0.5, 3.0)
    with pytest.raises(PolicyError, match="ttft_targets_s: each entry"):
        make_policy({"name": "scheduler", "ttft_targets_s": {"gold": 0.5}})
