"""What a run does with inputs that used to slip through: a swept choice of policy, sweeps that
could only be ignored or collide, malformed command-line YAML, limits that simulate nothing,
partial runs, the API's defaults and arguments, and an output folder reused by another
experiment. Each case is one clear answer: a run that does what was asked, or one error line
naming the field (``InputError``; exit code 2 from the command line)."""
from __future__ import annotations

import copy
from pathlib import Path

import pandas as pd
import pytest
import yaml

import sim
from sim.cli.main import main
from sim.core.errors import InputError
from tests.helpers import SMALL_EXPERIMENT, requests


def _write(tmp_path: Path, cfg: dict, name: str = "exp.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    return path


def _run(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out + out.err


@pytest.mark.parametrize("values", [["static", "continuous"],
                                    [{"name": "static"}, {"name": "continuous"}]])
def test_a_swept_policy_labels_each_run_by_the_policy_it_runs(tmp_path, values) -> None:
    cfg = copy.deepcopy(SMALL_EXPERIMENT)
    cfg.pop("policy")
    cfg["sweep"] = {"policy": values}
    summary = sim.run_experiment(_write(tmp_path, cfg), out=tmp_path / "o", quiet=True)
    assert list(summary["label"]) == ["static", "continuous"]
    assert list(summary["policy"]) == ["static", "continuous"]


def test_a_swept_policy_name_labels_runs_apart(tmp_path) -> None:
    cfg = copy.deepcopy(SMALL_EXPERIMENT)
    cfg["policy"] = {"name": "static"}
    cfg["sweep"] = {"policy.name": ["static", "dynamic"]}
    summary = sim.run_experiment(_write(tmp_path, cfg), out=tmp_path / "o", quiet=True)
    assert list(summary["label"]) == ["static", "dynamic"]


@pytest.mark.parametrize(("sweep", "message"), [
    ({"policies": [[{"name": "static"}]]}, "sweep.policies: cannot be varied"),
    ({"zip": [1, 2]}, "sweep.zip: cannot be varied"),
    ({"workload.arrival": [{"rate": 1}, {"rate": 2}], "workload.arrival.rate": [1, 2]},
     "workload.arrival.rate is varied inside workload.arrival"),
])
def test_sweeps_that_would_be_ignored_or_collide_are_refused(tmp_path, sweep, message) -> None:
    cfg = dict(copy.deepcopy(SMALL_EXPERIMENT), sweep=sweep)
    with pytest.raises(InputError, match=message):
        sim.run_experiment(_write(tmp_path, cfg), out=tmp_path / "o", quiet=True)


def test_sweeping_the_policy_beside_a_policies_list_is_refused(tmp_path) -> None:
    cfg = copy.deepcopy(SMALL_EXPERIMENT)
    cfg.pop("policy")
    cfg["policies"] = [{"name": "static"}, {"name": "dynamic"}]
    cfg["sweep"] = {"policy": ["continuous", "chunked_prefill"]}
    with pytest.raises(InputError, match="chooses the policy of every run"):
        sim.run_experiment(_write(tmp_path, cfg), out=tmp_path / "o", quiet=True)


@pytest.mark.parametrize("label", ["", "  "])
def test_an_empty_label_is_refused(tmp_path, label) -> None:
    cfg = copy.deepcopy(SMALL_EXPERIMENT)
    cfg["policy"]["label"] = label
    with pytest.raises(InputError, match="policy.label: expected a non-empty label"):
        sim.run_experiment(_write(tmp_path, cfg), out=tmp_path / "o", quiet=True)


@pytest.mark.parametrize(("args", "message"), [
    (["--set", "kv={num_blocks: [1"], "--set kv={num_blocks: [1: not a valid YAML mapping"),
    (["--set", "kv={block_size: 16, block_size: 32}"], "duplicate key 'block_size'"),
    (["--sweep", "workload.arrival.rate=[1,2"], "--sweep workload.arrival.rate=[1,2: not a "
                                                "valid YAML list"),
    (["--set", "kv.foo.bar=5"], "--set kv.foo: unknown key; accepted: num_blocks, block_size"),
    (["--set", "foo.bar=5"], "--set foo: unknown key; accepted: name, description"),
    (["--sweep", "foo.bar=[1,2]"], "--sweep foo.bar=[1, 2]: foo: unknown key; accepted: name"),
    (["--set", "sweep.seed=[0,1]", "--set", "zip.seed=[0,1]"],
     "seed is already varied in sweep; set it there"),
    (["--set", "limits.horizon_s=0"], "limits.horizon_s: must be > 0, got 0"),
])
def test_command_line_values_are_checked_and_named(tmp_path, capsys, args, message) -> None:
    path = _write(tmp_path, SMALL_EXPERIMENT)
    code, text = _run(capsys, "run", str(path), "--out", str(tmp_path / "o"), *args)
    assert code == 2
    assert message in text
    assert "Traceback" not in text


def test_text_that_is_no_yaml_collection_stays_text(tmp_path, capsys) -> None:
    path = _write(tmp_path, SMALL_EXPERIMENT)
    code, _ = _run(capsys, "run", str(path), "--out", str(tmp_path / "o"), "--set", "name=a:b")
    assert code == 0


def test_a_run_stopped_by_a_limit_says_so(tmp_path, capsys) -> None:
    path = _write(tmp_path, SMALL_EXPERIMENT)
    code, text = _run(capsys, "run", str(path), "--out", str(tmp_path / "o"),
                      "--set", "limits.horizon_s=0.5")
    assert code == 0
    assert "runs stopped early by limits.horizon_s or limits.wall_clock_s" in text
    assert "unfinished" in text


def test_horizon_and_wall_clock_must_be_positive_from_python_too() -> None:
    reqs = requests([0.0], 10, 3)
    for name in ("horizon_s", "wall_clock_s"):
        with pytest.raises(InputError, match=f"{name}: must be > 0"):
            sim.simulate(reqs, cost=sim.ConstantCost(0.01), kv=None, **{name: 0})


def test_an_analytic_cost_without_kv_runs_as_the_api_default_does(tmp_path) -> None:
    """A YAML without ``kv:`` gets what ``sim.simulate`` without ``kv`` gets: ``"auto"``,
    unlimited KV for a cost model without hardware (and an explicit block still needs
    ``num_blocks`` there)."""
    cfg = copy.deepcopy(SMALL_EXPERIMENT)
    cfg.pop("kv")
    summary = sim.run_experiment(_write(tmp_path, cfg), out=tmp_path / "o", quiet=True)
    rid = summary["run_id"][0]
    table = pd.read_parquet(tmp_path / "o" / "runs" / rid / "requests.parquet")
    reqs = [sim.Request(id=int(r.id), arrival_s=float(r.arrival_s),
                        num_prompt_tokens=int(r.num_prompt_tokens),
                        num_output_tokens=int(r.num_output_tokens))
            for r in table.itertuples()]
    api = sim.simulate(reqs, policy=cfg["policy"], cost=sim.ConstantCost(0.01))
    assert summary["p99_ttft_ms"][0] == pytest.approx(api.summary["p99_ttft_ms"])
    cfg["kv"] = {"block_size": 32}
    with pytest.raises(InputError, match="kv.num_blocks: required"):
        sim.run_experiment(_write(tmp_path, cfg), out=tmp_path / "o2", quiet=True)


def test_simulate_without_a_cost_model_runs_the_yaml_default() -> None:
    reqs = requests([0.0, 0.1, 0.2], 300, 20)
    default = sim.simulate(reqs)
    named = sim.simulate(reqs, cost=sim.build_cost_model("llama-3-8b", "h100-sxm", tp=1,
                                                         engine="vllm-v0"))
    assert default.summary == named.summary


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"horizon": 5}, "horizon: unknown argument 'horizon'; accepted: checks, cluster"),
    ({"checks": "yes"}, "checks: expected true or false, got 'yes'"),
    ({"event_skipping": 1}, "event_skipping: expected true or false, got 1"),
])
def test_simulate_names_a_bad_argument(kwargs, message) -> None:
    with pytest.raises(InputError, match=message):
        sim.simulate(requests([0.0], 10, 3), cost=sim.ConstantCost(0.01), kv=None, **kwargs)


