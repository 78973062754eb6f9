"""Engine profiles per engine generation: names, the `vllm` alias, TP terms and their fit."""
from __future__ import annotations

import numpy as np
import pytest

import sim
from sim.core.types import BatchShape
from sim.cost.engine_fit import fit_cpu_overheads, fit_framework_allreduce
from sim.cost.profiles import list_engines, load_engine
from sim.cost.roofline import DEFAULT_ENGINE

GENERATIONS = ("vllm-v0", "vllm-v1", "trtllm", "sglang", "ideal")


def _decode_32(gpu: str, tp: int, engine: str) -> sim.StepCost:
    """A 70B decode step of 32 sequences at 512 tokens of context."""
    cm = sim.build_cost_model("llama-2-70b", gpu, tp, engine=engine)
    return cm.step(BatchShape(np.ones(32, np.int64), np.full(32, 512, np.int64)))


def test_every_generation_is_a_profile_with_a_calibration_status():
    assert set(GENERATIONS) <= set(list_engines())
    for name in GENERATIONS:
        eng = load_engine(name)
        assert eng.name == name
        assert eng.calibration["status"] in {"fitted", "derived", "by-definition"}
    assert DEFAULT_ENGINE == "vllm-v0"


def test_vllm_is_an_alias_of_vllm_v0():
    assert load_engine("vllm") == load_engine("vllm-v0")
    old = sim.build_cost_model("llama-3-8b", "h100-sxm", 1, engine="vllm")
    new = sim.build_cost_model("llama-3-8b", "h100-sxm", 1, engine="vllm-v0")
    shape = BatchShape.of([1, 1, 300], [40, 900, 300])
    assert old.step(shape) == new.step(shape)


def test_tp1_pays_only_the_tp1_terms():
    eng = load_engine("vllm-v0")
    assert eng.overhead_terms(1) == (eng.per_step_s, eng.per_seq_s, eng.per_layer_launch_s)
    assert eng.allreduce_floor_s("h100-sxm", 1) == 0.0
    assert eng.tp_per_step_s > 0.005  # the Ray round trip of the measurements (~6 ms)


@pytest.mark.parametrize("gpu", ["a100-80gb", "h100-sxm"])
def test_vllm_v0_70b_decode_follows_the_measured_tp_dependence(gpu):
    """The fitted data: the TP>1 CPU excess is the same at TP 2 and TP 4 (Vidur, A100), and a
    framework-level decode-sized all-reduce takes a floor that does not fall with the GPU count
    (Vidur, DGX A100 / H100). So the overhead and the all-reduce stay flat in TP while the
    GPU's weight traffic halves: the step must not halve."""
    eng = load_engine("vllm-v0")
    floor = eng.allreduce_floor_s(gpu, 2)
    steps = {tp: _decode_32(gpu, tp, "vllm-v0") for tp in (2, 4, 8)}
    ideal = {tp: _decode_32(gpu, tp, "ideal") for tp in (2, 4, 8)}
    layers = 80
    for tp, c in steps.items():
        assert c.breakdown["overhead"] == pytest.approx(
            eng.per_step_s + eng.tp_per_step_s + eng.tp_per_rank_s * (tp - 2)
            + (eng.per_seq_s + eng.tp_per_seq_s) * 32 + eng.per_layer_launch_s * layers)
        assert c.breakdown["allreduce"] == pytest.approx(2 * layers * floor)  # under the floor
        assert ideal[tp].breakdown["allreduce"] < c.breakdown["allreduce"]
    # weights per GPU halve from TP 4 to TP 8; the measured-overhead step does not
    assert ideal[8].breakdown["mlp"] == pytest.approx(ideal[4].breakdown["mlp"] / 2, rel=0.1)
    assert steps[8].seconds / steps[4].seconds > 0.73
    assert steps[8].seconds / steps[4].seconds > ideal[8].seconds / ideal[4].seconds + 0.05
    assert steps[4].seconds / steps[2].seconds > ideal[4].seconds / ideal[2].seconds + 0.05


def test_newer_generations_cost_less_than_vllm_v0():
    for tp in (2, 4):
        v0 = _decode_32("h100-sxm", tp, "vllm-v0").seconds
        ideal = _decode_32("h100-sxm", tp, "ideal").seconds
        for name in ("vllm-v1", "trtllm", "sglang"):
            assert ideal < _decode_32("h100-sxm", tp, name).seconds < v0


def test_committed_numbers_are_the_fit():
    """Refitting the shipped data gives the numbers in vllm-v0.yaml (and their error is low)."""
    eng = load_engine("vllm-v0")
    params, errs = fit_cpu_overheads(eng.per_step_s, eng.per_seq_s, eng.per_layer_launch_s)
    assert params["tp_per_step_s"] == pytest.approx(eng.tp_per_step_s, rel=1e-3)
    assert params["tp_per_rank_s"] == pytest.approx(eng.tp_per_rank_s, abs=1e-6)
    assert params["tp_per_seq_s"] == pytest.approx(eng.tp_per_seq_s, abs=1e-7)
    assert all(e.heldout_mdape_pct < 10 for e in errs)
    floors, ar_errs = fit_framework_allreduce()
    for gpu, floor in floors.items():
        assert eng.allreduce_floor_us[gpu] == pytest.approx(floor)
    assert eng.allreduce_floor_us["default"] == pytest.approx(np.mean(list(floors.values())))
    assert all(e.heldout_mdape_pct < 20 for e in ar_errs)


