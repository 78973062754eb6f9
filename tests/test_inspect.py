"""Inspection and the environment a run does not depend on: ``--version``, ``profiles
--hardware``, the run ids listed for a bad ``trace`` folder, relative paths resolved from the
experiment's folder whatever the working directory, and one table format (Parquet) whatever
is installed, with CSV folders of older versions still read."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

import sim
from sim.cli.inspect import calibration_status
from sim.cli.main import main
from sim.cost.profiles import load_gpu
from sim.experiments.results import read_table, write_table

REPO = Path(__file__).resolve().parent.parent
PROFILES = REPO / "hardware_profiles"


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"batchsim {sim.__version__}"


def test_profiles_hardware_prints_specs_and_calibration_status(capsys):
    assert main(["profiles", "--hardware", "l40s"]) == 0
    text = capsys.readouterr().out
    assert "bf16 362.05" in text and "fp8 733" in text and "(dense)" in text
    assert "48 GB GDDR6, 0.864 TB/s" in text and "no NVLink" in text
    assert "HBM" not in text  # a GDDR6 card
    assert "calibration   datasheet-only" in text
    assert main(["profiles", "--hardware", "h100-sxm"]) == 0
    text = capsys.readouterr().out
    assert "80 GB HBM3, 3.35 TB/s" in text and "NVLink 900 GB/s" in text
    assert "calibration   fitted 2026-11-30" in text and "held-out" in text


def test_kv_capacity_names_the_memory_type(capsys):
    assert main(["profiles", "--model", "llama-3-8b", "--hardware", "l40s"]) == 0
    text = capsys.readouterr().out
    assert "memory per GPU" in text and "GDDR6" in text and "HBM" not in text


def test_calibration_status_reads_a_stated_status():
    gpu = load_gpu("l40s")
    stated = type(gpu.calibration)(**{**vars(gpu.calibration),
                                      "fit": {"status": "partly fitted (GEMM only)"}})
    assert calibration_status(gpu).startswith("datasheet-only")
    import dataclasses
    assert calibration_status(dataclasses.replace(gpu, calibration=stated)) == \
        "partly fitted (GEMM only)"


def test_profiles_model_alone_prints_the_architecture(capsys):
    assert main(["profiles", "--model", "llama-3-70b"]) == 0
    text = capsys.readouterr().out
    assert "num_layers" in text and "80" in text and "num_kv_heads" in text


TINY = {"name": "tiny", "seed": 0, "engine": "vllm",
        "workload": {"arrival": {"process": "poisson", "rate": 5}, "num_requests": 6,
                     "prompt_tokens": {"dist": "fixed", "value": 32},
                     "output_tokens": {"dist": "fixed", "value": 4}},
        "policy": {"name": "continuous"}, "output": {"plots": False}}


def test_trace_with_a_bad_run_id_lists_the_valid_ones(tmp_path, capsys):
    exp = tmp_path / "tiny.yaml"
    exp.write_text(yaml.safe_dump({**TINY, "sweep": {"seed": [0, 1]}}))
    out = tmp_path / "out"
    assert main(["run", str(exp), "--out", str(out), "--quiet"]) == 0
    ids = sorted(pd.read_csv(out / "summary.csv", dtype={"run_id": str})["run_id"])
    assert main(["trace", str(out / "runs" / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "finished runs in" in err
    assert all(rid in err for rid in ids)
    assert main(["trace", str(out)]) == 2  # the experiment folder itself: its runs are listed
    err = capsys.readouterr().err
    assert all(rid in err for rid in ids)
    assert main(["trace", str(out / "runs" / ids[0])]) == 0


def test_relative_paths_resolve_from_the_yaml_folder(tmp_path, monkeypatch):
    folder = tmp_path / "project"
    (folder / "gpus").mkdir(parents=True)
    (folder / "models").mkdir()
    shutil.copy(PROFILES / "gpus" / "l40s.yaml", folder / "gpus" / "my-gpu.yaml")
    shutil.copy(PROFILES / "models" / "llama-3-8b.yaml", folder / "models" / "m.yaml")
    shutil.copy(PROFILES / "engines" / "vllm.yaml", folder / "eng.yaml")
    shutil.copy(REPO / "traces" / "sample_native.csv", folder / "t.csv")
    exp = folder / "exp.yaml"
    exp.write_text(yaml.safe_dump({
        **TINY, "model": "models/m.yaml", "hardware": "gpus/my-gpu.yaml",
        "engine": "./eng.yaml", "workload": {"trace": "t.csv", "max_requests": 8}}))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    summary = sim.run_experiment("../project/exp.yaml", out="out", quiet=True)
    assert len(summary) == 1 and summary.loc[0, "completed"] == 8
    # the same numbers as the built-in names the files copy
    builtin = folder / "builtin.yaml"
    builtin.write_text(yaml.safe_dump({
        **TINY, "model": "llama-3-8b", "hardware": "l40s", "engine": "vllm",
        "workload": {"trace": "t.csv", "max_requests": 8}}))
    ref = sim.run_experiment(builtin, out="ref", quiet=True)
    assert summary.loc[0, "p99_ttft_ms"] == ref.loc[0, "p99_ttft_ms"]
    # capacity resolves them the same way (and finds the custom GPU's price: none)
    assert main(["capacity", "../project/exp.yaml", "--slo", "ttft_p99_ms=5000",
                 "--tolerance", "0.5", "--out", "cap", "--quiet"]) == 0
    # a missing file names the path it looked for, from the YAML's folder
    exp.write_text(exp.read_text().replace("gpus/my-gpu.yaml", "gpus/nope.yaml"))
    with pytest.raises(ValueError, match=str(folder / "gpus" / "nope.yaml")):
        sim.run_experiment("../project/exp.yaml", out="out2", quiet=True)


def test_tables_are_always_parquet_and_old_csv_folders_still_read(tmp_path, monkeypatch):
    exp = tmp_path / "tiny.yaml"
    exp.write_text(yaml.safe_dump(TINY))
    sim.run_experiment(exp, out=tmp_path / "out", quiet=True)
    (run,) = (tmp_path / "out" / "runs").iterdir()
    assert {p.name for p in run.iterdir()} >= {"requests.parquet", "steps.parquet"}
    assert not list(run.glob("*.csv"))
    # a folder written by an older batchsim without pyarrow: CSV with a '#' metadata line
    df = read_table(run / "requests")
    old = tmp_path / "old" / "runs" / run.name
    shutil.copytree(run, old)
    for stem in ("requests", "steps"):
        table = read_table(old / stem)
        (old / f"{stem}.parquet").unlink()
        with (old / f"{stem}.csv").open("w") as fh:
            fh.write(f"# version=0.0.9 config_hash={run.name} seed=0\n")
            table.to_csv(fh, index=False)
    numeric = [c for c in df.columns if pd.api.types.is_numeric_dtype(df[c])]
    pd.testing.assert_frame_equal(read_table(old / "requests")[numeric], df[numeric])
    assert main(["trace", str(old), "--out", str(tmp_path / "t.json")]) == 0
    assert json.loads((tmp_path / "t.json").read_text())
    path = write_table(tmp_path / "x", df, {"version": "1"})
    assert path.suffix == ".parquet"
