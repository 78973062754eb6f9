"""Replay measured benchmark runs through batchsim; compare; fit engine overheads to them.

``replay`` simulates a :class:`~sim.experiments.bench_results.BenchRun`'s requests (same
lengths, same or drawn arrivals) on a named model, GPU, TP degree and engine profile;
``compare`` puts measured and simulated p50 / p90 / p99 TTFT, TPOT, ITL and E2E and the
throughputs side by side with the error of each. ``fit_engine`` fits an engine profile's
per-step and per-sequence overheads (at TP 1 ``per_step_s`` / ``per_seq_s``; at TP > 1
``tp_per_step_s`` / ``tp_per_seq_s``, the TP 1 terms held) so the simulated mean TPOT of every
run matches the measured one: Gauss-Newton steps on ``Δ mean TPOT ≈ Δ per_step + Δ per_seq ·
rows``, with ``rows`` the token-weighted mean batch size of the run's decode steps.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from policies import DEFAULT_POLICY
from sim.core.errors import InputError
from sim.core.fields import check_value
from sim.cost.profiles import EngineProfile, load_engine
from sim.cost.roofline import build_cost_model
from sim.engine.inputs import SEED
from sim.engine.simulate import SimResult, simulate
from sim.experiments.bench_results import BenchRun

#: The metrics ``compare`` reports, as (name, measured-array getter, summary key prefix).
_LATENCIES = ("ttft", "tpot", "itl", "e2el")
_PCTS = (("p50", "median"), ("p90", "p90"), ("p99", "p99"))


def replay(run: BenchRun, model: str, hardware: str, tp: int = 1,
           engine: str | EngineProfile = "vllm-v0", policy: dict[str, Any] | None = None,
           seed: int = 0) -> SimResult:
    """Simulate ``run``'s requests (vLLM-style continuous batching unless ``policy``)."""
    seed = check_value(seed, SEED, "--seed")  # before it draws arrivals (numpy's own error)
    cost = build_cost_model(model, hardware, tp, engine=engine)
    return simulate(run.requests(seed), policy or {"name": DEFAULT_POLICY}, cost, seed=seed)


def measured(run: BenchRun) -> dict[str, float]:
    """The measured side of ``compare``: percentiles (ms) and throughputs."""
    itl = np.concatenate([g for g in run.itls_s if len(g)]) if any(
        len(g) for g in run.itls_s) else np.zeros(0)
    values = {"ttft": run.ttft_s, "tpot": run.tpot_s, "itl": itl, "e2el": run.e2e_s}
    out = {}
    for name, arr in values.items():
        for label, q in zip(("p50", "p90", "p99"), (50, 90, 99), strict=True):
            out[f"{label}_{name}_ms"] = float(np.percentile(arr, q) * 1e3) if len(arr) else \
                float("nan")
        out[f"mean_{name}_ms"] = float(arr.mean() * 1e3) if len(arr) else float("nan")
    arrival = run.arrivals()
    span = run.duration_s or float((arrival + run.e2e_s).max() - arrival.min())
    out["request_throughput"] = len(run.prompt_tokens) / span
    out["output_throughput"] = float(run.output_tokens.sum()) / span
    return out


def simulated(result: SimResult) -> dict[str, float]:
    """The simulated side of ``compare``, from the run's summary."""
    s = result.summary
    out = {f"{label}_{name}_ms": float(s[f"{key}_{name}_ms"])
           for name in _LATENCIES for label, key in _PCTS}
    out.update({f"mean_{name}_ms": float(s[f"mean_{name}_ms"]) for name in _LATENCIES})
    out["request_throughput"] = float(s["request_throughput"])
    out["output_throughput"] = float(s["output_throughput"])
    return out


def compare(run: BenchRun, result: SimResult) -> list[tuple[str, float, float, float]]:
    """``(metric, measured, simulated, error %)`` rows (error = simulated / measured − 1)."""
    meas, sim_ = measured(run), simulated(result)
    keys = [f"{label}_{name}_ms" for name in _LATENCIES for label, _ in _PCTS]
    keys += ["request_throughput", "output_throughput"]
    return [(k, meas[k], sim_[k], (sim_[k] / meas[k] - 1) * 100 if meas[k] else float("nan"))
            for k in keys]


