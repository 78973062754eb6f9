"""Adversarial suite, fault cases: the output folder, resume, executors and config files.

Each case is a reproduction of a defect found by an adversarial audit, run as the user would
(CLI exit code and stderr, or the Python API's exception), plus the fault injections that stand
in for a hostile machine: a full disk or too many open files (an injected ``OSError``), no
memory, a pool worker killed mid-run, a second command on the same folder, a kill and resume,
damaged result files. Every case takes seconds.
"""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import sim
import sim.experiments.runner as runner
from sim.api import run_experiment
from sim.cli.main import main
from sim.core.errors import EnvironmentFailure, InputError
from sim.experiments.config import MAX_RUNS, ConfigError, expand_runs, load_yaml
from sim.experiments.outdir import LOCK_NAME, OutputFolderError, OutputLock, finished_summary
from tests.helpers import SMALL_EXPERIMENT as SMALL

REPO = Path(__file__).resolve().parent.parent
SWEEP3 = {"sweep": {"workload.arrival.rate": [10, 20, 40]}}


def write_exp(folder: Path, text: str | None = None, **changes) -> Path:
    path = folder / "exp.yaml"
    path.write_text(text if text is not None else
                    yaml.safe_dump({**SMALL, **changes}, sort_keys=False))
    return path


def cli(capsys, *argv: str) -> tuple[int, str]:
    """Run ``batchsim`` in-process; return (exit code, stderr), stderr asserted one line."""
    rc = main(list(argv))
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err, err
    return rc, err


def finished(out: Path) -> list[str]:
    return sorted(p.parent.name for p in (out / "runs").glob("*/summary.json"))


# --- output folder (#8, #11) --------------------------------------------------------------

@pytest.mark.parametrize("name", ["../../escaped", "ABSOLUTE", "", "  ", "..", "a/b",
                                  "x" * 300])
def test_experiment_names_cannot_escape_runs(tmp_path, monkeypatch, capsys, name):
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    absolute = tmp_path / "abs-escape"
    exp = write_exp(tmp_path, name=str(absolute) if name == "ABSOLUTE" else name)
    rc, err = cli(capsys, "run", str(exp), "--quiet")
    assert rc == 2 and err.count("\n") == 1 and "name" in err, err
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["cwd", "exp.yaml"]  # no writes


