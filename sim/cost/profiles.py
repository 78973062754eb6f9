"""GPU, model-architecture and engine-overhead profiles, loaded from YAML (or a HF config.json).

Built-in profiles live in ``hardware_profiles/{gpus,models,engines}/<name>.yaml``. Names resolve
from any working directory: first from the source checkout next to this package, then from the
installed package data ``sim._profiles`` (pyproject maps it onto ``hardware_profiles/``). Every
number in a built-in profile carries a ``source``; unknown names raise :class:`ProfileError`
listing the known ones. Units live in field names: ``_gb`` gigabytes, ``_tbps`` terabytes/s,
``_gbps`` gigabytes/s (bytes, not bits), ``_us`` microseconds, ``_s`` seconds.
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from sim.core.errors import InputError
from sim.core.paths import PROFILE_SUFFIXES, checkout_root, names_a_file
from sim.cost.profile_schema import (
    ProfileError,
    check_engine,
    check_gpu,
    check_hf_config,
    check_model,
    read_profile_file,
)

#: Bytes per element of each supported weight / KV dtype. int4 is weight-only (AWQ/GPTQ style).
DTYPE_BYTES: Mapping[str, float] = {
    "fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5,
}

_KINDS = ("gpus", "models", "engines")
#: The config key (and ``build_cost_model`` argument) that names a profile of each kind.
_ARGUMENT = {"gpus": "hardware", "models": "model", "engines": "engine"}

__all__ = ["ProfileError"]  # defined with the profile validator, raised from here too


# --------------------------------------------------------------------------- locating files


def _roots() -> Iterator[Any]:
    """Profile roots in priority order: the source checkout, then installed package data."""
    checkout = checkout_root() / "hardware_profiles"
    if checkout.is_dir():
        yield checkout
    try:
        yield resources.files("sim._profiles")
    except (ModuleNotFoundError, TypeError):
        return


def _builtin(kind: str) -> dict[str, Any]:
    """Map of built-in profile name → file (Traversable) for one kind; first root wins."""
    found: dict[str, Any] = {}
    for root in _roots():
        folder = root.joinpath(kind)
        if not folder.is_dir():
            continue
        for entry in folder.iterdir():
            if entry.name.endswith(".yaml"):
                found.setdefault(entry.name[: -len(".yaml")], entry)
    return found


def _norm(name: str) -> str:
    """Canonical spelling of a profile name: lower case, dashes (``H100_SXM`` → ``h100-sxm``)."""
    return name.strip().lower().replace("_", "-")


def profile_file(name_or_path: str | Path) -> Path | None:
    """The file a profile argument names when it is an existing file (``./g.yaml``, a
    ``config.json``); ``None`` for a built-in name or a Hugging Face id."""
    text = str(name_or_path)
    path = Path(text).expanduser()
    if isinstance(name_or_path, Path) or names_a_file(text):
        return path if path.is_file() else None
    return None


def _read(kind: str, name_or_path: str | Path) -> tuple[dict[str, Any], str]:
    """Load the raw mapping of a profile by built-in name or file path; return it and its origin."""
    text = str(name_or_path)
    path = Path(text).expanduser()
    if isinstance(name_or_path, Path) or names_a_file(text):
        if profile_file(name_or_path) is not None:
            return read_profile_file(path), str(path)
        if kind != "models" or path.suffix in PROFILE_SUFFIXES:
            raise ProfileError(f"{kind[:-1]} profile file not found: {path}",
                               field=_ARGUMENT[kind])
    known = _builtin(kind)
    key = _norm(text)
    if key in known:
        data = yaml.safe_load(known[key].read_text(encoding="utf-8"))
        return data, f"{kind}/{key}.yaml"
    if kind == "models":  # a Hugging Face id such as meta-llama/Meta-Llama-3-70B
        for entry in known.values():
            data = yaml.safe_load(entry.read_text(encoding="utf-8"))
            if str(data.get("hf_id", "")).lower() == text.lower():
                return data, f"{kind}/{entry.name}"
    raise ProfileError(f"unknown {kind[:-1]} {text!r}; known: {', '.join(sorted(known))}",
                       field=_ARGUMENT[kind])


def list_gpus() -> list[str]:
    """Names of the built-in GPU profiles, sorted."""
    return sorted(_builtin("gpus"))


def list_models() -> list[str]:
    """Names of the built-in model architecture specs, sorted."""
    return sorted(_builtin("models"))


def list_engines() -> list[str]:
    """Names of the built-in engine overhead profiles, sorted."""
    return sorted(_builtin("engines"))


def _num(data: Mapping[str, Any], key: str, origin: str, default: Any = ...) -> Any:
    """Fetch a required (or defaulted) number from a profile, with a clear error naming it."""
    if key not in data or data[key] is None:
        if default is ...:
            raise ProfileError(f"{origin}: missing required field {key!r}")
        return default
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProfileError(f"{origin}: field {key!r} must be a number, got {value!r}")
    return value


# --------------------------------------------------------------------------- GPUs


@dataclass(frozen=True)
class Interconnect:
    """GPU-to-GPU link: datasheet bandwidth, the per-direction NCCL bus ceiling, all-reduce α."""

    type: str
    nvlink_gbps: float
    bus_bw_gbps: float
    allreduce_alpha_us: float
    alpha_per_peer_us: float = 0.0


@dataclass(frozen=True)
class Calibration:
    """Efficiency parameters of the roofline (see ``sim.cost.roofline`` for how each is used).

    ``compute_eff(m) = compute_eff_max · m / (m + compute_m_half)`` for a GEMM with ``m`` token
    rows; ``memory_eff`` scales HBM bandwidth; ``kernel_latency_us`` is the fixed floor each
    kernel pays; ``attention_*`` play the same roles for the attention kernel
    (``attention_m_half`` in new tokens per prefill row; memory efficiency and latency default to
    the GEMM ones); ``attention_row_tokens`` is the fixed per-sequence work of a decode kernel,
    in KV tokens; ``comm_eff`` scales the all-reduce bus bandwidth.
    """

    compute_eff_max: float = 0.75
    compute_m_half: float = 64.0
    memory_eff: float = 0.85
    attention_compute_eff: float = 0.5
    attention_m_half: float = 0.0
    attention_memory_eff: float | None = None
    attention_latency_us: float | None = None
    attention_row_tokens: float = 0.0
    kernel_latency_us: float = 4.0
    comm_eff: float = 0.8
    fit: Mapping[str, Any] = field(default_factory=dict)


#: The calibration states a GPU profile can declare (``calibration.status``).
CALIBRATION_STATUSES = ("fitted", "datasheet-only")


def calibration_note(gpu: GpuProfile) -> str:
    """One line saying how far ``gpu``'s numbers are measured: what they were fitted on, or a
    warning that they are datasheet peaks with hand-set efficiencies."""
    if gpu.calibration_status == "fitted":
        return f"{gpu.name}: calibrated (fitted on {gpu.calibration_data or 'measurements'})"
    return (f"WARNING: {gpu.name} is datasheet-only: peaks from the datasheet, hand-set "
            "efficiencies, never fitted to measurements (no known error)")


def calibration_notes(hardware: list[str] | tuple[str, ...]) -> list[str]:
    """``calibration_note`` of each distinct GPU named in ``hardware`` (names or paths; one that
    does not load is left out: the run itself reports that error)."""
    notes = []
    for name in dict.fromkeys(hardware):
        try:
            notes.append(calibration_note(load_gpu(name)))
        except InputError:
            continue
    return notes


@dataclass(frozen=True)
class GpuProfile:
    """One GPU: dense peaks per dtype (TFLOP/s), memory, links, price and calibration."""

    name: str
    description: str
    peak_tflops: Mapping[str, float]
    hbm_gb: float
    hbm_tbps: float
    interconnect: Interconnect
    pcie_gbps: float
    price_per_gpu_hour_usd: float | None
    calibration: Calibration
    sources: Mapping[str, str]
    origin: str = ""
    #: Device memory technology (``HBM3``, ``GDDR6``...); ``""`` when the profile omits it.
    #: ``hbm_gb`` / ``hbm_tbps`` hold the size and bandwidth of whichever memory it is.
    memory_type: str = ""
    #: ``fitted`` (efficiencies fitted to measurements, named by ``calibration_data``) or
    #: ``datasheet-only`` (hand-set efficiencies on datasheet peaks: no measured error).
    calibration_status: str = "datasheet-only"
    calibration_data: str = ""

    def peak_flops(self, dtype: str = "bf16") -> float:
        """Dense FLOP/s of one GPU for ``dtype``; weight-only formats (or a GPU without the
        dtype's tensor cores, e.g. fp8 on A100) compute in bf16, so they get the bf16 peak."""
        tflops = self.peak_tflops.get(dtype) or self.peak_tflops["bf16"]
        return float(tflops) * 1e12

    @property
    def hbm_bytes(self) -> float:
        """Device memory in bytes (decimal GB, as datasheets count)."""
        return self.hbm_gb * 1e9

    @property
    def hbm_bytes_per_s(self) -> float:
        """Datasheet memory bandwidth in bytes/s."""
        return self.hbm_tbps * 1e12


def load_gpu(name_or_path: str | Path) -> GpuProfile:
    """Load a GPU profile by built-in name (``h100-sxm``) or path to a YAML file."""
    data, origin = _read("gpus", name_or_path)
    check_gpu(data, origin, set(Calibration.__dataclass_fields__) - {"fit"})
    peaks = data["peak_tflops"]
    ic = data.get("interconnect") or {}
    cal = dict(data.get("calibration") or {})
    fit = cal.pop("fit", {}) or {}
    status = str(cal.pop("status", "fitted" if fit else "datasheet-only"))
    if status not in CALIBRATION_STATUSES:
        raise ProfileError(f"{origin}: calibration.status must be one of "
                           f"{', '.join(CALIBRATION_STATUSES)}, got {status!r}")
    fitted_on = str(cal.pop("fitted_on", fit.get("data", "")))
    known = set(Calibration.__dataclass_fields__) - {"fit"}
    if set(cal) - known:
        raise ProfileError(f"{origin}: unknown calibration keys {sorted(set(cal) - known)}; "
                           f"known: {sorted(known)}")
    return GpuProfile(
        name=str(data.get("name", Path(origin).stem)),
        description=str(data.get("description", "")),
        peak_tflops={k: float(v) for k, v in peaks.items() if v is not None},
        hbm_gb=float(_num(data, "hbm_gb", origin)),
        hbm_tbps=float(_num(data, "hbm_tbps", origin)),
        interconnect=Interconnect(
            type=str(ic.get("type", "none")),
            nvlink_gbps=float(_num(ic, "nvlink_gbps", origin, 0.0)),
            bus_bw_gbps=float(_num(ic, "bus_bw_gbps", origin, data.get("pcie_gbps", 32.0))),
            allreduce_alpha_us=float(_num(ic, "allreduce_alpha_us", origin, 10.0)),
            alpha_per_peer_us=float(_num(ic, "alpha_per_peer_us", origin, 0.0)),
        ),
        pcie_gbps=float(_num(data, "pcie_gbps", origin, 32.0)),
        price_per_gpu_hour_usd=data.get("price_per_gpu_hour_usd"),
        calibration=Calibration(**{k: float(v) for k, v in cal.items() if v is not None},
                                fit=fit),
        sources=dict(data.get("sources") or {}),
        origin=origin,
        memory_type=str(data.get("memory_type") or ""),
        calibration_status=status,
        calibration_data=fitted_on,
    )


# --------------------------------------------------------------------------- models


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer's architecture: enough to count FLOPs, weights and KV bytes."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    gated_mlp: bool = True
    num_experts: int = 1
    top_k: int = 1
    sliding_window: int | None = None
    max_position_embeddings: int | None = None
    tie_word_embeddings: bool = False
    dtype_bytes: float = 2.0
    hf_id: str = ""
    source: str = ""

    @property
    def is_moe(self) -> bool:
        """True for a mixture-of-experts MLP."""
        return self.num_experts > 1

    @property
    def attn_params_per_layer(self) -> int:
        """Q, K, V and O projection weights of one layer (biases ignored: negligible)."""
        q = self.num_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        return self.hidden_size * (q + 2 * kv) + q * self.hidden_size

    @property
    def mlp_params_per_expert(self) -> int:
        """Weights of one MLP (one expert): 3 matrices when gated (SwiGLU), else 2."""
        return (3 if self.gated_mlp else 2) * self.hidden_size * self.intermediate_size

    @property
    def params_per_layer(self) -> int:
        """All weights of one layer: attention, every expert, router, two norms."""
        router = self.hidden_size * self.num_experts if self.is_moe else 0
        return (self.attn_params_per_layer + self.num_experts * self.mlp_params_per_expert
                + router + 2 * self.hidden_size)

    @property
    def embedding_params(self) -> int:
        """Token embedding plus LM head (counted once when tied)."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    @property
    def param_count(self) -> int:
        """Total parameters (Llama-2-7b → 6.74e9)."""
        return self.num_layers * self.params_per_layer + self.embedding_params + self.hidden_size

    @property
    def active_param_count(self) -> int:
        """Parameters one token touches: only ``top_k`` experts per MoE layer."""
        idle = (self.num_experts - self.top_k) * self.mlp_params_per_expert
        return self.param_count - self.num_layers * idle

    def weight_bytes(self, dtype_bytes: float | None = None) -> float:
        """Bytes of all weights at ``dtype_bytes`` per parameter (default: the model's dtype)."""
        return self.param_count * (self.dtype_bytes if dtype_bytes is None else dtype_bytes)

    def kv_heads_per_gpu(self, tp: int = 1) -> int:
        """KV heads on each GPU: split over TP, replicated when GPUs outnumber heads."""
        return max(1, math.ceil(self.num_kv_heads / tp))

    def kv_bytes_per_token(self, tp: int = 1, kv_dtype_bytes: float = 2.0) -> float:
        """KV-cache bytes one token occupies on one GPU: 2 (K,V) × layers × heads × dim × bytes."""
        return 2.0 * self.num_layers * self.kv_heads_per_gpu(tp) * self.head_dim * kv_dtype_bytes


_NOT_GATED = {"opt", "gpt2", "gpt_neox", "gptj", "bloom", "falcon", "gpt_bigcode", "phi"}
_TORCH_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0}


def _from_hf_config(cfg: Mapping[str, Any], origin: str) -> dict[str, Any]:
    """Translate a Hugging Face ``config.json`` into ModelSpec fields."""
    def need(*keys: str) -> Any:
        for k in keys:
            if cfg.get(k) is not None:
                return cfg[k]
        raise ProfileError(f"{origin}: config.json lacks {' / '.join(keys)}")

    heads = int(need("num_attention_heads", "n_head"))
    hidden = int(need("hidden_size", "n_embd", "d_model"))
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None
    return {
        "name": str(cfg.get("_name_or_path") or Path(origin).parent.name).split("/")[-1].lower(),
        "hf_id": str(cfg.get("_name_or_path", "")),
        "num_layers": int(need("num_hidden_layers", "n_layer")),
        "hidden_size": hidden,
        "num_heads": heads,
        "num_kv_heads": int(cfg.get("num_key_value_heads") or heads),
        "head_dim": int(cfg.get("head_dim") or hidden // heads),
        "intermediate_size": int(need("intermediate_size", "ffn_dim", "n_inner")),
        "vocab_size": int(need("vocab_size")),
        "gated_mlp": cfg.get("model_type", "llama") not in _NOT_GATED,
        "num_experts": int(cfg.get("num_local_experts") or cfg.get("num_experts") or 1),
        "top_k": int(cfg.get("num_experts_per_tok") or 1),
        "sliding_window": int(window) if window else None,
        "max_position_embeddings": cfg.get("max_position_embeddings"),
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        "dtype_bytes": _TORCH_BYTES.get(str(cfg.get("torch_dtype")), 2.0),
        "source": origin,
    }


def load_model(name_or_path: str | Path) -> ModelSpec:
    """Load a model spec by built-in name (``llama-3-70b``), HF id, YAML path or config.json."""
    data, origin = _read("models", name_or_path)
    if "num_hidden_layers" in data or "n_layer" in data:
        check_hf_config(data, origin)
        data = _from_hf_config(data, origin)
    check_model(data, origin)  # every field's type and range, heads divisible by KV heads
    fields = {k: data[k] for k in ModelSpec.__dataclass_fields__ if data.get(k) is not None}
    fields.setdefault("name", Path(origin).stem)
    return ModelSpec(**fields)


# --------------------------------------------------------------------------- engines


@dataclass(frozen=True)
class EngineProfile:
    """CPU-side cost an engine adds to each step, and its collectives' framework latency.

    Every TP degree pays ``per_step_s + per_seq_s · rows + per_layer_launch_s · layers``; at
    TP > 1 the step also pays ``tp_per_step_s + tp_per_rank_s · (tp − 2) + tp_per_seq_s · rows``
    (worker RPC, synchronisation, input broadcast) and each all-reduce takes at least its
    framework-level floor ``allreduce_floor_us`` (the host's dispatch and synchronisation of a
    collective called from the framework; a mapping by GPU profile name with a ``default``, or
    one number), never less than the GPU's kernel-level time. ``calibration`` says what
    the numbers were fitted on (``status``: ``fitted``, ``derived`` or ``by-definition``)."""

    name: str
    per_step_s: float = 0.0
    per_seq_s: float = 0.0
    per_layer_launch_s: float = 0.0
    description: str = ""
    sources: Mapping[str, str] = field(default_factory=dict)
    tp_per_step_s: float = 0.0
    tp_per_rank_s: float = 0.0
    tp_per_seq_s: float = 0.0
    allreduce_floor_us: Mapping[str, float] = field(default_factory=dict)
    calibration: Mapping[str, Any] = field(default_factory=dict)

    def overhead_terms(self, tp: int) -> tuple[float, float, float]:
        """``(per step s, per sequence s, per layer s)`` at TP degree ``tp``."""
        if tp <= 1:
            return self.per_step_s, self.per_seq_s, self.per_layer_launch_s
        return (self.per_step_s + self.tp_per_step_s + self.tp_per_rank_s * (tp - 2),
                self.per_seq_s + self.tp_per_seq_s, self.per_layer_launch_s)

    def allreduce_floor_s(self, gpu: str, tp: int) -> float:
        """The least time one all-reduce of ``tp`` GPUs named ``gpu`` takes (s); 0 at TP 1."""
        if tp <= 1:
            return 0.0
        floor = self.allreduce_floor_us
        return float(floor.get(gpu, floor.get("default", 0.0))) * 1e-6


_ENGINE_NUMBERS = ("per_step_s", "per_seq_s", "per_layer_launch_s", "tp_per_step_s",
                   "tp_per_rank_s", "tp_per_seq_s")


def _floor_map(data: Mapping[str, Any], origin: str) -> dict[str, float]:
    """``allreduce_floor_us`` of an engine profile as ``{gpu or "default": µs}``."""
    raw = data.get("allreduce_floor_us")
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raw = {"default": raw}
    return {str(k): float(_num(raw, k, f"{origin}: allreduce_floor_us")) for k in raw}


def engine_name(name_or_path: str | Path) -> str:
    """The profile name ``name_or_path`` loads (an alias gives its target), or the text itself
    when it does not load."""
    try:
        return load_engine(name_or_path).name
    except InputError:
        return str(name_or_path)


def load_engine(name_or_path: str | Path = "ideal") -> EngineProfile:
    """Load an engine profile by name (``vllm-v0``, ``vllm-v1``, ``trtllm``, ``sglang``,
    ``ideal``) or YAML path. A profile that is only ``alias_of: OTHER`` (``vllm`` names
    ``vllm-v0``, so configs written before the engine generations keep running) loads OTHER."""
    data, origin = _read("engines", name_or_path)
    for _ in range(4):  # an alias names a profile; a short chain at most, never a loop
        check_engine(data, origin)
        target = data.get("alias_of")
        if target is None:
            break
        extra = sorted(set(data) - {"alias_of", "name", "description", "sources"})
        if extra:  # an alias cannot also change numbers: they would be silently ignored
            raise ProfileError(f"an alias profile holds only alias_of (and name, description,"
                               f" sources); also given: {', '.join(extra)}", source=origin,
                               field="alias_of")
        data, origin = _read("engines", str(target))
    else:
        raise ProfileError(f"{origin}: alias_of chain too long (a loop?)")
    numbers = {k: float(_num(data, k, origin, 0.0)) for k in _ENGINE_NUMBERS}
    return EngineProfile(
        name=str(data.get("name", Path(origin).stem)),
        description=str(data.get("description", "")),
        sources=dict(data.get("sources") or {}),
        calibration=dict(data.get("calibration") or {}),
        allreduce_floor_us=_floor_map(data, origin),
        **numbers,
    )
