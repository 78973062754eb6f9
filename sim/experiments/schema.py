"""The experiment config schema: every key with its type, unit, default and meaning.

One table drives validation, ``--set`` typing, the generated JSON Schema
(``batchsim schema``) and the docs' configuration reference. Blocks whose contents belong to another
module (``workload``, ``policy``) are validated there, with the same dotted-path messages.
"""
from __future__ import annotations

from typing import Any

from sim.core.fields import INT, MAP, NUM, OPT, STR, Key
from sim.cost.roofline import DEFAULT_ENGINE
from sim.kv.config import KV_FIELDS
from sim.metrics.stream import STEP_TABLE_CHOICES

SCHEMA: dict[str, Any] = {
    "name": Key(STR, "experiment", "Experiment name, used in titles and the report."),
    "description": Key(STR, "", "Free text shown in the report."),
    "seed": Key(INT, 0, "Seed of every random draw (workload generation, resampling).",
                minimum=0, maximum=2**63 - 1),
    "model": Key(STR, "llama-3-8b", "Built-in model name or path to a model YAML / HF "
                 "config.json."),
    "hardware": Key(STR, "h100-sxm", "Built-in GPU name or path to a GPU profile YAML."),
    "engine": Key(STR, DEFAULT_ENGINE, "Engine overhead profile: per-step CPU and launch overheads "
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
    "workload": Key(MAP, None, "Trace replay or synthetic traffic (see traces/README.md "
                    "for its forms).", required=True),
    "policy": Key(MAP + STR, None, "One policy: {name: ..., params...}."),
    "policies": Key((list,), None, "Several policies compared side by side (a sweep axis)."),
    "kv": KV_FIELDS,
    "slos": {
        "ttft_ms": Key(NUM + (OPT,), None, "Per-request TTFT limit for goodput.", "ms", 0, True),
        "tpot_ms": Key(NUM + (OPT,), None, "Per-request TPOT limit for goodput.", "ms", 0, True),
        "e2el_ms": Key(NUM + (OPT,), None, "Per-request E2E limit for goodput.", "ms", 0, True),
    },
    "metrics": {
        "warmup_s": Key(NUM, 0.0, "Ignore requests arriving in the first warmup_s.", "s", 0),
        "cooldown_s": Key(NUM, 0.0, "Ignore requests arriving in the last cooldown_s.", "s", 0),
        "step_table": Key(STR, "auto", "Per-step table: `full` (one row per step), `buckets` "
                          "(fixed time buckets of sums, counts and maxima; flat memory) or "
                          "`auto` (full up to 2,000,000 steps). Summaries are exact either "
                          "way.", choices=STEP_TABLE_CHOICES),
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
