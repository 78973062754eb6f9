"""Profiles: every built-in loads, every number is sourced, names resolve from anywhere."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sim.cost.profiles import (
    ProfileError,
    list_engines,
    list_gpus,
    list_models,
    load_engine,
    load_gpu,
    load_model,
)

REPO = Path(__file__).resolve().parent.parent
PROFILES = REPO / "hardware_profiles"

REQUIRED_GPUS = {"a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h200", "b200", "l4", "l40s",
                 "mi300x"}
REQUIRED_MODELS = {"llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b", "llama-3-70b",
                   "llama-3.1-405b", "mistral-7b", "mixtral-8x7b", "qwen2.5-7b", "qwen2.5-72b",
                   "opt-13b"}


def _numeric_leaves(node, prefix=""):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _numeric_leaves(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        yield prefix


def test_required_profiles_exist():
    assert REQUIRED_GPUS <= set(list_gpus())
    assert REQUIRED_MODELS <= set(list_models())
    assert {"ideal", "vllm"} <= set(list_engines())


@pytest.mark.parametrize("path", sorted((PROFILES / "gpus").glob("*.yaml"))
                         + sorted((PROFILES / "engines").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_number_has_a_source(path):
    data = yaml.safe_load(path.read_text())
    sources = data.get("sources", {})
    for leaf in _numeric_leaves({k: v for k, v in data.items() if k != "sources"}):
        parts = leaf.split(".")
        prefixes = {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
        assert prefixes & set(sources), f"{path.name}: {leaf} has no source"
        assert all(str(sources[p]).strip() for p in prefixes & set(sources))


@pytest.mark.parametrize("name", sorted(REQUIRED_MODELS))
def test_models_cite_their_config(name):
    spec = load_model(name)
    assert "config.json" in spec.source and spec.hf_id
    assert spec.num_heads % spec.num_kv_heads == 0


@pytest.mark.parametrize("name", sorted(REQUIRED_GPUS))
def test_gpu_peaks_are_dense_and_sane(name):
    gpu = load_gpu(name)
    bf16 = gpu.peak_tflops["bf16"]
    assert 100 <= bf16 <= 2500
    if "fp8" in gpu.peak_tflops:  # fp8 dense is twice bf16 dense; a sparsity figure would be 4x
        assert gpu.peak_tflops["fp8"] == pytest.approx(2 * bf16, rel=0.02)
    assert 0 < gpu.calibration.memory_eff <= 1 and 0 < gpu.calibration.compute_eff_max <= 1


def test_known_parameter_counts():
    # published sizes: Llama-2-7b 6.74B, Llama-3-70b 70.6B, Mixtral 46.7B total / 12.9B active
    assert load_model("llama-2-7b").param_count == pytest.approx(6.74e9, rel=0.01)
    assert load_model("llama-3-70b").param_count == pytest.approx(70.6e9, rel=0.01)
    assert load_model("llama-3.1-405b").param_count == pytest.approx(405.9e9, rel=0.01)
    mix = load_model("mixtral-8x7b")
    assert mix.param_count == pytest.approx(46.7e9, rel=0.01)
    assert mix.active_param_count == pytest.approx(12.9e9, rel=0.01)
    assert load_model("opt-13b").param_count == pytest.approx(12.85e9, rel=0.02)


def test_kv_bytes_per_token():
    m = load_model("llama-3-70b")  # 2 × 80 layers × 8 kv heads × 128 × 2 bytes = 327,680
    assert m.kv_bytes_per_token(1, 2) == 327_680
    assert m.kv_bytes_per_token(4, 2) == 327_680 / 4
    assert m.kv_bytes_per_token(16, 2) == 327_680 / 8  # at least one kv head per GPU
    assert m.kv_bytes_per_token(1, 1) == 327_680 / 2


def test_unknown_names_list_known_ones():
    with pytest.raises(ProfileError, match="h100-sxm"):
        load_gpu("h900")
    with pytest.raises(ValueError, match="llama-3-70b"):
        load_model("llama-9-1t")
    with pytest.raises(ProfileError, match="vllm"):
        load_engine("tgi")


def test_aliases_and_hf_ids():
    assert load_gpu("H100_SXM").name == "h100-sxm"
    assert load_model("meta-llama/Meta-Llama-3-70B").name == "llama-3-70b"


def test_engine_profiles():
    assert load_engine("ideal").per_step_s == 0 and load_engine("ideal").per_layer_launch_s == 0
    vllm = load_engine("vllm")
    assert 1e-4 < vllm.per_step_s < 1e-2 and vllm.per_seq_s > 0 and vllm.per_layer_launch_s > 0


def test_hf_config_json(tmp_path):
    cfg = {"_name_or_path": "org/tiny-moe", "model_type": "mixtral", "num_hidden_layers": 2,
           "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
           "intermediate_size": 128, "vocab_size": 1000, "num_local_experts": 4,
           "num_experts_per_tok": 2, "sliding_window": None, "torch_dtype": "bfloat16"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    spec = load_model(path)
    assert (spec.name, spec.head_dim, spec.num_experts, spec.top_k) == ("tiny-moe", 16, 4, 2)
    assert spec.gated_mlp and spec.sliding_window is None
    del cfg["num_hidden_layers"], cfg["_name_or_path"]
    path.write_text(json.dumps({**cfg, "n_layer": None}))
    with pytest.raises(ProfileError, match="num_hidden_layers"):
        load_model(path)


def test_names_resolve_from_another_cwd(tmp_path):
    code = ("from sim.cost.profiles import load_gpu, load_model, list_gpus;"
            "print(load_gpu('h100-sxm').hbm_gb, load_model('llama-3-70b').num_layers,"
            " len(list_gpus()))")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True, check=True).stdout.split()
    assert out[:2] == ["80.0", "80"] and int(out[2]) >= len(REQUIRED_GPUS)
