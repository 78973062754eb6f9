"""One set of defaults: the same setup from Python with default arguments and from a YAML with
default keys gives identical tables, and every run says which engine profile it used."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import sim
from sim.core.fields import validate_fields
from sim.cost.roofline import DEFAULT_ENGINE
from sim.experiments.results import read_table
from sim.experiments.schema import SCHEMA
from sim.kv.config import KV_FIELDS, KVConfig, resolve_kv
from sim.workload.build import build_workload

WORKLOAD = {"arrival": {"process": "poisson", "rate": 30.0}, "num_requests": 150,
            "lengths": {"dist": "empirical", "trace": "azure-conv"}}
POLICY = {"name": "continuous", "max_num_seqs": 128}


def test_python_defaults_equal_yaml_defaults(tmp_path: Path) -> None:
    exp = tmp_path / "e.yaml"
    exp.write_text("name: defaults\nmodel: llama-3-8b\nhardware: h100-sxm\n"
                   f"workload: {WORKLOAD}\npolicy: {POLICY}\n".replace("'", ""))
    summary = sim.run_experiment(exp, out=tmp_path / "out", plots=False, quiet=True)
    run = tmp_path / "out" / "runs" / summary["run_id"][0]

    requests = build_workload(WORKLOAD, np.random.default_rng(0))
    cost = sim.build_cost_model("llama-3-8b", "h100-sxm")
    res = sim.simulate(requests, policy=POLICY, cost=cost)

    pd.testing.assert_frame_equal(res.requests, read_table(run / "requests"))
    pd.testing.assert_frame_equal(res.steps, read_table(run / "steps"))
    assert res.engine_profile == DEFAULT_ENGINE == "vllm-v0"
    assert f"engine profile: {DEFAULT_ENGINE}" in (tmp_path / "out" / "report.md").read_text()


def test_kv_block_has_one_definition() -> None:
    """The schema's kv block is KV_FIELDS itself, and KVConfig's defaults are read from it."""
    assert SCHEMA["kv"] is KV_FIELDS
    defaults = validate_fields({}, KV_FIELDS)
    cfg = KVConfig(num_blocks=1)
    for name in ("block_size", "allocator", "slab_reserve", "preemption", "max_preemptions",
                 "prefix_caching"):
        assert getattr(cfg, name) == defaults[name], name
    assert resolve_kv({"num_blocks": 10}, sim.ConstantCost(0.01)).max_preemptions == 64


@pytest.mark.parametrize(("kv", "message"), [
    ({"block_size": "16"}, "kv.block_size: expected int, got str '16'"),
    ({"num_blocks": 100.7}, "kv.num_blocks: expected int or null, got float 100.7"),
    ({"num_blocks": 0}, "kv.num_blocks: must be >= 1, got 0"),
    ({"blocksize": 16}, "kv.blocksize: unknown key (did you mean 'block_size'?)"),
    ({"allocator": "paged2"}, "kv.allocator: 'paged2' is not one of paged, slab"),
])
def test_python_kv_is_checked_like_yaml(kv: dict, message: str) -> None:
    req = sim.Request(id=0, arrival_s=0.0, num_prompt_tokens=4, num_output_tokens=2)
    with pytest.raises(sim.InputError) as err:
        sim.simulate([req], policy={"name": "continuous"}, cost=sim.ConstantCost(0.01), kv=kv)
    assert str(err.value).startswith(message)


def test_analytic_cost_default_kv_is_unlimited() -> None:
    req = sim.Request(id=0, arrival_s=0.0, num_prompt_tokens=4, num_output_tokens=2)
    res = sim.simulate([req], policy={"name": "continuous"}, cost=sim.ConstantCost(0.01))
    assert res.kv is not None and res.kv.unlimited
    assert res.engine_profile == "none"


def test_no_policy_is_the_same_default_from_python_and_yaml(tmp_path: Path) -> None:
    """``sim.simulate(policy=None)`` was "policy: expected a mapping with a 'name' key" while a
    YAML without ``policy:`` runs ``DEFAULT_POLICY``: now both run it."""
    from policies import DEFAULT_POLICY

    exp = tmp_path / "e.yaml"
    exp.write_text("name: nopolicy\nmodel: llama-3-8b\nhardware: h100-sxm\n"
                   f"workload: {WORKLOAD}\n".replace("'", ""))
    summary = sim.run_experiment(exp, out=tmp_path / "out", plots=False, quiet=True)
    assert summary["policy"].tolist() == [DEFAULT_POLICY]
    run = tmp_path / "out" / "runs" / summary["run_id"][0]
    requests = build_workload(WORKLOAD, np.random.default_rng(0))
    res = sim.simulate(requests, cost=sim.build_cost_model("llama-3-8b", "h100-sxm"))
    pd.testing.assert_frame_equal(res.requests, read_table(run / "requests"))
