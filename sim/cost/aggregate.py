"""Aggregate forms of the roofline's ``step``: costs of the two batch shapes an engine meets
most, computed from sums instead of per-row arrays, bit-identical to ``step``.

- ``decode_step(rows, kv_tokens, c_min, c_max)``: a pure-decode batch from its row count, total
  context and shortest/longest context (``decode_step_for_rows`` binds the row count;
  ``decode_series`` costs ``k`` successive steps in numpy, every context one token longer
  each step).
- ``prefill_step(prompts)``: a batch of whole prompts (context = new tokens), attention in plain
  Python scalars.

Each performs ``step``'s floating-point operations in ``step``'s order on the same operands,
so the results are equal to the last bit (tests/test_fastpath.py checks every GPU and model
profile): the attention operators and the assembly are ``sim.cost.roofline_terms``, the same
functions ``step`` and the compiled interpreter call. A mixin of
``sim.cost.roofline.RooflineCost``: it reads the model's derived constants.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from sim.core.types import StepCost
from sim.cost.roofline_terms import (
    A_USES_MIN,
    BOUND_NAMES,
    PREFILL_TILE_TOKENS,
    assemble_step,
    attention_ops,
    decode_unit_s,
    dense_constants,
    prefill_peak_eff,
    prefill_unit_s,
)

if TYPE_CHECKING:  # the host's types; sim.cost.roofline imports this module
    from sim.cost.profiles import ModelSpec
    from sim.cost.roofline import CostParams

__all__ = ["PREFILL_TILE_TOKENS", "AggregateSteps", "assemble_one_attention"]
_BOUND_NAMES = np.array(["compute", "memory", "comm", "overhead"], dtype=object)


class AggregateSteps:
    """``RooflineCost``'s costs of pure-decode and whole-prompt batches from aggregates."""

    # What the mixin reads of its host, ``RooflineCost``: fields, the constants its
    # ``__post_init__`` derives, and three of its methods. Annotations only: no values here,
    # and a plain class's annotations do not become fields of the dataclass that inherits it.
    model: ModelSpec
    tp: int
    params: CostParams
    _peak: float  # one GPU's dense FLOP/s for the weight dtype
    _att_bw: float  # attention's effective HBM bytes/s
    _attn_flops_pair: float  # attention FLOPs per (query, key) pair
    _kv_bytes_tok_layer: float  # KV bytes per token and layer
    _q_bytes_tok: float  # query and output bytes per token and layer
    _hq: float  # query heads per GPU
    _hkv: float  # KV heads per GPU
    _split: float  # decode's split length (tokens)
    _gqa_lat: float  # decode's head-layout swap latency (s)
    _decode_consts: dict[int, tuple[float, ...]]  # rows -> ``decode_constants(rows)``
    _prefill_consts: dict[tuple[int, int], tuple[float, ...]]  # (T, rows) -> dense_constants
    _decode_fn: list[Callable[..., Any]]  # ``decode_step_function``'s closures, once built
    _terms: tuple[float, ...]  # ``attention_terms()``: the slots of ``roofline_terms.A_*``
    _step_memo: dict[tuple[float, int], tuple[Any, ...]]  # (T, rows) -> dense constants, ...
    _assemble: Callable[[float, int, tuple[Any, ...]], StepCost]
    _g: tuple[float, ...]  # ``dense_terms()``: the slots of ``roofline_terms.G_*``
    _decode_tail_s: Callable[[float, float], float]

    def prefill_step(self, prompts: tuple[int, ...]) -> StepCost:
        """``step`` of a batch of whole prompts (each row's context is its new tokens), with
        the attention terms computed in plain Python: bit-identical to ``step`` and several
        times faster on the few rows a prefill step usually has."""
        return self.mixed_step(0, 0, 0, 0, prompts)

    def mixed_step(self, dec_rows: int, dec_kv: int, dec_c_min: int, dec_c_max: int,
                   prompts: tuple[int, ...]) -> StepCost:
        """``step`` of ``dec_rows`` one-token decodes (attending ``dec_kv`` keys in all, the
        shortest row ``dec_c_min``, the longest ``dec_c_max``) batched with whole prompts
        (Orca's mixed steps), bit-identical to ``step``."""
        if self.model.sliding_window is not None:
            raise ValueError("mixed_step: a sliding-window model needs per-row contexts")
        T = dec_rows
        for n in prompts:
            T += n
        return self._assemble(float(T), dec_rows + len(prompts), self._prompt_attention(
            prompts, T, (dec_rows, dec_kv, dec_c_min, dec_c_max)))

    def _prompt_attention(self, prompts: tuple[int, ...], tokens: int,
                          decodes: tuple[int, int, int, int] = (0, 0, 0, 0)
                          ) -> tuple[int, float, float, float, float, float, float, float, float]:
        """``_attention`` for whole prompts (context == new tokens, no window) and ``decodes``
        (rows, keys, shortest and longest context of one-token decode rows): the reductions in
        Python scalars, the operators from ``roofline_terms.attention_ops``."""
        terms = self._terms
        dec_rows, dec_kv, dec_lo, dec_hi = decodes
        n_dec, pairs_all = dec_rows, dec_kv  # a decode row's causal pairs are its context
        for n in prompts:
            pairs_all += n * n - (n * n - n) // 2
            if n == 1:
                n_dec += 1
        kv_all = dec_kv + tokens - dec_rows  # each prompt row attends its own prompt
        new_pf = tokens - n_dec
        kv_dec = dec_kv + n_dec - dec_rows  # a one-token prompt (a "decode" row) attends one
        # the tail looks at every row: decode rows alone, or all rows once a prefill is in
        c_lo = min(prompts) if prompts else dec_lo
        c_hi = max(prompts) if prompts else dec_hi
        if dec_rows and prompts:
            c_lo, c_hi = min(c_lo, dec_lo), max(c_hi, dec_hi)
        rows = dec_rows + len(prompts)
        worst = peak_eff = 0.0
        if new_pf:
            peak_eff = prefill_peak_eff(terms, new_pf, rows - n_dec)
            first = True
            for n in prompts:
                if n == 1:
                    continue
                u = prefill_unit_s(terms, n, n * n - (n * n - n) // 2, n, peak_eff)
                if first or u > worst:
                    worst, first = u, False
        c_min = float(c_lo) if terms[A_USES_MIN] else 0.0
        return attention_ops(terms, rows, tokens, n_dec, kv_dec, pairs_all, kv_all, c_min,
                             float(c_hi), worst, peak_eff)

    @property
    def decode_uses_min_context(self) -> bool:
        """Whether a pure-decode step's cost looks at the shortest context, not only the longest
        (``decode_step``'s ``c_min``): only when the fitted row cost falls with context."""
        return self.params.attention_row_tokens + 1.0 > self._split

    def decode_step(self, rows: int, kv_tokens: int, c_min: int, c_max: int
                    ) -> tuple[float, float, float, str]:
        """``(seconds, flops, bytes, bound)`` of a pure-decode step from aggregates alone:
        ``rows`` sequences attending ``kv_tokens`` keys in all, the shortest ``c_min`` and the
        longest ``c_max``. Bit-identical to ``step`` on such a batch (same operations in the same
        order; the parts that depend on ``rows`` only are cached), so an engine can cost decode
        steps without building per-row arrays. Models with a sliding window need the rows."""
        return self.decode_step_function()(rows, kv_tokens, c_min, c_max)

    def decode_step_function(self
                             ) -> Callable[[int, int, int, int], tuple[float, float, float, str]]:
        """``decode_step`` as a closure over this model's constants: the fast path calls it
        once per decode step, so every lookup it can avoid is bound here once."""
        fn = self._decode_fn
        if fn:
            return fn[0]
        if self.model.sliding_window is not None:
            raise ValueError("decode_step: a sliding-window model needs per-row contexts")
        L, tp = self.model.num_layers, self.tp
        consts, make = self._decode_consts, self.decode_constants
        fpp, kvt, g, row_tok, q_bytes, peak_att, att_bw, hkv, split, par_half = \
            self.decode_scalars()
        uses_min = self.decode_uses_min_context

        terms = self._terms

        def unit(c: float) -> float:
            return decode_unit_s(terms, c)

        tails: dict[int, float] = {}  # longest context -> decode tail (when it alone counts)
        by_rows: dict[int, Callable[[int, int, int], tuple[float, float, float, str]]] = {}

        def constants(rows: int) -> tuple[float, ...]:
            k = consts.get(rows)
            if k is None:
                k = consts[rows] = make(rows)
            return k

        def for_rows(rows: int) -> Callable[[int, int, int], tuple[float, float, float, str]]:
            """``decode_step`` for one batch size, its constants bound once."""
            fn = by_rows.get(rows)
            if fn is not None:
                return fn
            consts = constants(rows)
            rows_row_tok, rows_kq = consts[17], consts[18]

            def decode_rows(kv_tokens: int, c_min: int, c_max: int
                            ) -> tuple[float, float, float, str]:
                f = fpp * kv_tokens
                b = kvt * (kv_tokens + rows_row_tok) + rows_kq
                tail: float | None  # a float once the branch below is done
                if uses_min:
                    tail = par_half * max(unit(float(c_max)), unit(float(c_min)))
                else:
                    tail = tails.get(c_max)
                    if tail is None:
                        tail = tails[c_max] = par_half * unit(float(c_max))
                tc = f / peak_att + g
                tm = b / att_bw + g
                tc += tail
                tm += tail
                return assemble_one_attention(consts, tc, tm, f, b, L, tp)

            if len(by_rows) > 4096:  # bound the memo
                by_rows.clear()
            by_rows[rows] = decode_rows
            return decode_rows

        def decode_step(rows: int, kv_tokens: int, c_min: int, c_max: int
                        ) -> tuple[float, float, float, str]:
            return for_rows(rows)(kv_tokens, c_min, c_max)

        def decode_series(rows: int, kv_tokens: int, c_min: int, c_max: int, k: int
                          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
            """``decode_step`` of ``k`` successive steps (every context one longer per step)
            as arrays: the same operations elementwise, so the same floats."""
            (s3, t0, t1, t2, t3, att_lat, t_norm, e_norm, norms_l, comm_l, emb_s, lm_s,
             overhead, c2, m2, f2, b2, rows_row_tok, rows_kq, memory_if_compute,
             compute_if_memory) = constants(rows)
            j = np.arange(k, dtype=np.int64)
            kv = kv_tokens + rows * j
            f = fpp * kv
            b = kvt * (kv + rows_row_tok) + rows_kq
            c = (c_max + j).astype(np.float64)
            tc: np.ndarray = fpp * c / peak_att
            tm: np.ndarray = (kvt * (c + row_tok + 1.0) + q_bytes) / att_bw
            slow = np.where(tc > tm, tc, tm) / (hkv * (1.0 + c / split))
            if uses_min:
                c = (c_min + j).astype(np.float64)
                tc = fpp * c / peak_att
                tm = (kvt * (c + row_tok + 1.0) + q_bytes) / att_bw
                slow = np.maximum(slow, np.where(tc > tm, tc, tm) / (hkv * (1.0 + c / split)))
            tail = par_half * slow
            tc = f / peak_att + g
            tm = b / att_bw + g
            tc += tail
            tm += tail
            compute = tc > tm
            t = np.where(compute, tc, tm)
            compute_s = np.where(compute, (t0 + t) * L + c2, compute_if_memory)
            memory_s = np.where(compute, memory_if_compute, ((t1 + t) + att_lat + t_norm) * L + m2)
            seconds = s3 + (t + att_lat) * L + norms_l
            if tp > 1:
                seconds += comm_l
            seconds = seconds + emb_s + lm_s + overhead
            # the bound as ``decode_step`` picks it: 0 compute, 1 memory, 2 comm, 3 overhead
            code = (memory_s >= compute_s).astype(np.int64)
            top = np.where(code == 1, memory_s, compute_s)
            code[comm_l > top] = 2
            top = np.maximum(top, comm_l) if comm_l > 0 else top
            code[overhead >= top] = 3
            bounds = _BOUND_NAMES[code].tolist()
            return seconds, ((t2 + f) * L + f2) * tp, (((t3 + b) + e_norm) * L + b2) * tp, bounds

        fn.extend((decode_step, decode_series, for_rows))
        return decode_step

    def decode_scalars(self) -> tuple[float, ...]:
        """The model constants a pure-decode step's attention cost reads, in the order
        ``(flops per key, KV bytes per token and layer, GQA latency, row tokens, query bytes,
        attention peak FLOP/s, attention bandwidth, KV heads, split tokens, decode par_half)``
        (what ``decode_step``'s closure binds).
        ``_decode_unit_s`` and ``_decode_tail_s`` are these, inlined with the same operations."""
        p = self.params
        return (self._attn_flops_pair, self._kv_bytes_tok_layer, self._gqa_lat,
                p.attention_row_tokens, self._q_bytes_tok, self._peak * p.attention_compute_eff,
                self._att_bw, self._hkv, self._split, p.attention_decode_par_half)

    def decode_step_for_rows(self, rows: int
                             ) -> Callable[[int, int, int], tuple[float, float, float, str]]:
        """``decode_step`` with ``rows`` fixed: ``f(kv_tokens, c_min, c_max)``, for callers
        that cost many decode steps of one batch size in a row."""
        self.decode_step_function()
        return self._decode_fn[2](rows)

    def decode_series(self, rows: int, kv_tokens: int, c_min: int, c_max: int, k: int
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
        """``(seconds, flops, bytes, bounds)`` of ``k`` successive pure-decode steps, the
        first as ``decode_step(rows, kv_tokens, c_min, c_max)`` and each later one with every
        context a token longer (``kv_tokens`` + ``rows`` per step): what an exact event skip
        of a steady decode stretch needs. Elementwise the same as ``decode_step``."""
        self.decode_step_function()
        return self._decode_fn[1](rows, kv_tokens, c_min, c_max, k)

    def decode_constants(self, rows: int) -> tuple[float, ...]:
        """``dense_constants`` of a pure-decode step of ``rows`` rows (``rows`` tokens)."""
        return self.dense_constants(float(rows), rows)

    def dense_constants(self, T: float, rows: int) -> tuple[float, ...]:
        """The parts of ``step`` for ``T`` tokens in ``rows`` rows that attention does not
        touch, as partial sums in ``step``'s order of operations: the 21 numbers of
        ``roofline_terms.dense_constants`` (slots ``D_*``), from the model's dense terms. With
        them, a step's cost is its attention operators and ``assemble_step``."""
        return dense_constants(self._g, float(T), rows)

    def prefill_cost(self, prompts: tuple[int, ...]) -> tuple[float, float, float, str]:
        """``(seconds, flops, bytes, bound)`` of ``prefill_step(prompts)`` without building its
        breakdown: the same floats, from ``dense_constants`` (memoized by tokens and rows) and
        the attention operator. What an engine costing many prefill steps wants."""
        if self.model.sliding_window is not None:
            raise ValueError("prefill_cost: a sliding-window model needs per-row contexts")
        T = 0
        for n in prompts:
            T += n
        ops = self._prompt_attention(prompts, T)
        if ops[0] != 1:  # one-token prompts make a second (decode) operator: the long way
            s = self.prefill_step(prompts)
            return s.seconds, s.flops, s.bytes, s.bound
        key = (T, len(prompts))
        consts = self._prefill_consts.get(key)
        if consts is None:
            if len(self._prefill_consts) > 1 << 16:  # bound the memo
                self._prefill_consts.clear()
            consts = self._prefill_consts[key] = self.dense_constants(float(T), len(prompts))
        _, tc, tm, f, b = ops[:5]
        return assemble_one_attention(consts, tc, tm, f, b, self.model.num_layers, self.tp)


def assemble_one_attention(consts: tuple[float, ...], tc: float, tm: float, f: float, b: float,
                           L: int, tp: int) -> tuple[float, float, float, str]:
    """``step``'s ``(seconds, flops, bytes, bound)`` from ``dense_constants`` and the step's one
    attention operator ``(compute s, memory s, flops, bytes)`` per layer, in ``_assemble``'s
    order of operations. The operator joins the compute or the memory tally, as in ``step``;
    the other tally is then the constants' own. ``bound`` is ``max`` over ``(seconds, name)``
    pairs as ``step`` takes it, ties going to the larger name ("overhead" > "memory" >
    "compute" > "comm"), without building the tuples."""
    seconds, flops, nbytes, code = assemble_step(consts, 1, tc, tm, f, b, 0.0, 0.0, 0.0, 0.0,
                                                 L, tp)
    return seconds, flops, nbytes, BOUND_NAMES[code]
