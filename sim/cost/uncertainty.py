"""Calibration uncertainty of a roofline cost model, as a distribution of one step-time scale.

The error a fitted profile makes is mostly systematic for one deployment (one model's shapes
on one GPU: a held-out shape family errs one way), so a run's uncertainty is one factor ``s``
on every step time: ``s = exp(σ · z)``, ``z`` standard normal, with ``σ`` the log-error scale
of the GPU profile's held-out kernels (``MdAPE / 0.6745``: the median absolute value of a
normal is 0.6745 σ) combined with the engine profile's held-out step error when it has one.
A datasheet-only GPU has no measured error; it gets ``DATASHEET_SIGMA``, an assumption (the
one unfitted GPU checked against measurements, MI300X, was ~60 % too fast). A derived engine
adds ``DERIVED_ENGINE_SIGMA``, also an assumption. ``scaled`` rebuilds a cost model whose every
step takes exactly ``s`` times as long (efficiencies divided by ``s``, latencies and overheads
multiplied).
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from sim.cost.roofline import CostParams, RooflineCost

#: σ of log step time for a datasheet-only GPU profile (assumed, not measured).
DATASHEET_SIGMA = 0.4
#: σ added for an engine profile derived from another's fit (assumed, not measured).
DERIVED_ENGINE_SIGMA = 0.1
_MAD_TO_SIGMA = 1.0 / 0.6745
_DIVIDE = ("compute_eff_max", "memory_eff", "attention_compute_eff", "attention_memory_eff",
           "comm_eff")
_MULTIPLY = ("attention_latency_s", "kernel_latency_s", "allreduce_alpha_s", "alpha_per_peer_s",
             "per_step_s", "per_seq_s", "per_layer_launch_s", "attention_gqa_latency_s",
             "allreduce_floor_s")


def step_sigma(cost: RooflineCost) -> float:
    """σ of log step time of ``cost`` (see the module docstring)."""
    gpu, engine = cost.gpu, cost.engine
    if gpu.calibration_status == "fitted":
        mdape = float((gpu.calibration.fit.get("heldout_mdape_pct") or {}).get("overall", 10.0))
        sigma_gpu = math.log1p(mdape / 100.0) * _MAD_TO_SIGMA
    else:
        sigma_gpu = DATASHEET_SIGMA
    status = engine.calibration.get("status")
    if status == "derived":
        sigma_engine = DERIVED_ENGINE_SIGMA
    else:
        # the per-step errors (keys tp1, tp2, ...), not the all-reduce floor's
        errs = [float(v) for k, v in (engine.calibration.get("heldout_mdape_pct") or {}).items()
                if str(k).startswith("tp")]
        sigma_engine = math.log1p(max(errs) / 100.0) * _MAD_TO_SIGMA if errs else 0.0
    return math.hypot(sigma_gpu, sigma_engine)


def scaled(cost: RooflineCost, s: float) -> RooflineCost:
    """``cost`` with every step ``s`` times as long (``s > 0``)."""
    if not s > 0:
        raise ValueError(f"step-time scale must be > 0, got {s}")
    p: CostParams = cost.params
    changes: dict[str, Any] = {k: getattr(p, k) / s for k in _DIVIDE}
    changes |= {k: getattr(p, k) * s for k in _MULTIPLY}
    return RooflineCost(cost.model, cost.gpu, cost.tp, cost.engine, replace(p, **changes),
                        cost.weight_dtype, cost.kv_dtype)
