"""The experiment config schema: every key with its type, unit, default and meaning.

One table drives validation, ``--set`` typing, the generated JSON Schema
(``batchsim schema``) and the docs' configuration reference. Blocks whose contents belong to another
module (``workload``, ``policy``) are validated there, with the same dotted-path messages.
"""
from __future__ import annotations

from typing import Any

from sim.core.fields import INT, MAP, NUM, OPT, STR, Key
from sim.cost.defaults import DEFAULT_ENGINE, DEFAULT_HARDWARE, DEFAULT_MODEL
from sim.cost.profiles import DTYPE_BYTES
from sim.engine.inputs import LIMIT_FIELDS, REPLICAS, SEED
from sim.experiments.intervals import INTERVAL_FIELDS
from sim.kv.config import KV_FIELDS
from sim.metrics.fields import SLO_FIELDS, WINDOW_FIELDS
from sim.metrics.stream import STEP_TABLE_CHOICES

SCHEMA: dict[str, Any] = {
    "name": Key(STR, "experiment", "Experiment name, used in titles and the report."),
    "description": Key(STR, "", "Free text shown in the report."),
    "seed": SEED,
    "model": Key(STR, DEFAULT_MODEL, "Built-in model name or path to a model YAML / HF "
                 "config.json."),
    "hardware": Key(STR, DEFAULT_HARDWARE, "Built-in GPU name or path to a GPU profile YAML."),
    "engine": Key(STR, DEFAULT_ENGINE, "Engine profile by generation (CPU overheads, TP terms, "
                  "collective floor): `vllm-v0`, `vllm-v1`, `trtllm`, `sglang`, `ideal` (none); "
                  "`vllm` = `vllm-v0`; or a path to an engine YAML."),
    "parallelism": {
        "tp": Key(INT, 1, "Tensor-parallel degree (GPUs per replica).", minimum=1,
                  maximum=64),
        "replicas": REPLICAS,
    },
    "cluster": Key(MAP + (OPT,), None, "Heterogeneous deployment: {groups: [{name, replicas, "
                   "hardware, tp, engine, policy, kv, weight}, ...]}; a key a group leaves out "
                   "takes the experiment's (see docs/routing.md). Replaces "
                   "parallelism.replicas."),
    "router": Key(MAP + STR + (OPT,), None, "Which replica each request joins: {name: ..., "
                  "params...} (see docs/routing.md); default round robin by arrival order."),
    "cost": {
        "kind": Key(STR, "roofline", "Cost model.", choices=("roofline", "constant", "linear")),
        "step_s": Key(NUM + (OPT,), None, "constant: seconds per step.", "s", 0, True),
        "base_s": Key(NUM, 0.0, "linear: fixed seconds per step.", "s", 0),
        "per_token_s": Key(NUM, 0.0, "linear: seconds per token computed.", "s", 0),
        "per_seq_s": Key(NUM, 0.0, "linear: seconds per batch row.", "s", 0),
        "weight_dtype": Key(STR, "bf16", "roofline: weight dtype.", choices=tuple(DTYPE_BYTES)),
        "kv_dtype": Key(STR, "bf16", "roofline: KV-cache dtype.", choices=tuple(DTYPE_BYTES)),
    },
    "workload": Key(MAP, None, "Trace replay or synthetic traffic (see traces/README.md "
                    "for its forms).", required=True),
    "policy": Key(MAP + STR, None, "One policy: {name: ..., params...}."),
    "policies": Key((list,), None, "Several policies compared side by side (a sweep axis)."),
    "kv": KV_FIELDS,
    "slos": SLO_FIELDS,
    "metrics": {
        **WINDOW_FIELDS,
        "step_table": Key(STR, "auto", "Per-step table: `full` (one row per step), `buckets` "
                          "(fixed time buckets of sums, counts and maxima; flat memory) or "
                          "`auto` (full up to 2,000,000 steps). Summaries are exact either "
                          "way.", choices=STEP_TABLE_CHOICES),
    },
    "limits": LIMIT_FIELDS,
    "intervals": INTERVAL_FIELDS,
    "sweep": Key(MAP + (OPT,), None, "dotted.key: [values] — Cartesian product of runs."),
    "zip": Key(MAP + (OPT,), None, "dotted.key: [values] — lists of equal length varied "
               "together."),
    "output": {
        "plots": Key((bool,), True, "Draw the PNG plots."),
        "load_key": Key(STR + (OPT,), None, "Swept key used as the x axis of load plots "
                        "(default: the first swept key); a key of `sweep:` or `zip:`."),
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
