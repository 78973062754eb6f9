"""The standing adversarial suite for inputs: every way a user can hand batchsim a bad value.

Four corpora, each checked through the loader or validator directly (fast) and a few end to
end through the CLI: the schema-driven mutation of every key of the experiment schema with a
set of bad values (each either runs or is one ``InputError`` naming the key, never another
exception), workloads with finite-but-huge numbers, the Python API misused, and broken
profile, trace and calibration files. A value that a key accepts is fine; a crash, a
traceback-worthy exception or a message that does not say which key is at fault is not.
"""
from __future__ import annotations

import copy
import json
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml

import sim
from sim.core.arrays import TraceArrays
from sim.core.errors import InputError
from sim.core.fields import MAX_INT, Key
from sim.core.types import BatchShape, StepCost
from sim.cost.calibrate import CalibrationError, calibrate
from sim.cost.iteration_calibration import fit_iterations
from sim.cost.profiles import ProfileError, load_engine, load_gpu, load_model
from sim.experiments.config import expand_runs
from sim.experiments.runner import simulate_config
from sim.experiments.schema import SCHEMA
from sim.kv.capacity import kv_capacity
from sim.workload.build import build_workload_arrays
from sim.workload.traces import TraceError, load_trace_arrays

REPO = Path(__file__).resolve().parents[1]
PROFILES = REPO / "hardware_profiles"

#: A tiny valid experiment (three requests on the default roofline) every mutation starts from.
BASE: dict[str, Any] = {"workload": {
    "arrival": {"rate": 10.0}, "num_requests": 3,
    "prompt_tokens": {"dist": "fixed", "value": 8},
    "output_tokens": {"dist": "fixed", "value": 4}}}

#: Bad values of every kind: wrong types, non-finite, negative, zero, fractional, huge.
BAD_VALUES: list[Any] = [
    "x", "", True, [], [1], {}, {"a": 1}, None, float("nan"), float("inf"), -float("inf"),
    -1, 0, 1.5, -1e-300, 1e308, 10**30, -(10**30), 2**63, 2**40]


