"""Calibration uncertainty of a roofline cost model, as step-time factors per operator class.

The error a fitted profile makes is mostly systematic for one deployment (one model's shapes
on one GPU: a held-out shape family errs one way), so one *draw* of the uncertainty is one
factor per operator class for a whole run: ``linear`` (GEMMs, norms, embedding, LM head),
``attention``, ``comm`` (all-reduce) and ``overhead`` (the engine's CPU time per step).
A factor is ``s = exp(r)``, ``r`` a log error ``log(measured / predicted)``:

- a fitted GPU whose profile records ``calibration.fit.train_log_residual_quantiles`` (written
  by ``batchsim calibrate`` from the *training* rows of its fit, never the held-out ones) draws
  ``r`` per class from those empirical quantiles: a bootstrap over the fit's residuals, with
  their skew and heavy tails, interpolated between the tabulated probabilities
  ``RESIDUAL_PROBS`` and clamped to the outermost ones (so intervals up to 98 %);
- a fitted GPU without that record draws one normal ``r`` for all GPU classes, ``σ`` from its
  held-out kernel MdAPE (``log(1 + MdAPE) / 0.6745``: the median absolute value of a normal is
  0.6745 σ) — the older, narrower rule;
- a datasheet-only GPU has no measured error; it gets ``DATASHEET_SIGMA`` (an assumption: the
  one unfitted GPU checked against measurements, MI300X, was ~60 % too fast), one normal draw
  shared by all GPU classes (an unfitted profile errs the same way everywhere);
- the engine's ``overhead`` class is normal with ``σ`` from the engine profile's held-out step
  MdAPE, or ``DERIVED_ENGINE_SIGMA`` (an assumption) for an engine derived from another's fit.

``perturbed`` rebuilds a cost model whose classes take ``s_c`` times as long (efficiencies
divided, latencies multiplied); with one factor for every class the whole step takes exactly
``s`` times as long (``scaled``). Analytic cost models (constant, linear) have no calibration
uncertainty: their factors are 1.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import Any

import numpy as np

from sim.core.errors import InputError
from sim.core.fields import is_real
from sim.cost.roofline import CostParams, RooflineCost

#: σ of log step time for a datasheet-only GPU profile (assumed, not measured).
DATASHEET_SIGMA = 0.4
#: σ added for an engine profile derived from another's fit (assumed, not measured).
DERIVED_ENGINE_SIGMA = 0.1
#: The operator classes that get a factor each, in the order of a draw's uniforms.
CLASSES = ("linear", "attention", "comm", "overhead")
#: Probabilities at which a profile tabulates its training log residuals.
RESIDUAL_PROBS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.975, 0.99)
#: The calibration data's kernel classes (``sim.cost.calibrate``) by operator class.
KERNEL_CLASS = {"gemm": "linear", "gemm_operators": "linear", "context_attention": "attention",
                "generation_attention": "attention", "allreduce": "comm"}
_MAD_TO_SIGMA = 1.0 / 0.6745
#: The parameters each class's factor divides (efficiencies) and multiplies (latencies). The
#: norms, embedding and the attention's KV-write kernel pay ``memory_eff`` / ``kernel_latency_s``
#: and so follow ``linear``.
_PARAMS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "linear": (("compute_eff_max", "memory_eff"), ("kernel_latency_s",)),
    "attention": (("attention_compute_eff", "attention_memory_eff"),
                  ("attention_latency_s", "attention_gqa_latency_s")),
    "comm": (("comm_eff",), ("allreduce_alpha_s", "alpha_per_peer_s", "allreduce_floor_s")),
    "overhead": ((), ("per_step_s", "per_seq_s", "per_layer_launch_s")),
}


@dataclass(frozen=True)
class StepUncertainty:
    """The distribution of one draw's per-class factors: each class's log-error quantiles at
    ``RESIDUAL_PROBS`` and the index of the uniform it reads (classes sharing an index move
    together); ``source`` says where the numbers come from, in words."""

    log_quantiles: Mapping[str, tuple[float, ...]]
    draw_of: Mapping[str, int]
    source: str

    def scales(self, u: Sequence[float] | np.ndarray) -> dict[str, float]:
        """The factor of each class for uniforms ``u`` (one per class, in ``CLASSES`` order)."""
        return {c: float(np.exp(np.interp(u[self.draw_of[c]], RESIDUAL_PROBS,
                                          self.log_quantiles[c]))) for c in CLASSES}


def normal_quantiles(sigma: float) -> tuple[float, ...]:
    """The log quantiles at ``RESIDUAL_PROBS`` of a normal log error of scale ``sigma``."""
    return tuple(sigma * NormalDist().inv_cdf(p) for p in RESIDUAL_PROBS)


def _engine_sigma(cost: RooflineCost) -> float:
    """σ of the engine's log overhead error (0 for an engine without a fit record)."""
    engine = cost.engine
    if engine.calibration.get("status") == "derived":
        return DERIVED_ENGINE_SIGMA
    # the per-step errors (keys tp1, tp2, ...), not the all-reduce floor's
    errs = [float(v) for k, v in (engine.calibration.get("heldout_mdape_pct") or {}).items()
            if str(k).startswith("tp")]
    return math.log1p(max(errs) / 100.0) * _MAD_TO_SIGMA if errs else 0.0


def _gpu_sigma(cost: RooflineCost) -> float:
    """σ of the GPU's log step error by the single-normal rule (see the module docstring)."""
    gpu = cost.gpu
    if gpu.calibration_status != "fitted":
        return DATASHEET_SIGMA
    mdape = float((gpu.calibration.fit.get("heldout_mdape_pct") or {}).get("overall", 10.0))
    return math.log1p(mdape / 100.0) * _MAD_TO_SIGMA


