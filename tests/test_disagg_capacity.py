"""``batchsim capacity --split-gpus``: colocated against every prefill:decode split, and the
disaggregation keys of a YAML experiment checked with their paths (exit 2, one line)."""
from __future__ import annotations

import pandas as pd
import pytest

from sim.cli.main import main
from sim.experiments.capacity_split import deployments, run_split
from sim.experiments.slo import CapacityError

EXP = """name: split_probe
model: llama-2-13b
hardware: a100-80gb
parallelism: {tp: 1}
workload:
  arrival: {process: poisson, rate: 4.0}
  num_requests: 30
  prompt_tokens: {dist: fixed, value: 256}
  output_tokens: {dist: fixed, value: 16}
policy: {name: continuous, max_num_seqs: 64}
"""


def test_the_deployments_are_colocated_then_every_split() -> None:
    blocks = deployments(8, 2)
    assert [b["label"] for b in blocks] == ["colocated-4", "split-1p3d", "split-2p2d",
                                           "split-3p1d"]
    assert [g["replicas"] for g in blocks[2]["groups"]] == [2, 2]
    with pytest.raises(CapacityError, match="multiple of TP=2"):
        deployments(7, 2)
    with pytest.raises(CapacityError, match="at least two replicas"):
        deployments(2, 2)


def test_split_capacity_puts_both_answers_side_by_side(tmp_path) -> None:
    exp = tmp_path / "e.yaml"
    exp.write_text(EXP)
    split = run_split(exp, 2, slo="ttft_p99_ms=2000,tpot_p99_ms=200", out=tmp_path / "o",
                      tolerance=0.5, quiet=True)
    assert split["deployment"].tolist() == ["colocated-2", "split-1p1d"]
    assert (split["gpus"] == 2).all()
    assert (split["max_rate_per_gpu"] == split["max_rate"] / 2).all()
    assert pd.read_csv(tmp_path / "o" / "split.csv")["deployment"].tolist() == \
        split["deployment"].tolist()


@pytest.mark.parametrize(("groups", "field"), [
    ("[{name: p, role: prefil}]", "cluster.groups[0].role"),
    ("[{name: p, role: prefill}]", "cluster.groups"),
])
def test_a_bad_role_in_a_yaml_exits_2_with_one_line(tmp_path, capsys, groups, field) -> None:
    exp = tmp_path / "bad.yaml"
    exp.write_text(EXP + f"cluster:\n  groups: {groups}\n")
    assert main(["run", str(exp), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "bad.yaml" in lines[0] and field in lines[0]


def test_a_swept_cluster_block_is_shown_by_its_label(tmp_path) -> None:
    import sim

    exp = tmp_path / "zip.yaml"
    exp.write_text(EXP.replace("num_requests: 30", "num_requests: 12") + """zip:
  cluster:
    - label: colocated
      groups: [{name: c, replicas: 2}]
    - label: split
      groups: [{name: p, role: prefill}, {name: d, role: decode}]
""")
    sim.run_experiment(str(exp), out=str(tmp_path / "o"))
    summary = pd.read_csv(tmp_path / "o" / "summary.csv")
    assert summary["cluster"].tolist() == ["colocated", "split"]
    split = summary.iloc[1]
    assert split["num_kv_transfers"] == 12 and split["num_gpus"] == 2
    assert split["request_throughput_per_gpu"] == split["request_throughput"] / 2
    runs = {p.name.split(".")[0] for d in (tmp_path / "o" / "runs").iterdir()
            for p in d.iterdir()}
    assert "links" in runs


def test_the_disaggregation_experiments_validate_and_keep_distserves_direction() -> None:
    """Both YAMLs expand; scaled down (300 requests at 16 req/s), the 2:2 split's p99 TPOT is
    below colocated continuous batching's on the same four GPUs (docs/disaggregation.md)."""
    from pathlib import Path

    from sim.experiments.config import expand_runs, load_yaml
    from sim.experiments.runner import simulate_config

    root = Path(__file__).resolve().parent.parent / "experiments"
    for name in ("disaggregation", "disaggregation_splitwise"):
        _, runs = expand_runs(load_yaml(root / f"{name}.yaml"), source=name)
        assert len({r.swept["cluster"]["label"] for r in runs}) == 5
    path = root / "disaggregation.yaml"
    raw = load_yaml(path)
    raw["sweep"] = {"workload.arrival.rate": [16]}
    raw["zip"] = {"cluster": [c for c in raw["zip"]["cluster"]
                              if c["label"] in ("colocated", "split-2p2d")]}
    _, runs = expand_runs(raw, ["workload.num_requests=300"], source=str(path))
    p99 = {r.swept["cluster"]["label"]: simulate_config(r.config, path.parent).summary[
        "p99_tpot_ms"] for r in runs}
    assert p99["split-2p2d"] < p99["colocated"]
