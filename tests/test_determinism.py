"""Determinism and clean endings: the same seed gives the same results everywhere, recorded.

Determinism: one experiment (a two-point sweep of a small synthetic workload) run

- twice in one process, in a fresh ``python -m sim.cli.main run`` process, with ``--jobs 1`` and
  ``--jobs 2`` (a process pool), and on a local Dask cluster (two worker processes; skipped
  when ``dask.distributed`` is missing)

must give the same ``summary.csv`` byte for byte and, run folder by run folder, equal
``requests`` and ``steps`` tables (every column, exact floats) and the same ``summary.json``
apart from the ``wall_s`` timing. A run's results do not depend on the other runs of its
sweep. Every result records what made it: ``summary.csv`` has ``seed`` and
``batchsim_version``; the Parquet tables carry ``batchsim.version``, ``batchsim.config_hash``
(the run folder's name) and ``batchsim.seed`` in their schema metadata. Different seeds draw
different workloads.

Clean endings (the liveness checks that exist today; a request that can never be served is
rejected with its reason — see ``test_engine_exact.py``): ``limits.horizon_s`` stops simulated
time, and requests not finished by then are counted in ``num_unfinished``. What the issue
asks for and the code lacks yet is pinned by strict xfails: partial results marked as such,
metrics of a partial run that stay within their ranges, and a wall-clock budget
(``limits.wall_clock_s``, a proposed key).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

import sim
from sim.cli.main import main
from sim.experiments.config import expand_runs
from sim.experiments.results import read_json, read_table
from sim.experiments.runner import build_requests

REPO = Path(__file__).resolve().parent.parent

EXPERIMENT = """\
name: determinism
seed: 7
cost: {kind: linear, base_s: 0.004, per_token_s: 2.0e-5}
kv: {num_blocks: 120, block_size: 16}
workload:
  arrival: {process: gamma, rate: 30, cv: 2.0}
  num_requests: 60
  prompt_tokens: {dist: lognormal, median: 60, sigma: 0.9, max: 600}
  output_tokens: {dist: exponential, mean: 12, max: 80}
policy: {name: chunked_prefill, token_budget: 128, max_num_seqs: 8}
sweep:
  workload.arrival.rate: [20, 60]