def _leaves(node: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted paths of every ``Key`` in a schema block."""
    out = []
    for key, value in node.items():
        if isinstance(value, Key):
            out.append(prefix + key)
        else:
            out.extend(_leaves(value, f"{prefix}{key}."))
    return out


def _set(data: dict[str, Any], path: str, value: Any) -> None:
    parts = path.split(".")
    for part in parts[:-1]:
        data = data.setdefault(part, {})
    data[parts[-1]] = value


#: Keys whose message may name them differently: each entry of ``policies`` is a policy spec.
_NAMED_AS = {"policies": ("policies", "policy")}


@pytest.mark.parametrize("path", _leaves(SCHEMA))
def test_every_schema_key_runs_or_names_itself_for_every_bad_value(path):
    names = _NAMED_AS.get(path, (path,))
    for value in BAD_VALUES:
        raw = copy.deepcopy(BASE)
        _set(raw, path, copy.deepcopy(value))
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # no overflow in the metrics either
            try:
                _, runs = expand_runs(raw, source="exp.yaml")
                for run in runs:
                    simulate_config(run.config, None)
            except InputError as e:
                assert any(n in str(e) for n in names), f"{path}={value!r}: {e}"
            except Exception as e:  # noqa: BLE001 - what the test is about
                pytest.fail(f"{path}={value!r}: {type(e).__name__}: {e}")


# --------------------------------------------------------------------------- workloads

def _workload(spec: dict[str, Any]) -> TraceArrays:
    return build_workload_arrays(spec, np.random.default_rng(0))


_SYNTH = BASE["workload"]


@pytest.mark.parametrize(("spec", "message"), [
    # #3: caps checked before anything is drawn (these used to allocate gigabytes)
    ({"conversations": {"num_conversations": 3, "turns": [1, 1_000_000_000]}},
     r"workload\.conversations\.turns: \[lo, hi\] needs 1 <= lo <= hi <= 1,000"),
    ({"conversations": {"num_conversations": 10**12}},
     r"workload\.conversations\.num_conversations: expected an integer in \(0, 20,000,000\]"),
    ({"conversations": {"num_conversations": 100_000, "turns": [1, 1000]}},
     r"may reach 100,000,000 requests, more than 20,000,000"),
    ({"conversations": {"num_conversations": 3, "user_tokens": {"median": 9, "sigma": 1e308}}},
     r"workload\.conversations\.user_tokens\.sigma: must be a number in \[0, 10\]"),
    ({"conversations": {"num_conversations": 3, "output_tokens": 10**9}},
     r"workload\.conversations\.output_tokens: must be in \[1, 10,000,000\]"),
    ({"conversations": {"num_conversations": 3, "rate": 1e-300}},
     r"workload\.conversations\.rate: turns arrive until .* beyond 1e\+09 s"),
    ({"conversations": {"num_conversations": 3, "think_time_s": 1e308}},
     r"workload\.conversations\.think_time_s: expected a number in"),
    # #9: finite-but-huge numbers are bounded, not OverflowError
    ({**_SYNTH, "priority": 1e308}, r"workload\.priority: must be <="),
    ({**_SYNTH, "priority": 10**30}, r"workload\.priority: must be <="),
    ({**_SYNTH, "arrival": {"process": "gamma", "rate": 1.0, "cv": 1e308}},
     r"workload\.arrival\.cv: must be <= 100"),
    ({**_SYNTH, "arrival": {"process": "gamma", "rate": 1.0, "cv": 1e-300}},
     r"workload\.arrival\.cv: must be >= 1e-06"),
    ({**_SYNTH, "prompt_tokens": {"dist": "lognormal", "median": 9, "sigma": 1e308}},
     r"workload\.prompt_tokens\.sigma: must be <= 10"),
    ({**_SYNTH, "arrival": {"rate": 1e308}}, r"workload\.arrival\.rate: must be <= 1e\+09"),
])
def test_workload_bounds_are_checked_before_anything_is_drawn(spec, message):
    with pytest.raises(InputError, match=message):
        _workload(spec)


_FIXED = {"dist": "fixed", "value": 8}
#: Valid workloads of every form, with the keys of each that the mutation below changes.
WORKLOAD_FORMS: dict[str, tuple[dict[str, Any], list[str]]] = {
    "synthetic": ({"arrival": {"process": "gamma", "rate": 10.0, "cv": 2.0}, "num_requests": 3,
                   "duration_s": 100.0, "prompt_tokens": {"dist": "uniform", "lo": 2, "hi": 9,
                                                          "min": 1, "max": 50},
                   "output_tokens": {"dist": "lognormal", "median": 5, "sigma": 1.0},
                   "priority": 1, "tenant": "a"},
                  ["arrival", "arrival.process", "arrival.rate", "arrival.cv", "num_requests",
                   "duration_s", "prompt_tokens", "prompt_tokens.dist", "prompt_tokens.lo",
                   "prompt_tokens.hi", "prompt_tokens.min", "prompt_tokens.max",
                   "output_tokens.median", "output_tokens.sigma", "priority", "tenant"]),
    "means": ({"arrival": {"rate": 10.0}, "num_requests": 3,
               "prompt_tokens": {"dist": "exponential", "mean": 5.0},
               "output_tokens": {"dist": "lognormal", "mean": 5, "sigma": 1.0}},
              ["prompt_tokens.mean", "output_tokens.mean"]),
    "joint": ({"arrival": {"rate": 10.0}, "num_requests": 3,
               "lengths": {"dist": "empirical", "trace": "sample", "max_prompt_tokens": 100,
                           "max_output_tokens": 100}},
              ["lengths", "lengths.dist", "lengths.trace", "lengths.max_prompt_tokens",
               "lengths.max_output_tokens"]),
    "trace": ({"trace": "sample", "sort": False, "start_s": 0.0, "duration_s": 1000.0,
               "max_requests": 50, "rate": 2.0, "max_prompt_tokens": 1000,
               "max_output_tokens": 1000},
              ["trace", "sort", "start_s", "duration_s", "max_requests", "rate",
               "max_prompt_tokens", "max_output_tokens"]),
    "time_scale": ({"trace": "sample", "time_scale": 2.0}, ["time_scale"]),
    "superposed": ({"mix": [{"arrival": {"rate": 5.0}, "num_requests": 3,
                             "prompt_tokens": _FIXED, "output_tokens": _FIXED}],
                    "duration_s": 100.0}, ["mix", "mix.0", "duration_s"]),
    "fractions": ({"arrival": {"rate": 5.0}, "num_requests": 4, "max_requests": 3,
                   "mix": [{"fraction": 0.5, "prompt_tokens": _FIXED, "output_tokens": _FIXED},
                           {"fraction": 0.5, "trace": "sample"}]},
                  ["max_requests", "mix.0.fraction", "mix.1.trace"]),
    "conversations": ({"conversations": {
        "num_conversations": 3, "rate": 1.0, "turns": [1, 3],
        "user_tokens": {"median": 20, "sigma": 1.0}, "output_tokens": 5, "think_time_s": 2.0,
        "max_context_tokens": 500}},
        ["conversations", *(f"conversations.{k}" for k in (
            "num_conversations", "rate", "turns", "user_tokens", "user_tokens.sigma",
            "user_tokens.median", "output_tokens", "think_time_s", "max_context_tokens"))]),
}


def _set_in(data: Any, path: str, value: Any) -> None:
    """Set a dotted path whose numeric parts index lists (``mix.0.fraction``)."""
    *parents, last = path.split(".")
    for part in parents:
        data = data[int(part)] if isinstance(data, list) else data[part]
    if isinstance(data, list):
        data[int(last)] = value
    else:
        data[last] = value


@pytest.mark.parametrize("form", WORKLOAD_FORMS)
def test_every_workload_key_builds_or_names_itself_for_every_bad_value(form):
    """Each bad value builds, or is one ``InputError`` naming the key or a block enclosing it
    (a rule across keys, like fractions summing to 1, names the block)."""
    spec, paths = WORKLOAD_FORMS[form]
    _workload(spec)  # the unchanged form is valid
    for path in paths:
        parts = path.split(".")
        # workload.a.b, workload.a (not the bare workload); list indices as [i]
        names = ["workload" + "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in parts[:k])
                 for k in range(1, len(parts) + 1)]
        for value in BAD_VALUES:
            changed = copy.deepcopy(spec)
            _set_in(changed, path, copy.deepcopy(value))
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                try:
                    _workload(changed)
                except InputError as e:
                    assert any(n in str(e) for n in names), f"{path}={value!r}: {e}"
                except Exception as e:  # noqa: BLE001 - what the test is about
                    pytest.fail(f"{path}={value!r}: {type(e).__name__}: {e}")


def test_conversations_within_the_caps_still_build():
    arr = _workload({"conversations": {"num_conversations": 5, "turns": [1, 1000],
                                       "user_tokens": {"median": 9, "sigma": 0}}})
    assert len(arr) >= 5 and (arr.num_prompt_tokens >= 9).all()


# --------------------------------------------------------------------------- Python API

def _reqs(**change: Any) -> list[sim.Request]:
    fields = {"id": 0, "arrival_s": 0.0, "num_prompt_tokens": 8, "num_output_tokens": 4}
    return [sim.Request(**{**fields, **change})]


COST = sim.ConstantCost(0.01)


class _Returns:
    """A user's cost model (only ``step``) whose every step takes ``seconds``."""

    peak_flops = None
    peak_bytes_per_s = None

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def step(self, shape: BatchShape) -> StepCost:
        return StepCost(self.seconds)


class _Aggregate(sim.ConstantCost):
    """A subclass of a built-in model whose fast-path method is broken."""

    def decode_step(self, rows: int, kv_tokens: int, c_min: int, c_max: int
                    ) -> tuple[float, float, float, str]:
        return float("nan"), 0.0, 0.0, "broken"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"requests": _reqs(num_output_tokens=0)}, r"^requests\[0\]\.num_output_tokens: must be"),
    ({"requests": _reqs(num_output_tokens=-3)}, r"^requests\[0\]\.num_output_tokens: must be"),
    ({"requests": _reqs(num_prompt_tokens=0)}, r"^requests\[0\]\.num_prompt_tokens: must be"),
    ({"requests": _reqs(num_prompt_tokens=8.0)}, r"^requests\[0\]\.num_prompt_tokens: must"),
    ({"requests": _reqs(num_prompt_tokens="8")}, r"^requests\[0\]\.num_prompt_tokens: must"),
    ({"requests": _reqs(num_prompt_tokens=10**9)},
     r"^requests\[0\]\.num_prompt_tokens: must be at most 10,000,000"),
    ({"requests": _reqs(arrival_s=-5.0)}, r"^requests\[0\]\.arrival_s: must be"),
    ({"requests": _reqs(arrival_s=float("inf"))}, r"^requests\[0\]\.arrival_s: must be"),
    ({"requests": _reqs(arrival_s=1e300)}, r"^requests\[0\]\.arrival_s: must be at most 1e"),
    ({"requests": TraceArrays(np.zeros(3), np.ones(2, np.int64), np.ones(3, np.int64))},
     r"^num_prompt_tokens: must have one value per request"),
    ({"requests": TraceArrays(np.zeros(2), np.ones(3, np.int64), np.ones(3, np.int64))},
     r"^num_prompt_tokens: must have one value per request"),
    ({"requests": None}, r"^requests: expected a sequence of Request or a TraceArrays"),
    ({"requests": [{"id": 0}]}, r"^requests\[0\]: expected a Request, got dict"),
    ({"requests": TraceArrays(np.zeros((2, 2)), np.ones(2, np.int64), np.ones(2, np.int64))},
     r"^arrival_s: must be a 1-D array"),
    ({"cost": None}, r"^cost: expected a cost model"),
    ({"cost": "roofline"}, r"^cost: expected a cost model"),
    ({"num_replicas": "2"}, r"^num_replicas: expected int"),
    ({"num_replicas": 0}, r"^num_replicas: must be >= 1"),
    ({"seed": -1}, r"^seed: must be >= 0"),
    ({"kv": 5}, r"^kv: expected a mapping, a KVConfig or None"),
    ({"policy": 5}, r"^policy: expected a mapping with a 'name' key"),
    ({"slos": {"foo_ms": 5}},
     r"^slos\.foo_ms: unknown key .*; accepted: ttft_ms, tpot_ms, e2el_ms$"),
    ({"slos": {"ttft_ms": -1}}, r"^slos\.ttft_ms: must be > 0"),
    ({"slos": [5]}, r"^slos: expected a mapping"),
    ({"warmup_s": float("nan")}, r"^warmup_s: must be finite"),
    ({"cooldown_s": 1e308}, r"^cooldown_s: must be <="),
    ({"horizon_s": float("nan")}, r"^horizon_s: must be finite"),
    ({"horizon_s": -1}, r"^horizon_s: must be >= 0"),
    ({"wall_clock_s": "5"}, r"^wall_clock_s: expected"),
    ({"max_model_len": 0}, r"^max_model_len: must be >= 1"),
    ({"kv": {"block_size": "16"}}, r"^kv\.block_size: expected int"),
    ({"kv": {"num_blocks": 100.7}}, r"^kv\.num_blocks: expected int"),
    # #15: integers the compiled kernel cannot hold, and an 8 TiB block table
    ({"kv": {"num_blocks": 100, "block_size": 2**40}}, r"^kv\.block_size: must be <= 65536"),
    ({"kv": {"num_blocks": 2**50}}, r"^kv\.num_blocks: must be <="),
    ({"kv": {"num_blocks": 100, "max_preemptions": 10**30}},
     r"^kv\.max_preemptions: must be at most 2\*\*53"),
    ({"policy": {"name": "continuous", "max_num_seqs": 10**30}},
     r"^policy\.max_num_seqs: must be at most 2\*\*53"),
    ({"policy": {"name": "continuous", "max_num_batched_tokens": 1e30}},
     r"^policy\.max_num_batched_tokens: must be at most 2\*\*53"),
    # a user's cost model: NaN, negative or infinite step times are errors, not latencies
    ({"cost": _Returns(float("nan"))}, r"^cost: _Returns\.step returned a step time of nan s"),
    ({"cost": _Returns(-1.0)}, r"^cost: _Returns\.step returned a step time of -1\.0 s"),
    ({"cost": _Returns(float("inf"))}, r"^cost: _Returns\.step returned .* of inf s"),
])
@pytest.mark.parametrize("fast_path", [True, False, "compiled"])
def test_api_misuse_is_one_input_error(kwargs, message, fast_path):
    args = {"requests": _reqs(), "policy": "continuous", "cost": COST, **kwargs}
    with pytest.raises(InputError, match=message):
        sim.simulate(args.pop("requests"), args.pop("policy"), args.pop("cost"),
                     fast_path=fast_path, **args)


