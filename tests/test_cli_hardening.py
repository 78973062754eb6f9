"""CLI misuse an audit found answered with silence, ``nan`` or exit 1 after the work: each is now
exit 2 with one line naming the argument or file and the problem, before any work is done (or,
for a valid but degenerate input, a meaningful answer instead of ``nan``).

Unwritable outputs are made without chmod (tests may run as root): a path under an existing
regular file can never be created.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from sim.cli.main import main
from sim.core.errors import InputError
from sim.experiments.bench_results import vllm_result_json
from tests.helpers import dd1_experiment


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    """(stdout, the one stderr line) of the last command; fails on a traceback."""
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return out, err


# --- 1. capacity: repeated --slo ------------------------------------------------------------

STEP, OUT_TOKENS, N = 0.01, 10, 100
#: D/D/1 (see test_capacity.py): constant arrivals, one batch row, a constant step, so the p99
#: TTFT limit L holds up to rate 1 / (S - (L - s) / (0.99 (N - 1))) with S = OUT_TOKENS * STEP.
DD1 = dd1_experiment(STEP, OUT_TOKENS, N)


@pytest.fixture
def dd1(tmp_path: Path) -> Path:
    path = tmp_path / "dd1.yaml"
    path.write_text(DD1)
    return path


def test_repeated_slo_flags_all_apply(dd1: Path, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    # The TTFT SLO binds; the TPOT one never does. Keeping only the last --slo (the bug) made
    # the search "unbounded" instead of finding the TTFT capacity.
    ttft_ms, tol = 1000.0, 0.02
    code = main(["capacity", str(dd1), "--slo", f"ttft_p99_ms={ttft_ms:g}",
                 "--slo", "tpot_p99_ms=100000", "--tolerance", str(tol),
                 "--out", str(tmp_path / "cap")])
    out = capsys.readouterr().out
    assert code == 0
    assert "p99_ttft_ms <= 1000" in out and "p99_tpot_ms <= 100000" in out, out
    (row,) = pd.read_csv(tmp_path / "cap" / "capacity.csv").to_dict("records")
    exact = 1 / (OUT_TOKENS * STEP - (ttft_ms / 1e3 - STEP) / (0.99 * (N - 1)))
    assert row["status"] == "found"
    assert exact / (1 + tol) <= row["max_rate"] <= exact


def test_comma_separated_slos_still_work(dd1: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["capacity", str(dd1), "--slo", "ttft_p99_ms=1000,tpot_p99_ms=100000",
                 "--out", str(tmp_path / "cap")])
    out = capsys.readouterr().out
    assert code == 0
    assert "p99_ttft_ms <= 1000" in out and "p99_tpot_ms <= 100000" in out, out


@pytest.mark.parametrize("slos", [["ttft_p99_ms=2000", "ttft_p99_ms=100"],
                                  ["ttft_p99_ms=2000,tpot_p99_ms=1", "tpot_p99_ms=5"],
                                  ["ttft_p50_ms=2000", "ttft_median_ms=100"]])
def test_a_metric_in_two_slo_flags_exits_2_naming_it(dd1: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str],
                                                     slos: list[str]) -> None:
    argv = ["capacity", str(dd1), "--out", str(tmp_path / "cap")]
    for slo in slos:
        argv += ["--slo", slo]
    assert main(argv) == 2
    _, err = _one_error_line(capsys)
    metric = slos[1].split("=")[0]
    assert f"--slo {metric}: given twice" in err, err
    assert not (tmp_path / "cap").exists()  # refused before any probe


# --- 2. calibrate: options of another mode --------------------------------------------------

@pytest.mark.parametrize(("argv", "option"), [
    (["--gpu", "h100-sxm", "--model", "llama-3-8b"], "--model"),
    (["--gpu", "h100-sxm", "--out", "x.yaml"], "--out"),
    (["--hardware", "h100-sxm"], "--hardware"),
    (["--gpu", "h100-sxm", "--tp", "1"], "--tp"),
    (["--gpu", "h100-sxm", "--seed", "0"], "--seed"),
    (["--gpu", "h100-sxm", "--engine", "vllm-v0"], "--engine"),
])
def test_engine_from_options_without_engine_from_exit_2(
        argv: list[str], option: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    fits: list[Any] = []
    monkeypatch.setattr("sim.cli.calibrate.calibrate", lambda *a: fits.append(a))
    assert main(["calibrate", *argv]) == 2
    out, err = _one_error_line(capsys)
    assert f"error: {option}: applies only with --engine-from RESULTS" in err, err
    assert fits == [] and out == ""  # refused before the fit, nothing printed
    assert list(tmp_path.iterdir()) == []


def _vllm_file(path: Path, **change: Any) -> Path:
    """A small valid ``vllm bench serve`` result, with ``change`` applied."""
    data = vllm_result_json(np.array([10, 20, 30]), np.array([3, 2, 4]),
                            np.array([0.1, 0.2, 0.05]), [[0.01, 0.03], [0.02], [0.01] * 3],
                            2.0, 1.5)
    path.write_text(json.dumps(data | change))
    return path


@pytest.mark.parametrize(("argv", "option", "words"), [
    (["--gpu", "h100-sxm"], "--gpu", "kernel tables"),
    (["--write"], "--write", "kernel tables"),
    (["--data", "somewhere"], "--data", "measured timings"),
    (["--report", "rep"], "--report", "measured timings"),
])
def test_kernel_table_options_with_engine_from_exit_2(
        argv: list[str], option: str, words: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    result = _vllm_file(tmp_path / "r.json")
    fits: list[Any] = []
    monkeypatch.setattr("sim.experiments.validate.fit_engine", lambda *a, **k: fits.append(a))
    assert main(["calibrate", "--engine-from", str(result), "--out",
                 str(tmp_path / "e.yaml"), *argv]) == 2
    _, err = _one_error_line(capsys)
    assert f"error: {option}: applies to fitting GPU profiles to {words}" in err, err
    assert "not with --engine-from" in err
    assert fits == [] and sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_gpu_with_an_iteration_csv_exits_2(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    from sim.core.paths import checkout_root

    csv = checkout_root() / "hardware_profiles" / "measurements" / "iteration_example.csv"
    assert csv.is_file()
    assert main(["calibrate", "--data", str(csv), "--gpu", "h100-sxm"]) == 2
    _, err = _one_error_line(capsys)
    assert "--gpu: applies to kernel tables; an iteration CSV" in err, err


# --- 5. calibrate: an output that can never be written, refused before the work --------------

def test_unwritable_report_folder_exits_2_before_the_fit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "afile").write_text("mine")
    report = tmp_path / "afile" / "sub" / "rep"
    fits: list[Any] = []
    monkeypatch.setattr("sim.cli.calibrate.calibrate", lambda *a: fits.append(a))
    assert main(["calibrate", "--gpu", "h100-sxm", "--report", str(report)]) == 2
    out, err = _one_error_line(capsys)
    assert f"--report {report}: cannot be written there ({tmp_path / 'afile'} is not a " \
           "folder)" in err, err
    assert "resume" not in err  # not the environment-failure message of exit 1
    assert fits == [] and out == ""
    assert (tmp_path / "afile").read_text() == "mine"


def test_unwritable_engine_yaml_exits_2_before_the_fit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    result = _vllm_file(tmp_path / "r.json")
    (tmp_path / "afile").write_text("mine")
    out_yaml = tmp_path / "afile" / "e.yaml"
    fits: list[Any] = []
    monkeypatch.setattr("sim.experiments.validate.fit_engine", lambda *a, **k: fits.append(a))
    assert main(["calibrate", "--engine-from", str(result), "--out", str(out_yaml)]) == 2
    out, err = _one_error_line(capsys)
    assert f"--out {out_yaml}: cannot be written there" in err and "resume" not in err, err
    assert fits == [] and out == ""


def test_engine_from_still_fits_with_the_shared_defaults(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # --model/--hardware/--tp/--seed now default to None on calibrate's parser (so that other
    # modes can refuse them); --engine-from must still get validate's defaults.
    from sim.cli.validate import DEFAULTS

    seen: dict[str, Any] = {}

    def fake_fit(runs: Any, model: str, hardware: str, tp: int, engine: str,
                 seed: int = 0) -> Any:
        seen.update(model=model, hardware=hardware, tp=tp, seed=seed)
        raise InputError("stop here", field="fit")

    monkeypatch.setattr("sim.experiments.validate.fit_engine", fake_fit)
    result = _vllm_file(tmp_path / "r.json")
    assert main(["calibrate", "--engine-from", str(result), "--out",
                 str(tmp_path / "new" / "e.yaml")]) == 2
    assert seen == DEFAULTS


# --- 3. validate: empty guidellm report, zero duration ---------------------------------------

def test_guidellm_report_without_benchmarks_exits_2(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "g.json"
    report.write_text(json.dumps({"benchmarks": []}))
    assert main(["validate", str(report)]) == 2
    out, err = _one_error_line(capsys)
    assert f"{report}: benchmarks: no benchmark entries" in err, err
    assert out == ""  # not a header with no table under it


@pytest.mark.parametrize(("change", "message"), [
    ({"duration": 0}, "duration: must be a number > 0, got 0"),
    ({"duration": -3.0}, "duration: must be a number > 0, got -3.0"),
    ({"duration": "long"}, "duration: must be a number > 0, got 'long'"),
    ({"burstiness": 0}, "burstiness: must be a number > 0, got 0"),
    ({"max_concurrency": 0}, "max_concurrency: must be a whole number >= 1 or null, got 0"),
    ({"max_concurrency": "8"}, "max_concurrency: must be a whole number >= 1 or null"),
])
def test_bad_vllm_run_settings_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      change: dict[str, Any], message: str) -> None:
    result = _vllm_file(tmp_path / "r.json", **change)
    assert main(["validate", str(result)]) == 2
    out, err = _one_error_line(capsys)
    assert f"{result}: {message}" in err, err
    assert out == ""


def test_guidellm_benchmark_that_is_not_an_object_exits_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "g.json"
    report.write_text(json.dumps({"benchmarks": [[1, 2]]}))
    assert main(["validate", str(report)]) == 2
    _, err = _one_error_line(capsys)
    assert f"{report}#benchmarks[0]: expected a benchmark object" in err, err


def test_a_bad_second_file_is_reported_before_any_replay(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = _vllm_file(tmp_path / "good.json")
    bad = tmp_path / "g.json"
    bad.write_text(json.dumps({"benchmarks": []}))
    assert main(["validate", str(good), str(bad)]) == 2
    out, _ = _one_error_line(capsys)
    assert out == ""


# --- 4. profiles: no memory left for the KV cache --------------------------------------------

def test_profiles_without_kv_memory_exits_2_as_run_does(
        capsys: pytest.CaptureFixture[str]) -> None:
    from sim.cost.roofline import build_cost_model
    from sim.kv.config import resolve_kv

    with pytest.raises(InputError) as run_error:  # what `batchsim run` reports
        resolve_kv({"gpu_memory_utilization": 0.01},
                   build_cost_model(model="llama-3-8b", hardware="h100-sxm"))
    assert main(["profiles", "--model", "llama-3-8b", "--hardware", "h100-sxm",
                 "--gpu-memory-utilization", "0.01"]) == 2
    out, err = _one_error_line(capsys)
    assert out == ""  # not "KV blocks 0"
    assert run_error.value.problem in err
    assert "error: --gpu-memory-utilization 0.01: no memory left for the KV cache" in err, err


def test_profiles_with_kv_memory_still_prints_the_capacity(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profiles", "--model", "llama-3-8b", "--hardware", "h100-sxm",
                 "--gpu-memory-utilization", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "KV blocks" in out and "KV blocks                      0 " not in out


# --- 6. trace-stats: one request --------------------------------------------------------------

def _trace(tmp_path: Path, arrivals: list[float]) -> Path:
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,num_prompt_tokens,num_output_tokens\n"
                    + "".join(f"{t},10,5\n" for t in arrivals))
    return path


def test_trace_stats_of_one_request_says_n_a(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace-stats", str(_trace(tmp_path, [0.5]))]) == 0
    out = capsys.readouterr().out
    assert "nan" not in out, out
    assert "mean rate        n/a (one request)" in out
    assert "interarrival cv  n/a (one request)" in out
    assert "requests         1" in out


def test_trace_stats_of_simultaneous_requests_says_n_a(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace-stats", str(_trace(tmp_path, [2.0, 2.0, 2.0]))]) == 0
    out = capsys.readouterr().out
    assert "nan" not in out, out
    assert "mean rate        n/a (every request arrives at the same time)" in out


def test_trace_stats_of_a_real_spread_prints_numbers(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace-stats", str(_trace(tmp_path, [0.0, 1.0, 3.0]))]) == 0
    out = capsys.readouterr().out
    assert "mean rate        0.667 req/s" in out and "interarrival cv  0.333" in out, out
