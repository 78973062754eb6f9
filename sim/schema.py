"""The experiment config schema: every key with its type, unit, default and meaning.

One table drives validation, ``--set`` typing, the generated JSON Schema
(``batchsim schema``) and the README's reference. Blocks whose contents belong to another
module (``workload``, ``policy``) are validated there, with the same dotted-path messages.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Key:
    """One config key: accepted types, default, unit and a one-line meaning."""

    types: tuple[type, ...]
    default: Any
    doc: str
    unit: str = ""
    minimum: float | None = None
    exclusive_min: bool = False
    maximum: float | None = None
    choices: tuple[Any, ...] | None = None
    required: bool = False


NUM = (int, float)
STR = (str,)
INT = (int,)
MAP = (dict,)
OPT = type(None)

SCHEMA: dict[str, Any] = {
    "name": Key(STR, "experiment", "Experiment name, used in titles and the report."),
    "description": Key(STR, "", "Free text shown in the report."),
    "seed": Key(INT, 0, "Seed of every random draw (workload generation, resampling).",
                minimum=0, maximum=2**63 - 1),
    "model": Key(STR, "llama-3-8b", "Built-in model name or path to a model YAML / HF "
                 "config.json."),
    "hardware": Key(STR, "h100-sxm", "Built-in GPU name or path to a GPU profile YAML."),
    "engine": Key(STR, "vllm", "Engine overhead profile: per-step CPU and launch overheads "
                  "(`ideal` = none)."),
    "parallelism": {
        "tp": Key(INT, 1, "Tensor-parallel degree (GPUs per replica).", minimum=1,
                  maximum=64),
        "replicas": Key(INT, 1, "Model replicas; requests are routed round-robin.", minimum=1,
                        maximum=4096),
    },
    "cost": {
        "kind": Key(STR, "roofline", "Cost model.", choices=("roofline", "constant", "linear")),
        "step_s": Key(NUM + (OPT,), None, "constant: seconds per step.", "s", 0, True),
        "base_s": Key(NUM, 0.0, "linear: fixed seconds per step.", "s", 0),
        "per_token_s": Key(NUM, 0.0, "linear: seconds per token computed.", "s", 0),
        "per_seq_s": Key(NUM, 0.0, "linear: seconds per batch row.", "s", 0),
        "weight_dtype": Key(STR, "bf16", "roofline: weight dtype (bf16, fp16, fp8, int8, int4)."),
        "kv_dtype": Key(STR, "bf16", "roofline: KV-cache dtype."),
    },
    "workload": Key(MAP, None, "Trace replay or synthetic traffic (see the README's workload "
                    "section).", required=True),
    "policy": Key(MAP + STR, None, "One policy: {name: ..., params...}."),
    "policies": Key((list,), None, "Several policies compared side by side (a sweep axis)."),
    "kv": {
        "num_blocks": Key(INT + (OPT,), None, "KV blocks per replica; default: derived from "
                          "HBM, weights and gpu_memory_utilization.", minimum=1),
        "block_size": Key(INT, 16, "Tokens per KV block.", "tokens", 1),
        "allocator": Key(STR, "paged", "paged (blocks on demand) or slab (reserve "
                         "reserve_tokens per sequence at admission).", choices=("paged", "slab")),
        "reserve_tokens": Key(INT + (OPT,), None, "slab: tokens reserved per sequence "
                              "(e.g. max_model_len).", "tokens", 1),
        "gpu_memory_utilization": Key(NUM, 0.9, "Share of HBM the engine may use.", "", 0, True),
        "activation_reserve_gb": Key(NUM + (OPT,), None, "HBM kept for activations per GPU; "
                                     "default from the cost model.", "GB", 0),
        "unlimited": Key((bool,), False, "Ignore KV capacity entirely (analytic studies)."),
        "slab_reserve": Key(STR, "max_model_len", "slab: reserve reserve_tokens per sequence "
                            "(max_model_len) or its prompt + max_output_tokens.",
                            choices=("max_model_len", "prompt_plus_max_output")),
        "max_output_tokens": Key(INT + (OPT,), None, "slab with prompt_plus_max_output: output "
                                 "tokens reserved per sequence.", "tokens", 1),
        "preemption": Key(STR, "recompute", "Out of blocks: drop the KV and recompute it, or "
                          "swap it to host memory over PCIe.", choices=("recompute", "swap")),
        "swap_gbps": Key(NUM + (OPT,), None, "swap: host link bandwidth of a replica; default "
                         "gpu.pcie_gbps × tp.", "GB/s", 0, True),
        "kv_bytes_per_token": Key(NUM + (OPT,), None, "swap: KV bytes per token of a replica; "
                                  "default from the cost model.", "B", 0, True),
        "max_preemptions": Key(INT, 64, "Reject a request preempted more often than this "
                               "(livelock guard).", "", 0),
        "prefix_caching": Key((bool,), False, "Reuse cached KV blocks of shared prompt prefixes "
                              "(requests' prefix_id / num_prefix_tokens), evicted LRU."),
    },
    "slos": {
        "ttft_ms": Key(NUM + (OPT,), None, "Per-request TTFT limit for goodput.", "ms", 0, True),
        "tpot_ms": Key(NUM + (OPT,), None, "Per-request TPOT limit for goodput.", "ms", 0, True),
        "e2el_ms": Key(NUM + (OPT,), None, "Per-request E2E limit for goodput.", "ms", 0, True),
    },
    "metrics": {
        "warmup_s": Key(NUM, 0.0, "Ignore requests arriving in the first warmup_s.", "s", 0),
        "cooldown_s": Key(NUM, 0.0, "Ignore requests arriving in the last cooldown_s.", "s", 0),
    },
    "limits": {
        "horizon_s": Key(NUM + (OPT,), None, "Stop simulated time here (partial results are "
                         "marked).", "s", 0, True),
        "wall_clock_s": Key(NUM + (OPT,), None, "Stop a run after this much real time "
                            "(partial results are marked).", "s", 0, True),
        "max_model_len": Key(INT + (OPT,), None, "Longest prompt + output a request may "
                             "reach; default the model's max_position_embeddings (vLLM's "
                             "rule); longer requests are rejected at arrival.", "tokens", 1),
    },
    "sweep": Key(MAP, None, "dotted.key: [values] — Cartesian product of runs."),
    "zip": Key(MAP, None, "dotted.key: [values] — lists of equal length varied together."),
    "output": {
        "plots": Key((bool,), True, "Draw the PNG plots."),
        "load_key": Key(STR + (OPT,), None, "Swept key used as the x axis of load plots "
                        "(default: the first swept key)."),
    },
}


def lookup(path: str) -> Key | dict[str, Any] | None:
    """The schema entry of a dotted path, or ``None`` if unknown."""
    node: Any = SCHEMA
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def json_schema() -> dict[str, Any]:
    """A JSON Schema (draft 2020-12) document generated from ``SCHEMA``."""
    names = {int: "integer", float: "number", str: "string", bool: "boolean", dict: "object",
             list: "array", type(None): "null"}

    def conv(node: Any) -> dict[str, Any]:
        if isinstance(node, dict):
            return {"type": "object", "additionalProperties": False,
                    "properties": {k: conv(v) for k, v in node.items()}}
        types = sorted({names[t] for t in node.types})
        if "integer" in types and "number" in types:
            types.remove("integer")
        out: dict[str, Any] = {"type": types[0] if len(types) == 1 else types,
                               "description": node.doc + (f" [{node.unit}]" if node.unit else "")}
        if node.default is not None:
            out["default"] = node.default
        if node.choices:
            out["enum"] = list(node.choices)
        if node.minimum is not None:
            out["exclusiveMinimum" if node.exclusive_min else "minimum"] = node.minimum
        if node.maximum is not None:
            out["maximum"] = node.maximum
        return out

    doc = conv(SCHEMA)
    doc["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    doc["title"] = "batchsim experiment"
    doc["required"] = ["workload"]
    return doc