def test_a_valid_name_and_an_absolute_out_still_work(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exp = write_exp(tmp_path, name="my exp-1")
    assert len(run_experiment(exp, quiet=True)) == 1
    assert (tmp_path / "runs" / "my exp-1" / "summary.csv").is_file()
    # --out may be anything, even with a name that could not be a folder
    weird = write_exp(tmp_path, name="../../x")
    assert len(run_experiment(weird, out=tmp_path / "o", quiet=True)) == 1


def _out_cases(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "afile").write_text("mine")
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    return {"existing file": str(tmp_path / "afile"), "/dev/null": "/dev/null",
            "file as parent": str(tmp_path / "afile" / "sub"),
            "300-char name": str(tmp_path / ("n" * 300)), "symlink loop": str(loop / "x")}


def test_unusable_out_folders_exit_2_with_one_line(tmp_path, capsys):
    exp = write_exp(tmp_path)
    for what, out in _out_cases(tmp_path).items():
        rc, err = cli(capsys, "run", str(exp), "--out", out, "--quiet")
        assert rc == 2 and err.count("\n") == 1 and "--out" in err, (what, err)
    assert (tmp_path / "afile").read_text() == "mine"


def test_read_only_out_folder_exits_2(tmp_path, capsys, monkeypatch):
    exp = write_exp(tmp_path)
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() != 0:  # root writes anyway; inject the refusal the kernel would give
        ro.chmod(0o500)
    else:
        monkeypatch.setattr(os, "access", lambda *a, **k: False)
    try:
        rc, err = cli(capsys, "run", str(exp), "--out", str(ro / "x"), "--quiet")
    finally:
        ro.chmod(0o700)
    assert rc == 2 and "permission denied" in err.lower(), err


# --- Dask and relative paths (#1) ---------------------------------------------------------

def test_out_is_absolute_before_any_run_is_shipped(tmp_path, monkeypatch):
    """A worker with another working directory writes where the client reads."""
    import sim.experiments.dask_executor as dx

    shipped: list[str] = []

    def elsewhere(args, address):
        here = os.getcwd()
        os.chdir(tmp_path / "worker_cwd")
        try:
            for a in args:
                shipped.append(a[2])
                yield Path(a[2]).name, runner.execute_run(*a)
        finally:
            os.chdir(here)

    (tmp_path / "worker_cwd").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(dx, "run_on_dask", elsewhere)
    summary = run_experiment(write_exp(tmp_path, **SWEEP3), out="rel_out", executor="dask",
                             quiet=True)
    assert len(summary) == 3 and all(Path(p).is_absolute() for p in shipped)
    assert len(finished(tmp_path / "rel_out")) == 3
    assert not (tmp_path / "worker_cwd" / "rel_out").exists()


def test_a_worker_whose_files_do_not_arrive_fails_the_run_loudly(tmp_path, monkeypatch,
                                                                 capsys):
    import sim.experiments.dask_executor as dx

    def lost(args, address):  # a worker on another machine without the shared folder
        for a in args:
            yield Path(a[2]).name, {"completed": 30}

    monkeypatch.setattr(dx, "run_on_dask", lost)
    rc, err = cli(capsys, "run", str(write_exp(tmp_path)), "--out", str(tmp_path / "o"),
                  "--executor", "dask", "--quiet")
    assert rc == 1 and err.count("\n") == 1 and "shared filesystem" in err, err


def test_real_dask_cluster_with_another_cwd_and_a_relative_out(tmp_path, monkeypatch):
    pytest.importorskip("dask.distributed")
    from dask.distributed import LocalCluster

    monkeypatch.setenv("PYTHONPATH", str(REPO))
    (tmp_path / "cluster_cwd").mkdir()
    (tmp_path / "client_cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cluster_cwd")
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster:
        monkeypatch.chdir(tmp_path / "client_cwd")
        summary = run_experiment(write_exp(tmp_path, **SWEEP3), out="rel_out",
                                 executor="dask", address=cluster.scheduler_address,
                                 quiet=True)
    assert len(summary) == 3
    assert len(finished(tmp_path / "client_cwd" / "rel_out")) == 3
    assert not (tmp_path / "cluster_cwd" / "rel_out").exists()


@pytest.mark.parametrize("address, rc, words", [
    ("nonsense", 2, "not a Dask scheduler address"),
    ("foo://x:1", 2, "not a Dask scheduler address"),
    ("tcp://127.0.0.1:1", 1, "cannot reach the Dask scheduler"),
])
def test_bad_dask_addresses_say_what_happened(tmp_path, monkeypatch, capsys, address, rc,
                                              words):
    pytest.importorskip("dask.distributed")
    import sim.experiments.dask_executor as dx

    monkeypatch.setattr(dx, "CONNECT_TIMEOUT_S", 1)
    got, err = cli(capsys, "run", str(write_exp(tmp_path)), "--out", str(tmp_path / "o"),
                   "--executor", "dask", "--address", address, "--quiet")
    assert got == rc and words in err and err.count("\n") == 1, err


# --- resume: stale inputs (#6) and damaged runs (#26) --------------------------------------

TRACE = "arrival_s,num_prompt_tokens,num_output_tokens\n0,10,3\n0.1,20,4\n0.2,30,5\n"


def test_editing_the_trace_file_makes_a_new_run(tmp_path):
    (tmp_path / "t.csv").write_text(TRACE)
    exp = write_exp(tmp_path, workload={"trace": "t.csv"})
    first = run_experiment(exp, out=tmp_path / "o", quiet=True)
    again = run_experiment(exp, out=tmp_path / "o", quiet=True)
    assert list(again["run_id"]) == list(first["run_id"])  # unchanged file: resumed
    (tmp_path / "t.csv").write_text(TRACE + "0.3,40,6\n")
    changed = run_experiment(exp, out=tmp_path / "o", quiet=True)
    assert changed["run_id"][0] != first["run_id"][0]
    assert int(changed["completed"][0]) == 4 and int(first["completed"][0]) == 3
    cfg = yaml.safe_load((tmp_path / "o" / "runs" / changed["run_id"][0] / "config.yaml")
                         .read_text())
    assert set(cfg["inputs"]) == {"workload.trace"}
    assert main(["plot", str(tmp_path / "o")]) == 0  # the redrawn report knows the run ids
    assert "- runs: 1 finished of 1" in (tmp_path / "o" / "report.md").read_text()


def test_editing_a_custom_profile_file_makes_a_new_run(tmp_path):
    from sim.cost.profiles import builtin_files

    gpu = yaml.safe_load(builtin_files("gpus")["h100-sxm"].read_text())
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(gpu))
    exp = write_exp(tmp_path, cost={"kind": "roofline"}, hardware=str(tmp_path / "g.yaml"),
                    kv={"num_blocks": 400, "block_size": 16})
    first = run_experiment(exp, out=tmp_path / "o", quiet=True)
    gpu["hbm_tbps"] = gpu["hbm_tbps"] / 2
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(gpu))
    second = run_experiment(exp, out=tmp_path / "o", quiet=True)
    assert second["run_id"][0] != first["run_id"][0]
    assert second["p99_tpot_ms"][0] > first["p99_tpot_ms"][0]


