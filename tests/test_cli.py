"""The command line end to end: a tiny experiment runs, resumes, and bad input exits with 2."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from sim.cli.main import main
from tests.helpers import tiny_experiment

REPO = Path(__file__).resolve().parent.parent

TINY = tiny_experiment()


def write(tmp_path: Path, text: str, name: str = "exp.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "sim.cli.main", *args], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=120)


def test_run_writes_summary_tables_and_config(tmp_path):
    exp = write(tmp_path, TINY)
    out = tmp_path / "out"
    assert main(["run", str(exp), "--out", str(out), "--quiet"]) == 0
    summary = pd.read_csv(out / "summary.csv")
    assert list(summary["workload.arrival.rate"]) == [10, 40]
    assert (summary["completed"] == 40).all()
    for rid in summary["run_id"]:
        folder = out / "runs" / rid
        assert (folder / "config.yaml").exists() and (folder / "summary.json").exists()
        assert any(folder.glob("requests.*")) and any(folder.glob("steps.*"))


def test_rerun_resumes_and_redoes_only_unfinished(tmp_path):
    exp = write(tmp_path, TINY)
    out = tmp_path / "out"
    assert main(["run", str(exp), "--out", str(out), "--quiet"]) == 0
    first = (out / "summary.csv").read_text()
    victim = sorted((out / "runs").iterdir())[0]
    (victim / "summary.json").unlink()  # as if killed before the run finished
    stamp = {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*/summary.json")}
    assert main(["run", str(exp), "--out", str(out), "--quiet"]) == 0
    assert (victim / "summary.json").exists()
    for p, t in stamp.items():
        assert p.stat().st_mtime_ns == t, "finished runs must not be redone"
    assert (out / "summary.csv").read_text() == first


def test_set_override_changes_the_run(tmp_path):
    exp = write(tmp_path, TINY)
    out = tmp_path / "out"
    assert main(["run", str(exp), "--out", str(out), "--quiet",
                 "--set", "workload.num_requests=7"]) == 0
    assert (pd.read_csv(out / "summary.csv")["completed"] == 7).all()


def test_same_seed_gives_identical_outputs(tmp_path):
    exp = write(tmp_path, TINY)
    for name in ("a", "b"):
        assert main(["run", str(exp), "--out", str(tmp_path / name), "--quiet"]) == 0
    assert (tmp_path / "a/summary.csv").read_text() == (tmp_path / "b/summary.csv").read_text()


def test_console_entry_points_answer_help():
    for args in (["--help"], ["run", "--help"], ["profiles"], ["schema"]):
        p = run_cli(*args)
        assert p.returncode == 0, p.stderr


def test_trace_stats_of_builtin_trace():
    p = run_cli("trace-stats", "azure-conv")
    assert p.returncode == 0 and "19,366" in p.stdout


# Each entry: a config mutation and a fragment the one-line error must contain.
BAD_CONFIGS = [
    ("nme: x\n" + TINY, "did you mean 'name'"),
    (TINY.replace("seed: 1", "seed: -1"), "seed"),
    (TINY.replace("seed: 1", "seed: one"), "seed"),
    (TINY.replace("[10, 40]", "[10, -3]"), "workload.arrival.rate"),
    (TINY.replace("name: continuous", "name: contiuous"), "did you mean 'continuous'"),
    (TINY.replace("max_num_seqs: 8", "max_num_seqs: 0"), "max_num_seqs"),
    (TINY.replace("max_num_seqs: 8", "max_num_sequences: 8"), "max_num_sequences"),
    (TINY.replace("step_s: 0.01", "step_s: 0"), "cost.step_s"),
    (TINY.replace("kind: constant", "kind: quantum"), "cost.kind"),
    (TINY.replace("num_blocks: 400", "num_blocks: many"), "kv.num_blocks"),
    (TINY.replace("block_size: 16", "block_size: 0"), "kv.block_size"),
    (TINY.replace("[10, 40]", "10"), "sweep.workload.arrival.rate"),
    (TINY.replace("workload.arrival.rate", "workload.arival.rate"), "workload"),
    (TINY.replace("dist: uniform, lo: 10", "dist: unicorn, lo: 10"), "workload.prompt_tokens"),
    (TINY.replace("cost: {kind: constant, step_s: 0.01}", "model: llama-9-1t"), "llama-9-1t"),
    (TINY.replace("cost: {kind: constant, step_s: 0.01}", "hardware: tpu-v9"), "tpu-v9"),
    ("- just\n- a list\n", "mapping"),
    ("name: [unclosed\n", "invalid YAML"),
    (TINY.replace("workload:\n", "workloads:\n"), "workloads"),
    ("name: x\n", "workload"),
    (TINY.replace("parallelism", "x") + "parallelism: {tp: 0}\n", "parallelism.tp"),
    (TINY.replace("output: {plots: false}", "output: {plots: maybe}"), "output.plots"),
    (TINY.replace("metrics", "m") + "metrics: {warmup_s: -1}\n", "metrics.warmup_s"),
    (TINY.replace("kv: {num_blocks: 400, block_size: 16}",
                  "kv: {num_blocks: 400, allocator: slab}"), "reserve_tokens"),
    # YAML's words, not Python's: null and mapping (they read NoneType and dict)
    (TINY.replace("seed: 1", "seed: null"), "seed: expected int, got null"),
    (TINY.replace("kv: {num_blocks: 400, block_size: 16}", "kv: null"),
     "kv: expected a mapping, got null"),
    (TINY.replace("name: tiny", "name: tiny\ncluster: [a]"),
     "cluster: expected mapping or null, got list ['a']"),
]


@pytest.mark.parametrize("text,fragment", BAD_CONFIGS)
def test_bad_config_is_one_line_and_exit_2(tmp_path, capsys, text, fragment):
    exp = write(tmp_path, text)
    code = main(["run", str(exp), "--out", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    assert err.count("\n") == 1, err
    assert fragment in err, err


BAD_TRACES = [
    ("arrival_s,num_prompt_tokens,num_output_tokens\n0,10,5\n1,abc,5\n", "row 2"),
    ("arrival_s,num_prompt_tokens,num_output_tokens\n0,10,5\n1,-4,5\n", "row 2"),
    ("arrival_s,num_prompt_tokens,num_output_tokens\n0,10,5\n1,4,0\n", "row 2"),
    ("arrival_s,num_prompt_tokens,num_output_tokens\n", "no data rows"),
    ("", "empty"),
    ("time,prompt,out\n0,1,1\n", "column"),
    ("arrival_s,num_prompt_tokens,num_output_tokens\n5,10,5\n1,10,5\n", "sort"),
    ("arrival_s,num_prompt_tokens,num_output_tokens\nnan,10,5\n", "row 1"),
]


@pytest.mark.parametrize("trace,fragment", BAD_TRACES)
def test_bad_trace_is_one_line_and_exit_2(tmp_path, capsys, trace, fragment):
    (tmp_path / "t.csv").write_text(trace)
    exp = write(tmp_path, TINY.split("workload:")[0] + "workload: {trace: t.csv}\n"
                "policy: {name: continuous}\n")
    code = main(["run", str(exp), "--out", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "t.csv" in err and fragment.lower() in err.lower(), err


def test_missing_config_file_exits_2():
    p = run_cli("run", "/nonexistent.yaml")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "/nonexistent.yaml" in p.stderr


def test_builtin_names_resolve_from_any_directory(tmp_path):
    code = ("import sim; c = sim.build_cost_model(model='llama-3-8b', hardware='h100-sxm');"
            "from sim.workload.traces import load_trace_arrays;"
            "print(len(load_trace_arrays('azure-conv')))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "19366"


def test_a_run_that_rejects_requests_says_so_naming_run_count_and_reason(tmp_path, capsys):
    """A cache too small for any request (every request rejected, NaN latencies) used to finish
    with exit code 0 and not a word: now one line names the run, how many and why."""
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(TINY.replace("num_blocks: 400", "num_blocks: 1"))
    assert main(["run", str(cfg), "--out", str(tmp_path / "o"),
                 "--set", "sweep=null"]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "rejected" in line]
    assert len(notes) == 1 and notes[0].startswith(
        "batchsim: requests rejected (they can never run on this deployment; every reason in "
        "runs/<id>/requests, column reason): continuous ("), notes
    assert "): 40 of 40 (needs " in notes[0] and "the cache has 1)" in notes[0], notes
    assert main(["run", str(cfg), "--out", str(tmp_path / "o2"), "--set", "sweep=null",
                 "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_profiles_kv_flags_need_a_deployment_and_share_the_kv_defaults(capsys):
    """``batchsim profiles --tp 2`` (no --model/--hardware) silently ignored the flag; and the
    capacity report's defaults are the ``kv`` block's, not a second copy of them."""
    from sim.kv.capacity import describe_capacity
    from sim.kv.config import KV_FIELDS

    for flag, value in (("--tp", "2"), ("--block-size", "0"),
                        ("--gpu-memory-utilization", "0.5")):
        assert main(["profiles", "--hardware", "h100-sxm", flag, value]) == 2
        assert capsys.readouterr().err == (f"batchsim: error: {flag}: sizes the KV capacity of "
                                           "a deployment: give --model and --hardware too\n")
    assert main(["profiles", "--model", "llama-3-8b", "--hardware", "h100-sxm"]) == 0
    assert capsys.readouterr().out.strip() == describe_capacity(
        "llama-3-8b", "h100-sxm", 1, KV_FIELDS["block_size"].default,
        KV_FIELDS["gpu_memory_utilization"].default).strip()


def test_a_resume_flag_says_that_re_running_resumes(capsys):
    """There is no ``--resume``: the error says what to do instead."""
    with pytest.raises(SystemExit) as stop:
        main(["run", "experiments/quickstart.yaml", "--resume"])
    assert stop.value.code == 2
    assert capsys.readouterr().err == (
        "batchsim: error: unrecognized arguments: --resume; re-running the same command "
        "resumes (finished runs are skipped) (see 'batchsim --help')\n")
