"""Heterogeneous clusters (``cluster: {groups: [...]}``): groups of replicas with their own GPU,
policy and KV behind one router, validated key by key, with a summary per group."""
from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

import sim
from sim.core.types import Request

COST = sim.build_cost_model(model="llama-3-8b", hardware="h100-sxm", tp=1, engine="vllm")


def workload(n: int = 240, rate: float = 40.0, seed: int = 2) -> list[Request]:
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate, n))
    return [Request(i, float(t[i]), int(rng.integers(50, 1500)), int(rng.integers(5, 200)))
            for i in range(n)]


def test_one_group_is_the_same_run_as_identical_replicas() -> None:
    reqs = workload()
    policy = {"name": "chunked_prefill", "token_budget": 512}
    plain = sim.simulate(reqs, policy=policy, cost=COST, num_replicas=3,
                         router="least_outstanding_tokens", checks=True)
    grouped = sim.simulate(reqs, policy=policy, cost=COST, checks=True,
                           cluster={"groups": [{"name": "all", "replicas": 3}]},
                           router="least_outstanding_tokens")
    pd.testing.assert_frame_equal(grouped.requests.drop(columns="group"), plain.requests)
    pd.testing.assert_frame_equal(grouped.steps.drop(columns="group"), plain.steps)
    assert (grouped.requests["group"] == "all").all()
    for key, value in plain.summary.items():
        assert grouped.summary[key] == pytest.approx(value, nan_ok=True), key
    assert grouped.groups["completed"].tolist() == [plain.summary["completed"]]
    # the run says which engine ran and why (the console's fallback line reads it)
    assert grouped.engine == "general"
    assert grouped.engine_reason == "a cluster of groups runs on the general engine"


def test_a_faster_group_weighs_more_and_load_aware_routing_uses_it() -> None:
    reqs = workload(n=400, rate=60.0)
    cluster = {"groups": [
        {"name": "h100", "replicas": 2, "model": "llama-3-8b", "hardware": "h100-sxm"},
        {"name": "a100", "replicas": 2, "model": "llama-3-8b", "hardware": "a100-80gb",
         "policy": {"name": "continuous", "max_num_seqs": 64}}]}
    rr = sim.simulate(reqs, policy={"name": "chunked_prefill"}, cluster=cluster)
    lot = sim.simulate(reqs, policy={"name": "chunked_prefill"}, cluster=cluster,
                       router="least_outstanding_tokens", checks=True)
    weights = lot.replicas.set_index("group")["weight"]
    assert weights["h100"].min() > 1.0 > weights["a100"].max()  # relative to the mean
    assert rr.requests["group"].value_counts().tolist() == [200, 200]
    per_group = lot.groups.set_index("group")
    assert per_group.loc["h100", "completed"] > per_group.loc["a100", "completed"]
    assert per_group["completed"].sum() == lot.summary["completed"] == 400
    assert lot.summary["p99_ttft_ms"] < rr.summary["p99_ttft_ms"]
    assert set(lot.steps["group"]) == {"h100", "a100"}
    assert lot.engine_profile == "vllm-v0"  # `vllm` names vllm-v0


def test_a_given_weight_overrides_the_measured_one() -> None:
    cluster = {"groups": [{"name": "a", "replicas": 1, "cost": COST, "weight": 3.0},
                          {"name": "b", "replicas": 1, "cost": COST}]}
    res = sim.simulate(workload(n=60), policy="continuous", cluster=cluster,
                       router="least_outstanding_requests")
    assert res.replicas["weight"].tolist() == [3.0, 1.0]


