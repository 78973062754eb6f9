"""Roofline cost model: per-operator FLOPs and bytes of one forward pass, timed per GPU profile.

Each layer is split into operator classes (QKV projection, O projection, MLP, attention,
norms/elementwise, TP all-reduce) plus the embedding and LM head once per step. An operator takes
``max(flops / (peak × compute_eff), bytes / (HBM bandwidth × memory_eff)) + kernel latency``;
GEMM efficiency is shape-aware (few token rows cannot fill the tensor cores), attention splits
into compute-bound prefill and KV-reading decode, and all-reduce is ``α + 2(n−1)/n · bytes / bus``.
Attention also pays for under-filled SMs: with ``P`` independent work units (prefill: query-head
× 128-token query tiles; decode: KV-head streams, long contexts split into ``split_tokens``
pieces) a uniform batch takes ``t · (1 + par_half / P)``, so few heads per GPU run worse.
Everything is per GPU of one tensor-parallel model instance; ``StepCost.flops``/``bytes`` are the
totals over its ``tp`` GPUs. ``step`` does a handful of numpy reductions and scalar arithmetic so
the simulator can call it every iteration.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import overload

import numpy as np

from sim.core.fields import is_integer, not_one_of
from sim.core.types import BatchShape, StepCost
from sim.cost.aggregate import AggregateSteps
from sim.cost.base import ShapeCost, StepSeries
from sim.cost.defaults import DEFAULT_ENGINE  # re-exported: the default of build_cost_model
from sim.cost.profile_schema import check_overrides
from sim.cost.profiles import (
    DTYPE_BYTES,
    EngineProfile,
    GpuProfile,
    ModelSpec,
    ProfileError,
    load_engine,
    load_gpu,
    load_model,
)
from sim.cost.roofline_terms import (
    A_USES_MIN,
    BOUND_NAMES,
    D_ATT_LAT,
    D_COMM_L,
    D_EMB_S,
    D_LM_S,
    D_NORMS_L,
    D_OVERHEAD,
    NUM_ATTENTION_TERMS,
    NUM_DENSE_TERMS,
    allreduce_s,
    assemble_step,
    attention_ops,
    attention_seconds,
    batch_reductions,
    causal_pairs,
    decode_tail_s,
    decode_unit_s,
    dense_gemms,
    overhead_s,
    prefill_peak_eff,
    prefill_unit_s,
)

_ACT_BYTES = 2.0  # activations stay bf16/fp16 whatever the weight format

#: Batches of at most this many rows have their attention reductions done over Python lists
#: (``RooflineCost._attention_rows``): a dozen numpy calls cost more than a loop over so few
#: rows. Both forms give the same floats, so the threshold changes speed only.
ROWS_IN_PYTHON = 128


@dataclass(frozen=True)
class CostParams:
    """Every tunable of the roofline in SI units: GPU calibration plus engine overheads."""

    compute_eff_max: float
    compute_m_half: float
    memory_eff: float
    attention_compute_eff: float
    attention_m_half: float
    attention_memory_eff: float
    attention_latency_s: float
    attention_row_tokens: float
    kernel_latency_s: float
    comm_eff: float
    allreduce_alpha_s: float
    alpha_per_peer_s: float
    per_step_s: float
    per_seq_s: float
    per_layer_launch_s: float
    attention_pad_tokens: float = 0.0
    attention_prefill_par_half: float = 0.0
    attention_decode_par_half: float = 0.0
    attention_split_tokens: float = float("inf")
    attention_mha_split_tokens: float = float("inf")
    attention_gqa_latency_s: float = 0.0

    allreduce_floor_s: float = 0.0

    @staticmethod
    def of(gpu: GpuProfile, engine: EngineProfile, tp: int = 1, **overrides: float
           ) -> CostParams:
        """Collect the parameters of ``gpu`` and ``engine`` at TP degree ``tp`` (the engine's
        overhead terms and collective latency depend on it), then apply named overrides."""
        c, ic = gpu.calibration, gpu.interconnect
        per_step_s, per_seq_s, per_layer_s = engine.overhead_terms(tp)
        base = CostParams(
            c.compute_eff_max, c.compute_m_half, c.memory_eff, c.attention_compute_eff,
            c.attention_m_half,
            c.memory_eff if c.attention_memory_eff is None else c.attention_memory_eff,
            (c.kernel_latency_us if c.attention_latency_us is None else c.attention_latency_us)
            * 1e-6, c.attention_row_tokens, c.kernel_latency_us * 1e-6, c.comm_eff,
            ic.allreduce_alpha_us * 1e-6, ic.alpha_per_peer_us * 1e-6,
            per_step_s, per_seq_s, per_layer_s,
            *(float(_calibration_value(c, k, d)) for k, d in _ATTENTION_EXTRAS.items()))
        # without its own fit, multi-head decode splits like grouped-query decode
        split = base.attention_split_tokens
        base = replace(base, attention_mha_split_tokens=float(
            _calibration_value(c, "attention_mha_split_tokens", split)),
            attention_gqa_latency_s=float(
            _calibration_value(c, "attention_gqa_latency_us", 0.0)) * 1e-6,
            allreduce_floor_s=engine.allreduce_floor_s(gpu.name, tp))
        known = [f.name for f in fields(CostParams)]
        bad = sorted(set(overrides) - set(known))
        if bad:
            raise ProfileError(f"unknown cost-model override(s) {bad}; known: {', '.join(known)}")
        check_overrides(overrides)
        return replace(base, **{k: float(v) for k, v in overrides.items()})


#: Attention-occupancy parameters and their neutral defaults (no padding, full occupancy). A GPU
#: profile gives them as ``calibration:`` keys, or inside ``calibration.fit`` while
#: ``sim.cost.profiles.Calibration`` does not yet declare them.
_ATTENTION_EXTRAS = {"attention_pad_tokens": 0.0, "attention_prefill_par_half": 0.0,
                     "attention_decode_par_half": 0.0, "attention_split_tokens": float("inf")}


def _calibration_value(cal: object, key: str, default: float) -> float:
    """``key`` of a GPU calibration: its attribute, else its ``fit`` entry, else ``default``."""
    value = getattr(cal, key, None)
    if value is None:
        value = getattr(cal, "fit", {}).get(key)
    return default if value is None else value


def allreduce_seconds(alpha_s: float, n: int, msg_bytes: float, bus_bytes_per_s: float
                      ) -> float:
    """One ring all-reduce of ``msg_bytes`` over ``n`` GPUs: ``α + 2(n−1)/n · bytes / bus``
    (``roofline_terms.allreduce_s``)."""
    return allreduce_s(alpha_s, n, msg_bytes, bus_bytes_per_s)


@dataclass(frozen=True)
class _Gemm:
    """One weight GEMM of a layer, per GPU: output features ``n``, input features ``k``."""

    name: str
    n: float
    k: float


@dataclass(frozen=True)
class RooflineCost(AggregateSteps, ShapeCost):
    """Roofline step cost of ``model`` on ``tp`` GPUs of kind ``gpu`` (build with
    :func:`build_cost_model`). Attributes beyond the CostModel protocol: ``weight_bytes_per_gpu``,
    ``kv_bytes_per_token`` (per GPU) and :meth:`kv_capacity_tokens`."""

    model: ModelSpec
    gpu: GpuProfile
    tp: int
    engine: EngineProfile
    params: CostParams
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    peak_flops: float = field(init=False)
    peak_bytes_per_s: float = field(init=False)
    weight_bytes_per_gpu: float = field(init=False)
    kv_bytes_per_token: float = field(init=False)
    # derived constants ``__post_init__`` sets besides those ``AggregateSteps`` declares:
    # out of ``__init__``, ``repr`` and equality (the caches are no part of the model's value)
    _gemms: tuple[_Gemm, _Gemm, _Gemm, _Gemm] = field(init=False, repr=False, compare=False)
    _wb: float = field(init=False, repr=False, compare=False)  # weight bytes per parameter
    _bw: float = field(init=False, repr=False, compare=False)  # effective HBM bytes/s
    _bus: float = field(init=False, repr=False, compare=False)  # all-reduce bus bytes/s
    _alpha: float = field(init=False, repr=False, compare=False)  # all-reduce latency (s)

    def __post_init__(self) -> None:
        m, tp, p = self.model, self.tp, self.params
        wb, kvb = DTYPE_BYTES[self.weight_dtype], DTYPE_BYTES[self.kv_dtype]
        peak = self.gpu.peak_flops(self.weight_dtype)
        hq, hkv = m.num_heads / tp, m.kv_heads_per_gpu(tp)
        setf = object.__setattr__  # frozen: derived constants are set once, here
        setf(self, "peak_flops", tp * peak)
        setf(self, "peak_bytes_per_s", tp * self.gpu.hbm_bytes_per_s)
        setf(self, "weight_bytes_per_gpu", self._weight_params_per_gpu() * wb)
        setf(self, "kv_bytes_per_token", m.kv_bytes_per_token(tp, kvb))
        h, inter = m.hidden_size, m.intermediate_size / tp
        setf(self, "_gemms", (
            _Gemm("qkv_proj", (hq + 2 * hkv) * m.head_dim, h),
            _Gemm("o_proj", h, hq * m.head_dim),
            _Gemm("mlp", (2 if m.gated_mlp else 1) * inter, h),
            _Gemm("mlp", h, inter),
        ))
        setf(self, "_wb", wb)
        setf(self, "_peak", peak)
        setf(self, "_bw", self.gpu.hbm_bytes_per_s * p.memory_eff)
        setf(self, "_att_bw", self.gpu.hbm_bytes_per_s * p.attention_memory_eff)
        # attention FLOPs per (query, key) pair: QK^T and PV, 2 FLOPs per multiply-add each
        setf(self, "_attn_flops_pair", 4.0 * hq * m.head_dim)
        setf(self, "_kv_bytes_tok_layer", 2.0 * hkv * m.head_dim * kvb)
        setf(self, "_q_bytes_tok", 2.0 * hq * m.head_dim * _ACT_BYTES)  # read Q, write O
        setf(self, "_hq", hq)
        setf(self, "_hkv", float(hkv))
        # FlashAttention-2 decode dispatch: multi-head layouts (hq == hkv) split long KV by
        # their own rule (never, on A100); grouped-query layouts with several KV heads pay the
        # query/output head-layout swap (fixed extra latency) that hkv == 1 gets for free
        setf(self, "_split", p.attention_mha_split_tokens if hq == hkv
             else p.attention_split_tokens)
        setf(self, "_gqa_lat", p.attention_gqa_latency_s if 1 < hkv < hq else 0.0)
        ic = self.gpu.interconnect
        bus = (ic.bus_bw_gbps if ic.nvlink_gbps > 0 else self.gpu.pcie_gbps) * 1e9 * p.comm_eff
        setf(self, "_bus", bus)
        setf(self, "_alpha", p.allreduce_alpha_s + p.alpha_per_peer_s * max(0, tp - 2))
        terms = (self._attn_flops_pair, self._kv_bytes_tok_layer, self._gqa_lat,
                 p.attention_row_tokens, self._q_bytes_tok, peak, p.attention_compute_eff,
                 self._att_bw, self._hkv, self._split, p.attention_decode_par_half,
                 p.attention_m_half, p.attention_pad_tokens, hq, p.attention_prefill_par_half,
                 1.0 if p.attention_row_tokens + 1.0 > self._split else 0.0)
        assert len(terms) == NUM_ATTENTION_TERMS
        setf(self, "_terms", terms)  # ``attention_terms()``, named by ``roofline_terms.A_*``
        setf(self, "_step_memo", {})  # (T, rows) -> (dense constants, breakdown base)
        setf(self, "_decode_consts", {})  # rows -> ``decode_constants(rows)``
        g_qkv, g_o, g_up, g_down = self._gemms
        dense = (p.kernel_latency_s, peak, self._bw, wb, p.compute_eff_max, p.compute_m_half,
                 g_qkv.n, g_qkv.k, g_o.n, g_o.k, g_up.n, g_up.k, g_down.n, g_down.k,
                 1.0 if m.is_moe else 0.0, float(m.num_experts or 1), float(m.top_k or 1),
                 float(m.hidden_size), self._q_bytes_tok, float(tp), self._alpha, bus,
                 p.allreduce_floor_s, m.vocab_size / tp, p.per_step_s, p.per_seq_s,
                 p.per_layer_launch_s, float(m.num_layers), p.attention_latency_s,
                 p.attention_row_tokens, self._kv_bytes_tok_layer)
        assert len(dense) == NUM_DENSE_TERMS
        setf(self, "_g", dense)  # ``dense_terms()``, named by ``roofline_terms.G_*``
        setf(self, "_prefill_consts", {})  # (T, rows) -> ``dense_constants(T, rows)``
        setf(self, "_decode_fn", [])  # the ``decode_step_function`` closure, once built

    def _weight_params_per_gpu(self) -> float:
        """Parameters one GPU stores: layers and LM head sharded by TP, KV heads replicated."""
        m, tp = self.model, self.tp
        q, kv = m.num_heads * m.head_dim, m.kv_heads_per_gpu(tp) * m.head_dim
        attn = m.hidden_size * (q / tp + 2 * kv) + q / tp * m.hidden_size
        mlp = m.num_experts * m.mlp_params_per_expert / tp
        router = m.hidden_size * m.num_experts if m.is_moe else 0
        layer = attn + mlp + router + 2 * m.hidden_size
        return m.num_layers * layer + m.embedding_params / tp + m.hidden_size

    def compute_eff(self, m: float) -> float:
        """Fraction of peak a GEMM with ``m`` token rows reaches: saturating in ``m``."""
        p = self.params
        return p.compute_eff_max * m / (m + p.compute_m_half)

    @overload
    def _decode_unit_s(self, c: float) -> float: ...
    @overload
    def _decode_unit_s(self, c: np.ndarray) -> np.ndarray: ...

    def _decode_unit_s(self, c: float | np.ndarray) -> float | np.ndarray:
        """Seconds of one parallel unit of a decode row attending ``c`` keys
        (``roofline_terms.decode_unit_s``); on arrays, the same operations elementwise (what
        ``step_series`` costs a stretch of decode steps with)."""
        if not isinstance(c, np.ndarray):
            return decode_unit_s(self._terms, c)
        p = self.params
        tc = self._attn_flops_pair * c / (self._peak * p.attention_compute_eff)
        tm = (self._kv_bytes_tok_layer * (c + p.attention_row_tokens + 1.0)
              + self._q_bytes_tok) / self._att_bw
        return np.maximum(tc, tm) / (self._hkv * (1.0 + c / self._split))

    @overload
    def _decode_tail_s(self, c_min: float, c_max: float) -> float: ...
    @overload
    def _decode_tail_s(self, c_min: np.ndarray, c_max: np.ndarray) -> np.ndarray: ...

    def _decode_tail_s(self, c_min: float | np.ndarray, c_max: float | np.ndarray
                       ) -> float | np.ndarray:
        """Under-filled-SM cost of decode attention: ``par_half`` units of the slowest row
        (``roofline_terms.decode_tail_s``). The unit time is a ratio of linear maps in the
        context (quasi-convex), so the slowest row is the shortest or the longest; when the
        unit time grows with the context (``row_tokens + 1 <= split_tokens``, every fitted GPU)
        only the longest is looked at, and the step time stays monotone in work."""
        if not isinstance(c_max, np.ndarray):
            return decode_tail_s(self._terms, float(c_min), c_max)
        slow = self._decode_unit_s(c_max)
        if self._terms[A_USES_MIN]:
            slow = np.maximum(slow, self._decode_unit_s(c_min))
        return self.params.attention_decode_par_half * slow

    def attention_terms(self) -> tuple[float, ...]:
        """The model constants the attention terms read, in the slots of
        ``sim.cost.roofline_terms`` (``A_*``): what a compiled interpreter costs steps with."""
        return self._terms

    def _attention(self, new: np.ndarray, ctx: np.ndarray, tokens: int
                   ) -> tuple[int, float, float, float, float, float, float, float, float]:
        """One layer's decode and prefill attention operators (``roofline_terms.attention_ops``)
        from the batch's reductions, in numpy.

        On top of the roofline the kernel pays ``par_half`` extra units of its slowest row's
        per-unit time (the larger of the decode and prefill tails): for a uniform batch of
        ``P`` units, ``t · (1 + par_half / P)``."""
        w, rows = self.model.sliding_window, len(new)
        terms = self._terms
        if w is not None:
            ctx_w = np.minimum(ctx, w)
        worst = peak_eff = 0.0
        if tokens == rows:  # pure decode, the common case: keep it to few reductions
            n_dec = rows
            c_all = ctx if w is None else ctx_w
            kv_dec = pairs_all = kv_all = int(c_all.sum())
        else:
            dec = new == 1
            n_dec = int(np.count_nonzero(dec))
            if w is None:  # causal: query i of a chunk sees ctx - new + i keys
                pairs = causal_pairs(new, ctx)
                kv_tok = ctx
            else:  # ...but never more than w of them
                first = ctx - new + 1
                full = np.clip(ctx_w - first + 1, 0, None)  # queries at positions <= w
                pairs = full * (2 * first + full - 1) // 2 + (new - full) * w
                kv_tok = np.minimum(ctx, w + new - 1)
            pairs_all = int(pairs.sum())
            kv_all = int(kv_tok.sum())
            kv_dec = int(kv_tok[dec].sum()) if n_dec else 0
            # every row streams its KV: the decode-style tail covers prefill rows too, so a row
            # turning from decode into a prefill chunk never lowers it
            c_all = kv_tok
            prefill = ~dec
            peak_eff = prefill_peak_eff(terms, tokens - n_dec, rows - n_dec)
            first_unit = True
            for n, pr, kv in zip(new[prefill].tolist(), pairs[prefill].tolist(),
                                 kv_tok[prefill].tolist(), strict=True):
                u = prefill_unit_s(terms, n, pr, kv, peak_eff)
                if first_unit or u > worst:
                    worst, first_unit = u, False
        c_min = float(c_all.min()) if terms[A_USES_MIN] else 0.0
        return attention_ops(terms, rows, tokens, n_dec, kv_dec, pairs_all, kv_all, c_min,
                             float(c_all.max()), worst, peak_eff)

    def _attention_rows(self, new: list[int], ctx: list[int], tokens: int
                        ) -> tuple[int, float, float, float, float, float, float, float, float]:
        """``_attention`` over Python lists of a small batch without a sliding window: the
        same reductions (``roofline_terms.batch_reductions``, which compiled steps are costed
        from too), so the same operators to the last bit, without a dozen numpy calls on a
        few rows."""
        terms, rows = self._terms, len(new)
        n_dec, kv_dec, pairs_all, kv_all, c_lo, c_hi, worst, peak_eff = batch_reductions(
            terms, new, ctx, rows, tokens)
        c_min = float(c_lo) if terms[A_USES_MIN] else 0.0
        return attention_ops(terms, rows, tokens, n_dec, kv_dec, pairs_all, kv_all, c_min,
                             float(c_hi), worst, peak_eff)

    def step(self, shape: BatchShape) -> StepCost:
        """Cost of one forward pass over ``shape`` on all ``tp`` GPUs (time is per GPU, in
        parallel; flops/bytes are totals)."""
        new, ctx = shape.new_tokens, shape.context_lens
        rows = len(new)
        if rows == 0:
            overhead = self._overhead(rows)
            return StepCost(overhead, bound="overhead", breakdown={"overhead": overhead})
        if rows <= ROWS_IN_PYTHON and self.model.sliding_window is None:
            new_l = new.tolist()
            T = sum(new_l)
            return self._assemble(float(T), rows, self._attention_rows(new_l, ctx.tolist(), T))
        T = int(new.sum())
        return self._assemble(float(T), rows, self._attention(new, ctx, T))

    def _overhead(self, rows: int) -> float:
        """The engine's CPU-side seconds of a step of ``rows`` rows (its TP terms included)."""
        p = self.params
        return overhead_s(p.per_step_s, p.per_seq_s, p.per_layer_launch_s, rows,
                          self.model.num_layers)

    def dense_terms(self) -> tuple[float, ...]:
        """The model constants the parts of a step attention does not touch read, in the slots
        of ``sim.cost.roofline_terms`` (``G_*``): ``dense_constants`` is computed from them."""
        return self._g

    def _assemble(self, T: float, rows: int,
                  ops: tuple[int, float, float, float, float, float, float, float, float]
                  ) -> StepCost:
        """``step``'s total from the dense constants of ``(T, rows)`` and the attention
        operators (``roofline_terms.assemble_step``), with its per-operator breakdown."""
        key = (T, rows)
        memo = self._step_memo.get(key)
        if memo is None:
            if len(self._step_memo) > 1 << 16:  # bound the memo
                self._step_memo.clear()
            d = self.dense_constants(T, rows)
            L = self.model.num_layers
            t_qkv, t_o, t_mlp = dense_gemms(self._g, T)[:3]
            memo = self._step_memo[key] = (d, (("qkv_proj", t_qkv * L), ("o_proj", t_o * L),
                                               ("mlp", t_mlp * L)))
        d, dense_part = memo
        L, tp = self.model.num_layers, self.tp
        seconds, flops, nbytes, code = assemble_step(d, *ops, L, tp)
        breakdown = dict(dense_part)
        breakdown["attention"] = (attention_seconds(ops[0], ops[1], ops[2], ops[5], ops[6])
                                  + d[D_ATT_LAT]) * L
        breakdown["norms"] = d[D_NORMS_L]
        if tp > 1:
            breakdown["allreduce"] = d[D_COMM_L]
        breakdown["embedding"], breakdown["lm_head"] = d[D_EMB_S], d[D_LM_S]
        breakdown["overhead"] = d[D_OVERHEAD]
        return StepCost(seconds, flops, nbytes, BOUND_NAMES[code], breakdown)

    def step_series(self, shape: BatchShape, num_steps: int) -> StepSeries:
        """Successive pure-decode steps in numpy: only attention changes as contexts grow.

        Reproduces ``step`` bit for bit in ``seconds`` (same operations in the same order);
        falls back to repeated ``step`` calls for prefill rows or when the bound would switch.
        """
        new, ctx = shape.new_tokens, shape.context_lens
        if num_steps < 3 or len(new) == 0 or not (new == 1).all():
            return super().step_series(shape, num_steps)
        first = self.step(shape)
        last = self.step(BatchShape(new, ctx + (num_steps - 1), shape.num_padding_tokens))
        if first.bound != last.bound:
            return super().step_series(shape, num_steps)
        p, L, rows = self.params, self.model.num_layers, len(new)
        j = np.arange(num_steps)
        w = self.model.sliding_window
        if w is None:
            kv = int(ctx.sum()) + rows * j
        else:
            kv = np.minimum(ctx[None, :] + j[:, None], w).sum(axis=1)
        fpp, kvt = self._attn_flops_pair, self._kv_bytes_tok_layer
        f = fpp * kv
        b = kvt * (kv + rows * p.attention_row_tokens) + rows * (kvt + self._q_bytes_tok)
        c_min, c_max = float(ctx.min()) + j, float(ctx.max()) + j
        if w is not None:
            c_min, c_max = np.minimum(c_min, w), np.minimum(c_max, w)
        tail = self._decode_tail_s(c_min, c_max)
        g = self._gqa_lat
        t = np.maximum(f / (self._peak * p.attention_compute_eff) + g + tail,
                       b / self._att_bw + g + tail)
        att = (t + (p.attention_latency_s + p.kernel_latency_s)) * L
        total = np.zeros(num_steps)
        for name, value in first.breakdown.items():  # same summation order as ``step``
            total = total + (att if name == "attention" else value)
        scale = L * self.tp
        return StepSeries(total, first.flops + (f - f[0]) * scale,
                          first.bytes + (b - b[0]) * scale, (first.bound,) * num_steps)

    def kv_capacity_tokens(self, gpu_memory_utilization: float = 0.9,
                           activation_reserve_gb: float = 1.0) -> int:
        """KV tokens that fit per replica: per-GPU memory × utilization − weights − reserve."""
        free = (self.gpu.hbm_bytes * gpu_memory_utilization - self.weight_bytes_per_gpu
                - activation_reserve_gb * 1e9)
        return max(0, int(free // self.kv_bytes_per_token))




def build_cost_model(model: str | Path | ModelSpec, hardware: str | Path | GpuProfile,
                     tp: int = 1, engine: str | Path | EngineProfile = DEFAULT_ENGINE,
                     weight_dtype: str = "bf16", kv_dtype: str = "bf16",
                     **overrides: float) -> RooflineCost:
    """Build the roofline of ``model`` on ``tp`` × ``hardware`` (names, paths or loaded specs).

    ``engine`` defaults to ``DEFAULT_ENGINE``, as an experiment YAML without ``engine:`` does.
    ``overrides`` replace any :class:`CostParams` field (e.g. ``memory_eff=0.8``). Raises
    :class:`ProfileError` for an unknown name, dtype or override, a TP degree the heads cannot
    split over, or weights that do not fit in ``tp`` × device memory.
    """
    spec = model if isinstance(model, ModelSpec) else load_model(model)
    gpu = hardware if isinstance(hardware, GpuProfile) else load_gpu(hardware)
    eng = engine if isinstance(engine, EngineProfile) else load_engine(engine)
    for what, dt in (("weight_dtype", weight_dtype), ("kv_dtype", kv_dtype)):
        if not isinstance(dt, str) or dt not in DTYPE_BYTES:
            raise ProfileError(not_one_of(dt, DTYPE_BYTES), field=what)
    if not is_integer(tp) or tp < 1:
        raise ProfileError(f"must be a positive integer, got {tp!r}", field="tp")
    tp = int(tp)
    if spec.num_heads % tp:
        raise ProfileError(f"{spec.name}: {spec.num_heads} attention heads do not split over "
                           f"tp={tp}", field="tp")
    cost = RooflineCost(spec, gpu, tp, eng, CostParams.of(gpu, eng, tp, **overrides),
                        weight_dtype, kv_dtype)
    if cost.weight_bytes_per_gpu > gpu.hbm_bytes:
        need = cost.weight_bytes_per_gpu * tp / 1e9
        raise ProfileError(
            f"{spec.name} weights ({need:.1f} GB at {weight_dtype}) do not fit in tp={tp} × "
            f"{gpu.name} ({tp * gpu.hbm_gb:g} GB); raise tp or use a smaller weight_dtype")
    return cost
