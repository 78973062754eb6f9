"""Sweeps at scale: expansion order, seed aggregation, crash and Ctrl-C safety, failing runs,
and identical results from the serial, process-pool and Dask executors."""
from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from scipy import stats

import sim.experiments.runner
from sim.api import run_experiment
from sim.experiments.config import ConfigError, expand_runs
from sim.experiments.progress import Progress, format_seconds
from tests.helpers import SMALL_EXPERIMENT as SMALL

REPO = Path(__file__).resolve().parent.parent



def write(tmp_path: Path, **changes) -> Path:
    data = {**SMALL, **changes}
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_cartesian_sweep_times_zip_times_policies_in_documented_order():
    raw = {**SMALL, "policies": [{"name": "continuous"}, {"name": "static", "batch_size": 4}],
           "sweep": {"seed": [0, 1], "workload.arrival.rate": [5, 10]},
           "zip": {"workload.num_requests": [10, 20], "metrics.warmup_s": [0.0, 1.0]}}
    raw.pop("policy")
    _, runs = expand_runs(raw)
    assert len(runs) == 2 * 2 * 2 * 2
    got = [(r.label, r.swept["seed"], r.swept["workload.arrival.rate"],
            r.swept["workload.num_requests"], r.swept["metrics.warmup_s"]) for r in runs]
    want = [(p, s, rate, n, w) for p in ("continuous", "static") for s in (0, 1)
            for rate in (5, 10) for n, w in ((10, 0.0), (20, 1.0))]
    assert got == want
    for r in runs:  # swept values land in the resolved config
        assert r.config["seed"] == r.swept["seed"]
        assert r.config["workload"]["num_requests"] == r.swept["workload.num_requests"]
        assert r.config["metrics"]["warmup_s"] == r.swept["metrics.warmup_s"]
        assert "sweep" not in r.config and "zip" not in r.config


def test_zip_lists_must_have_one_length():
    with pytest.raises(ConfigError, match="zip"):
        expand_runs({**SMALL, "zip": {"seed": [0, 1], "workload.num_requests": [5]}})


def test_seed_sweep_writes_mean_and_ci95(tmp_path):
    exp = write(tmp_path, sweep={"seed": [0, 1, 2], "workload.arrival.rate": [10, 40]})
    summary = run_experiment(exp, out=tmp_path / "out", quiet=True)
    assert len(summary) == 6
    agg = pd.read_csv(tmp_path / "out" / "summary_by_seed.csv")
    assert list(agg["workload.arrival.rate"]) == [10, 40]
    assert {"p99_ttft_ms", "p99_ttft_ms_ci95", "output_throughput_ci95"} <= set(agg.columns)
    assert "seed" not in agg.columns
    for _, row in agg.iterrows():
        vals = summary[summary["workload.arrival.rate"] == row["workload.arrival.rate"]]
        v = vals["p99_ttft_ms"]
        assert row["p99_ttft_ms"] == pytest.approx(v.mean())
        assert row["p99_ttft_ms_ci95"] == pytest.approx(v.sem() * stats.t.ppf(0.975, 2))


# ~1 s of simulation per run: slow enough to interrupt a 6-run sweep between runs. Shortest-
# prompt-first ordering keeps it on the general engine (FCFS runs it in ~0.1 s on the fast
# path, and the sweep would end before the signal lands).
SLOW = {"workload": {**SMALL["workload"], "num_requests": 1200},
        "policy": {**SMALL["policy"], "ordering": "spf"},
        "sweep": {"seed": [0, 1, 2], "workload.arrival.rate": [50, 100]}}


