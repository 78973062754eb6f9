"""Step costs inside the compiled interpreter, from the cost models' own scalar rules.

Nothing here restates a formula: the roofline's dense constants, attention operators and step
assembly are ``sim.cost.roofline_terms`` and ``LinearCost``'s time is
``sim.cost.base.linear_seconds``, compiled with ``numba.njit`` from their one source
(``jit_rule`` rebinds a rule's calls to the compiled forms of the rules it calls), fed with the
model's own constants (``RooflineCost.dense_terms()`` and ``attention_terms()``).

numba's on-disk cache of a function only notices changes to its own file, so
``sim.engine.compiled_loop`` pins the sources of every rule it compiles (``RULES_SHA256``).
"""
from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import numpy as np
from numba import njit

from sim.core import rules
from sim.cost import base, roofline_terms

#: The cost models the interpreter costs itself, by code.
ROOFLINE, CONSTANT, LINEAR = 0, 1, 2
#: Bound codes past the roofline's four (``roofline_terms.BOUND_NAMES``).
BOUND_CONSTANT, BOUND_LINEAR = 4, 5
BOUND_NAMES = (*roofline_terms.BOUND_NAMES, "constant", "linear")
#: Slots of ``analytic`` (``ConstantCost``/``LinearCost`` parameters).
C_BASE_S, C_PER_TOKEN_S, C_PER_SEQ_S = 0, 1, 2


#: How every function of the interpreter compiles: cached on disk; integer division by zero
#: unchecked (numpy's model: no divisor here can be zero, and the check costs a branch on
#: every block count).
KERNEL: dict[str, Any] = {"cache": True, "error_model": "numpy"}


def jit_rule(fn: Callable[..., Any], *, inline: bool = False, **calls: Any) -> Any:
    """``fn`` compiled with ``numba.njit`` (``KERNEL``; inlined into its callers when
    ``inline``), its calls to the rules named in ``calls`` bound to their compiled forms (the
    Python function itself stays as it is)."""
    scope = dict(fn.__globals__)
    scope.update(calls)
    clone = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__,
                               fn.__closure__)
    clone.__module__, clone.__qualname__, clone.__doc__ = fn.__module__, fn.__qualname__, \
        fn.__doc__
    return njit(**KERNEL, inline="always" if inline else "never")(clone)


# the per-row rules, inlined: they run for every request in the batch every step
blocks_for = jit_rule(rules.blocks_for, inline=True)
uncomputed_tokens = jit_rule(rules.uncomputed_tokens, inline=True)
tokens_allowed = jit_rule(rules.tokens_allowed, inline=True)
within_limit = jit_rule(rules.within_limit, inline=True)
blocks_fit = jit_rule(rules.blocks_fit, inline=True)
blocks_needed = jit_rule(rules.blocks_needed, inline=True)
max_fitting_tokens = jit_rule(rules.max_fitting_tokens, inline=True, blocks_needed=blocks_needed)
admits = jit_rule(rules.admits, inline=True)
outranks = jit_rule(rules.outranks, inline=True)
batch_due_s = jit_rule(rules.batch_due_s, inline=True)
batch_ready = jit_rule(rules.batch_ready, inline=True)
rejoin_free_blocks = jit_rule(rules.rejoin_free_blocks, inline=True)
prompt_bucket = jit_rule(rules.prompt_bucket)
watermark_blocks = rules.watermark_blocks  # read once, in Python
linear_seconds = jit_rule(base.linear_seconds)
decode_unit_s = jit_rule(roofline_terms.decode_unit_s)
decode_tail_s = jit_rule(roofline_terms.decode_tail_s, decode_unit_s=decode_unit_s)
prefill_peak_eff = jit_rule(roofline_terms.prefill_peak_eff)
prefill_unit_s = jit_rule(roofline_terms.prefill_unit_s)
attention_ops = jit_rule(roofline_terms.attention_ops, decode_tail_s=decode_tail_s)
causal_pairs = jit_rule(roofline_terms.causal_pairs, inline=True)
batch_reductions = jit_rule(roofline_terms.batch_reductions, causal_pairs=causal_pairs,
                            prefill_peak_eff=prefill_peak_eff, prefill_unit_s=prefill_unit_s)
overhead_s = jit_rule(roofline_terms.overhead_s)
gemm_op = jit_rule(roofline_terms.gemm_op)
allreduce_s = jit_rule(roofline_terms.allreduce_s)
tally_op = jit_rule(roofline_terms.tally_op)
assemble_step = jit_rule(roofline_terms.assemble_step, tally_op=tally_op)
dense_gemms = jit_rule(roofline_terms.dense_gemms, gemm_op=gemm_op, tally_op=tally_op)
dense_constants = jit_rule(roofline_terms.dense_constants, dense_gemms=dense_gemms,
                           allreduce_s=allreduce_s, gemm_op=gemm_op, tally_op=tally_op,
                           overhead_s=overhead_s)