output: {plots: false}
"""

#: summary.json entries that measure the machine, not the simulation.
VOLATILE = {"wall_s"}


def write_experiment(folder: Path, text: str = EXPERIMENT) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "exp.yaml"
    path.write_text(text)
    return path


def run(exp: Path, out: Path, *extra: str) -> Path:
    assert main(["run", str(exp), "--out", str(out), "--quiet", *extra]) == 0
    return out


def assert_same_results(a: Path, b: Path) -> None:
    """Two output folders hold identical results: summary.csv, and every run's tables."""
    assert (a / "summary.csv").read_text() == (b / "summary.csv").read_text()
    runs_a = sorted(p.name for p in (a / "runs").iterdir())
    runs_b = sorted(p.name for p in (b / "runs").iterdir())
    assert runs_a == runs_b and runs_a
    for rid in runs_a:
        for table in ("requests", "steps"):
            pd.testing.assert_frame_equal(read_table(a / "runs" / rid / table),
                                          read_table(b / "runs" / rid / table),
                                          check_exact=True)
        sa, sb = (read_json(x / "runs" / rid / "summary.json") for x in (a, b))
        assert {k: v for k, v in sa.items() if k not in VOLATILE} == \
            {k: v for k, v in sb.items() if k not in VOLATILE}
        assert (a / "runs" / rid / "config.yaml").read_text() == \
            (b / "runs" / rid / "config.yaml").read_text()


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The experiment run once, serially, in this process."""
    folder = tmp_path_factory.mktemp("reference")
    return run(write_experiment(folder), folder / "out")


# -- the same seed, the same results -----------------------------------------------------------

def test_the_reference_runs_are_nontrivial(reference):
    summary = pd.read_csv(reference / "summary.csv")
    assert list(summary["workload.arrival.rate"]) == [20, 60]
    assert (summary["completed"] + summary["num_rejected"] == 60).all()
    assert (summary["num_preemptions"] > 0).any() or (summary["max_kv_usage"] > 0.5).any()


def test_rerun_in_the_same_process_is_identical(reference, tmp_path):
    assert_same_results(reference, run(write_experiment(tmp_path), tmp_path / "again"))


def test_a_fresh_process_gives_identical_results(reference, tmp_path):
    exp = write_experiment(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.run([sys.executable, "-m", "sim.cli.main", "run", str(exp), "--out",
                        str(tmp_path / "sub"), "--quiet"], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=120)
    assert p.returncode == 0, p.stderr
    assert_same_results(reference, tmp_path / "sub")


def test_two_jobs_give_the_same_results_as_one(reference, tmp_path):
    assert_same_results(reference, run(write_experiment(tmp_path), tmp_path / "j2",
                                       "--jobs", "2"))


def test_the_dask_executor_gives_the_same_results(reference, tmp_path):
    pytest.importorskip("dask.distributed")
    assert_same_results(reference, run(write_experiment(tmp_path), tmp_path / "dask",
                                       "--executor", "dask"))


def test_a_run_does_not_depend_on_the_rest_of_its_sweep(reference, tmp_path):
    alone = EXPERIMENT.replace("[20, 60]", "[60]")
    out = run(write_experiment(tmp_path, alone), tmp_path / "alone")
    (rid,) = [p.name for p in (out / "runs").iterdir()]
    for table in ("requests", "steps"):
        pd.testing.assert_frame_equal(read_table(out / "runs" / rid / table),
                                      read_table(reference / "runs" / rid / table),
                                      check_exact=True)


# -- what made a result is recorded with it ----------------------------------------------------

def test_summary_records_seed_and_version(reference):
    summary = pd.read_csv(reference / "summary.csv")
    assert (summary["seed"] == 7).all()
    assert (summary["batchsim_version"].astype(str) == sim.__version__).all()


def test_tables_carry_version_config_hash_and_seed(reference):
    for folder in (reference / "runs").iterdir():
        for table in ("requests", "steps"):
            import pyarrow.parquet as pq

            meta = pq.read_schema(folder / f"{table}.parquet").metadata
            assert meta[b"batchsim.version"].decode() == sim.__version__
            assert meta[b"batchsim.config_hash"].decode() == folder.name
            assert meta[b"batchsim.seed"].decode() == "7"


def test_the_resolved_config_reproduces_the_run(reference, tmp_path):
    """A run folder's config.yaml alone is enough to reproduce its tables."""
    folder = sorted((reference / "runs").iterdir())[0]
    cfg = yaml.safe_load((folder / "config.yaml").read_text())
    res = sim.experiments.runner.simulate_config(cfg, base_dir=tmp_path)
    pd.testing.assert_frame_equal(res.requests, read_table(folder / "requests"),
                                  check_exact=True)


# -- different seeds, different workloads --------------------------------------------------------

def _workload(seed: int) -> list[sim.Request]:
    raw = yaml.safe_load(EXPERIMENT)
    raw["seed"] = seed
    _, runs = expand_runs(raw)
    return build_requests(runs[0].config, base_dir=None)


def test_same_seed_same_workload_different_seed_different_workload():
    a, b, c = _workload(1), _workload(1), _workload(2)
    assert a == b
    arrivals = [np.array([r.arrival_s for r in w]) for w in (a, c)]
    prompts = [np.array([r.num_prompt_tokens for r in w]) for w in (a, c)]
    assert not np.array_equal(*arrivals) and not np.array_equal(*prompts)


def test_swept_seeds_give_different_runs(tmp_path):
    text = EXPERIMENT.replace("workload.arrival.rate: [20, 60]", "seed: [1, 2]")
    out = run(write_experiment(tmp_path, text), tmp_path / "seeds")
    summary = pd.read_csv(out / "summary.csv")
    assert list(summary["seed"]) == [1, 2]
    a, b = (read_table(out / "runs" / rid / "requests") for rid in summary["run_id"])
    assert not np.array_equal(a["arrival_s"], b["arrival_s"])
    assert summary["mean_ttft_ms"].nunique() == 2