def test_every_gpu_states_its_calibration_and_datasheet_only_warns(tmp_path):
    from sim.cost.profiles import calibration_note, list_gpus, load_gpu

    statuses = {g: load_gpu(g).calibration_status for g in list_gpus()}
    assert set(statuses.values()) == {"fitted", "datasheet-only"}
    assert {g for g, s in statuses.items() if s == "fitted"} == {"a100-80gb", "h100-sxm", "h200"}
    assert calibration_note(load_gpu("mi300x")).startswith("WARNING: mi300x is datasheet-only")
    assert "Vidur" in calibration_note(load_gpu("h100-sxm"))
    bad = tmp_path / "gpu.yaml"
    bad.write_text("peak_tflops: {bf16: 100}\nhbm_gb: 10\nhbm_tbps: 1\n"
                   "calibration: {status: guessed}\n")
    with pytest.raises(sim.InputError, match="calibration.status"):
        load_gpu(bad)
    plain = tmp_path / "plain.yaml"  # a custom profile without a fit is datasheet-only
    plain.write_text("peak_tflops: {bf16: 100}\nhbm_gb: 10\nhbm_tbps: 1\n")
    assert load_gpu(plain).calibration_status == "datasheet-only"


def test_report_and_console_show_the_calibration(tmp_path, capsys):
    exp = tmp_path / "e.yaml"
    exp.write_text("name: cal\nmodel: llama-2-7b\nhardware: a100-40gb\n"
                   "workload: {arrival: {process: poisson, rate: 2.0}, num_requests: 20,\n"
                   "  lengths: {dist: empirical, trace: azure-conv}}\n"
                   "policy: {name: continuous}\n")
    sim.run_experiment(exp, out=tmp_path / "out", plots=False, quiet=False)
    assert "WARNING: a100-40gb is datasheet-only" in capsys.readouterr().err
    report = (tmp_path / "out" / "report.md").read_text()
    assert "- calibration: WARNING: a100-40gb is datasheet-only" in report


def _steps(tokens, rows, live):
    import pandas as pd

    return pd.DataFrame({"num_prefill_tokens": np.array(tokens) - np.array(rows),
                         "num_decode_tokens": rows, "num_seqs": rows, "kv_live_tokens": live})


def test_validity_counts_follow_the_fitted_range():
    from sim.cost.validity import validity_counts

    cm = sim.build_cost_model("llama-3-8b", "h100-sxm", 1, engine="vllm-v0")
    # inside; 200 rows (> 128 in the engine data); 9000 tokens (> 8192); 40k mean context
    steps = _steps([64, 200, 9000, 4], [64, 200, 4, 4], [64 * 500, 200 * 500, 9000, 4 * 40000])
    assert validity_counts(steps, cm) == {"steps_calibrated": 1, "steps_extrapolated": 3,
                                          "steps_datasheet_only": 0}
    tp8 = sim.build_cost_model("llama-3-70b", "h100-sxm", 8, engine="vllm-v0")  # TP 8 > 4
    assert validity_counts(steps, tp8)["steps_extrapolated"] == 4
    ideal = sim.build_cost_model("llama-3-70b", "h100-sxm", 8, engine="ideal")  # GPU range only
    assert validity_counts(steps, ideal)["steps_calibrated"] == 2  # 200 rows now inside
    fp8 = sim.build_cost_model("llama-3-8b", "h100-sxm", 1, engine="ideal", weight_dtype="fp8")
    assert validity_counts(steps, fp8)["steps_extrapolated"] == 4
    sheet = sim.build_cost_model("llama-3-8b", "mi300x", 1)
    assert validity_counts(steps, sheet)["steps_datasheet_only"] == 4


def test_a_run_summary_counts_every_step():
    from sim.workload.build import build_workload_arrays

    arrays = build_workload_arrays({"arrival": {"process": "poisson", "rate": 5.0},
                                    "num_requests": 30,
                                    "lengths": {"dist": "empirical", "trace": "azure-conv"}},
                                   np.random.default_rng(0))
    res = sim.simulate(arrays.to_requests(), policy={"name": "continuous"},
                       cost=sim.build_cost_model("llama-3-8b", "h100-sxm"))
    s = res.summary
    assert s["steps_calibrated"] + s["steps_extrapolated"] == len(res.steps) > 0
    assert s["steps_datasheet_only"] == 0


def test_engine_data_folder_is_not_a_gpu():
    from sim.cost.calibrate import measured_gpus

    assert measured_gpus() == ["a100-80gb", "h100-sxm", "h200"]