def step_sigma(cost: RooflineCost) -> float:
    """σ of log step time of ``cost`` by the single-normal rule: the GPU's σ and the engine's
    combined in quadrature (used when one overall scale is asked for)."""
    return math.hypot(_gpu_sigma(cost), _engine_sigma(cost))


def uncertainty_of(cost: Any, sigma: float | None = None) -> StepUncertainty:
    """The ``StepUncertainty`` of ``cost`` (see the module docstring); ``sigma`` replaces it by
    one normal factor of that σ shared by every class (0: no calibration uncertainty)."""
    if sigma is not None and not (is_real(sigma) and 0 <= sigma < math.inf):
        raise InputError(f"must be a finite number >= 0, got {sigma!r}", field="sigma")
    if sigma is not None or not isinstance(cost, RooflineCost):
        q = normal_quantiles(0.0 if sigma is None else sigma)
        what = "analytic cost model (exact)" if sigma is None else f"σ = {sigma:g} (given)"
        return StepUncertainty(dict.fromkeys(CLASSES, q), dict.fromkeys(CLASSES, 0), what)
    overhead = normal_quantiles(_engine_sigma(cost))
    table = (cost.gpu.calibration.fit.get("train_log_residual_quantiles") or {}
             if cost.gpu.calibration_status == "fitted" else {})
    if table:
        quantiles = {c: _checked_table(table, c, cost.gpu.name) for c in CLASSES[:3]}
        return StepUncertainty(quantiles | {"overhead": overhead},
                               {c: i for i, c in enumerate(CLASSES)},
                               "training residuals per operator class")
    gpu = normal_quantiles(_gpu_sigma(cost))
    return StepUncertainty(dict.fromkeys(CLASSES[:3], gpu) | {"overhead": overhead},
                           dict.fromkeys(CLASSES[:3], 0) | {"overhead": 3},
                           f"one normal factor, σ = {_gpu_sigma(cost):.3f}")


def _checked_table(table: Any, c: str, gpu: str) -> tuple[float, ...]:
    """Class ``c``'s row of a profile's residual table: ``len(RESIDUAL_PROBS)`` finite,
    nondecreasing numbers (else an ``InputError`` naming the profile and field)."""
    row = table.get(c) if isinstance(table, Mapping) else None
    values: list[Any] = row if isinstance(row, list) else []
    ok = (len(values) == len(RESIDUAL_PROBS)
          and all(is_real(v) and math.isfinite(v) for v in values))
    if not ok or any(b < a for a, b in zip(values, values[1:], strict=False)):
        raise InputError(f"expected {len(RESIDUAL_PROBS)} nondecreasing numbers (quantiles "
                         f"at {', '.join(map(str, RESIDUAL_PROBS))})", source=gpu,
                         field=f"calibration.fit.train_log_residual_quantiles.{c}")
    return tuple(float(v) for v in values)


def residual_quantiles(points: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]]
                       ) -> dict[str, list[float]]:
    """The ``train_log_residual_quantiles`` record of a fit: per operator class, quantiles at
    ``RESIDUAL_PROBS`` of ``log(measured / predicted)`` over the *training* rows only.
    ``points`` maps each kernel class to ``(predicted, measured, held-out mask)``
    (``CalibrationReport.points``); a class without training rows gets no entry."""
    logs: dict[str, list[np.ndarray]] = {}
    for kernel, (pred, meas, held) in points.items():
        train = ~np.asarray(held, bool)
        r = np.log(np.asarray(meas, float)[train] / np.asarray(pred, float)[train])
        logs.setdefault(KERNEL_CLASS.get(kernel, kernel), []).append(r)
    return {c: [round(float(v), 4) for v in np.quantile(np.concatenate(v), RESIDUAL_PROBS)]
            for c, v in logs.items() if sum(len(a) for a in v)}


def perturbed(cost: Any, scales: Mapping[str, float]) -> Any:
    """``cost`` with each operator class ``scales[c]`` times as long (missing classes: 1);
    an analytic cost model is returned unchanged (it has no calibration to perturb)."""
    if not isinstance(cost, RooflineCost):
        return cost
    p: CostParams = cost.params
    changes: dict[str, Any] = {}
    for c, (divide, multiply) in _PARAMS.items():
        s = float(scales.get(c, 1.0))
        if not s > 0:
            raise ValueError(f"step-time scale of {c} must be > 0, got {s}")
        changes |= {k: getattr(p, k) / s for k in divide}
        changes |= {k: getattr(p, k) * s for k in multiply}
    return RooflineCost(cost.model, cost.gpu, cost.tp, cost.engine, replace(p, **changes),
                        cost.weight_dtype, cost.kv_dtype)


def scaled(cost: RooflineCost, s: float) -> RooflineCost:
    """``cost`` with every step ``s`` times as long (``s > 0``)."""
    if not s > 0:
        raise ValueError(f"step-time scale must be > 0, got {s}")
    return perturbed(cost, dict.fromkeys(CLASSES, s))


#: Tag of the random stream of calibration draws (apart from the workload's seeds).
_DRAW_TAG = 0x1F1DE


def draw_uniforms(seed: int, k: int) -> np.ndarray:
    """The uniforms of draw ``k`` of a run with seed ``seed`` (one per class; deterministic)."""
    return np.random.default_rng([seed, _DRAW_TAG, k]).random(len(CLASSES))
