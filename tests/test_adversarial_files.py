"""The standing adversarial suite for input files: profiles, traces and calibration tables.

The companion of ``test_adversarial_inputs.py`` (config keys, workloads, the Python API): each
broken file is one ``InputError`` subclass whose message names the file, and the field or the
row and column, never a traceback; the loaders are called directly, so the corpus runs in
seconds.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from sim.cost.calibrate import CalibrationError, calibrate
from sim.cost.iteration_calibration import fit_iterations
from sim.cost.profiles import ProfileError, load_engine, load_gpu, load_model
from sim.workload.traces import TraceError, load_trace_arrays

REPO = Path(__file__).resolve().parents[1]
PROFILES = REPO / "hardware_profiles"


# --------------------------------------------------------------------------- profile files

def _builtin(kind: str, name: str) -> dict[str, Any]:
    return yaml.safe_load((PROFILES / kind / f"{name}.yaml").read_text())


@pytest.mark.parametrize(("change", "message"), [
    ({"hbm_gb": float("nan")}, r"g\.yaml: hbm_gb: must be finite, got nan"),
    ({"hbm_gb": 0}, r"g\.yaml: hbm_gb: must be > 0"),
    ({"hbm_tbps": 0}, r"g\.yaml: hbm_tbps: must be > 0"),
    ({"hbm_gb": "80"}, r"g\.yaml: hbm_gb: expected float or int"),
    ({"peak_tflops": {"bf16": 0}}, r"g\.yaml: peak_tflops\.bf16: must be > 0"),
    ({"peak_tflops": {"fp8": 5.0}}, r"g\.yaml: peak_tflops: must give at least 'bf16'"),
    ({"peak_tflops": None}, r"g\.yaml: peak_tflops: missing required field"),
    ({"pcie_gbps": 0}, r"g\.yaml: pcie_gbps: must be > 0"),
    ({"interconnect": {"bus_bw_gbps": 0}}, r"g\.yaml: interconnect\.bus_bw_gbps: must be > 0"),
    ({"calibration": {"memory_eff": 0}}, r"g\.yaml: calibration\.memory_eff: must be > 0"),
    ({"calibration": {"memory_ef": 0.5}}, r"g\.yaml: calibration\.memory_ef: unknown key"),
    ({"hbmgb": 80}, r"g\.yaml: hbmgb: unknown key \(did you mean 'hbm_gb'\?\)"),
])
def test_gpu_profile_fields_are_validated(tmp_path, change, message):
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump({**_builtin("gpus", "h100-sxm"), **change}))
    with pytest.raises(ProfileError, match=message):
        load_gpu(path)


@pytest.mark.parametrize(("change", "message"), [
    ({"num_layers": 31.5}, r"m\.yaml: num_layers: expected int, got float 31\.5"),
    ({"num_experts": 0}, r"m\.yaml: num_experts: must be >= 1"),
    ({"dtype_bytes": "two"}, r"m\.yaml: dtype_bytes: expected float or int or null"),
    ({"dtype_bytes": 0}, r"m\.yaml: dtype_bytes: must be > 0"),
    ({"num_heads": 33}, r"m\.yaml: num_heads: must be a multiple of num_kv_heads"),
    ({"top_k": 3}, r"m\.yaml: top_k: must be <= num_experts"),
    ({"hidden_size": None}, r"m\.yaml: hidden_size: missing required field"),
    ({"gated_mlp": "yes"}, r"m\.yaml: gated_mlp: expected bool"),
])
def test_model_profile_fields_are_validated(tmp_path, change, message):
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump({**_builtin("models", "llama-3-8b"), **change}))
    with pytest.raises(ProfileError, match=message):
        load_model(path)


_HF = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
       "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
       "model_type": "llama", "torch_dtype": "bfloat16"}


@pytest.mark.parametrize(("change", "message"), [
    ({"num_hidden_layers": 31.5}, r"config\.json: num_hidden_layers: expected int or null"),
    ({"hidden_size": "4096"}, r"config\.json: hidden_size: expected int or null"),
    ({"vocab_size": 0}, r"config\.json: vocab_size: must be >= 1"),
    ({"num_local_experts": 0}, r"config\.json: num_local_experts: must be >= 1"),
    ({"num_key_value_heads": 5}, r"config\.json: num_heads: must be a multiple"),
])
def test_hf_config_fields_are_validated(tmp_path, change, message):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**_HF, **change}))
    with pytest.raises(ProfileError, match=message):
        load_model(path)
    path.write_text(json.dumps(_HF))
    assert load_model(path).num_layers == 32


@pytest.mark.parametrize(("change", "message"), [
    ({"per_step_s": -1}, r"e\.yaml: per_step_s: must be >= 0, got -1"),
    ({"per_seq_s": float("inf")}, r"e\.yaml: per_seq_s: must be finite"),
    ({"per_layer_launch_s": "fast"}, r"e\.yaml: per_layer_launch_s: expected"),
    ({"per_step": 0.001}, r"e\.yaml: per_step: unknown key \(did you mean 'per_step_s'\?\)"),
])
def test_engine_profile_fields_are_validated(tmp_path, change, message):
    path = tmp_path / "e.yaml"
    path.write_text(yaml.safe_dump({**_builtin("engines", "vllm-v0"), **change}))
    with pytest.raises(ProfileError, match=message):
        load_engine(path)


@pytest.mark.parametrize(("name", "text", "message"), [
    ("g.yaml", "a: [1\n", r"g\.yaml: invalid YAML \(line 2\)"),
    ("g.yaml", "a: !!python/object:os.system x\n", r"g\.yaml: invalid YAML \(line 1\): could "
     r"not determine a constructor"),
    ("g.yaml", "- 1\n", r"g\.yaml: expected a mapping at the top level"),
    ("g.yaml", "", r"g\.yaml: expected a mapping at the top level"),
    ("config.json", "{", r"config\.json: invalid JSON \(line 1\)"),
])
def test_unreadable_profile_files_are_one_error_naming_the_file(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    loader = load_model if name.endswith(".json") else load_gpu
    with pytest.raises(ProfileError, match=message):
        loader(path)
    path.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ProfileError, match="not valid UTF-8"):
        loader(path)


def test_the_profile_tables_cover_every_profile_field():
    """A field added to a profile dataclass needs its line in ``sim.cost.profile_schema``
    (else files that set it are refused as having an unknown key)."""
    import dataclasses

    from sim.cost import profile_schema as schema
    from sim.cost.profiles import EngineProfile, GpuProfile, Interconnect, ModelSpec

    def names(cls: type) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)}

    # derived on loading, never written: the calibration status and what it was fitted on
    assert set(schema.GPU_FIELDS) == names(GpuProfile) - {"origin", "calibration_status",
                                                          "calibration_data"}
    assert set(schema.INTERCONNECT_FIELDS) == names(Interconnect)
    assert set(schema.MODEL_FIELDS) == names(ModelSpec)
    assert set(schema.ENGINE_FIELDS) - {"alias_of"} == names(EngineProfile)


@pytest.mark.parametrize("kind", ["gpus", "models", "engines"])
def test_every_builtin_profile_passes_the_validator(kind):
    loader = {"gpus": load_gpu, "models": load_model, "engines": load_engine}[kind]
    for path in sorted((PROFILES / kind).glob("*.yaml")):
        loader(path.stem)


# --------------------------------------------------------------------------- trace files

_NATIVE = "arrival_s,num_prompt_tokens,num_output_tokens\n"
_AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


@pytest.mark.parametrize(("body", "message"), [
    # #12: pandas reads these words as booleans, i.e. 1 and 0
    (_NATIVE + "0,true,5\n", r"row 1: column num_prompt_tokens: not a number: 'True'"),
    (_NATIVE + "0,3,5\n1,TRUE,5\n", r"row 2: column num_prompt_tokens: not a finite number"),
    (_NATIVE + "0,3,FALSE\n", r"row 1: column num_output_tokens: not a number: 'False'"),
    (_NATIVE + "True,3,4\n", r"row 1: column arrival_s: not a number: 'True'"),
    (_NATIVE[:-1] + ",priority\n0,3,4,true\n", r"row 1: column priority: not a number"),
    # #13: stamps with and without a UTC offset mixed
    (_AZURE + "2023-11-16 18:15:46.68,3,4\n2023-11-16 18:15:47.68+05:00,3,4\n",
     r"t\.csv: row 2: column TIMESTAMP: '2023-11-16 18:15:47\.68\+05:00' has a UTC offset but "
     r"row 1 has none"),
    (_AZURE + "2023-11-16 18:15:46.68Z,3,4\n2023-11-16 18:15:47.68,3,4\n",
     r"t\.csv: row 2: column TIMESTAMP: .* has no UTC offset but row 1 has one"),
    # #25: 400 years overflowed int64 nanoseconds and read as out of order
    (_AZURE + "1800-01-01 00:00:00,3,4\n2200-01-01 00:00:00,3,4\n",
     r"t\.csv: row 2: column TIMESTAMP: more than 1e\+09 s from the first row's time"),
])
def test_broken_traces_are_one_error_naming_row_and_column(tmp_path, body, message):
    path = tmp_path / "t.csv"
    path.write_text(body)
    with pytest.raises(TraceError, match=message):
        load_trace_arrays(path)


def test_mixed_offsets_across_chunks_are_refused(tmp_path, monkeypatch):
    import sim.workload.traces as traces

    monkeypatch.setattr(traces, "CHUNK_ROWS", 2)
    rows = ["2023-11-16 18:15:46", "2023-11-16 18:15:47", "2023-11-16 18:15:48+05:00",
            "2023-11-16 18:15:49+05:00", "2023-11-16 18:15:50+05:00"]
    path = tmp_path / "t.csv"
    path.write_text(_AZURE + "".join(f"{r},3,4\n" for r in rows))
    with pytest.raises(TraceError, match=r"row 3: column TIMESTAMP: .* has a UTC offset"):
        load_trace_arrays(path)


def test_utc_offsets_alone_count_in_utc(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(_AZURE + "2023-11-16 18:00:00+05:00,3,4\n2023-11-16 14:00:01+01:00,3,4\n")
    assert load_trace_arrays(path).arrival_s.tolist() == [0.0, 1.0]


@pytest.mark.parametrize("name", ["t.zip", "t.xz", "t.csv.bz2", "t.tar", "t.zst"])
def test_plain_csv_under_a_compression_suffix_loads_as_plain_text(tmp_path, name):
    path = tmp_path / name
    path.write_text(_NATIVE + "0,3,4\n1.5,5,6\n")
    trace = load_trace_arrays(path)
    assert trace.arrival_s.tolist() == [0.0, 1.5] and trace.num_prompt_tokens.tolist() == [3, 5]


@pytest.mark.parametrize("name", ["t.zip", "t.xz"])
def test_a_really_compressed_non_gzip_trace_is_one_error(tmp_path, name):
    import lzma
    import zipfile

    path = tmp_path / name
    if name.endswith(".xz"):
        path.write_bytes(lzma.compress((_NATIVE + "0,3,4\n").encode()))
    else:
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr("t.csv", _NATIVE + "0,3,4\n")
    with pytest.raises(TraceError, match=r"t\.(zip|xz): "):
        load_trace_arrays(path)


# --------------------------------------------------------------------------- calibration files

ITERATIONS = PROFILES / "measurements" / "iteration_example.csv"


@pytest.mark.parametrize(("column", "value", "message"), [
    ("measured_ms", "inf", r"it\.csv: row 5: measured_ms: must be a finite number"),
    ("measured_ms", 1e30, r"it\.csv: row 5: measured_ms: must be at most 1e\+06 ms"),
    ("measured_ms", -2.0, r"it\.csv: row 5: measured_ms: must be > 0 ms"),
    ("batch_size", -4, r"it\.csv: row 5: batch_size: must be >= 1, got -4"),
    ("batch_size", 2.5, r"it\.csv: row 5: batch_size: must be a whole number, got 2\.5"),
    ("tp", 0, r"it\.csv: row 5: tp: must be >= 1"),
    ("model", "nosuch", r"it\.csv: row 5: model: unknown model 'nosuch'"),
])
def test_iteration_csv_rows_are_checked_naming_file_row_and_column(tmp_path, column, value,
                                                                  message):
    frame = pd.read_csv(ITERATIONS)
    frame[column] = frame[column].astype(object)
    frame.loc[3, column] = value
    frame.to_csv(tmp_path / "it.csv", index=False)
    with pytest.raises(CalibrationError, match=message):
        fit_iterations(tmp_path / "it.csv")


@pytest.mark.parametrize(("name", "column", "value", "message"), [
    ("gemm.csv.gz", "latency", "inf", r"gemm\.csv\.gz: row 4: latency: must be a finite number"),
    ("gemm.csv.gz", "latency", -1.0, r"gemm\.csv\.gz: row 4: latency: must be >= 0 ms"),
    ("gemm.csv.gz", "m", -5, r"gemm\.csv\.gz: row 4: m: must be >= 1, got -5"),
    ("nccl.csv.gz", "latency", 1e12, r"nccl\.csv\.gz: row 4: latency: must be at most 1e\+06"),
])
def test_kernel_tables_are_checked_naming_file_row_and_column(tmp_path, name, column, value,
                                                             message):
    source = PROFILES / "measurements" / "h100-sxm"
    folder = tmp_path / "k"
    folder.mkdir()
    for table in source.glob("*.csv.gz"):
        frame = pd.read_csv(table)
        if table.name == name:
            frame[column] = frame[column].astype(object)
            frame.loc[2, column] = value
        frame.to_csv(folder / table.name, index=False)
    with pytest.raises(CalibrationError, match=message):
        calibrate("h100-sxm", folder)


@pytest.mark.parametrize("name", ["it.zip", "it.xz", "it.csv.bz2"])
def test_a_plain_iteration_csv_under_a_compression_suffix_is_read_as_text(tmp_path, name):
    """#13 for calibration: pandas would decompress by the suffix and raise BadZipFile."""
    path = tmp_path / name
    path.write_bytes(ITERATIONS.read_bytes())
    assert fit_iterations(path).n_train == fit_iterations(ITERATIONS).n_train


def test_a_corrupt_gzip_calibration_file_is_one_error(tmp_path):
    path = tmp_path / "it.csv"
    path.write_bytes(b"\x1f\x8bnot really gzip")
    with pytest.raises(CalibrationError, match=r"it\.csv: cannot read iteration CSV"):
        fit_iterations(path)