@pytest.mark.parametrize("fast_path", [True, "compiled"])
def test_a_broken_fast_path_method_of_a_builtin_subclass_is_caught(fast_path):
    # a subclass is user code: it is checked (and not run by the compiled kernel, which would
    # ignore its override)
    with pytest.raises(InputError, match=r"^cost: _Aggregate\.decode_step returned .* of nan"):
        sim.simulate(_reqs(), "continuous", _Aggregate(0.01), fast_path=fast_path)


def test_the_yaml_and_the_api_share_one_rule_and_message():
    """The same bad value gives the same words from a YAML key and the Python argument."""
    for block, key, value in (("kv", "block_size", 0), ("kv", "gpu_memory_utilization", 5),
                              ("limits", "horizon_s", -1), ("slos", "ttft_ms", 0),
                              ("metrics", "warmup_s", float("inf"))):
        raw = copy.deepcopy(BASE)
        _set(raw, f"{block}.{key}", value)
        with pytest.raises(InputError) as yaml_error:
            expand_runs(raw, source="exp.yaml")
        arg = {"kv": {"kv": {key: value}}, "slos": {"slos": {key: value}}}.get(
            block, {key: value})
        with pytest.raises(InputError) as api_error:
            sim.simulate(_reqs(), "continuous", sim.build_cost_model("llama-3-8b", "h100-sxm"),
                         **arg)
        assert api_error.value.problem == str(yaml_error.value).rsplit(": ", 1)[-1]