def test_simulate_refuses_an_empty_request_list() -> None:
    with pytest.raises(InputError, match="requests: no requests to simulate"):
        sim.simulate([], cost=sim.ConstantCost(0.01))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"out": 5}, "--out: expected a folder path, got int"),
    ({"job": 2}, "job: unknown argument 'job'; accepted: path, overrides, out, sweeps"),
])
def test_run_experiment_names_a_bad_argument(tmp_path, kwargs, message) -> None:
    with pytest.raises(InputError, match=message):
        sim.run_experiment(_write(tmp_path, SMALL_EXPERIMENT), **kwargs)


def test_a_router_with_nothing_to_route_between_is_noted(tmp_path, capsys) -> None:
    cfg = dict(copy.deepcopy(SMALL_EXPERIMENT), router={"name": "least_outstanding_tokens"})
    code, text = _run(capsys, "run", str(_write(tmp_path, cfg)), "--out", str(tmp_path / "o"))
    assert code == 0
    assert "router is not used: every run that sets it has one replica" in text


def test_another_experiment_in_the_same_folder_keeps_the_first_ones_outputs(tmp_path) -> None:
    first = _write(tmp_path, SMALL_EXPERIMENT)
    out = tmp_path / "o"
    sim.run_experiment(first, out=out, quiet=True)
    before = (out / "summary.csv").read_text(encoding="utf-8")
    sim.run_experiment(first, out=out, quiet=True)  # the same experiment: a resume
    assert not (out / "previous").exists()
    sim.run_experiment(first, overrides=["workload.arrival.rate=5"], out=out, quiet=True)
    kept = out / "previous" / "1"
    assert (kept / "summary.csv").read_text(encoding="utf-8") == before
    assert (kept / "experiment.yaml").is_file()
    assert (out / "summary.csv").read_text(encoding="utf-8") != before
    assert len(list((out / "runs").iterdir())) == 2  # both experiments' runs stay


def test_duplicate_entries_are_counted_as_one_run(tmp_path, capsys) -> None:
    cfg = dict(copy.deepcopy(SMALL_EXPERIMENT), sweep={"seed": [2, 2]})
    code, text = _run(capsys, "run", str(_write(tmp_path, cfg)), "--out", str(tmp_path / "o"))
    assert code == 0
    assert "small: 1 runs, 1 duplicate run once, 0 already done" in text
