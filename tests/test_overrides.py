"""``--set`` / ``--sweep`` on swept keys and automatic policy labels, from the CLI and the API.

The issue's commands are reproduced as written (the quickstart cut to a few requests so that
each run takes a moment): ``--set workload.rate=6`` on the quickstart used to rerun its swept
rates 4, 8 and 16 silently; ``--set 'sweep.workload.rate=[6]'`` and ``--set sweep=null`` were
refused.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml

from sim.api import run_experiment
from sim.cli.main import main
from sim.experiments.config import ConfigError, expand_runs
from sim.experiments.labels import policy_labels
from tests.helpers import SMALL_EXPERIMENT as SMALL

REPO = Path(__file__).resolve().parent.parent
QUICKSTART = str(REPO / "experiments" / "quickstart.yaml")
#: The quickstart cut to a few requests, no plots: the runs take a moment each.
CHEAP = ["--set", "workload.max_requests=20", "--no-plots"]


def rates(out: Path) -> list[float]:
    return [yaml.safe_load((out / "runs" / rid / "config.yaml").read_text())["workload"]["rate"]
            for rid in pd.read_csv(out / "summary.csv", dtype={"run_id": str})["run_id"]]


def test_set_on_a_swept_key_replaces_the_sweep_and_says_so(tmp_path, capsys):
    out = tmp_path / "q6"
    assert main(["run", QUICKSTART, "--set", "workload.rate=6", "--out", str(out), *CHEAP]) == 0
    err = capsys.readouterr().err
    assert rates(out) == [6]
    notes = [line for line in err.splitlines() if "replaces the sweep" in line]
    assert notes == ["batchsim: --set workload.rate=6 replaces the sweep of workload.rate "
                     "(sweep: [4, 8, 16])"]
    # the quickstart's own run ids are not reused: the rate-6 run is a new run
    _, runs = expand_runs(yaml.safe_load(Path(QUICKSTART).read_text()))
    from sim.experiments.runner import run_id
    done = pd.read_csv(out / "summary.csv", dtype={"run_id": str})["run_id"]
    assert not {run_id(r.config) for r in runs} & set(done)


def test_quiet_suppresses_the_note(tmp_path, capsys):
    assert main(["run", QUICKSTART, "--set", "workload.rate=6", "--out", str(tmp_path / "q"),
                 "--quiet", *CHEAP]) == 0
    assert capsys.readouterr().err == ""


def test_api_overrides_follow_the_same_rule(tmp_path, capsys):
    summary = run_experiment(QUICKSTART, overrides=["workload.rate=4", "workload.max_requests=20"],
                             out=tmp_path / "q", plots=False)
    assert len(summary) == 1 and rates(tmp_path / "q") == [4]
    assert "replaces the sweep of workload.rate" in capsys.readouterr().err
    # a mapping of dotted keys works the same
    summary = run_experiment(QUICKSTART, overrides={"workload.rate": 5,
                                                    "workload.max_requests": 20},
                             out=tmp_path / "q5", plots=False, quiet=True)
    assert rates(tmp_path / "q5") == [5]


def test_set_sweep_dotted_key_and_sweep_null(tmp_path):
    one = tmp_path / "one"
    assert main(["run", QUICKSTART, "--set", "sweep.workload.rate=[6]", "--out", str(one),
                 *CHEAP]) == 0
    summary = pd.read_csv(one / "summary.csv")
    assert list(summary["workload.rate"]) == [6]  # still a sweep: the column is kept
    none = tmp_path / "none"
    assert main(["run", QUICKSTART, "--set", "sweep=null", "--out", str(none), *CHEAP]) == 0
    assert rates(none) == [4.0]  # the YAML's own workload.rate
    assert "workload.rate" not in pd.read_csv(none / "summary.csv").columns


def test_sweep_flag_and_api_sweeps(tmp_path):
    out = tmp_path / "s"
    assert main(["run", QUICKSTART, "--sweep", "workload.rate=[2, 3]", "--sweep", "seed=0,1",
                 "--out", str(out), *CHEAP]) == 0
    summary = pd.read_csv(out / "summary.csv")
    assert list(zip(summary["workload.rate"], summary["seed"], strict=True)) == [
        (2, 0), (2, 1), (3, 0), (3, 1)]
    summary = run_experiment(QUICKSTART, overrides=["workload.max_requests=20"],
                             sweeps={"workload.rate": [3, 5]}, out=tmp_path / "api",
                             plots=False, quiet=True)
    assert list(summary["workload.rate"]) == [3, 5]
    summary = run_experiment(QUICKSTART, overrides=["workload.max_requests=20"],
                             sweeps={"workload.rate": None}, out=tmp_path / "api0",
                             plots=False, quiet=True)
    assert len(summary) == 1 and "workload.rate" not in summary.columns


def test_override_rules_on_the_raw_config():
    raw = {**SMALL, "sweep": {"workload.arrival.rate": [1, 2], "seed": [0, 1]},
           "zip": {"metrics.warmup_s": [0.0, 1.0], "metrics.cooldown_s": [0.0, 1.0]}}
    notes: list[str] = []
    _, runs = expand_runs(raw, ["workload.arrival={process: poisson, rate: 7}",
                                "metrics.warmup_s=0.5"], notify=notes.append)
    assert [r.swept for r in runs] == [{"seed": 0, "metrics.cooldown_s": 0.0},
                                       {"seed": 0, "metrics.cooldown_s": 1.0},
                                       {"seed": 1, "metrics.cooldown_s": 0.0},
                                       {"seed": 1, "metrics.cooldown_s": 1.0}]
    assert {r.config["workload"]["arrival"]["rate"] for r in runs} == {7}
    assert {r.config["metrics"]["warmup_s"] for r in runs} == {0.5}
    assert len(notes) == 2 and "(zip: [0.0, 1.0])" in notes[1]
    # a value inside a swept key cannot be set around the sweep
    raw2 = {**SMALL, "sweep": {"workload.arrival": [{"process": "poisson", "rate": 1}]}}
    with pytest.raises(ConfigError, match=r"workload.arrival is swept.*sweep.workload.arrival"):
        expand_runs(raw2, ["workload.arrival.rate=3"])
    # a key may be varied by sweep or by zip, not both
    with pytest.raises(ConfigError, match="already varied in zip"):
        expand_runs(raw, ["sweep.metrics.warmup_s=[1.0]"])
    with pytest.raises(ConfigError, match="unknown key"):
        expand_runs(raw, ["sweep.kv.nope=[1]"])
    with pytest.raises(ConfigError, match="--sweep"):
        main_err = expand_runs(raw, None, sweeps={"seed": 3})
        del main_err


@pytest.mark.parametrize("args,fragment", [
    (["--sweep", "workload.rate"], "expected dotted.key=[value, ...]"),
    (["--sweep", "workload.rate=[]"], "expected dotted.key=[value, ...]"),
    (["--set", "sweep.workload.rate=6"], "sweep.workload.rate: expected a non-empty list"),
    (["--set", "sweep.nope.key=[1]"], "unknown key"),
])
def test_bad_sweep_arguments_exit_2(tmp_path, capsys, args, fragment):
    assert main(["run", QUICKSTART, *args, "--out", str(tmp_path / "x"), *CHEAP]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err, err


def test_automatic_labels_name_the_parameters_that_differ():
    specs = [{"name": "chunked_prefill", "token_budget": 512},
             {"name": "chunked_prefill", "token_budget": 2048},
             {"name": "continuous", "max_num_seqs": 64},
             "static",
             {"name": "chunked_prefill", "token_budget": 512, "max_num_seqs": 8},
             {"name": "continuous", "max_num_seqs": 64, "label": "mine"}]
    assert policy_labels(specs) == [
        "chunked_prefill(token_budget=512)", "chunked_prefill(token_budget=2048)",
        "continuous", "static", "chunked_prefill(token_budget=512, max_num_seqs=8)", "mine"]
    # identical specs, and an automatic label equal to a written one, are numbered
    assert policy_labels(["continuous", "continuous"]) == ["continuous", "continuous #2"]
    assert policy_labels([{"name": "static", "label": "continuous"}, "continuous"]) == [
        "continuous", "continuous #2"]
    with pytest.raises(ValueError, match=r"policies\[1\].label.*used by policies\[0\]"):
        policy_labels([{"name": "static", "label": "a"}, {"name": "continuous", "label": "a"}])


def test_labels_reach_console_summary_and_capacity(tmp_path, capsys):
    exp = tmp_path / "two.yaml"
    raw = {**SMALL, "policies": [{"name": "chunked_prefill", "token_budget": 512},
                                 {"name": "chunked_prefill", "token_budget": 2048}]}
    raw.pop("policy")
    exp.write_text(yaml.safe_dump(raw))
    assert main(["run", str(exp), "--out", str(tmp_path / "r")]) == 0
    text = capsys.readouterr().out
    summary = pd.read_csv(tmp_path / "r" / "summary.csv")
    want = ["chunked_prefill(token_budget=512)", "chunked_prefill(token_budget=2048)"]
    assert list(summary["label"]) == want
    assert list(summary["policy"]) == ["chunked_prefill"] * 2  # the name column is kept
    assert all(w in text for w in want)
    assert main(["capacity", str(exp), "--slo", "ttft_p99_ms=2000", "--tolerance", "0.5",
                 "--out", str(tmp_path / "c"), "--quiet"]) == 0
    assert list(pd.read_csv(tmp_path / "c" / "capacity.csv")["label"]) == want


@pytest.mark.parametrize("args,fragment", [
    (["--set", "a..b=1"], "--set a..b: empty key name (two dots in a row, or a dot at an end)"),
    (["--set", "workload..rate=1"], "--set workload..rate: empty key name"),
    (["--sweep", "seed.=[1, 2]"], "seed.: empty key name"),
])
def test_a_key_with_an_empty_name_is_refused(tmp_path, capsys, args, fragment):
    """``a..b`` used to read as an unknown key with an empty list of accepted ones."""
    assert main(["run", QUICKSTART, *args, "--out", str(tmp_path / "x"), *CHEAP]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err, err


def test_an_unknown_key_in_the_files_sweep_names_the_file_and_the_block(tmp_path):
    for block in ("sweep", "zip"):
        with pytest.raises(ConfigError, match=rf"^exp\.yaml: {block}\.modle: unknown key "
                           r"\(did you mean 'model'\?\)"):
            expand_runs({**SMALL, block: {"modle": ["a", "b"]}}, source="exp.yaml")


@pytest.mark.parametrize("overrides", [5, [5], ["seed=1", None], "seed=1", object()])
def test_overrides_that_are_no_list_of_strings_are_one_input_error(tmp_path, overrides):
    with pytest.raises(ConfigError, match=r"^overrides: expected a list of 'dotted\.key=value' "
                       r"strings \(or a mapping of dotted key to value\), got "):
        run_experiment(QUICKSTART, overrides=overrides, out=tmp_path / "x")


@pytest.mark.parametrize("args,fragment", [
    (["--set", "policies[0].max_num_seqs=4"], "--set policies[0].max_num_seqs: a list entry "
     "cannot be set on its own (policies[0]); set the whole list, e.g. --set 'policies=[...]'"),
    (["--set", "cluster.groups[1].replicas=2"], "set the whole list, e.g. --set "
     "'cluster.groups=[...]'"),
    (["--set", "kv.block_size.x=1"], "--set kv.block_size.x: kv.block_size is a single value, "
     "not a block of keys; set it whole, e.g. --set 'kv.block_size=...'"),
])
def test_a_key_below_a_list_or_a_value_says_what_to_set_instead(tmp_path, capsys, args,
                                                                 fragment):
    """These read "unknown key; accepted:" with nothing accepted."""
    assert main(["run", QUICKSTART, *args, "--out", str(tmp_path / "x"), *CHEAP]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err, err


def test_a_block_written_as_its_name_takes_a_key_below_it():
    # ``policy: static`` is short for ``{name: static}``: --set, --sweep and the file's own
    # sweep can then reach its parameters (the router's and the decode router's too)
    raw = {**SMALL, "policy": "static", "router": "random",
           "parallelism": {"replicas": 2}, "sweep": {"router.name": ["round_robin", "random"]}}
    _, runs = expand_runs(raw, ["policy.batch_size=4", "router.refresh_s=0.5"])
    assert [r.config["policy"]["batch_size"] for r in runs] == [4, 4]
    assert [r.config["policy"]["name"] for r in runs] == ["static", "static"]
    assert [r.config["router"]["name"] for r in runs] == ["round_robin", "random"]
    assert {r.config["router"]["refresh_s"] for r in runs} == {0.5}
    split = {**SMALL, "cluster": {"groups": [{"name": "p", "role": "prefill", "replicas": 1},
                                             {"name": "d", "role": "decode", "replicas": 1}],
                                  "decode_router": "random"}}
    _, runs = expand_runs(split, ["cluster.decode_router.refresh_s=0.25"])
    assert runs[0].config["cluster"]["decode_router"] == {"name": "random", "refresh_s": 0.25}
    # any other value stays what it is: a key below it is refused, naming the flag or the
    # file's sweep, the value and the key
    with pytest.raises(ConfigError, match=r"^--set workload.arrival.process.x=1: "
                       r"workload.arrival.process: is not a mapping"):
        expand_runs(SMALL, ["workload.arrival.process.x=1"])
    with pytest.raises(ConfigError, match=r"^exp.yaml: sweep: workload.arrival.process: is "
                       r"not a mapping, cannot set workload.arrival.process.x"):
        expand_runs({**SMALL, "sweep": {"workload.arrival.process.x": [1]}}, source="exp.yaml")
