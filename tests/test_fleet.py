"""The GPUs a deployment occupies and their price: one hardware, heterogeneous groups, and
disaggregated pools are all counted GPU by GPU (``sim.experiments.fleet``)."""
from __future__ import annotations

import pytest

from sim.cluster.groups import parse_groups
from sim.cost.profiles import load_gpu
from sim.experiments.fleet import cost_per_mtok, fleet, fleet_label
from sim.experiments.runner import cluster_args

BASE = {"model": "llama-3-8b", "hardware": "h100-sxm", "engine": "vllm",
        "parallelism": {"tp": 2, "replicas": 3},
        "cost": {"kind": "roofline", "weight_dtype": "bf16", "kv_dtype": "bf16"}}


def test_without_a_cluster_block_the_fleet_is_tp_times_replicas():
    assert fleet(BASE) == {"h100-sxm": 6}
    assert fleet_label(fleet(BASE)) == "h100-sxm"


def test_groups_count_their_own_replicas_tp_and_hardware_with_the_experiments_defaults():
    config = {**BASE, "cluster": {"groups": [
        {"name": "p", "role": "prefill", "replicas": 3},            # tp 2 from parallelism
        {"name": "d", "role": "decode", "replicas": 1, "tp": 4},
        {"name": "old", "replicas": 2, "hardware": "a100-80gb", "tp": 1}]}}
    assert fleet(config) == {"h100-sxm": 3 * 2 + 4, "a100-80gb": 2}
    assert fleet_label(fleet(config)) == "10×h100-sxm+2×a100-80gb"


def test_the_fleet_counts_the_groups_the_cluster_is_built_of():
    # the fleet reads the groups by the cluster's own rules (each key a group leaves out takes
    # the experiment's value, ``replicas`` its default): the GPUs of the built groups
    config = {**BASE, "cluster": {"groups": [
        {"name": "a"}, {"name": "b", "replicas": 2, "tp": None, "hardware": None},
        {"name": "c", "tp": 4}, {"name": "d", "replicas": 3, "hardware": "a100-80gb", "tp": 1}]}}
    args = cluster_args(config)
    built: dict[str, int] = {}
    for g in parse_groups(args["cluster"], policy="continuous", kv=None, cost=None,
                          cost_keys=args["cost_keys"]):
        built[g.hardware] = built.get(g.hardware, 0) + g.replicas * g.tp
    assert fleet(config) == built == {"h100-sxm": 2 + 2 * 2 + 4, "a100-80gb": 3}


def test_the_price_per_million_tokens_sums_every_gpu_of_the_fleet():
    config = {**BASE, "cluster": {"groups": [
        {"name": "a", "replicas": 1, "tp": 1},
        {"name": "b", "replicas": 2, "tp": 1, "hardware": "a100-80gb"}]}}
    usd_per_hour = (load_gpu("h100-sxm").price_per_gpu_hour_usd
                    + 2 * load_gpu("a100-80gb").price_per_gpu_hour_usd)
    tokens_per_s = 1000.0
    assert cost_per_mtok(config, tokens_per_s) == pytest.approx(
        usd_per_hour / (tokens_per_s * 3600) * 1e6, rel=1e-12)


def test_no_price_when_a_gpu_has_no_list_price_or_nothing_was_produced():
    assert cost_per_mtok({**BASE, "hardware": "h200"}, 1000.0) is None
    assert cost_per_mtok(BASE, 0.0) is None