def comparison_table(source: str, rows: list[tuple[str, float, float, float]]) -> str:
    """Markdown table of ``compare`` rows."""
    lines = [f"`{source}`", "", "| metric | measured | simulated | error % |",
             "|---|---|---|---|"]
    lines += [f"| {k} | {m:.4g} | {s:.4g} | {e:+.1f} |" for k, m, s, e in rows]
    return "\n".join(lines)


def _decode_rows(result: SimResult) -> float:
    """Token-weighted mean rows of the run's steps that produce decode tokens."""
    st = result.steps
    w = st["num_decode_tokens"].to_numpy(float)
    return float((w * st["num_seqs"].to_numpy(float)).sum() / w.sum()) if w.sum() else 0.0


def fit_engine(runs: list[BenchRun], model: str, hardware: str, tp: int = 1,
               engine: str = "vllm-v0", seed: int = 0, iterations: int = 8
               ) -> tuple[EngineProfile, list[dict[str, float]]]:
    """Fit the overhead terms of ``engine`` (see the module docstring) to ``runs``; return the
    fitted profile and, per run, the measured and final simulated mean TPOT (ms)."""
    if not runs:
        raise InputError("no benchmark runs to fit", field="--engine-from")
    base = load_engine(engine)
    keys = ("per_step_s", "per_seq_s") if tp == 1 else ("tp_per_step_s", "tp_per_seq_s")
    target = np.array([float(np.mean(r.tpot_s)) for r in runs])
    theta = np.array([getattr(base, k) for k in keys], float)
    prof = base
    for _ in range(iterations):
        prof = replace(base, name=f"{base.name}-fitted", **dict(zip(keys, theta, strict=True)))
        results = [replay(r, model, hardware, tp, prof, seed=seed) for r in runs]
        sim_tpot = np.array([float(res.summary["mean_tpot_ms"]) * 1e-3 for res in results])
        resid = target - sim_tpot
        if np.all(np.abs(resid) <= 1e-4 * target):
            break
        jac = np.column_stack([np.ones(len(runs)), [_decode_rows(r) for r in results]])
        step, *_ = np.linalg.lstsq(jac, resid, rcond=None)
        theta = np.maximum(theta + step, 0.0)  # overheads are never negative
    report = [{"measured_mean_tpot_ms": t * 1e3, "simulated_mean_tpot_ms": s * 1e3}
              for t, s in zip(target, sim_tpot, strict=True)]
    return prof, report


def engine_yaml(profile: EngineProfile, sources: list[str], model: str, hardware: str,
                tp: int) -> str:
    """An engine profile YAML of ``profile`` (what ``calibrate --engine-from`` writes)."""
    import yaml

    numbers = {k: getattr(profile, k) for k in (
        "per_step_s", "per_seq_s", "per_layer_launch_s", "tp_per_step_s", "tp_per_rank_s",
        "tp_per_seq_s")}
    data: dict[str, Any] = {"name": profile.name, "description": profile.description,
                            **{k: float(f"{v:.6g}") for k, v in numbers.items()}}
    if profile.allreduce_floor_us:
        data["allreduce_floor_us"] = dict(profile.allreduce_floor_us)
    fitted = "per_step_s, per_seq_s" if tp == 1 else "tp_per_step_s, tp_per_seq_s"
    data["calibration"] = {"status": "fitted", "data": ", ".join(sources),
                           "range": dict(profile.calibration.get("range") or {})}
    data["sources"] = {"calibration": f"batchsim calibrate --engine-from on {model} / "
                       f"{hardware} / tp {tp}: {fitted} fitted to the runs' mean TPOT; the "
                       "other terms are the base profile's", **dict(profile.sources)}
    return yaml.safe_dump(data, sort_keys=False, width=100)