def test_a_valid_user_cost_model_still_runs_exactly():
    res = sim.simulate(_reqs(), "continuous", _Returns(0.25))
    assert res.summary["num_unfinished"] == 0
    assert res.requests["finish_s"].tolist() == [4 * 0.25]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"block_size": 0}, r"^block_size: must be >= 1"),
    ({"gpu_memory_utilization": 5}, r"^gpu_memory_utilization: must be <= 1"),
    ({"gpu_memory_utilization": float("nan")}, r"^gpu_memory_utilization: must be finite"),
    ({"gpu_memory_utilization": -0.5}, r"^gpu_memory_utilization: must be > 0"),
])
def test_kv_capacity_takes_the_kv_blocks_rules(kwargs, message):
    with pytest.raises(InputError, match=message):
        kv_capacity("llama-3-8b", "h100-sxm", **kwargs)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"hardware": "nosuch"}, r"^hardware: unknown gpu 'nosuch'"),
    ({"model": "nosuch"}, r"^model: unknown model 'nosuch'"),
    ({"engine": "nosuch"}, r"^engine: unknown engine 'nosuch'"),
    ({"hardware": "./missing.yaml"}, r"^hardware: gpu profile file not found"),
    ({"tp": 0}, r"tp must be a positive integer"),
    ({"tp": "2"}, r"tp must be a positive integer"),
    ({"weight_dtype": "fp7"}, r"unknown weight_dtype 'fp7'"),
    # the cost-parameter overrides: an efficiency of 0 divided by zero, NaN went through
    ({"memory_eff": 0}, r"^memory_eff: must be > 0"),
    ({"memory_eff": float("nan")}, r"^memory_eff: must be finite"),
    ({"compute_eff_max": -1}, r"^compute_eff_max: must be > 0"),
    ({"kernel_latency_s": "x"}, r"^kernel_latency_s: expected"),
    ({"per_step_s": 1e308}, r"^per_step_s: must be <= 86400"),
])
def test_build_cost_model_misuse_is_one_input_error(kwargs, message):
    """Names, TP, dtypes and parameter overrides of ``sim.build_cost_model``."""
    args = {"model": "llama-3-8b", "hardware": "h100-sxm", **kwargs}
    with pytest.raises(InputError, match=message):
        sim.build_cost_model(**args)


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
    path.write_text(yaml.safe_dump({**_builtin("engines", "vllm"), **change}))
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

    assert set(schema.GPU_FIELDS) == names(GpuProfile) - {"origin"}
    assert set(schema.INTERCONNECT_FIELDS) == names(Interconnect)
    assert set(schema.MODEL_FIELDS) == names(ModelSpec)
    assert set(schema.ENGINE_FIELDS) == names(EngineProfile)


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


