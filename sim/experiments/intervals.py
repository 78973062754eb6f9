"""Prediction intervals of a run's summary metrics: calibration uncertainty plus seed noise.

Draw ``k`` (``k = 0 .. draws - 1``) of a run with seed ``seed`` is a replica of the run with
seed ``seed + 1 + k`` (the workload's sampling noise: new arrivals and lengths, new policy
randomness) and its own per-operator-class step-time factors (the cost model's calibration
uncertainty, :mod:`sim.cost.uncertainty`, drawn from ``draw_uniforms(seed, k)``). The interval
of a metric is the ``(1 − level) / 2`` and ``(1 + level) / 2`` quantiles over the draws, widened
where needed to contain the point estimate (the run itself: seed ``seed``, factors 1), written
as ``<metric>_lo`` / ``<metric>_hi``. Everything is deterministic in ``seed``.

One settings table (``INTERVAL_FIELDS``, the experiment's ``intervals:`` block) and one rule
(``check_intervals``) serve YAML runs, ``batchsim capacity`` and the Python functions.
"""
from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sim.core.errors import InputError
from sim.core.fields import INT, NUM, Key, is_real, validate_fields
from sim.core.types import Request
from sim.cost.uncertainty import draw_uniforms, perturbed, uncertainty_of

#: The ``intervals:`` block of an experiment (and the Python functions' arguments).
INTERVAL_FIELDS: dict[str, Any] = {
    "draws": Key(INT, 0, "Prediction intervals: replicas of each run, each with its own seed "
                 "and calibration draw, behind the `<metric>_lo` / `_hi` columns (and "
                 "`batchsim capacity`'s `max_rate_lo` / `_hi`). 0 = no intervals (the default: "
                 "each draw simulates the run once more); else at least 2, 8-16 typical.",
                 minimum=0, maximum=1000),
    "level": Key(NUM, 0.9, "Nominal coverage of the prediction intervals (the draws' "
                 "(1 - level)/2 and (1 + level)/2 quantiles).", minimum=0.5, maximum=0.98),
}

#: The summary metrics that get an interval (those a run's summary has).
INTERVAL_METRICS = (
    *(f"{q}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el")
      for q in ("mean", "median", "p90", "p99")),
    "duration", "request_throughput", "output_throughput", "total_token_throughput",
    "request_goodput", "slo_attainment", "busy_fraction", "mfu", "mbu", "slot_utilization",
    "mean_batch_size", "max_kv_usage", "mean_kv_usage")
#: The columns that say how the intervals were made.
INTERVAL_INFO = ("interval_level", "interval_draws")


def check_intervals(block: Mapping[str, Any] | None, prefix: str = "intervals."
                    ) -> dict[str, Any]:
    """The validated ``intervals`` settings (defaults filled in): ``draws`` is 0 (off) or at
    least 2, ``level`` in [0.5, 0.98]; an ``InputError`` names the dotted field otherwise."""
    out = validate_fields(dict(block or {}), INTERVAL_FIELDS, prefix)
    if out["draws"] == 1:
        raise InputError("must be 0 (no intervals) or at least 2, got 1",
                         field=f"{prefix}draws")
    return out


def check_config_intervals(config: Mapping[str, Any]) -> None:
    """``check_intervals`` on a resolved run config's ``intervals`` block (the rule the schema
    cannot say: not exactly one draw)."""
    check_intervals(config.get("intervals"))


def bounds(point: float, values: Sequence[float], level: float) -> tuple[float, float]:
    """The interval of one metric: the draws' quantiles, widened to contain ``point``
    (NaN draws ignored; NaN when ``point`` or every draw is NaN)."""
    arr = np.asarray(values, float)
    point = float(point)
    if not np.isfinite(point) or not np.isfinite(arr).any():
        return float("nan"), float("nan")
    lo, hi = np.nanquantile(arr[np.isfinite(arr)], [(1 - level) / 2, (1 + level) / 2])
    return min(float(lo), point), max(float(hi), point)


def interval_columns(point: Mapping[str, Any], draws: Sequence[Mapping[str, Any]],
                     level: float) -> dict[str, float]:
    """``<metric>_lo`` / ``<metric>_hi`` of each ``INTERVAL_METRICS`` entry ``point`` has a
    number for (not MFU of an analytic cost model, say), from the draws' summaries, plus
    ``INTERVAL_INFO``."""
    out: dict[str, float] = {}
    for m in INTERVAL_METRICS:
        if not is_real(point.get(m)) or not np.isfinite(point[m]):
            continue
        lo, hi = bounds(point[m], [np.nan if d.get(m) is None else d[m] for d in draws], level)
        out[f"{m}_lo"], out[f"{m}_hi"] = lo, hi
    return out | {"interval_level": float(level), "interval_draws": len(draws)}


def draw_config(config: Mapping[str, Any], k: int) -> dict[str, Any]:
    """The run config of draw ``k``: seed ``seed + 1 + k`` and ``interval_draw`` =
    ``[seed, k]``, which ``sim.experiments.runner.simulate_config`` turns into the cost
    model's calibration draw (it also keeps the draw's run id apart)."""
    out = copy.deepcopy(dict(config))
    out["interval_draw"] = [int(config["seed"]), int(k)]
    out["seed"] = int(config["seed"]) + 1 + int(k)
    return out


