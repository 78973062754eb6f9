"""The standing adversarial suite for inputs: every way a user can hand batchsim a bad value.

Corpora checked through the loader or validator directly (fast) and a few end to end through
the CLI: the schema-driven mutation of every key of the experiment schema and of every
workload form with a set of bad values (each either runs or is one ``InputError`` naming the
key, never another exception), workloads with finite-but-huge numbers, and the Python API
misused. Broken profile, trace and calibration files are ``test_adversarial_files.py``'s. A
value that a key accepts is fine; a crash, a traceback-worthy exception or a message that does
not say which key is at fault is not.
"""
from __future__ import annotations

import copy
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

import sim
from sim.core.arrays import TraceArrays
from sim.core.errors import InputError
from sim.core.fields import MAX_INT, Key
from sim.core.types import BatchShape, StepCost
from sim.experiments.config import expand_runs
from sim.experiments.runner import simulate_config
from sim.experiments.schema import SCHEMA
from sim.kv.capacity import kv_capacity
from sim.workload.build import build_workload_arrays

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
    ({**_SYNTH, "priority": 1e308}, r"workload\.priority: expected int, got float 1e\+308"),
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
    ({"horizon_s": -1}, r"^horizon_s: must be > 0"),
    ({"horizon_s": 0}, r"^horizon_s: must be > 0"),
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
    ({"policy": {"name": "continuous", "max_num_batched_tokens": 1e30}},  # a float: no int
     r"^policy\.max_num_batched_tokens: expected int, got float 1e\+30$"),
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
    # a subclass is user code: it runs on the general engine (the compiled interpreter would
    # ignore its overrides), and every method of it an engine may call is checked
    from sim.cost.checked import checked_cost

    res = sim.simulate(_reqs(), "continuous", _Aggregate(0.01), fast_path=fast_path)
    assert res.engine == "general" and "cost model" in res.engine_reason
    with pytest.raises(InputError, match=r"^cost: _Aggregate\.decode_step returned .* of nan"):
        checked_cost(_Aggregate(0.01)).decode_step(1, 10, 10, 10)


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
    # a misspelt name suggests the closest built-ins (a short one is near several)
    ({"hardware": "h100"}, r"^hardware: unknown gpu 'h100' \(did you mean 'h200', 'h100-sxm' "
     r"or 'h100-pcie'\?\); known: "),
    ({"model": "llama-3-8"}, r"^model: unknown model 'llama-3-8' \(did you mean 'llama-3-8b'"),
    ({"model": None}, r"^model: expected a built-in model name or a profile file path, got "
     r"None$"),
    ({"hardware": "./missing.yaml"}, r"^hardware: gpu profile file not found"),
    ({"tp": 0}, r"^tp: must be a positive integer"),
    ({"tp": "2"}, r"^tp: must be a positive integer"),
    ({"tp": 3}, r"^tp: llama-3-8b: 32 attention heads do not split over tp=3$"),
    ({"weight_dtype": "fp7"}, r"^weight_dtype: 'fp7' is not one of fp32, bf16, fp16, fp8, int8, "
     r"int4 \(did you mean 'fp8'\?\)$"),
    ({"kv_dtype": ["fp8"]}, r"^kv_dtype: \['fp8'\] is not one of"),
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


def test_a_tp_the_heads_cannot_split_over_names_parallelism_tp(tmp_path, capsys):
    """From the YAML the TP error names ``parallelism.tp`` (it named ``model/hardware``)."""
    from sim.cli.main import main

    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump({**BASE, "parallelism": {"tp": 3}}))
    assert main(["run", str(exp), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    assert capsys.readouterr().err == (f"batchsim: error: {exp}: parallelism.tp: llama-3-8b: "
                                       "32 attention heads do not split over tp=3\n")


@pytest.mark.parametrize(("make", "message"), [
    (lambda: sim.ConstantCost(step_s="a"), r"^cost\.step_s: expected a number of seconds, "
     r"got 'a'$"),
    (lambda: sim.ConstantCost(step_s="0.01"), r"^cost\.step_s: expected a number"),
    (lambda: sim.ConstantCost(step_s=True), r"^cost\.step_s: expected a number"),
    (lambda: sim.LinearCost(base_s=0.01, per_token_s=None), r"^cost\.per_token_s: expected "
     r"a number of seconds, got None$"),
])
def test_analytic_cost_models_take_numbers_of_seconds_only(make, message):
    """``ConstantCost("a")`` was a ``ValueError`` from ``float``, and ``"0.01"`` or ``True``
    were taken as numbers, which the YAML's ``cost.step_s`` refuses."""
    with pytest.raises(InputError, match=message):
        make()
    assert sim.ConstantCost(step_s=np.float32(0.5)).step_s == 0.5


@pytest.mark.parametrize(("new_tokens", "context_lens", "message"), [
    ("a", "b", r"^new_tokens: expected a 1-D list of integer token counts, got \['a'\]$"),
    ([float("nan")], [1], r"^new_tokens: expected a 1-D list of integer token counts"),
    ([2.5], [8], r"^new_tokens: expected a 1-D list of integer token counts, got \[2\.5\]"),
    ([1], [None], r"^context_lens: expected a 1-D list of integer token counts"),
    ([1], [10**30], r"^context_lens: expected a 1-D list of integer token counts"),
    ([True], [1], r"^new_tokens: expected a 1-D list of integer token counts"),
    ([512.0, 1], [512, 900], r"^new_tokens: expected a 1-D list of integer token counts"),
])
def test_step_time_takes_whole_token_counts_only(new_tokens, context_lens, message):
    """``cost.step_time`` (``BatchShape.of``): a string or NaN was a numpy ValueError, and 2.5
    new tokens silently cost as 2; 512.0 is refused as an integer key's 64.0 is."""
    cost = sim.build_cost_model(model="llama-3-8b", hardware="h100-sxm")
    with pytest.raises(InputError, match=message):
        cost.step_time(new_tokens=new_tokens, context_lens=context_lens)
    # integers only, as every integer key (``sim.core.fields.check_int``): numpy ints count
    assert cost.step_time(new_tokens=np.array([512, 1], np.int32),
                          context_lens=[512, 900]) == cost.step_time(new_tokens=[512, 1],
                                                                     context_lens=[512, 900])


# --------------------------------------------------------------------------- end to end

def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    entry = "import sys; from sim.cli.main import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", entry, *args], capture_output=True,
                          text=True, cwd=cwd, timeout=120, check=False)


def test_cli_prints_one_line_and_exits_2(tmp_path):
    """A few reproductions end to end: the CLI prints the InputError and exits 2."""
    gpu = {**yaml.safe_load((PROFILES / "gpus" / "h100-sxm.yaml").read_text()),
           "hbm_gb": float("nan")}
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