@pytest.mark.parametrize(("groups", "message"), [
    ([{"name": "a", "replicas": 0}], r"cluster\.groups\[0\]\.replicas: must be >= 1"),
    ([{"name": "a"}, {"name": "a"}], r"cluster\.groups\[1\]\.name: duplicate group name"),
    ([{"replicas": 2}], r"cluster\.groups\[0\]\.name: required key missing"),
    ([{"name": "a", "gpus": 2}], r"cluster\.groups\[0\]\.gpus: unknown key"),
    ([{"name": "a", "hardware": "h900", "model": "llama-3-8b"}],
     r"cluster\.groups\[0\]\.hardware: unknown gpu 'h900'"),
    ([{"name": "a", "weight": 0}], r"cluster\.groups\[0\]\.weight: must be > 0"),
    ([], r"cluster\.groups: expected a list of 1 to 64 groups"),
])
def test_every_group_key_is_checked_with_its_path(groups, message) -> None:
    with pytest.raises(sim.InputError, match=message):
        sim.simulate(workload(n=5), policy="continuous", cost=COST, cluster={"groups": groups})


def test_a_yaml_cluster_runs_and_writes_a_table_per_group(tmp_path) -> None:
    exp = tmp_path / "het.yaml"
    exp.write_text(
        "model: llama-3-8b\nhardware: h100-sxm\n"
        "workload: {arrival: {rate: 30}, num_requests: 120, prompt_tokens: {dist: fixed, "
        "value: 400}, output_tokens: {dist: fixed, value: 40}}\n"
        "policy: {name: chunked_prefill}\nrouter: least_outstanding_requests\n"
        "cluster:\n  groups:\n    - {name: fast, replicas: 2}\n"
        "    - {name: slow, replicas: 1, hardware: a100-80gb}\n")
    sim.run_experiment(str(exp), out=str(tmp_path / "out"))
    (run,) = (tmp_path / "out" / "runs").iterdir()
    names = {p.name.split(".")[0] for p in run.iterdir()}
    assert {"groups", "replicas", "requests", "steps"} <= names
    bad = tmp_path / "bad.yaml"
    bad.write_text(exp.read_text().replace("a100-80gb", "a99"))
    with pytest.raises(sim.InputError, match=r"bad\.yaml: cluster\.groups\[1\]\.hardware"):
        sim.run_experiment(str(bad), out=str(tmp_path / "out2"))


def test_a_disaggregated_result_is_a_mixed_clusters_plus_only_its_own_parts() -> None:
    # one assembly of a cluster's result (``sim.cluster.deployment``) for both kinds of run:
    # the same tables and summary keys, in the same order, the hand-off adding only its own
    from sim.cluster.disagg_run import DISAGG_COLUMNS
    from sim.cluster.metrics import imbalance
    from sim.cluster.routed import RoutingLog

    reqs = workload(60)
    kv = {"num_blocks": 400, "block_size": 16}
    groups = [{"name": "a", "replicas": 2, "kv": kv}, {"name": "b", "replicas": 1, "kv": kv}]
    mixed = sim.simulate(reqs, policy="continuous", cost=COST, cluster={"groups": groups},
                         router="least_outstanding_requests")
    split = sim.simulate(reqs, policy="continuous", cost=COST, router="least_outstanding_requests",
                         cluster={"groups": [{**groups[0], "role": "prefill"},
                                             {**groups[1], "role": "decode"}]})
    assert list(split.steps.columns) == list(mixed.steps.columns)
    assert list(split.requests.columns) == [*mixed.requests.columns, *DISAGG_COLUMNS]
    assert list(split.groups.columns) == ["group", "role", *mixed.groups.columns[1:]]
    # a mixed run's routers weigh replicas by capacity: its table says by how much
    assert list(mixed.replicas.columns) == [*split.replicas.columns[:2], "weight",
                                            *split.replicas.columns[2:]]
    assert [k for k in split.summary if k in mixed.summary] == list(mixed.summary)
    routing = imbalance(RoutingLog(), mixed.steps, 3)
    assert set(routing) <= set(mixed.summary)
    assert {f"decode_{k}" for k in routing} | {"decode_router"} <= set(split.summary)


