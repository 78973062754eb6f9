"""The per-replica load figure: exact time means from the requests table, drawn only for
multi-replica runs, in the PNG plots, report.md and report.html, with bucketed step tables."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from sim.api import run_experiment
from sim.report.replica_load import outstanding

EXPERIMENT = {
    "name": "fleet",
    "cost": {"kind": "constant", "step_s": 0.01},
    "kv": {"unlimited": True},
    "parallelism": {"replicas": 3},
    "workload": {"arrival": {"process": "poisson", "rate": 40.0}, "num_requests": 60,
                 "prompt_tokens": {"dist": "uniform", "lo": 10, "hi": 100},
                 "output_tokens": {"dist": "uniform", "lo": 5, "hi": 50}},
    "policy": {"name": "continuous"},
    "metrics": {"step_table": "buckets"},
    "sweep": {"router.name": ["round_robin", "least_outstanding_requests"]},
}


def test_outstanding_is_the_exact_time_mean_per_bucket():
    requests = pd.DataFrame({
        "replica": [0, 0, 1, 1, 1],
        "arrival_s": [0.0, 1.0, 0.0, 1.0, 2.0],
        "finish_s": [2.0, 3.0, 4.0, np.nan, np.nan],
        "status": ["finished", "finished", "finished", "rejected", "running"]})
    t, load = outstanding(requests, buckets=8)
    assert t.tolist() == [0.5 * i for i in range(8)]
    # replica 0: one request on [0, 2], another on [1, 3]
    assert load[0].tolist() == [1, 1, 2, 2, 1, 1, 0, 0]
    # replica 1: one on [0, 4]; the rejected one leaves at once; the unfinished one stays
    assert load[1].tolist() == [1, 1, 1, 1, 2, 2, 2, 2]
    half = outstanding(requests.assign(finish_s=[2.25, 3.0, 4.0, np.nan, np.nan]), buckets=8)[1]
    assert half[0][4] == 1.5  # a finish inside a bucket counts for the time it was there


def _run(folder: Path, experiment: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "exp.yaml"
    path.write_text(yaml.safe_dump(experiment), encoding="utf-8")
    run_experiment(path, out=folder / "out", quiet=True)
    return folder / "out"


@pytest.mark.parametrize("replicas", [3, 1])
def test_the_figure_is_drawn_for_multi_replica_runs_only(tmp_path, replicas):
    exp = {**EXPERIMENT, "parallelism": {"replicas": replicas}}
    out = _run(tmp_path, exp)
    png = out / "plots" / "replica_load.png"
    report = (out / "report.md").read_text(encoding="utf-8")
    page = (out / "report.html").read_text(encoding="utf-8")
    if replicas > 1:
        assert png.read_bytes().startswith(b"\x89PNG") and png.stat().st_size > 5000
        assert "](plots/replica_load.png)" in report
        assert "Outstanding requests (arrived, not finished) on each replica" in page
    else:
        assert not png.exists() and "replica_load" not in report
