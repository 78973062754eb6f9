"""The one validator of every profile file: GPU, model (YAML or a Hugging Face config.json) and
engine-overhead profiles, built-in or a user's own.

Each format is a table of typed ``Key`` (``sim.core.fields``: types, bounds, required) checked
by the same ``check_value`` the experiment schema uses, so ``hbm_gb: .nan``, ``peak_tflops:
{bf16: 0}``, an engine ``per_step_s: -1``, ``num_layers: 31.5`` or ``dtype_bytes: two`` are each
one ``ProfileError`` naming the file and the field, before any arithmetic divides by them.
``read_profile_file`` turns unreadable files, YAML errors and YAML tags into the same kind of
one-line error (with the line). A Hugging Face ``config.json`` is checked on the keys batchsim
reads from it (the rest of such a file is the model's business), then translated and checked
as a model profile.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from sim.core.errors import InputError
from sim.core.fields import INT, MAP, NUM, OPT, STR, Key, check_value, unknown_key


class ProfileError(InputError):
    """A profile is unknown, malformed, or cannot serve the requested configuration."""


BOOL = (bool,)
#: Largest plausible value of a hardware figure (TFLOP/s, GB, TB/s, GB/s, µs): a units slip
#: beyond it (bytes for gigabytes) would only produce nonsense.
_HUGE = 1e7
#: Longest per-step CPU overhead an engine profile may add (a day, as a cost model's step).
_MAX_OVERHEAD_S = 86_400.0


def _pos(doc: str, unit: str = "", required: bool = False) -> Key:
    """A finite number > 0 (at most ``_HUGE``)."""
    return Key(NUM, None, doc, unit, 0, True, _HUGE, required=required)


def _nonneg(doc: str, unit: str = "", maximum: float = _HUGE) -> Key:
    """A finite number >= 0, or null (the loader's default)."""
    return Key(NUM + (OPT,), None, doc, unit, 0, False, maximum)


_TEXT = Key(STR + (OPT,), None, "free text")
_SOURCES = Key(MAP + (OPT,), None, "where each figure comes from")

#: GPU profile (``hardware_profiles/gpus/*.yaml``, ``hardware: ./g.yaml``).
GPU_FIELDS: dict[str, Any] = {
    "name": _TEXT, "description": _TEXT, "sources": _SOURCES,
    "peak_tflops": Key(MAP, None, "dense peak per dtype", "TFLOP/s", required=True),
    "hbm_gb": _pos("device memory", "GB", required=True),
    "hbm_tbps": _pos("memory bandwidth", "TB/s", required=True),
    "memory_type": Key(STR + (OPT,), None, "device memory technology (HBM3, GDDR6, ...)"),
    "pcie_gbps": Key(NUM + (OPT,), None, "host link", "GB/s", 0, True, _HUGE),
    "price_per_gpu_hour_usd": _nonneg("price", "USD/h"),
    "interconnect": Key(MAP + (OPT,), None, "GPU-to-GPU link"),
    "calibration": Key(MAP + (OPT,), None, "roofline efficiencies"),
}
INTERCONNECT_FIELDS: dict[str, Key] = {
    "type": _TEXT,
    "nvlink_gbps": _nonneg("datasheet link bandwidth", "GB/s"),
    "bus_bw_gbps": Key(NUM + (OPT,), None, "NCCL bus bandwidth", "GB/s", 0, True, _HUGE),
    "allreduce_alpha_us": _nonneg("all-reduce latency", "us"),
    "alpha_per_peer_us": _nonneg("all-reduce latency per peer", "us"),
}
#: Calibration values that scale a rate: 0 would divide by zero.
_EFFICIENCIES = ("compute_eff_max", "memory_eff", "attention_compute_eff",
                 "attention_memory_eff", "comm_eff")

#: Model architecture (``hardware_profiles/models/*.yaml``, ``model: ./m.yaml``).
MODEL_FIELDS: dict[str, Key] = {
    "name": _TEXT, "hf_id": _TEXT, "source": _TEXT,
    **{k: Key(INT, None, doc, minimum=1, maximum=1 << 24, required=True) for k, doc in (
        ("num_layers", "decoder layers"), ("hidden_size", "model width"),
        ("num_heads", "attention heads"), ("num_kv_heads", "KV heads"),
        ("head_dim", "per-head width"), ("intermediate_size", "MLP width"),
        ("vocab_size", "vocabulary"))},
    "gated_mlp": Key(BOOL + (OPT,), None, "SwiGLU-style 3-matrix MLP"),
    "num_experts": Key(INT + (OPT,), None, "MLP experts (1: dense)", minimum=1, maximum=4096),
    "top_k": Key(INT + (OPT,), None, "experts per token", minimum=1, maximum=4096),
    "sliding_window": Key(INT + (OPT,), None, "attention window", "tokens", 1),
    "max_position_embeddings": Key(INT + (OPT,), None, "context limit", "tokens", 1),
    "tie_word_embeddings": Key(BOOL + (OPT,), None, "LM head shares the embedding"),
    "dtype_bytes": Key(NUM + (OPT,), None, "bytes per weight", "B", 0, True, 8),
}

#: The keys of a Hugging Face ``config.json`` batchsim reads (others are not looked at).
HF_FIELDS: dict[str, Key] = {
    **{k: Key(INT + (OPT,), None, k, minimum=1, maximum=1 << 24) for k in (
        "num_attention_heads", "n_head", "hidden_size", "n_embd", "d_model",
        "num_hidden_layers", "n_layer", "num_key_value_heads", "head_dim", "intermediate_size",
        "ffn_dim", "n_inner", "vocab_size", "num_local_experts", "num_experts",
        "num_experts_per_tok", "sliding_window", "max_position_embeddings")},
    "tie_word_embeddings": Key(BOOL + (OPT,), None, "LM head shares the embedding"),
    "use_sliding_window": Key(BOOL + (OPT,), None, "whether sliding_window applies"),
    "model_type": _TEXT, "torch_dtype": _TEXT, "_name_or_path": _TEXT,
}

#: Engine overhead profile (``hardware_profiles/engines/*.yaml``, ``engine: ./e.yaml``).
ENGINE_FIELDS: dict[str, Key] = {
    "name": _TEXT, "description": _TEXT, "sources": _SOURCES,
    **{k: _nonneg(doc, "s", _MAX_OVERHEAD_S) for k, doc in (
        ("per_step_s", "CPU time per step"), ("per_seq_s", "CPU time per batch row"),
        ("per_layer_launch_s", "launch time per layer"),
        ("tp_per_step_s", "extra CPU time per step at TP > 1 (worker RPC, input broadcast)"),
        ("tp_per_rank_s", "extra CPU time per step per TP rank beyond two"),
        ("tp_per_seq_s", "extra CPU time per batch row at TP > 1"))},
    "allreduce_floor_us": Key(NUM + MAP + (OPT,), None, "framework-level all-reduce latency "
                              "floor, one number or {gpu: us, default: us}", "us"),
    "calibration": Key(MAP + (OPT,), None, "what the profile was fitted on, and its error"),
    "alias_of": Key(STR + (OPT,), None, "another engine profile this name stands for"),
}
#: Calibration entries of a GPU profile that describe the fit rather than set a parameter.
GPU_CALIBRATION_NOTES: dict[str, Key] = {
    "status": Key(STR + (OPT,), None, "fitted or datasheet-only",
                  choices=("fitted", "datasheet-only", None)),
    "fitted_on": _TEXT,
}


def read_profile_file(path: Path) -> dict[str, Any]:
    """The mapping in a profile file (JSON for ``.json``, else YAML with safe loading only)."""
    try:
        raw = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ProfileError("not valid UTF-8 text (binary file?)", source=str(path)) from None
    except OSError as e:
        raise ProfileError(f"cannot read: {e.strerror or e}", source=str(path)) from None
    try:
        data = json.loads(raw) if path.suffix == ".json" else yaml.safe_load(raw)
    except json.JSONDecodeError as e:
        raise ProfileError(f"invalid JSON (line {e.lineno}): {e.msg}", source=str(path)) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ProfileError(f"invalid YAML{where}: {problem}", source=str(path)) from None
    except (ValueError, RecursionError) as e:  # an integer too long to convert, deep nesting
        raise ProfileError(f"cannot parse: {str(e).splitlines()[0] or type(e).__name__}",
                           source=str(path)) from None
    if not isinstance(data, dict):
        raise ProfileError("expected a mapping at the top level", source=str(path))
    return data


def check_table(data: Mapping[str, Any], table: Mapping[str, Key], origin: str,
                prefix: str = "", strict: bool = True) -> None:
    """Check the keys of ``data`` present in ``table`` (unknown keys refused if ``strict``)."""
    for key, value in data.items():
        path = f"{prefix}{key}"
        node = table.get(key) if isinstance(key, str) else None
        if node is None:
            if strict:
                raise _located(unknown_key(str(key), table, path), origin)
            continue
        if value is None and node.required:
            continue  # reported as missing below
        try:
            check_value(value, node, path)
        except InputError as e:
            raise _located(e, origin) from None
    for key, node in table.items():
        if node.required and data.get(key) is None:
            raise ProfileError("missing required field", source=origin, field=f"{prefix}{key}")


def check_gpu(data: Mapping[str, Any], origin: str, calibration_keys: set[str]) -> None:
    """Check a GPU profile mapping; ``calibration_keys`` are the ``Calibration`` fields."""
    check_table(data, GPU_FIELDS, origin)
    peaks = data["peak_tflops"]
    if "bf16" not in peaks or peaks["bf16"] is None:
        raise ProfileError("must give at least 'bf16'", source=origin, field="peak_tflops")
    check_table(peaks, {str(k): _pos("dense peak", "TFLOP/s") for k in peaks if peaks[k]
                        is not None}, origin, "peak_tflops.")
    check_table(data.get("interconnect") or {}, INTERCONNECT_FIELDS, origin, "interconnect.")
    cal = {k: v for k, v in (data.get("calibration") or {}).items() if k != "fit"}
    table: dict[str, Key] = {k: (Key(NUM + (OPT,), None, k, "", 0, True, _HUGE)
                                 if k in _EFFICIENCIES else _nonneg(k, maximum=float("inf")))
                             for k in sorted(calibration_keys - set(GPU_CALIBRATION_NOTES))}
    check_table(cal, {**table, **GPU_CALIBRATION_NOTES}, origin, "calibration.")


def check_model(data: Mapping[str, Any], origin: str) -> None:
    """Check a model spec mapping (after any ``config.json`` translation)."""
    check_table(data, MODEL_FIELDS, origin)
    if data["num_heads"] % data["num_kv_heads"]:
        raise ProfileError(f"must be a multiple of num_kv_heads ({data['num_kv_heads']}), got "
                           f"{data['num_heads']}", source=origin, field="num_heads")
    experts, top_k = data.get("num_experts") or 1, data.get("top_k") or 1
    if top_k > experts:
        raise ProfileError(f"must be <= num_experts ({experts}), got {top_k}", source=origin,
                           field="top_k")


def check_hf_config(data: Mapping[str, Any], origin: str) -> None:
    """Check the keys of a Hugging Face ``config.json`` that batchsim reads."""
    check_table(data, HF_FIELDS, origin, strict=False)


def check_engine(data: Mapping[str, Any], origin: str) -> None:
    """Check an engine overhead profile mapping."""
    check_table(data, ENGINE_FIELDS, origin)


def check_overrides(overrides: Mapping[str, Any]) -> None:
    """Check ``build_cost_model``'s cost-parameter overrides: numbers >= 0 (an efficiency
    > 0: it divides), ``inf`` only where a parameter means "no limit" (``*_split_tokens``)."""
    for name, value in overrides.items():
        efficiency = name in _EFFICIENCIES or name.endswith("_eff")
        top = (None if name.endswith("_split_tokens") else
               _MAX_OVERHEAD_S if name.endswith("_s") else _HUGE)  # seconds: at most a day
        key = Key(NUM, None, name, "", 0, efficiency, top)
        if name.endswith("_split_tokens") and value == float("inf"):
            continue
        try:
            check_value(value, key, name)
        except InputError as e:
            raise ProfileError(e.problem, field=e.field) from None


def _located(error: InputError, origin: str) -> ProfileError:
    """``error`` as a ``ProfileError`` naming the profile file."""
    return ProfileError(error.problem, source=origin, field=error.field)