# --------------------------------------------------------------------------- end to end

def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    entry = "import sys; from sim.cli.main import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", entry, *args], capture_output=True,
                          text=True, cwd=cwd, timeout=120, check=False)


def test_cli_prints_one_line_and_exits_2(tmp_path):
    """A few reproductions end to end: the CLI prints the InputError and exits 2."""
    gpu = {**_builtin("gpus", "h100-sxm"), "hbm_gb": float("nan")}
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(gpu))
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump({**BASE, "hardware": "./g.yaml"}))
    cases = [(["run", "exp.yaml", "--out", "out", "--quiet"], "hbm_gb: must be finite"),
             (["profiles", "--model", "llama-3-8b", "--hardware", "h100-sxm",
               "--gpu-memory-utilization", "5"], "gpu_memory_utilization: must be <= 1"),
             (["profiles", "--model", "llama-3-8b", "--hardware", "h100-sxm",
               "--block-size", "0"], "block_size: must be >= 1")]
    for args, message in cases:
        done = _cli(*args, cwd=tmp_path)
        assert done.returncode == 2, (args, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], (args, done.stderr)


def test_integers_at_the_caps_run_in_the_compiled_kernel_exactly():
    """#15: the largest integers the keys accept run, compiled as interpreted, bit for bit."""
    n = 2000
    trace = TraceArrays(np.linspace(0.0, 10.0, n), np.full(n, 50, np.int64),
                        np.full(n, 20, np.int64))
    cases = [({"name": "continuous", "max_num_seqs": MAX_INT,
               "max_num_batched_tokens": MAX_INT}, {"num_blocks": 10_000,
                                                    "max_preemptions": MAX_INT}),
             ({"name": "continuous"}, {"num_blocks": 2**40, "block_size": 65536}),
             ({"name": "continuous", "max_num_seqs": 64}, {"num_blocks": 300,
                                                            "max_preemptions": MAX_INT})]
    for policy, kv in cases:
        finish = [sim.simulate(trace, policy, COST, kv=kv, fast_path=fast, max_model_len=MAX_INT)
                  .requests["finish_s"].to_numpy() for fast in ("compiled", "interpreted")]
        assert np.array_equal(*finish)


def test_max_int_is_within_the_kernels_int64_range():
    assert MAX_INT * (1 << 9) < 2**63  # room for a sum or a product with a small factor
