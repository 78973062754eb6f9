"""Scaled-down reproductions: each experiment YAML, run small, keeps its qualitative result.

Every test loads the real experiment file, keeps one or two sweep points and a few hundred
requests (``expand_runs`` overrides), simulates in memory and checks the ordering of the
policies and the direction of each published gain — never a published number. The full-size
runs and their numbers are in docs/chapter7.md and docs/reproductions.md.
"""
from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import pytest

from sim.experiments.config import expand_runs, load_yaml
from sim.experiments.runner import simulate_config

EXPERIMENTS = Path(__file__).resolve().parent.parent / "experiments"


@cache
def results(name: str, sweep: tuple[tuple[str, tuple], ...],
            overrides: tuple[str, ...] = ()) -> dict[tuple, object]:
    """Simulate ``experiments/<name>.yaml`` with ``sweep`` replacing its sweep (zip kept).

    Returns ``{(label, *swept values in sweep order, *zipped values): SimResult}``.
    """
    path = EXPERIMENTS / f"{name}.yaml"
    raw = load_yaml(path)
    raw["sweep"] = {k: list(v) for k, v in sweep}
    if raw.get("zip"):  # a key may be varied by sweep or zip, not both: the sweep's wins here
        raw["zip"] = {k: v for k, v in raw["zip"].items() if k not in raw["sweep"]}
    _, runs = expand_runs(raw, list(overrides), source=str(path))
    out = {}
    for spec in runs:
        key = (spec.label, *spec.swept.values())
        out[key] = simulate_config(spec.config, path.parent)
    return out


def test_every_experiment_validates() -> None:
    """The six YAMLs load, validate and expand (a typo would fail the full runs later)."""
    for name in ("chapter7", "repro_anyscale", "repro_orca", "repro_sarathi",
                 "repro_distserve", "repro_vllm_kv"):
        path = EXPERIMENTS / f"{name}.yaml"
        _, runs = expand_runs(load_yaml(path), source=str(path))
        assert runs, name


def test_chapter7_policy_story() -> None:
    """Past static's capacity: continuous serves more, wastes no padding, uses more FLOPs;
    chunked prefill keeps the p99 inter-token gap below continuous batching's stalls."""
    rate = "workload.arrival.rate"
    r = results("chapter7", ((rate, (4.0,)),), ("workload.num_requests=300",))
    s = {k[0]: v.summary for k, v in r.items()}
    static, dynamic, cont = s["static"], s["dynamic"], s["continuous"]
    chunked = s["chunked_prefill-512"]
    assert cont["request_throughput"] > 2 * static["request_throughput"]
    assert cont["request_throughput"] > 2 * dynamic["request_throughput"]
    assert static["padding_fraction"] > 0.3 and cont["padding_fraction"] == 0.0
    assert cont["mfu"] > 2 * static["mfu"]
    assert cont["p99_ttft_ms"] < static["p99_ttft_ms"] / 10
    # Run-to-completion batches are never interrupted by prefills: the steadiest TPOT...
    assert static["p99_tpot_ms"] < cont["p99_tpot_ms"]
    # ...and chunked prefill removes continuous batching's decode stalls.
    assert chunked["p99_itl_ms"] < cont["p99_itl_ms"] / 2
    assert chunked["median_ttft_ms"] > cont["median_ttft_ms"]


def test_anyscale_throughput_ordering() -> None:
    """naive static < optimized static < continuous (slab) < continuous (paged), 40GB A100
    where KV memory binds, and paged beats slab for continuous batching on both GPUs."""
    cap = (("workload.output_tokens.mean", (128,)), ("workload.output_tokens.max", (128,)))
    r = results("repro_anyscale", (("hardware", ("a100-80gb", "a100-40gb")),
                                   ("kv.allocator", ("slab", "paged")), *cap),
                ("workload.num_requests=150",))
    tput = {(k[0], k[1], k[2]): v.summary["output_throughput"] for k, v in r.items()}
    for hw in ("a100-80gb", "a100-40gb"):
        naive = tput[("naive-static", hw, "slab")]
        assert tput[("continuous", hw, "slab")] > naive
        assert tput[("continuous", hw, "paged")] > tput[("continuous", hw, "slab")]
        assert tput[("optimized-static", hw, "paged")] > naive
    hw = "a100-80gb"
    assert (tput[("naive-static", hw, "slab")] < tput[("optimized-static", hw, "slab")]
            < tput[("continuous", hw, "slab")] < tput[("continuous", hw, "paged")])


def test_orca_iteration_level_beats_request_level() -> None:
    """At a load above FasterTransformer-style batching's capacity, Orca serves it all with a
    lower normalized latency (E2E / output tokens)."""
    rate = "workload.arrival.rate"
    r = results("repro_orca", ((rate, (8.0,)),), ("workload.num_requests=300",))
    s = {k[0]: v for k, v in r.items()}

    def norm_latency(res: object) -> float:
        q = res.requests[res.requests["status"] == "finished"]
        return float(np.median(q["e2e_s"] / q["num_output_tokens"]))

    for ft in ("ft-bs8", "ft-bs32"):
        assert s["orca"].summary["request_throughput"] > s[ft].summary["request_throughput"]
        assert norm_latency(s["orca"]) < norm_latency(s[ft])


def test_sarathi_chunked_prefill_tames_tbt() -> None:
    """Same load: chunked prefill's P99 TBT meets the 100 ms SLO that vLLM-style prefill-first
    scheduling breaks, at the price of a longer median TTFT."""
    rate = "workload.arrival.rate"
    r = results("repro_sarathi", ((rate, (4.0,)),), ("workload.num_requests=300",))
    s = {k[0]: v.summary for k, v in r.items()}
    assert s["sarathi-serve"]["p99_itl_ms"] <= 100 < s["vllm"]["p99_itl_ms"]
    assert s["sarathi-serve"]["median_ttft_ms"] > s["vllm"]["median_ttft_ms"]


def test_distserve_attainment_falls_with_load() -> None:
    """Colocated continuous batching meets the TTFT/TPOT SLOs at light load, not at heavy."""
    rate = "workload.arrival.rate"
    r = results("repro_distserve", ((rate, (1.0, 6.0)),), ("workload.num_requests=300",))
    att = {k[1]: v.summary["slo_attainment"] for k, v in r.items()}
    assert att[1.0] >= 0.9 > att[6.0]


@pytest.mark.parametrize("hardware", ["a100-40gb", "a100-80gb"])
def test_vllm_kv_paging_raises_live_fraction_and_throughput(hardware: str) -> None:
    """Slab reservation leaves most held KV empty; paging fills it and serves more."""
    r = results("repro_vllm_kv", (("hardware", (hardware,)), ("kv.allocator", ("slab", "paged")),
                                  ("workload.arrival.rate", (8.0,))),
                ("workload.num_requests=300",))
    s = {k[2]: v.summary for k, v in r.items()}
    assert s["slab"]["mean_kv_live_fraction"] < 0.5
    assert s["paged"]["mean_kv_live_fraction"] > 0.9
    assert s["paged"]["request_throughput"] > 1.2 * s["slab"]["request_throughput"]