def start_run(exp: Path, out: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # A suite started in the background (``cmd &``) inherits an ignored SIGINT, and Python then
    # never installs its Ctrl-C handler: restore the default so the test does not depend on it.
    return subprocess.Popen([sys.executable, "-m", "sim.cli.main", "run", str(exp), "--out",
                             str(out), *extra], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def wait_for_first_run(proc: subprocess.Popen, out: Path, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while not any((out / "runs").glob("*/summary.json")):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < end, "no run finished in time"
        time.sleep(0.01)


def assert_nothing_corrupt(out: Path, allow_tmp: bool) -> None:
    for path in out.rglob("*"):
        if not path.is_file():
            continue
        if path.name.endswith(".tmp"):
            assert allow_tmp and path.name.startswith("."), path
            continue
        if path.suffix == ".json":
            json.loads(path.read_text())
        elif path.suffix == ".yaml":
            yaml.safe_load(path.read_text())
        elif path.suffix == ".parquet":
            pd.read_parquet(path)
        elif path.suffix == ".csv":
            pd.read_csv(path, comment="#")


def assert_complete(out: Path, n: int) -> None:
    summary = pd.read_csv(out / "summary.csv")
    assert len(summary) == n and summary["run_id"].is_unique
    folders = sorted(p.name for p in (out / "runs").iterdir())
    assert folders == sorted(summary["run_id"])
    for rid in folders:
        assert json.loads((out / "runs" / rid / "summary.json").read_text())["run_id"] == rid


def test_sigkill_mid_sweep_then_rerun_completes_every_run_once(tmp_path):
    exp, out = write(tmp_path, **SLOW), tmp_path / "out"
    proc = start_run(exp, out)
    wait_for_first_run(proc, out)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    finished = list((out / "runs").glob("*/summary.json"))
    assert 1 <= len(finished) < 6, "the kill must land mid-sweep"
    assert_nothing_corrupt(out, allow_tmp=True)
    again = start_run(exp, out, "--quiet")
    _, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    assert not list(out.rglob("*.tmp")), "stale temporary files are cleaned on start"
    assert_nothing_corrupt(out, allow_tmp=False)
    assert_complete(out, 6)


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_ctrl_c_exits_130_with_a_clean_folder(tmp_path, jobs):
    exp, out = write(tmp_path, **SLOW), tmp_path / "out"
    proc = start_run(exp, out, "--jobs", jobs)
    wait_for_first_run(proc, out)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "re-run to resume" in err
    assert_nothing_corrupt(out, allow_tmp=False)
    assert len(list((out / "runs").glob("*/summary.json"))) < 6


def test_a_failing_run_records_error_and_the_sweep_goes_on(tmp_path, monkeypatch):
    real = sim.experiments.runner.simulate_config

    def flaky(config, base_dir, requests=None):
        if config["workload"]["arrival"]["rate"] == 20:
            raise RuntimeError("boom at rate 20")
        return real(config, base_dir, requests)

    exp, out = write(tmp_path, sweep={"workload.arrival.rate": [10, 20, 40]}), tmp_path / "out"
    monkeypatch.setattr(sim.experiments.runner, "simulate_config", flaky)
    summary = run_experiment(exp, out=out, quiet=True)
    assert list(summary["workload.arrival.rate"]) == [10, 40]
    errors = list((out / "runs").glob("*/error.txt"))
    assert len(errors) == 1 and "boom at rate 20" in errors[0].read_text()
    assert not (errors[0].parent / "summary.json").exists()
    monkeypatch.setattr(sim.experiments.runner, "simulate_config", real)
    summary = run_experiment(exp, out=out, quiet=True)  # the resume redoes the failed run
    assert list(summary["workload.arrival.rate"]) == [10, 20, 40]
    assert not list((out / "runs").glob("*/error.txt"))


EXECUTOR_SWEEP = {"sweep": {"seed": [0, 1], "workload.arrival.rate": [10, 40]}}


def test_jobs_2_matches_jobs_1(tmp_path):
    exp = write(tmp_path, **EXECUTOR_SWEEP)
    run_experiment(exp, out=tmp_path / "serial", quiet=True)
    run_experiment(exp, out=tmp_path / "pool", jobs=2, quiet=True)
    serial = (tmp_path / "serial" / "summary.csv").read_text()
    assert (tmp_path / "pool" / "summary.csv").read_text() == serial
    assert (tmp_path / "pool" / "summary_by_seed.csv").read_text() == \
        (tmp_path / "serial" / "summary_by_seed.csv").read_text()


def test_dask_matches_local(tmp_path, monkeypatch):
    pytest.importorskip("dask.distributed")
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # workers import this checkout's sim
    exp = write(tmp_path, **EXECUTOR_SWEEP)
    run_experiment(exp, out=tmp_path / "local", quiet=True)
    run_experiment(exp, out=tmp_path / "dask", executor="dask", quiet=True)
    assert (tmp_path / "dask" / "summary.csv").read_text() == \
        (tmp_path / "local" / "summary.csv").read_text()


def test_progress_bar_on_a_terminal_and_log_lines_otherwise():
    now = [0.0]
    buf = io.StringIO()
    bar = Progress("exp", 4, stream=buf, bar=True, clock=lambda: now[0])
    bar.start()
    now[0] = 10.0
    bar.advance("aaa")
    line = bar.line(100)
    assert len(line) < 100 and "1/4 runs" in line and "ETA 30s" in line and "[" in line
    assert len(bar.line(30)) < 30  # a narrow terminal drops the bar, never wraps
    bar.advance("bbb", error="ValueError: x")
    bar.close()
    text = buf.getvalue()
    assert "\r" in text and "run bbb FAILED: ValueError: x\n" in text and text.endswith("\n")
    assert "1 failed" in bar.line(80)

    buf = io.StringIO()
    log = Progress("exp", 2, stream=buf, bar=None, clock=lambda: now[0])  # StringIO: no tty
    log.start()
    log.advance("aaa")
    assert buf.getvalue().startswith("  [1/2] run aaa ok") and "\r" not in buf.getvalue()
    quiet = Progress("exp", 2, stream=buf, quiet=True)
    quiet.advance("x")
    quiet.message("hidden")
    assert "hidden" not in buf.getvalue()
    assert format_seconds(42) == "42s" and format_seconds(185) == "3m05s"
    assert format_seconds(3720) == "1h02m"


def test_load_key_must_name_a_swept_key(tmp_path):
    """``output.load_key`` that names no swept key (a typo) was ignored by the plots without a
    word; a key the file sweeps stays acceptable after an override made it a single value."""
    from sim.experiments.config import ConfigError, expand_runs
    from tests.helpers import SMALL_EXPERIMENT

    raw = {**SMALL_EXPERIMENT, "sweep": {"workload.arrival.rate": [10, 20]},
           "output": {"load_key": "workload.arrival.rat"}}
    with pytest.raises(ConfigError, match=r"^exp\.yaml: output\.load_key: "
                       r"'workload\.arrival\.rat' is not a swept key; swept: "
                       r"workload\.arrival\.rate$"):
        expand_runs(raw, source="exp.yaml")
    raw["output"]["load_key"] = "workload.arrival.rate"
    assert len(expand_runs(raw, source="exp.yaml")[1]) == 2
    assert len(expand_runs(raw, ["workload.arrival.rate=5"], source="exp.yaml")[1]) == 1
