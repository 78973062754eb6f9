"""Prediction intervals of a run's summary metrics: calibration uncertainty plus seed noise.

Each of ``draws`` replicas of the run gets its own seed (the workload's sampling noise: new
arrivals and lengths) and its own step-time scale ``s = exp(σ z)`` from the cost model's
calibration uncertainty (:mod:`sim.cost.uncertainty`); the interval of a metric is the
``(1 − level) / 2`` and ``(1 + level) / 2`` quantiles over the replicas, written as
``<metric>_lo`` and ``<metric>_hi`` next to the point estimate (the seed-``seed`` run with
``s = 1``). Draws are deterministic in ``seed``.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from sim.core.types import Request
from sim.cost.roofline import RooflineCost
from sim.cost.uncertainty import scaled, step_sigma
from sim.engine.simulate import simulate

#: The summary metrics that get an interval.
INTERVAL_METRICS = tuple(f"{q}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el")
                         for q in ("median", "p90", "p99")) + (
    "request_throughput", "output_throughput")


def summary_with_intervals(requests: Callable[[int], Sequence[Request]], policy: Any,
                           cost: RooflineCost, kv: Any = "auto", seed: int = 0,
                           draws: int = 16, level: float = 0.9,
                           sigma: float | None = None) -> dict[str, float]:
    """The summary of the seed-``seed`` run plus ``_lo`` / ``_hi`` of ``INTERVAL_METRICS``.

    ``requests(seed)`` builds the workload of one seed; ``sigma`` overrides the cost model's
    calibration σ (0: seed noise only)."""
    if draws < 2 or not 0 < level < 1:
        raise ValueError("need draws >= 2 and 0 < level < 1")
    base = simulate(requests(seed), policy, cost, kv, seed=seed).summary
    sig = step_sigma(cost) if sigma is None else sigma
    z = np.random.default_rng([seed, 0x1F1DE]).standard_normal(draws)
    values: dict[str, list[float]] = {m: [] for m in INTERVAL_METRICS}
    for k in range(draws):
        s = simulate(requests(seed + 1 + k), policy, scaled(cost, float(np.exp(sig * z[k]))),
                     kv, seed=seed + 1 + k).summary
        for m in INTERVAL_METRICS:
            values[m].append(float(s[m]))
    out = dict(base)
    lo_q, hi_q = (1 - level) / 2, (1 + level) / 2
    for m, v in values.items():
        arr = np.asarray(v, float)
        out[f"{m}_lo"] = float(min(np.nanquantile(arr, lo_q), base[m]))
        out[f"{m}_hi"] = float(max(np.nanquantile(arr, hi_q), base[m]))
    out["interval_sigma"] = sig
    return out


def capacity_with_interval(requests: Callable[[float, int], Sequence[Request]], policy: Any,
                           cost: RooflineCost, passes: Callable[[dict[str, Any]], bool],
                           start: float, kv: Any = "auto", seed: int = 0, draws: int = 8,
                           level: float = 0.9, tolerance: float = 0.05,
                           sigma: float | None = None) -> dict[str, float]:
    """The highest rate whose run ``passes`` (``sim.experiments.capacity.search``), with an
    interval: the point search runs seed ``seed`` at ``s = 1``; each of ``draws`` searches runs
    its own seed and step-time scale (as ``summary_with_intervals``), and ``max_rate_lo`` /
    ``max_rate_hi`` are the quantiles of their results. ``requests(rate, seed)`` builds the
    workload at one rate."""
    from sim.experiments.capacity import search

    if draws < 2 or not 0 < level < 1:
        raise ValueError("need draws >= 2 and 0 < level < 1")

    def best(c: RooflineCost, s: int) -> float:
        def evaluate(rates: list[float], phase: str) -> list[bool]:
            return [passes(simulate(requests(r, s), policy, c, kv, seed=s).summary)
                    for r in rates]

        return search(start, tolerance, 1, evaluate).rate

    sig = step_sigma(cost) if sigma is None else sigma
    z = np.random.default_rng([seed, 0xCA9]).standard_normal(draws)
    point = best(cost, seed)
    rates = np.array([best(scaled(cost, float(np.exp(sig * z[k]))), seed + 1 + k)
                      for k in range(draws)])
    lo_q, hi_q = (1 - level) / 2, (1 + level) / 2
    return {"max_rate": point,
            "max_rate_lo": float(min(np.nanquantile(rates, lo_q), point)),
            "max_rate_hi": float(max(np.nanquantile(rates, hi_q), point)),
            "interval_sigma": sig}