@pytest.mark.parametrize(("group", "message"), [
    ({"name": "b", "policy": {"name": "continuous", "max_num_seqs": 0}},
     r"^cluster\.groups\[1\]\.policy\.max_num_seqs: must be > 0, got 0$"),
    ({"name": "b", "policy": "contineous"},
     r"^cluster\.groups\[1\]\.policy\.name: unknown policy 'contineous' \(did you mean"),
    ({"name": "b", "kv": {"block_size": 0}},
     r"^cluster\.groups\[1\]\.kv\.block_size: must be >= 1"),
    ({"name": "b", "hardware": "l4"}, r"^cluster\.groups\[1\]\.kv: no memory left"),
])
def test_a_groups_own_policy_and_kv_are_checked_naming_the_group(group, message) -> None:
    """A group's policy and KV cache are built once when the cluster is read, so a bad one is an
    error at the group's path before anything runs (the experiment's KV cache too, where only
    this group's GPU cannot hold it: half of an L4 is less than Llama-3-8B's weights)."""
    cluster = {"groups": [{"name": "a"}, group]}
    with pytest.raises(sim.InputError, match=message):
        sim.simulate(workload(n=5), policy="continuous", cluster=cluster,
                     kv={"gpu_memory_utilization": 0.5},
                     cost_keys={"model": "llama-3-8b", "hardware": "h100-sxm", "tp": 1,
                                "engine": "vllm"})


def test_a_misspelt_cluster_key_suggests_the_right_one() -> None:
    with pytest.raises(sim.InputError, match=r"^cluster\.gruops: unknown key \(did you mean "
                       r"'groups'\?\); accepted: decode_router, groups, label, network$"):
        sim.simulate(workload(n=5), policy="continuous", cost=COST,
                     cluster={"groups": [{"name": "a"}], "gruops": []})


def test_a_cluster_with_a_bucketed_step_table_exits_2_before_any_run(tmp_path, capsys) -> None:
    """It was checked only inside the run: exit 1, "every run failed"."""
    from sim.cli.main import main

    exp = tmp_path / "exp.yaml"
    exp.write_text("model: llama-3-8b\nmetrics: {step_table: buckets}\n"
                   "cluster: {groups: [{name: a}]}\nworkload: {arrival: {rate: 5}, "
                   "num_requests: 3, prompt_tokens: {dist: fixed, value: 8}, "
                   "output_tokens: {dist: fixed, value: 4}}\n")
    assert main(["run", str(exp), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    assert capsys.readouterr().err == (
        f"batchsim: error: {exp}: metrics.step_table: a cluster keeps one row per step; "
        "bucketed step tables are not supported for clusters yet\n")
    assert not (tmp_path / "o").exists()


def test_parallelism_replicas_beside_a_cluster_is_said_to_be_unused() -> None:
    """A cluster's groups set the replicas; ``parallelism.replicas: 3`` beside one was
    ignored without a word."""
    from sim.experiments.config import expand_runs

    raw = {"model": "llama-3-8b", "parallelism": {"replicas": 3},
           "cluster": {"groups": [{"name": "a"}]},
           "workload": {"arrival": {"rate": 5}, "num_requests": 3,
                        "prompt_tokens": {"dist": "fixed", "value": 8},
                        "output_tokens": {"dist": "fixed", "value": 4}}}
    notes: list[str] = []
    expand_runs(raw, notify=notes.append)
    assert notes == ["parallelism.replicas (3) is not used by the runs with a cluster block: "
                     "its groups set the replicas"]
    notes.clear()
    expand_runs({**raw, "parallelism": {"tp": 1}}, notify=notes.append)
    assert notes == []


def test_num_replicas_beside_a_cluster_is_noted_not_silently_dropped() -> None:
    reqs = workload(40)
    groups = {"groups": [{"name": "all", "replicas": 2}]}
    with pytest.warns(UserWarning, match=r"num_replicas \(3\) is not used: the cluster's "
                      "groups set the replicas"):
        noted = sim.simulate(reqs, cost=COST, cluster=groups, num_replicas=3)
    assert noted.groups["replicas"].tolist() == [2]  # the groups' replicas run
    assert sorted(noted.requests["replica"].unique()) == [0, 1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the default num_replicas says nothing
        sim.simulate(reqs, cost=COST, cluster=groups)