# -- runs end cleanly: the simulated-time horizon and a wall-clock budget -------------------------

HORIZON = """\
name: horizon
seed: 0
cost: {kind: constant, step_s: 0.01}
kv: {unlimited: true}
workload:
  arrival: {process: constant, rate: 50}
  num_requests: 10
  prompt_tokens: {dist: fixed, value: 4}
  output_tokens: {dist: fixed, value: 3}
policy: {name: continuous, max_num_seqs: 1}
limits: {horizon_s: 0.1}
output: {plots: false}
"""


def horizon_run(tmp_path: Path, text: str = HORIZON) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    """Run ``text``; return its summary.json, requests and steps tables."""
    out = run(write_experiment(tmp_path, text), tmp_path / "out")
    (folder,) = (out / "runs").iterdir()
    return (read_json(folder / "summary.json"), read_table(folder / "requests"),
            read_table(folder / "steps"))


def test_horizon_stops_simulated_time_and_counts_the_unfinished(tmp_path):
    # Arrivals every 20 ms, one request at a time, 30 ms each: requests 0, 1, 2 finish at
    # 30, 60, 90 ms; request 3 starts at 90 ms and has its first token at 100 ms when the
    # horizon stops the clock; 4..9 are still waiting (5..9 arrive at or after the horizon).
    summary, reqs, steps = horizon_run(tmp_path)
    assert summary["completed"] == 3
    assert summary["num_unfinished"] == 7 and summary["num_rejected"] == 0
    assert list(reqs["status"]) == ["finished"] * 3 + ["running"] + ["waiting"] * 6
    assert np.allclose(reqs["finish_s"][:3], [0.03, 0.06, 0.09])
    assert reqs.loc[3, "num_generated"] == 2  # 100 ms lands a hair early in float: one more
    assert (steps["start_s"] < 0.1).all(), "no step starts at or after the horizon"
    assert reqs["first_scheduled_s"][4:].isna().all()


def test_horizon_beyond_the_last_finish_changes_nothing(tmp_path):
    _, full, full_steps = horizon_run(tmp_path / "a", HORIZON.replace("horizon_s: 0.1",
                                                                       "horizon_s: null"))
    summary, reqs, steps = horizon_run(tmp_path / "b", HORIZON.replace("horizon_s: 0.1",
                                                                        "horizon_s: 100"))
    assert summary["num_unfinished"] == 0 and summary["completed"] == 10
    pd.testing.assert_frame_equal(reqs, full, check_exact=True)
    pd.testing.assert_frame_equal(steps, full_steps, check_exact=True)


def test_partial_results_are_marked_as_such(tmp_path):
    summary, _, _ = horizon_run(tmp_path / "cut")
    assert summary["partial"] is True
    table = pd.read_csv(tmp_path / "cut" / "out" / "summary.csv")
    assert bool(table.loc[0, "partial"]) is True
    whole, _, _ = horizon_run(tmp_path / "whole", HORIZON.replace("horizon_s: 0.1",
                                                                   "horizon_s: 100"))
    assert whole["partial"] is False


def test_metrics_of_a_partial_run_stay_in_range(tmp_path):
    summary, _, _ = horizon_run(tmp_path)
    assert 0 <= summary["busy_fraction"] <= 1


def test_wall_clock_budget_ends_a_long_run_cleanly(tmp_path):
    # 6M steps: seconds even compiled (a warm kernel does 200k three-token requests inside the
    # budget); a cold one spends the budget loading and stops at its first clock check, after
    # 64 steps: two requests done
    long_run = HORIZON.replace("num_requests: 10", "num_requests: 200000").replace(
        "limits: {horizon_s: 0.1}", "limits: {wall_clock_s: 0.5}").replace(
        "output_tokens: {dist: fixed, value: 3}", "output_tokens: {dist: fixed, value: 30}")
    t0 = time.perf_counter()
    summary, reqs, _ = horizon_run(tmp_path, long_run)
    assert time.perf_counter() - t0 < 10
    assert summary["partial"] is True
    assert 0 < summary["completed"] < 200_000
    assert summary["completed"] + summary["num_unfinished"] == 200_000 == len(reqs)