def draw_cost(cost: Any, seed: int, k: int, sigma: float | None = None) -> Any:
    """``cost`` perturbed by calibration draw ``k`` of a run with seed ``seed``."""
    return perturbed(cost, uncertainty_of(cost, sigma).scales(draw_uniforms(seed, k)))


def draw_cluster(cluster: Mapping[str, Any], cost_keys: Mapping[str, Any], policy: Any,
                 kv: Any, seed: int, k: int) -> dict[str, Any]:
    """A ``cluster`` block whose groups carry their cost models under calibration draw ``k``:
    each group's model is built as the cluster would build it (``parse_groups``), perturbed
    with the draw's uniforms (one draw for every group: groups on one GPU profile err
    together) and handed back as the group's ready ``cost``."""
    from sim.cluster.groups import parse_groups

    built = parse_groups(cluster, policy=policy, kv=kv, cost=None, cost_keys=cost_keys)
    groups = [{**raw, "cost": draw_cost(g.cost, seed, k),
               "hardware": raw.get("hardware") or g.hardware or None}
              for raw, g in zip(cluster["groups"], built, strict=True)]
    return {**cluster, "groups": groups}


def config_intervals(config: Mapping[str, Any], base_dir: Path | None,
                     point: Mapping[str, Any]) -> dict[str, float]:
    """The interval columns of a run config whose summary is ``point`` (its
    ``intervals.draws`` replicas simulated one after the other)."""
    from sim.experiments.runner import simulate_config  # the runner calls this module

    settings = config["intervals"]
    draws = [simulate_config(draw_config(config, k), base_dir).summary
             for k in range(settings["draws"])]
    return interval_columns(point, draws, settings["level"])


def summary_with_intervals(requests: Callable[[int], Sequence[Request]], policy: Any,
                           cost: Any, kv: Any = "auto", seed: int = 0,
                           draws: int = 16, level: float = 0.9,
                           sigma: float | None = None) -> dict[str, float]:
    """The summary of the seed-``seed`` run plus ``_lo`` / ``_hi`` of ``INTERVAL_METRICS``.

    ``requests(seed)`` builds the workload of one seed; ``draws`` and ``level`` follow the
    YAML ``intervals`` block's rules (0 draws: no interval columns); ``sigma`` replaces the
    cost model's calibration uncertainty by one normal factor of that σ (0: seed noise only).
    """
    from sim.engine.simulate import simulate

    settings = check_intervals({"draws": draws, "level": level})
    base = simulate(requests(seed), policy, cost, kv, seed=seed).summary
    if not settings["draws"]:
        return dict(base)
    sims = [simulate(requests(seed + 1 + k), policy, draw_cost(cost, seed, k, sigma), kv,
                     seed=seed + 1 + k).summary for k in range(settings["draws"])]
    return dict(base) | interval_columns(base, sims, settings["level"])


def capacity_interval(point: float, search: Callable[[int], float], draws: int,
                      level: float) -> dict[str, float]:
    """``max_rate_lo`` / ``max_rate_hi`` around the capacity ``point`` from ``draws``
    searches (``search(k)``: the highest passing rate under draw ``k``, NaN when even the
    lowest rate probed fails), plus ``INTERVAL_INFO``. A draw whose SLOs fail near idle
    has no capacity: it counts as 0, not as a missing value (which would bias the interval
    up)."""
    rates = [search(k) for k in range(draws)]
    lo, hi = bounds(point, [0.0 if np.isnan(r) else r for r in rates], level)
    return {"max_rate_lo": lo, "max_rate_hi": hi, "interval_level": float(level),
            "interval_draws": draws}


def capacity_with_interval(requests: Callable[[float, int], Sequence[Request]], policy: Any,
                           cost: Any, passes: Callable[[dict[str, Any]], bool],
                           start: float, kv: Any = "auto", seed: int = 0, draws: int = 8,
                           level: float = 0.9, tolerance: float = 0.05,
                           sigma: float | None = None) -> dict[str, float]:
    """The highest rate whose run ``passes`` (``sim.experiments.capacity.search``), with an
    interval: the point search runs seed ``seed`` with the cost model as fitted; search ``k``
    runs draw ``k`` (as ``summary_with_intervals``). ``requests(rate, seed)`` builds the
    workload at one rate."""
    from sim.engine.simulate import simulate
    from sim.experiments.capacity import search

    settings = check_intervals({"draws": draws, "level": level})
    if not settings["draws"]:
        raise InputError("must be at least 2 for an interval", field="draws")

    def best(c: Any, s: int) -> float:
        def evaluate(rates: list[float], phase: str) -> list[bool]:
            return [passes(simulate(requests(r, s), policy, c, kv, seed=s).summary)
                    for r in rates]

        return search(start, tolerance, 1, evaluate).rate

    point = best(cost, seed)
    out = capacity_interval(point, lambda k: best(draw_cost(cost, seed, k, sigma),
                                                  seed + 1 + k), draws, level)
    return {"max_rate": point, **out}
