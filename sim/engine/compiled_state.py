"""A compiled replica's arrays as one numba object, for calls into the interpreter from Python.

numba types and unboxes every argument of a compiled function on each call from Python, about
0.1 µs an array: ``compiled_loop.run`` takes two dozen of them, and a driver that runs a
replica once per event (``sim.engine.compiled_drive``) calls it hundreds of thousands of times
a run. ``ReplicaArrays`` holds references to the arrays (``FIELDS``, those of
``sim.engine.compiled.CompiledReplica`` and the driver's load buffer) in one numba structure,
so such a call passes one argument. It references the arrays it was packed from: a caller
packs them again whenever one of them was replaced or resized (``CompiledReplica.layout``).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numba import njit, types
from numba.experimental import structref

from sim.engine.compiled_cost import KERNEL

#: The arrays ``ReplicaArrays`` holds, in ``compiled_loop.run``'s order, then ``out``: the
#: load buffer ``compiled_drive.load_now`` fills.
FIELDS = ("req_i", "req_f", "running", "hkeys", "hranks", "hitems", "pending", "plan_idx",
          "plan_n", "pre_idx", "params_i", "params_f", "analytic", "terms", "dense", "log_i",
          "log_f", "log_b", "irr", "irr_count", "st_i", "st_f", "residues", "batch", "out")


@structref.register
class ReplicaArraysType(types.StructRef):
    """numba's type of ``ReplicaArrays`` (the arrays' types, field by field)."""

    def preprocess_fields(self, fields: Sequence[tuple[str, Any]]) -> tuple[tuple[str, Any],
                                                                          ...]:
        """Fields of plain (not literal) types."""
        return tuple((name, types.unliteral(typ)) for name, typ in fields)


class ReplicaArrays(structref.StructRefProxy):
    """One replica's arrays in one object (module docstring); made by ``pack``."""


structref.define_proxy(ReplicaArrays, ReplicaArraysType, list(FIELDS))


@njit(**KERNEL)
def _pack(req_i, req_f, running, hkeys, hranks, hitems, pending, plan_idx, plan_n, pre_idx,  # noqa: ANN001, ANN202
          params_i, params_f, analytic, terms, dense, log_i, log_f, log_b, irr, irr_count,
          st_i, st_f, residues, batch, out):
    # built in compiled (and cached) code: the proxy's own constructor would be compiled
    # anew in every process
    return ReplicaArrays(req_i, req_f, running, hkeys, hranks, hitems, pending, plan_idx,
                         plan_n, pre_idx, params_i, params_f, analytic, terms, dense, log_i,
                         log_f, log_b, irr, irr_count, st_i, st_f, residues, batch, out)


def pack(owner: Any, out: np.ndarray) -> ReplicaArrays:
    """The ``FIELDS`` of ``owner`` (a ``CompiledReplica``) and ``out``, in one object."""
    return _pack(*(getattr(owner, name) for name in FIELDS[:-1]), out)
