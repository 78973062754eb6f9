"""batchsim: a discrete-event simulator of LLM serving batching policies.

The public API: ``Request``, ``simulate``, ``build_cost_model``, ``ConstantCost``,
``LinearCost`` and ``run_experiment`` (plus the values a custom policy or cost model sees:
``View``, ``Plan``, ``BatchShape``, ``StepCost``, ...) and ``InputError``, the class of every
user-input error.

Names are resolved on first use (PEP 562), so ``import sim`` is cheap and importing a layer
(``sim.core.types`` from a policy module, say) never drags in the engine: ``import policies``
before ``import sim`` works.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from sim.core.version import __version__

if TYPE_CHECKING:
    from sim.api import run_experiment
    from sim.cluster.simulate import simulate
    from sim.core.errors import InputError
    from sim.core.types import BatchShape, KVView, Plan, Request, SeqView, StepCost, View
    from sim.cost.base import ConstantCost, CostModel, LinearCost
    from sim.cost.roofline import build_cost_model
    from sim.engine.simulate import SimResult

#: Public name -> the module that defines it.
_EXPORTS = {
    "BatchShape": "sim.core.types", "KVView": "sim.core.types", "Plan": "sim.core.types",
    "Request": "sim.core.types", "SeqView": "sim.core.types", "StepCost": "sim.core.types",
    "View": "sim.core.types", "InputError": "sim.core.errors",
    "ConstantCost": "sim.cost.base", "CostModel": "sim.cost.base", "LinearCost": "sim.cost.base",
    "SimResult": "sim.engine.simulate", "simulate": "sim.cluster.simulate",
    "build_cost_model": "sim.cost.roofline", "run_experiment": "sim.api",
}

__all__ = ["BatchShape", "ConstantCost", "CostModel", "InputError", "KVView", "LinearCost", "Plan",
           "Request", "SeqView", "SimResult", "StepCost", "View", "__version__",
           "build_cost_model", "run_experiment", "simulate"]


def __getattr__(name: str) -> Any:
    """Import a public name's module the first time the name is used."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sim' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
