"""Hardening regressions: user files under ``--out`` survive a run, invalid requests are
rejected before a simulation starts, and gzip-compressed traces load like plain ones."""
from __future__ import annotations

import os
from pathlib import Path

import yaml

import sim.experiments.results as results
from sim.api import run_experiment
from sim.experiments.results import atomic_write, is_temp_file, write_text
from sim.experiments.run import clean_temp_files

SMALL = {
    "name": "small",
    "cost": {"kind": "constant", "step_s": 0.01},
    "kv": {"num_blocks": 400, "block_size": 16},
    "workload": {"arrival": {"process": "poisson", "rate": 20}, "num_requests": 10,
                 "prompt_tokens": {"dist": "uniform", "lo": 10, "hi": 50},
                 "output_tokens": {"dist": "uniform", "lo": 2, "hi": 10}},
    "policy": {"name": "continuous", "max_num_seqs": 8},
    "output": {"plots": False},
}


# --- 1. only batchsim's own temporary files are cleaned ---------------------------------------

def test_run_keeps_user_dot_tmp_files_under_out(tmp_path):
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump(SMALL, sort_keys=False))
    out = tmp_path / "proj"
    (out / "runs" / "abc").mkdir(parents=True)
    (out / "notes").mkdir()
    mine = [out / ".draft.tmp", out / "notes" / ".draft.tmp", out / "runs" / "abc" / ".x.tmp",
            out / ".summary.csv.abc123.tmp"]
    for p in mine:
        p.write_text("mine\n")
    debris = [out / ".summary.csv.batchsim-q1w2e3.tmp",
              out / "runs" / "abc" / ".summary.json.batchsim-zz.tmp"]
    for p in debris:
        p.write_text("half")
    run_experiment(exp, out=out, quiet=True)
    for p in mine:
        assert p.read_text() == "mine\n", p
    for p in debris:
        assert not p.exists(), p


def test_clean_temp_files_only_in_batchsim_folders(tmp_path):
    out = tmp_path / "out"
    deep = out / "data" / "sub"
    deep.mkdir(parents=True)
    (out / "plots").mkdir()
    outside = deep / ".t.batchsim-abc.tmp"  # not a folder batchsim writes into
    outside.write_text("x")
    inside = out / "plots" / ".a.png.batchsim-abc.tmp"
    inside.write_text("x")
    assert clean_temp_files(out) == 1
    assert outside.exists() and not inside.exists()
    assert clean_temp_files(tmp_path / "missing") == 0


def test_atomic_write_names_its_temporary_file_and_fsyncs_before_rename(tmp_path, monkeypatch):
    events: list[str] = []
    seen: list[Path] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(results.os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd)))
    monkeypatch.setattr(results.os, "replace",
                        lambda a, b: (events.append("replace"), real_replace(a, b)))

    def write(p: Path) -> None:
        seen.append(p)
        p.write_text("data")

    atomic_write(tmp_path / "f.txt", write)
    assert events == ["fsync", "replace"]
    assert (tmp_path / "f.txt").read_text() == "data"
    assert seen[0].name.startswith(".f.txt.batchsim-") and seen[0].name.endswith(".tmp")
    assert is_temp_file(seen[0])
    assert not is_temp_file(Path(".draft.tmp")) and not is_temp_file(Path("a.batchsim-x.tmp"))
    write_text(tmp_path / "g.txt", "hi")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.txt", "g.txt"]
