"""batchsim: a discrete-event simulator of LLM serving batching policies.

The public API (DESIGN section 8): ``Request``, ``simulate``, ``build_cost_model``,
``ConstantCost``, ``LinearCost`` and ``run_experiment``.
"""
from __future__ import annotations

from sim.cost import ConstantCost, CostModel, LinearCost
from sim.simulate import SimResult, simulate
from sim.types import BatchShape, KVView, Plan, Request, SeqView, StepCost, View

__version__ = "0.1.0"

__all__ = ["BatchShape", "ConstantCost", "CostModel", "KVView", "LinearCost", "Plan", "Request",
           "SeqView", "SimResult", "StepCost", "View", "build_cost_model", "run_experiment",
           "simulate", "__version__"]


def build_cost_model(model, hardware, tp: int = 1, **kwargs):  # noqa: ANN001, ANN201
    """Roofline cost model for ``model`` on ``hardware`` with tensor parallelism ``tp``."""
    from sim.roofline import build_cost_model as _build

    return _build(model=model, hardware=hardware, tp=tp, **kwargs)


def run_experiment(path, overrides=None, out=None, **kwargs):  # noqa: ANN001, ANN201
    """Run the experiment YAML at ``path`` (with ``--set``-style overrides) into ``out``."""
    from sim.experiment import run_experiment as _run

    return _run(path, overrides=overrides, out=out, **kwargs)