@njit(**KERNEL)
def step_cost(kind: int, analytic: np.ndarray, terms: np.ndarray, dense: np.ndarray,
              num_layers: int, tp: int, rows: int,
              tokens: int, n_dec: int, kv_dec: int, pairs_all: int, kv_all: int, c_lo: int,
              c_hi: int, worst_pf: float, peak_eff: float
              ) -> tuple[float, float, float, int]:
    """``(seconds, flops, bytes, bound code)`` of a step from its reductions (see
    ``roofline_terms.attention_ops``; the prefill unit and efficiency are the caller's, who
    holds the rows)."""
    if kind != ROOFLINE:
        return analytic_step(kind, analytic, tokens, rows)
    return roofline_step(terms, dense_constants(dense, float(tokens), rows), num_layers, tp,
                         rows, tokens, n_dec, kv_dec, pairs_all, kv_all, c_lo, c_hi, worst_pf,
                         peak_eff)


@njit(**KERNEL, inline="always")
def analytic_step(kind: int, analytic: np.ndarray, tokens: int, rows: int
                  ) -> tuple[float, float, float, int]:
    """``step_cost`` of a ``ConstantCost`` or ``LinearCost`` step (``kind``): its time alone."""
    if kind == CONSTANT:
        return analytic[C_BASE_S], 0.0, 0.0, BOUND_CONSTANT
    return (linear_seconds(analytic[C_BASE_S], analytic[C_PER_TOKEN_S], analytic[C_PER_SEQ_S],
                           tokens, rows), 0.0, 0.0, BOUND_LINEAR)


@njit(**KERNEL, inline="always")
def roofline_step(terms: np.ndarray, d: tuple, num_layers: int, tp: int, rows: int,
                  tokens: int, n_dec: int, kv_dec: int, pairs_all: int, kv_all: int,
                  c_lo: int, c_hi: int, worst_pf: float, peak_eff: float
                  ) -> tuple[float, float, float, int]:
    """``step_cost`` of a roofline step whose dense constants ``d`` are known
    (``dense_constants`` of its tokens and rows: the same for every step of a decode
    stretch, whose rows and tokens do not change)."""
    c_min = float(c_lo) if terms[roofline_terms.A_USES_MIN] != 0.0 else 0.0
    count_ops, tc0, tm0, f0, b0, tc1, tm1, f1, b1 = attention_ops(
        terms, rows, tokens, n_dec, kv_dec, pairs_all, kv_all, c_min, float(c_hi), worst_pf,
        peak_eff)
    return assemble_step(d, count_ops, tc0, tm0, f0, b0, tc1, tm1, f1, b1, num_layers, tp)


@njit(**KERNEL, inline="always")
def decode_step_cost(kind: int, analytic: np.ndarray, terms: np.ndarray, dense: np.ndarray,
                     num_layers: int, tp: int, rows: int, kv: int, c_lo: int, c_hi: int
                     ) -> tuple[float, float, float, int]:
    """``step_cost`` of a pure-decode step: ``rows`` rows of one new token each, attending
    ``kv`` keys together, the shortest ``c_lo`` and the longest ``c_hi`` (padding rows are
    rows like any other: the GPU computes them)."""
    if kind != ROOFLINE:
        return analytic_step(kind, analytic, rows, rows)
    return decode_roofline_step(terms, dense_constants(dense, float(rows), rows), num_layers,
                                tp, rows, kv, c_lo, c_hi)


@njit(**KERNEL, inline="always")
def decode_roofline_step(terms: np.ndarray, d: tuple, num_layers: int, tp: int, rows: int,
                         kv: int, c_lo: int, c_hi: int) -> tuple[float, float, float, int]:
    """``decode_step_cost`` of a roofline step whose dense constants ``d`` are known
    (``dense_constants(dense, rows, rows)``: one value for a whole decode stretch)."""
    return roofline_step(terms, d, num_layers, tp, rows, rows, rows, kv, kv, kv, c_lo, c_hi,
                         0.0, 0.0)


def cost_inputs(cost: Any, kind: int) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, int,
                                               int]:
    """What ``step_cost`` is given of ``cost`` (its ``cost_kind``, ``kind``): ``(kind,
    analytic, terms, dense, num_layers, tp)`` — ``ConstantCost``/``LinearCost`` parameters in
    the ``C_*`` slots, or the roofline's own attention and dense constants
    (``RooflineCost.attention_terms``, ``dense_terms``)."""
    roofline = kind == ROOFLINE
    analytic = np.array(
        [cost.step_s, 0.0, 0.0] if kind == CONSTANT else
        [cost.base_s, cost.per_token_s, cost.per_seq_s] if kind == LINEAR else [0.0] * 3)
    terms = np.array(cost.attention_terms() if roofline else [0.0], dtype=np.float64)
    dense = np.array(cost.dense_terms() if roofline else [0.0], dtype=np.float64)
    return (kind, analytic, terms, dense, cost.model.num_layers if roofline else 1,
            cost.tp if roofline else 1)


__all__ = ["BOUND_NAMES", "CONSTANT", "LINEAR", "ROOFLINE", "admits", "analytic_step",
           "batch_due_s", "batch_ready", "batch_reductions", "blocks_for", "blocks_needed",
           "cost_inputs", "decode_roofline_step", "decode_step_cost", "max_fitting_tokens",
           "outranks", "prefill_peak_eff", "prefill_unit_s", "prompt_bucket", "rejoin_free_blocks",
           "roofline_step", "step_cost", "watermark_blocks"]