def test_run_ids_without_input_files_are_unchanged():
    _, runs = expand_runs(dict(SMALL))
    assert runner.pin_inputs(runs[0].config, REPO) is runs[0].config


@pytest.mark.parametrize("damage", ["empty summary", "garbage summary", "empty requests",
                                    "truncated steps", "no itl", "summary of another run"])
def test_damaged_finished_runs_are_redone(tmp_path, damage):
    exp, out = write_exp(tmp_path, **SWEEP3), tmp_path / "o"
    run_experiment(exp, out=out, quiet=True)
    victim = out / "runs" / finished(out)[1]
    if damage == "empty summary":
        (victim / "summary.json").write_bytes(b"")
    elif damage == "garbage summary":
        (victim / "summary.json").write_text("{not json")
    elif damage == "empty requests":
        (victim / "requests.parquet").write_bytes(b"")
    elif damage == "truncated steps":
        data = (victim / "steps.parquet").read_bytes()
        (victim / "steps.parquet").write_bytes(data[: len(data) // 2])
    elif damage == "no itl":
        (victim / "itl_irregular.npy").unlink()
    else:
        s = json.loads((victim / "summary.json").read_text())
        (victim / "summary.json").write_text(json.dumps({**s, "run_id": "0" * 12}))
    assert finished_summary(victim) is None
    summary = run_experiment(exp, out=out, quiet=True)
    assert len(summary) == 3 and finished_summary(victim) is not None


def test_trace_export_of_a_truncated_steps_file_is_one_line(tmp_path, capsys):
    out = tmp_path / "o"
    run_experiment(write_exp(tmp_path), out=out, quiet=True)
    run = out / "runs" / finished(out)[0]
    data = (run / "steps.parquet").read_bytes()
    (run / "steps.parquet").write_bytes(data[:-20])
    rc, err = cli(capsys, "trace", str(run))
    assert rc == 2 and err.count("\n") == 1 and "re-run" in err, err
    from sim.experiments.results import ResultFileError, read_table
    (run / "requests.parquet").write_bytes(b"PAR1" + b"\0" * 40 + b"PAR1")
    with pytest.raises(ResultFileError, match="requests.parquet"):
        read_table(run / "requests")


# --- kill and resume, concurrent writers (#20) ---------------------------------------------

SLOW = {"workload": {**SMALL["workload"], "num_requests": 3000},
        "sweep": {"workload.arrival.rate": [5, 10, 20, 40, 80, 160]}}


def start_run(exp: Path, out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "sim.cli.main", "run", str(exp), "--out",
                             str(out), *extra], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_a_second_command_on_the_same_out_is_refused_then_resume_works(tmp_path, capsys):
    exp, out = write_exp(tmp_path, **SLOW), tmp_path / "o"
    first = start_run(exp, out)
    try:
        deadline = time.monotonic() + 60
        while not list((out / "runs").glob("*/config.yaml")):  # the first run is writing
            assert first.poll() is None and time.monotonic() < deadline, first.stderr
            time.sleep(0.05)
        rc, err = cli(capsys, "run", str(exp), "--out", str(out), "--quiet")
        assert rc == 2 and "another batchsim command" in err and str(first.pid) in err, err
        rc, err = cli(capsys, "plot", str(out))
        assert rc == 2 and "another batchsim command" in err, err
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=30)
    # the lock died with its process: a re-run resumes and completes every run once
    summary = run_experiment(exp, out=out, quiet=True)
    assert len(summary) == 6 and summary["run_id"].is_unique
    assert not [p for p in out.rglob("*.tmp")]


def test_the_lock_is_per_folder_and_released(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    with OutputLock(a), OutputLock(b):
        assert (a / LOCK_NAME).read_text().strip() == str(os.getpid())
        with pytest.raises(OutputFolderError, match="another batchsim command"):
            OutputLock(a).__enter__()
    with OutputLock(a):
        pass


# --- pool worker death (#16) ---------------------------------------------------------------

def _kill_at_rate_20(marker: Path | None):
    real = runner.simulate_config

    def dying(config, base_dir, requests=None):
        if config["workload"]["arrival"]["rate"] == 20 and (marker is None or
                                                              not marker.exists()):
            if marker is not None:
                marker.write_text("died once")
            os.kill(os.getpid(), signal.SIGKILL)  # what the OOM killer does
        return real(config, base_dir, requests)
    return dying


def test_a_worker_killed_every_time_records_error_and_the_sweep_goes_on(tmp_path,
                                                                       monkeypatch):
    monkeypatch.setattr(runner, "simulate_config", _kill_at_rate_20(None))
    exp, out = write_exp(tmp_path, sweep={"workload.arrival.rate": [10, 20, 40, 80]}), \
        tmp_path / "o"
    summary = run_experiment(exp, out=out, jobs=2, quiet=True)
    assert sorted(summary["workload.arrival.rate"]) == [10, 40, 80]
    errors = list((out / "runs").glob("*/error.txt"))
    assert len(errors) == 1
    text = errors[0].read_text()
    # the exit status is named when the pool still holds the dead process (not guaranteed:
    # the pool's manager thread may have reaped it first)
    assert text.startswith("WorkerDied:") and ("signal 9 (SIGKILL)" in text
                                               or "ended abruptly" in text), text
    assert summary.attrs["errors"] and "WorkerDied" in summary.attrs["errors"][0]


def test_a_worker_killed_once_is_retried_and_every_run_finishes(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "simulate_config", _kill_at_rate_20(tmp_path / "marker"))
    exp, out = write_exp(tmp_path, sweep={"workload.arrival.rate": [10, 20, 40, 80]}), \
        tmp_path / "o"
    summary = run_experiment(exp, out=out, jobs=2, quiet=True)
    assert (tmp_path / "marker").exists() and len(summary) == 4
    assert not list((out / "runs").glob("*/error.txt"))


# --- the machine fails (#21) ---------------------------------------------------------------

@pytest.mark.parametrize("exc, words", [
    (OSError(errno.ENOSPC, "No space left on device", "x.parquet"), "no space left on device"),
    (OSError(errno.EMFILE, "Too many open files"), "ulimit -n"),
    (OSError(errno.EFBIG, "File too large"), "ulimit -f"),
    (MemoryError(), "out of memory"),
])
@pytest.mark.parametrize("jobs", ["1", "2"])
def test_environment_failures_are_one_line_exit_1(tmp_path, monkeypatch, capsys, exc, words,
                                                  jobs):
    real = runner.write_table

    def failing(stem, df, meta):
        if "requests" in stem.name:
            raise exc
        return real(stem, df, meta)

    def failing_sim(config, base_dir, requests=None):
        raise exc

    monkeypatch.setattr(runner, "simulate_config" if isinstance(exc, MemoryError)
                        else "write_table", failing_sim if isinstance(exc, MemoryError)
                        else failing)
    out = tmp_path / "o"
    rc, err = cli(capsys, "run", str(write_exp(tmp_path, **SWEEP3)), "--out", str(out),
                  "--jobs", jobs, "--quiet")
    assert rc == 1 and words in err and err.count("\n") == 1, err
    assert not [p for p in out.rglob("*.tmp")], "temporaries are removed"
    assert not list((out / "runs").glob("*/summary.json"))


def test_a_full_disk_mid_write_leaves_nothing_half_written(tmp_path, monkeypatch):
    import sim.experiments.results as results

    calls = {"n": 0}
    real_replace = os.replace

    def enospc_on_third(a, b):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_replace(a, b)

    out = tmp_path / "o"
    monkeypatch.setattr(results.os, "replace", enospc_on_third)
    with pytest.raises(OSError):
        run_experiment(write_exp(tmp_path), out=out, quiet=True)
    monkeypatch.setattr(results.os, "replace", real_replace)
    assert not [p for p in out.rglob("*.tmp")] and not finished(out)
    assert len(run_experiment(write_exp(tmp_path), out=out, quiet=True)) == 1


# --- config files (#7, #17, #24, #25) ------------------------------------------------------

BASE = yaml.safe_dump(SMALL, sort_keys=False)


@pytest.mark.parametrize("text, words", [
    (BASE.replace("policy:\n  name: continuous\n  max_num_seqs: 8",
                  "policy: {name: continuous, max_num_seqs: 64, max_num_seqs: 8}"),
     "duplicate key 'max_num_seqs'"),
    (BASE + "seed: 1\nseed: 2\n", "duplicate key 'seed'"),
    (BASE.replace("name: small", "name: sm\0all"), "NUL"),
    (BASE.replace("policy:\n  name: continuous\n  max_num_seqs: 8", "policies: []"),
     "policies: empty list"),
    (BASE + "metrics: {warmup_s: 1.0e+308}\n", "metrics.warmup_s: must be <= 1e+09"),
    (BASE + "metrics: {cooldown_s: 1.0e+6}\n", "metrics.cooldown_s: warmup_s=0 s and "
     "cooldown_s=1e+06 s leave no request to measure"),
])
def test_bad_config_files_are_one_line_exit_2(tmp_path, capsys, text, words):
    exp = write_exp(tmp_path, text)
    rc, err = cli(capsys, "run", str(exp), "--out", str(tmp_path / "o"), "--quiet")
    assert rc == 2 and words in err and err.count("\n") == 1, err
    if "duplicate" in words or "NUL" in words:
        assert "line" in err and "exp.yaml" in err


def test_merge_keys_and_yaml_1_2_numbers_are_accepted(tmp_path):
    text = BASE.replace("cost:\n  kind: constant\n  step_s: 0.01",
                        "defaults: &c {kind: constant, step_s: 1e-2}\ncost:\n  <<: *c")
    text = text.replace("name: small", "name: small")
    raw = load_yaml(write_exp(tmp_path, text))
    assert raw["cost"] == {"kind": "constant", "step_s": 0.01}


def test_non_regular_config_files_are_refused_without_reading(tmp_path, capsys):
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/zero"), tmp_path):
        rc, err = cli(capsys, "run", str(path), "--quiet")
        assert rc == 2 and "not a regular file" in err, err
    big = tmp_path / "big.yaml"
    big.write_text("# x\n" * 2_000_000)
    with pytest.raises(ConfigError, match="larger than"):
        load_yaml(big)


def test_sweep_size_is_capped_before_expansion():
    huge = {**SMALL, "sweep": {"seed": list(range(100)), "workload.arrival.rate":
                               list(range(1, 101)), "kv.num_blocks": list(range(400, 500))}}
    with pytest.raises(ConfigError, match=f"1,000,000 runs.*{MAX_RUNS:,}"):
        expand_runs(huge)


def test_deduplicating_many_identical_runs_is_linear(tmp_path):
    # 2,000 identical points (a swept key that changes nothing): one run, quickly
    exp = write_exp(tmp_path, sweep={"description": ["same"] * 2000})
    summary = run_experiment(exp, out=tmp_path / "o", quiet=True)
    assert len(summary) == 1


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_quiet_hides_warnings(tmp_path, monkeypatch, capsys, jobs):
    import warnings

    real = runner.simulate_config

    def warning(config, base_dir, requests=None):
        warnings.warn("a library complains", RuntimeWarning, stacklevel=1)
        return real(config, base_dir, requests)

    monkeypatch.setattr(runner, "simulate_config", warning)
    exp = write_exp(tmp_path, **SWEEP3)
    assert main(["run", str(exp), "--out", str(tmp_path / "o"), "--quiet", "--jobs", jobs]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == "", captured
    with pytest.warns(RuntimeWarning):  # without --quiet it shows (and main leaves no filter)
        main(["run", str(exp), "--out", str(tmp_path / "p"), "--no-plots"])


def test_api_and_cli_share_the_measurement_window_rule():
    reqs = [sim.Request(id=i, arrival_s=float(i), num_prompt_tokens=10, num_output_tokens=2)
            for i in range(3)]
    with pytest.raises(InputError, match="warmup_s"):
        sim.simulate(reqs, policy="continuous", cost=sim.ConstantCost(step_s=0.01), kv=None,
                     warmup_s=1e308)
    with pytest.raises(InputError, match="warmup_s"):
        sim.simulate(reqs, policy="continuous", cost=sim.ConstantCost(step_s=0.01), kv=None,
                     warmup_s=float("nan"))


def test_environment_failure_is_not_an_input_error():
    assert not issubclass(EnvironmentFailure, ValueError)


def test_capacity_uses_the_same_output_folder_guard(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    exp = write_exp(tmp_path, name="../escaped")
    rc, err = cli(capsys, "capacity", str(exp), "--slo", "ttft_p99_ms=1000", "--quiet")
    assert rc == 2 and "name" in err, err
    rc, err = cli(capsys, "capacity", str(exp), "--slo", "ttft_p99_ms=1000", "--out",
                  "/dev/null", "--quiet")
    assert rc == 2 and "--out" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp.yaml"]
    (tmp_path / "cap").mkdir()
    with OutputLock(tmp_path / "cap"):
        rc, err = cli(capsys, "capacity", str(exp), "--slo", "ttft_p99_ms=1000", "--out",
                      str(tmp_path / "cap"), "--quiet")
    assert rc == 2 and "another batchsim command" in err, err


@pytest.mark.parametrize("jobs", ["0", "-2", "100000"])
@pytest.mark.parametrize("command", ["run", "capacity"])
def test_jobs_outside_one_to_four_per_cpu_exit_2_before_anything_starts(tmp_path, capsys,
                                                                       monkeypatch, command,
                                                                       jobs):
    """``--jobs`` is one rule for run and capacity, and for ``sim.run_experiment``: a whole
    number from 1 to 4 per CPU (``--jobs 100000`` would start that many processes)."""
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    exp = write_exp(tmp_path)
    extra = ["--slo", "ttft_p99_ms=1000"] if command == "capacity" else []
    rc, err = cli(capsys, command, str(exp), *extra, "--jobs", jobs, "--out",
                  str(tmp_path / "o"), "--quiet")
    assert rc == 2 and err == ("batchsim: error: --jobs: must be a whole number from 1 to 8 "
                               f"(4 per CPU of this machine), got {jobs}\n"), err
    assert not (tmp_path / "o").exists()
    for bad in (0, "2", 2.0, True):
        with pytest.raises(InputError, match=r"^--jobs: must be a whole number from 1 to 8"):
            run_experiment(exp, out=tmp_path / "o", jobs=bad)


def test_an_unknown_executor_or_an_address_without_dask_is_refused(tmp_path):
    """From Python too: ``executor="spark"`` would run locally, an ``address`` without dask
    would be ignored."""
    exp = write_exp(tmp_path)
    with pytest.raises(InputError, match=r"^--executor: 'dsak' is not one of local, dask "
                       r"\(did you mean 'dask'\?\)$"):
        run_experiment(exp, out=tmp_path / "o", executor="dsak")
    with pytest.raises(InputError, match=r"^--address: a Dask scheduler address "
                       r"\('tcp://h:8786'\) needs --executor dask$"):
        run_experiment(exp, out=tmp_path / "o", address="tcp://h:8786")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("command", ["run", "capacity"])
def test_a_folder_of_other_files_is_refused_as_out_and_left_untouched(tmp_path, capsys,
                                                                     command):
    """``--out`` at a folder of the user's own files used to overwrite its ``summary.csv``,
    ``report.md`` and ``plots/*.png``; a folder batchsim wrote is still reused (resume)."""
    exp = write_exp(tmp_path)
    mine = tmp_path / "mine"
    (mine / "plots").mkdir(parents=True)
    files = {mine / "report.md": "my notes\n", mine / "summary.csv": "a,b\n",
             mine / "plots" / "latency.png": "png\n"}
    for path, text in files.items():
        path.write_text(text)
    extra = ["--slo", "ttft_p99_ms=1000"] if command == "capacity" else []
    rc, err = cli(capsys, command, str(exp), *extra, "--out", str(mine), "--quiet")
    assert rc == 2 and err == (
        f"batchsim: error: --out {mine}: a folder of other files (plots, report.md, "
        "summary.csv), not a batchsim output folder; batchsim would replace files there "
        "(summary.csv, report.md, plots/...): give a new or empty folder\n"), err
    assert {p: p.read_text() for p in files} == files
    assert sorted(p.name for p in mine.iterdir()) == ["plots", "report.md", "summary.csv"]
    ours = tmp_path / "ours"
    ours.mkdir()  # empty (hidden files aside): fine, and once written it is batchsim's own
    (ours / ".DS_Store").write_text("finder")
    assert cli(capsys, command, str(exp), *extra, "--out", str(ours), "--quiet")[0] == 0
    assert cli(capsys, command, str(exp), *extra, "--out", str(ours), "--quiet")[0] == 0


@pytest.mark.parametrize("path", [None, 5, {"workload": {}}, ""])
def test_an_experiment_argument_that_is_no_path_is_one_config_error(path, tmp_path):
    """``sim.run_experiment(None)`` was a ``TypeError`` from pathlib; capacity the same."""
    from sim.experiments.capacity import run_capacity

    with pytest.raises(ConfigError, match=r"^config: expected the path of an experiment YAML "
                       r"file, got "):
        run_experiment(path, out=tmp_path / "o")
    with pytest.raises(ConfigError, match=r"^config: expected the path"):
        run_capacity(path, slo="ttft_p99_ms=100", out=tmp_path / "o")


@pytest.mark.parametrize(("kwargs", "field"), [({"plots": "no"}, "plots"),
                                               ({"quiet": 1}, "quiet")])
def test_run_experiment_flags_are_booleans(tmp_path, kwargs, field):
    """``plots="no"`` drew the plots (a non-empty string is true)."""
    with pytest.raises(InputError, match=rf"^{field}: expected true or false, got "):
        run_experiment(write_exp(tmp_path), out=tmp_path / "o", **kwargs)
    assert not (tmp_path / "o").exists()
