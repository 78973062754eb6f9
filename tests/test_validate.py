"""``batchsim validate`` and ``calibrate --engine-from`` on result files written here in the
published formats (vllm bench serve --save-result --save-detailed; guidellm's report)."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from sim.cli.main import main as batchsim
from sim.cost.profiles import load_engine
from sim.experiments.bench_results import (
    BenchResultError,
    BenchRun,
    load_bench_results,
    vllm_result_json,
)
from sim.experiments.validate import fit_engine, replay

MODEL, GPU = "llama-3-8b", "h100-sxm"
#: The overheads the "measured" files are simulated with; the fit starts from vllm-v0's.
TRUE = {"per_step_s": 0.0020, "per_seq_s": 0.00008}


def _lengths(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(64, 1024, n), rng.integers(16, 256, n)


def _measured_file(path: Path, rate: float, n: int = 80, seed: int = 1) -> Path:
    """A vllm bench serve result as batchsim with ``TRUE`` overheads would have measured it."""
    prompt, output = _lengths(n, seed)
    shell = BenchRun("gen", prompt, output, np.zeros(n), tuple(np.zeros(0) for _ in range(n)),
                     rate)
    engine = replace(load_engine("vllm-v0"), **TRUE)
    res = replay(shell, MODEL, GPU, 1, engine)
    req = res.requests.sort_values("id")
    assert (req["status"] == "finished").all()
    ttft, tpot = req["ttft_s"].to_numpy(), req["tpot_s"].fillna(0.0).to_numpy()
    itls = [[float(t)] * (int(o) - 1) for t, o in zip(tpot, req["num_output_tokens"],
                                                        strict=True)]
    data = vllm_result_json(prompt, output, ttft, itls, rate, float(res.summary["duration"]))
    path.write_text(json.dumps(data))
    return path


def test_vllm_file_loads_and_skips_failed_requests(tmp_path):
    data = vllm_result_json(np.array([10, 20, 30]), np.array([3, 1, 0]),
                            np.array([0.1, 0.2, 0.0]), [[0.01, 0.03], [], []], 2.0, 1.5)
    data["errors"] = ["", "", "timeout"]
    (tmp_path / "r.json").write_text(json.dumps(data))
    (run,) = load_bench_results(tmp_path / "r.json")
    assert list(run.prompt_tokens) == [10, 20] and run.request_rate == 2.0
    assert run.e2e_s == pytest.approx([0.14, 0.2]) and run.tpot_s == pytest.approx([0.02])
    gaps = np.diff(run.arrivals(0))
    assert (gaps > 0).all() and run.arrivals(0)[0] == 0.0


def test_guidellm_report_loads_with_its_arrivals(tmp_path):
    reqs = [{"prompt_tokens": 100, "output_tokens": 11, "start_time": 1000.0 + i,
             "first_token_time": 1000.2 + i, "last_token_time": 1001.2 + i,
             "end_time": 1001.2 + i} for i in range(3)]
    (tmp_path / "g.json").write_text(json.dumps(
        {"benchmarks": [{"requests": {"successful": reqs, "errored": []}}]}))
    (run,) = load_bench_results(tmp_path / "g.json")
    assert list(run.arrivals()) == [0.0, 1.0, 2.0]
    assert run.ttft_s == pytest.approx([0.2] * 3) and run.tpot_s == pytest.approx([0.1] * 3)


def test_bad_files_are_one_line_errors(tmp_path, capsys):
    (tmp_path / "x.json").write_text("{\"foo\": 1}")
    with pytest.raises(BenchResultError, match="neither"):
        load_bench_results(tmp_path / "x.json")
    (tmp_path / "y.json").write_text("{not json")
    assert batchsim(["validate", str(tmp_path / "y.json")]) == 2
    assert "not JSON" in capsys.readouterr().err


def test_validate_prints_measured_simulated_and_error(tmp_path, capsys):
    path = _measured_file(tmp_path / "run.json", rate=6.0)
    engine = tmp_path / "true.yaml"
    engine.write_text("name: known-overheads\nper_step_s: 0.002\nper_seq_s: 0.00008\n"
                      "per_layer_launch_s: 0.000018\n")
    assert batchsim(["validate", str(path), "--model", MODEL, "--hardware", GPU,
                     "--engine", str(engine)]) == 0
    out = capsys.readouterr().out
    for metric in ("p50_ttft_ms", "p99_tpot_ms", "p90_itl_ms", "p99_e2el_ms",
                   "request_throughput"):
        assert f"| {metric} |" in out
    # replayed with the overheads that made the file, TTFT and E2E come back exactly
    row = next(ln for ln in out.splitlines() if ln.startswith("| p50_ttft_ms |"))
    assert row.endswith("| +0.0 |")


def test_engine_fit_round_trip_recovers_the_overheads(tmp_path):
    """Acceptance: results simulated with known overheads -> the fit recovers them (5 %)."""
    files = [_measured_file(tmp_path / f"r{rate}.json", rate) for rate in (2.0, 12.0)]
    runs = [run for f in files for run in load_bench_results(f)]
    profile, rows = fit_engine(runs, MODEL, GPU, 1, "vllm-v0")
    for key, value in TRUE.items():
        assert getattr(profile, key) == pytest.approx(value, rel=0.05), key
    for row in rows:
        assert row["simulated_mean_tpot_ms"] == pytest.approx(row["measured_mean_tpot_ms"],
                                                               rel=0.01)


def test_calibrate_engine_from_writes_a_profile_and_never_overwrites(tmp_path):
    files = [str(_measured_file(tmp_path / f"r{rate}.json", rate)) for rate in (2.0, 12.0)]
    out = tmp_path / "fitted.yaml"
    assert batchsim(["calibrate", "--engine-from", *files, "--model", MODEL, "--hardware", GPU,
                     "--out", str(out)]) == 0
    fitted = load_engine(out)
    assert fitted.per_step_s == pytest.approx(TRUE["per_step_s"], rel=0.05)
    assert fitted.calibration["status"] == "fitted"
    before = out.read_text()
    assert batchsim(["calibrate", "--engine-from", *files, "--out", str(out)]) == 2
    assert out.read_text() == before


def _vllm_file(tmp_path: Path, change) -> Path:  # noqa: ANN001
    data = vllm_result_json(np.array([10, 20, 30]), np.array([3, 2, 4]),
                            np.array([0.1, 0.2, 0.05]), [[0.01, 0.03], [0.02], [0.01] * 3],
                            2.0, 1.5)
    change(data)
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d["input_lens"].__setitem__(1, "a"), "input_lens[1]: must be a whole number "
     ">= 0, got 'a'"),
    (lambda d: d["output_lens"].__setitem__(0, 2.5), "output_lens[0]: must be a whole number"),
    (lambda d: d["ttfts"].__setitem__(2, float("nan")), "ttfts[2]: must be a finite number "
     ">= 0, got nan"),
    (lambda d: d["itls"][0].__setitem__(1, -1), "itls[0][1]: must be a finite number >= 0"),
    (lambda d: d["itls"].__setitem__(1, 5), "itls[1]: must be a list of gaps, got 5"),
    (lambda d: d.__setitem__("request_rate", 0), "request_rate: must be a number > 0 or "
     "\"inf\", got 0"),
])
def test_a_bad_value_in_a_result_file_is_one_error_naming_file_and_entry(tmp_path, capsys,
                                                                          change, message):
    """A string was a numpy ValueError, a zero rate a ZeroDivisionError (exit 1, traceback),
    a NaN TTFT replayed silently."""
    path = _vllm_file(tmp_path, change)
    assert batchsim(["validate", str(path), "--model", MODEL, "--hardware", GPU]) == 2
    assert capsys.readouterr().err.startswith(f"batchsim: error: {path}: {message}")


def test_a_negative_seed_is_an_input_error_before_arrivals_are_drawn(tmp_path, capsys):
    path = _vllm_file(tmp_path, lambda d: None)
    assert batchsim(["validate", str(path), "--seed", "-1"]) == 2
    assert capsys.readouterr().err == "batchsim: error: --seed: must be >= 0, got -1\n"
