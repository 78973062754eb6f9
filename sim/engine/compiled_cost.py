"""Step costs inside the compiled interpreter, from the cost models' own scalar rules.

Nothing here restates a formula: the roofline's attention operators and step assembly are
``sim.cost.roofline_terms`` and ``LinearCost``'s time is ``sim.cost.base.linear_seconds``,
compiled with ``numba.njit`` from their one source (``jit_rule`` rebinds a rule's calls to the
compiled forms of the rules it calls). The parts of a roofline step attention does not touch
come from ``RooflineCost.dense_constants`` itself, asked through ``numba.objmode`` once per
``(tokens, rows)`` shape and kept in an open-addressing table (``DenseTable``'s arrays).

numba's on-disk cache of a function only notices changes to its own file, so
``sim.engine.compiled_loop`` pins the sources of every rule it compiles (``RULES_SHA256``).
"""
from __future__ import annotations

import threading
import types
from collections.abc import Callable
from typing import Any

import numpy as np
from numba import njit, objmode

from sim.core import rules
from sim.cost import base, roofline_terms

#: The cost models the interpreter costs itself, by code.
ROOFLINE, CONSTANT, LINEAR = 0, 1, 2
#: Bound codes past the roofline's four (``roofline_terms.BOUND_NAMES``).
BOUND_CONSTANT, BOUND_LINEAR = 4, 5
BOUND_NAMES = (*roofline_terms.BOUND_NAMES, "constant", "linear")
#: Slots of the table of dense constants (a power of two) before it is cleared and refilled.
TABLE_SLOTS = 1 << 16
#: Slots of ``analytic`` (``ConstantCost``/``LinearCost`` parameters).
C_BASE_S, C_PER_TOKEN_S, C_PER_SEQ_S = 0, 1, 2

_active = threading.local()  # the running cost model, for the objmode callback


def jit_rule(fn: Callable[..., Any], **calls: Any) -> Any:
    """``fn`` compiled with ``numba.njit(cache=True)``, its calls to the rules named in
    ``calls`` bound to their compiled forms (the Python function itself stays as it is)."""
    scope = dict(fn.__globals__)
    scope.update(calls)
    clone = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__,
                               fn.__closure__)
    clone.__module__, clone.__qualname__, clone.__doc__ = fn.__module__, fn.__qualname__, \
        fn.__doc__
    return njit(cache=True)(clone)


blocks_for = jit_rule(rules.blocks_for)
blocks_needed = jit_rule(rules.blocks_needed)
max_fitting_tokens = jit_rule(rules.max_fitting_tokens, blocks_needed=blocks_needed)
admits = jit_rule(rules.admits)
outranks = jit_rule(rules.outranks)
watermark_blocks = rules.watermark_blocks  # read once, in Python
linear_seconds = jit_rule(base.linear_seconds)
decode_unit_s = jit_rule(roofline_terms.decode_unit_s)
decode_tail_s = jit_rule(roofline_terms.decode_tail_s, decode_unit_s=decode_unit_s)
prefill_peak_eff = jit_rule(roofline_terms.prefill_peak_eff)
prefill_unit_s = jit_rule(roofline_terms.prefill_unit_s)
attention_ops = jit_rule(roofline_terms.attention_ops, decode_tail_s=decode_tail_s)
assemble_step = jit_rule(roofline_terms.assemble_step)


def fill_dense(vals: np.ndarray, slot: int, tokens: int, rows: int) -> None:
    """objmode callback: ``RooflineCost.dense_constants(tokens, rows)`` into ``vals[slot]``."""
    vals[slot, :] = _active.cost.dense_constants(float(tokens), rows)


@njit(cache=True)
def _dense_slot(keys: np.ndarray, vals: np.ndarray, count: np.ndarray, tokens: int,
                rows: int) -> int:
    """The table slot holding the dense constants of ``(tokens, rows)``, filled from Python on
    a miss; a table half full is cleared first (the constants are a pure function)."""
    key = tokens * (1 << 24) + rows
    mask = keys.shape[0] - 1
    slot = (key * 0x9E3779B1) & mask
    while keys[slot] != key:
        if keys[slot] < 0:
            if 2 * count[0] >= keys.shape[0]:
                keys[:] = -1
                count[0] = 0
                slot = (key * 0x9E3779B1) & mask
            keys[slot] = key
            count[0] += 1
            with objmode():
                fill_dense(vals, slot, tokens, rows)
            break
        slot = (slot + 1) & mask
    return slot


@njit(cache=True)
def step_cost(kind: int, analytic: np.ndarray, terms: np.ndarray, keys: np.ndarray,
              vals: np.ndarray, count: np.ndarray, num_layers: int, tp: int, rows: int,
              tokens: int, n_dec: int, kv_dec: int, pairs_all: int, kv_all: int, c_lo: int,
              c_hi: int, worst_pf: float, peak_eff: float
              ) -> tuple[float, float, float, int]:
    """``(seconds, flops, bytes, bound code)`` of a step from its reductions (see
    ``roofline_terms.attention_ops``; the prefill unit and efficiency are the caller's, who
    holds the rows)."""
    if kind == CONSTANT:
        return analytic[C_BASE_S], 0.0, 0.0, BOUND_CONSTANT
    if kind == LINEAR:
        return (linear_seconds(analytic[C_BASE_S], analytic[C_PER_TOKEN_S],
                               analytic[C_PER_SEQ_S], tokens, rows), 0.0, 0.0, BOUND_LINEAR)
    c_min = float(c_lo) if terms[roofline_terms.A_USES_MIN] != 0.0 else 0.0
    count_ops, tc0, tm0, f0, b0, tc1, tm1, f1, b1 = attention_ops(
        terms, rows, tokens, n_dec, kv_dec, pairs_all, kv_all, c_min, float(c_hi), worst_pf,
        peak_eff)
    slot = _dense_slot(keys, vals, count, tokens, rows)
    return assemble_step(vals[slot], count_ops, tc0, tm0, f0, b0, tc1, tm1, f1, b1,
                         num_layers, tp)


def activate(cost: Any) -> None:
    """Make ``cost`` the model the objmode callback asks (``deactivate`` after the run)."""
    _active.cost = cost


def deactivate() -> None:
    """Forget the cost model of the run that ended."""
    _active.__dict__.pop("cost", None)


__all__ = ["BOUND_NAMES", "CONSTANT", "LINEAR", "ROOFLINE", "TABLE_SLOTS", "activate",
           "admits", "blocks_for", "blocks_needed", "deactivate", "max_fitting_tokens",
           "outranks", "prefill_peak_eff", "prefill_unit_s", "step_cost", "watermark_blocks"]
