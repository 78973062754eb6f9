"""A model's architecture (``ModelSpec``): from a built-in YAML, a path or a HF ``config.json``.

Enough of the architecture to count FLOPs, weight bytes and KV bytes per token: layers, hidden
size, attention and KV heads, MLP width (gated or not, experts), vocabulary, dtype.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.cost.profile_files import read_raw
from sim.cost.profile_schema import ProfileError, check_hf_config, check_model


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
    data, origin = read_raw("models", name_or_path)
    if "num_hidden_layers" in data or "n_layer" in data:
        check_hf_config(data, origin)
        data = _from_hf_config(data, origin)
    check_model(data, origin)  # every field's type and range, heads divisible by KV heads
    fields = {k: data[k] for k in ModelSpec.__dataclass_fields__ if data.get(k) is not None}
    fields.setdefault("name", Path(origin).stem)
    return ModelSpec(**fields)
