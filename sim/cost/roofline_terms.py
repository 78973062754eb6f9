"""The roofline's per-step arithmetic as plain scalar functions, written once.

``RooflineCost`` (``sim.cost.roofline``) splits a step into the parts attention does not touch
(GEMMs, norms, all-reduce, embedding, LM head, engine overhead: ``dense_constants``, memoized by
token and row count) and the attention operators, whose terms come from a few reductions over
the batch's rows. What turns those into the step's ``(seconds, flops, bytes, bound)`` lives
here: the decode unit and tail, the prefill unit, the attention operators and the assembly.
Like ``sim.core.rules`` these are functions of numbers only (no objects, no ``None``), so the
same source serves ``RooflineCost`` in Python and the compiled interpreter
(``sim.engine.compiled``), which compiles them with ``numba.njit``: the same operations in the
same order, hence the same floats to the last bit.

Two indexable records carry the constants, read through the named slots below: the model's
attention terms (``RooflineCost.attention_terms()``, ``A_*``) and the dense constants of one
``(tokens, rows)`` shape (``RooflineCost.dense_constants``, ``D_*``). A tuple in Python, a
float64 array in compiled code.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: Query rows per prefill attention tile (FlashAttention's block size for head_dim 128).
PREFILL_TILE_TOKENS = 128.0

# -- slots of the attention terms (``RooflineCost.attention_terms``) ----------------------------
A_FPP = 0  # attention FLOPs per (query, key) pair
A_KVT = 1  # KV bytes per token and layer
A_GQA_LAT = 2  # decode's head-layout swap latency (s)
A_ROW_TOK = 3  # fixed per-row work, in tokens
A_Q_BYTES = 4  # query and output bytes per token and layer
A_PEAK = 5  # one GPU's dense FLOP/s for the weight dtype
A_ATT_EFF = 6  # attention's compute efficiency
A_ATT_BW = 7  # attention's effective HBM bytes/s
A_HKV = 8  # KV heads per GPU
A_SPLIT = 9  # decode's split length (tokens)
A_DEC_PAR_HALF = 10  # decode's under-filled-SM units
A_M_HALF = 11  # prefill chunk length at half efficiency
A_PAD_TOKENS = 12  # masked keys per query of a diagonal tile
A_HQ = 13  # query heads per GPU
A_PF_PAR_HALF = 14  # prefill's under-filled-SM units
A_USES_MIN = 15  # 1.0 when the row cost falls with context (the shortest row counts too)
NUM_ATTENTION_TERMS = 16

# -- slots of the dense constants (``RooflineCost.dense_constants``) ---------------------------
D_S3 = 0  # GEMM seconds (QKV, O, MLP) over all layers
D_C0, D_M0, D_F0, D_B0 = 1, 2, 3, 4  # per-layer compute s, memory s, flops, bytes before attention
D_ATT_LAT = 5  # attention kernel + KV-cache write latency (s)
D_T_NORM = 6  # norms' seconds per layer
D_E_NORM = 7  # norms' bytes per layer
D_NORMS_L = 8  # norms' seconds over all layers
D_COMM_L = 9  # all-reduce seconds over all layers (0 at TP 1)
D_EMB_S, D_LM_S = 10, 11  # embedding and LM head seconds
D_OVERHEAD = 12  # the engine's CPU-side seconds
D_C2, D_M2, D_F2, D_B2 = 13, 14, 15, 16  # embedding + LM head compute s, memory s, flops, bytes

D_ROWS_ROW_TOK, D_ROWS_KQ = 17, 18  # rows × row tokens; rows × (KV + query bytes)
D_MEMORY_IF_COMPUTE, D_COMPUTE_IF_MEMORY = 19, 20  # the other tally of a one-operator step
NUM_DENSE = 21

# -- slots of the dense terms (``RooflineCost.dense_terms``): the model on its GPUs -----------
G_LAT = 0  # kernel launch latency (s)
G_PEAK = 1  # one GPU's dense FLOP/s for the weight dtype
G_BW = 2  # effective HBM bytes/s of the GEMMs
G_WB = 3  # weight bytes per parameter
G_EFF_MAX, G_M_HALF = 4, 5  # GEMM efficiency: saturating in token rows
G_QKV_N, G_QKV_K, G_O_N, G_O_K = 6, 7, 8, 9  # per-GPU GEMM shapes (outputs, inputs)
G_UP_N, G_UP_K, G_DOWN_N, G_DOWN_K = 10, 11, 12, 13
G_MOE, G_EXPERTS, G_TOP_K = 14, 15, 16  # 1.0 for a mixture of experts; experts; top-k
G_HIDDEN = 17  # hidden size
G_Q_BYTES = 18  # query and output bytes per token and layer
G_TP = 19  # tensor-parallel degree
G_ALPHA, G_BUS, G_AR_FLOOR = 20, 21, 22  # all-reduce latency (s), bus bytes/s, floor (s)
G_LM_N = 23  # LM head outputs per GPU (vocabulary / TP)
G_PER_STEP, G_PER_SEQ, G_PER_LAYER = 24, 25, 26  # the engine's overhead terms (s)
G_LAYERS = 27  # layers
G_ATT_LAT = 28  # attention kernel latency (s), before the KV-cache write
G_ROW_TOK, G_KVT = 29, 30  # per-row work in tokens; KV bytes per token and layer
NUM_DENSE_TERMS = 31

#: Activation bytes (bf16/fp16 whatever the weight format).
ACT_BYTES = 2.0

#: Bound names by code (``assemble_step``'s last result).
BOUND_NAMES = ("compute", "memory", "comm", "overhead")
BOUND_COMPUTE, BOUND_MEMORY, BOUND_COMM, BOUND_OVERHEAD = 0, 1, 2, 3


def decode_unit_s(a: Sequence[float], c: float) -> float:
    """Seconds of one parallel unit of a decode row attending ``c`` keys: the row's time over
    its KV streams ``hkv · (1 + c / split_tokens)``."""
    tc = a[A_FPP] * c / (a[A_PEAK] * a[A_ATT_EFF])
    tm = (a[A_KVT] * (c + a[A_ROW_TOK] + 1.0) + a[A_Q_BYTES]) / a[A_ATT_BW]
    return (tc if tc > tm else tm) / (a[A_HKV] * (1.0 + c / a[A_SPLIT]))


def decode_tail_s(a: Sequence[float], c_min: float, c_max: float) -> float:
    """Under-filled-SM cost of decode attention: ``par_half`` units of the slowest row, the
    longest (``c_max``) or, when the row cost falls with context, possibly the shortest."""
    slow = decode_unit_s(a, c_max)
    if a[A_USES_MIN] != 0.0:
        low = decode_unit_s(a, c_min)
        slow = slow if slow >= low else low
    return a[A_DEC_PAR_HALF] * slow


def prefill_peak_eff(a: Sequence[float], new_pf: int, rows_pf: int) -> float:
    """The FLOP/s prefill attention reaches on ``new_pf`` tokens in ``rows_pf`` rows: short
    chunks run worse (saturating in the mean chunk length)."""
    chunk = new_pf / rows_pf
    return a[A_PEAK] * (a[A_ATT_EFF] * chunk / (chunk + a[A_M_HALF]))


def prefill_unit_s(a: Sequence[float], n: int, pairs: int, kv: int, peak_eff: float) -> float:
    """Seconds of one query-head tile unit of a prefill row of ``n`` new tokens computing
    ``pairs`` causal (query, key) pairs over ``kv`` keys."""
    fpp = a[A_FPP]
    tc = (fpp * pairs + fpp * a[A_PAD_TOKENS] * n) / peak_eff
    tm = (a[A_KVT] * (kv + n + a[A_ROW_TOK]) + a[A_Q_BYTES] * n) / a[A_ATT_BW]
    return (tc if tc >= tm else tm) / (a[A_HQ] * (1.0 + n / PREFILL_TILE_TOKENS))


def causal_pairs(new: Any, ctx: Any) -> Any:
    """Causal (query, key) pairs of a row of ``new`` tokens attending ``ctx`` keys, its new
    ones included: query ``i`` sees ``ctx - new + i`` keys (elementwise on arrays)."""
    return new * ctx - (new * new - new) // 2


def batch_reductions(a: Sequence[float], new: Sequence[int], ctx: Sequence[int], rows: int,
                     tokens: int) -> tuple[int, int, int, int, int, int, float, float]:
    """What ``attention_ops`` reads of a batch without a sliding window, from its ``rows``
    rows of ``new`` tokens attending ``ctx`` keys each (lists, or arrays in compiled code;
    ``tokens`` their sum): ``(n_dec, kv_dec, pairs_all, kv_all, c_lo, c_hi, worst_pf,
    peak_eff)``, ``c_lo``/``c_hi`` the shortest and longest context, ``worst_pf`` the slowest
    prefill unit (the first in row order on ties; 0.0 with ``peak_eff`` for a pure decode).
    Integer sums, so exact in any order."""
    kv_all = sum(ctx)
    c_lo, c_hi = min(ctx), max(ctx)
    if tokens == rows:  # pure decode: one token a row, whose pairs are its context
        return rows, kv_all, kv_all, kv_all, c_lo, c_hi, 0.0, 0.0
    chunks = [k for k in range(rows) if new[k] != 1]
    n_dec = rows - len(chunks)
    kv_pf = pairs_pf = 0
    for k in chunks:
        kv_pf += ctx[k]
        pairs_pf += causal_pairs(new[k], ctx[k])
    kv_dec = kv_all - kv_pf
    peak_eff = prefill_peak_eff(a, tokens - n_dec, rows - n_dec)
    worst = 0.0
    first = True
    for k in chunks:
        u = prefill_unit_s(a, new[k], causal_pairs(new[k], ctx[k]), ctx[k], peak_eff)
        if first or u > worst:
            worst, first = u, False
    return n_dec, kv_dec, kv_dec + pairs_pf, kv_all, c_lo, c_hi, worst, peak_eff


def attention_ops(a: Sequence[float], rows: int, tokens: int, n_dec: int, kv_dec: int,
                  pairs_all: int, kv_all: int, c_min: float, c_max: float, worst_pf: float,
                  peak_eff: float) -> tuple[int, float, float, float, float, float, float,
                                            float, float]:
    """One layer's attention operators ``(count, tc0, tm0, f0, b0, tc1, tm1, f1, b1)`` (compute
    s, memory s, flops, bytes each) from the batch's reductions: ``n_dec`` one-token rows
    attending ``kv_dec`` keys, ``pairs_all`` causal pairs and ``kv_all`` keys over all rows, the
    shortest and longest row ``c_min``/``c_max`` (``c_min`` read only when it counts), the
    slowest prefill unit ``worst_pf`` at ``peak_eff`` (both read only with prefill rows). The
    decode operator comes first; the slowest unit's tail joins the last one."""
    fpp, kvt, row_tok, q_bytes, bw = (a[A_FPP], a[A_KVT], a[A_ROW_TOK], a[A_Q_BYTES],
                                      a[A_ATT_BW])
    tail = decode_tail_s(a, c_min, c_max)
    count = 0
    tc0 = tm0 = f0 = b0 = tc1 = tm1 = f1 = b1 = 0.0
    if n_dec:  # decode: one query per row, reads the row's whole KV
        f0 = fpp * kv_dec
        b0 = kvt * (kv_dec + n_dec * row_tok) + n_dec * (kvt + q_bytes)
        g = a[A_GQA_LAT]
        tc0 = f0 / (a[A_PEAK] * a[A_ATT_EFF]) + g
        tm0 = b0 / bw + g
        count = 1
    new_pf = tokens - n_dec
    if new_pf:  # prefill chunks: causal FLOPs against the context; short chunks run worse
        f = fpp * (pairs_all - kv_dec)
        rows_pf = rows - n_dec
        b = kvt * (kv_all - kv_dec + new_pf + rows_pf * row_tok) + q_bytes * new_pf
        worst = a[A_PF_PAR_HALF] * worst_pf
        tail = tail if tail >= worst else worst
        tc = (f + fpp * a[A_PAD_TOKENS] * new_pf) / peak_eff
        tm = b / bw
        if count:
            tc1, tm1, f1, b1 = tc + tail, tm + tail, f, b
        else:
            tc0, tm0, f0, b0 = tc + tail, tm + tail, f, b
        return count + 1, tc0, tm0, f0, b0, tc1, tm1, f1, b1
    return count, tc0 + tail, tm0 + tail, f0, b0, tc1, tm1, f1, b1


def attention_seconds(count: int, tc0: float, tm0: float, tc1: float, tm1: float) -> float:
    """Seconds of one layer's attention operators (before the kernel latency)."""
    t = tc0 if tc0 > tm0 else tm0
    if count == 2:
        t += tc1 if tc1 > tm1 else tm1
    return t


def assemble_step(d: Sequence[float], count: int, tc0: float, tm0: float, f0: float, b0: float,
                  tc1: float, tm1: float, f1: float, b1: float, num_layers: int, tp: int
                  ) -> tuple[float, float, float, int]:
    """A step's ``(seconds, flops, bytes, bound code)`` from its dense constants ``d`` and its
    ``count`` attention operators (``attention_ops``). Each operator joins the compute or the
    memory tally (``tally_op``); the bound is the largest of compute, memory, all-reduce and
    overhead time, ties going to the later of ``BOUND_NAMES`` order "overhead" > "memory" >
    "compute" > "comm" (the order of the names, as ``max`` over ``(seconds, name)`` pairs
    takes it)."""
    c, m, f, b = d[D_C0], d[D_M0], d[D_F0], d[D_B0]
    # no latency per operator: the layer's attention kernel latency is added once, below
    att, c, m, f, b = tally_op(c, m, f, b, tc0, tm0, f0, b0, 0.0)
    if count == 2:
        t, c, m, f, b = tally_op(c, m, f, b, tc1, tm1, f1, b1, 0.0)
        att += t
    att_lat = d[D_ATT_LAT]
    m = m + att_lat + d[D_T_NORM]
    compute_s = c * num_layers + d[D_C2]
    memory_s = m * num_layers + d[D_M2]
    seconds = d[D_S3] + (att + att_lat) * num_layers + d[D_NORMS_L]
    comm_l = d[D_COMM_L]
    if tp > 1:
        seconds += comm_l
    overhead = d[D_OVERHEAD]
    seconds = seconds + d[D_EMB_S] + d[D_LM_S] + overhead
    if memory_s >= compute_s:
        bound, top = BOUND_MEMORY, memory_s
    else:
        bound, top = BOUND_COMPUTE, compute_s
    if comm_l > top:
        bound, top = BOUND_COMM, comm_l
    if overhead >= top:
        bound = BOUND_OVERHEAD
    return (seconds, (f * num_layers + d[D_F2]) * tp,
            ((b + d[D_E_NORM]) * num_layers + d[D_B2]) * tp, bound)


def overhead_s(per_step_s: float, per_seq_s: float, per_layer_launch_s: float, rows: int,
               num_layers: int) -> float:
    """The engine's CPU-side seconds of a step of ``rows`` rows."""
    return per_step_s + per_seq_s * rows + per_layer_launch_s * num_layers


def gemm_op(g: Sequence[float], m: float, n: float, k: float, experts: float, m_rows: float
            ) -> tuple[float, float, float, float]:
    """``(compute s, memory s, flops, bytes)`` of ``m`` tokens through an ``n × k`` weight
    GEMM; a mixture of experts reads ``experts`` weight sets and each expert GEMM sees
    ``m_rows`` tokens on average (few rows cannot fill the tensor cores)."""
    flops = 2.0 * m * n * k
    nbytes = experts * n * k * g[G_WB] + m * (n + k) * ACT_BYTES
    eff = g[G_EFF_MAX] * m_rows / (m_rows + g[G_M_HALF])
    return flops / (g[G_PEAK] * eff), nbytes / g[G_BW], flops, nbytes


def allreduce_s(alpha_s: float, n: float, msg_bytes: float, bus_bytes_per_s: float) -> float:
    """One ring all-reduce of ``msg_bytes`` over ``n`` GPUs: ``α + 2(n−1)/n · bytes / bus``."""
    return alpha_s + 2 * (n - 1) / n * msg_bytes / bus_bytes_per_s


def tally_op(c: float, m: float, f: float, b: float, tc: float, tm: float, fo: float,
             bo: float, lat: float) -> tuple[float, float, float, float, float]:
    """One operator ``(tc, tm, fo, bo)`` taking ``max(compute, memory) + lat`` seconds, added
    to the compute- or memory-bound seconds ``c``/``m`` and the flops and bytes ``f``/``b``;
    returns its seconds and the new tallies."""
    t = (tc if tc >= tm else tm) + lat
    if tc > tm:
        c += t
    else:
        m += t
    return t, c, m, f + fo, b + bo


def dense_gemms(g: Sequence[float], T: float) -> tuple[float, float, float, float, float,
                                                       float, float]:
    """One layer's weight GEMMs for ``T`` tokens: seconds of the QKV projection, the O
    projection and the MLP, then the compute-bound and memory-bound seconds, flops and bytes
    they add (each operator takes ``max(compute, memory) + latency``)."""
    lat = g[G_LAT]
    experts, tokens, rows_up = 1.0, T, T
    if g[G_MOE] != 0.0:  # expected distinct experts T tokens touch with top-k routing
        e, k = g[G_EXPERTS], g[G_TOP_K]
        experts = e * (1.0 - (1.0 - k / e) ** T)
        tokens = T * k
        rows_up = tokens / experts
    tc, tm, fo, bo = gemm_op(g, T, g[G_QKV_N], g[G_QKV_K], 1.0, T)
    t_qkv, c, m, f, b = tally_op(0.0, 0.0, 0.0, 0.0, tc, tm, fo, bo, lat)
    tc, tm, fo, bo = gemm_op(g, T, g[G_O_N], g[G_O_K], 1.0, T)
    t_o, c, m, f, b = tally_op(c, m, f, b, tc, tm, fo, bo, lat)
    tc, tm, fo, bo = gemm_op(g, tokens, g[G_UP_N], g[G_UP_K], experts, rows_up)
    t_up, c, m, f, b = tally_op(c, m, f, b, tc, tm, fo, bo, lat)
    tc, tm, fo, bo = gemm_op(g, tokens, g[G_DOWN_N], g[G_DOWN_K], experts, rows_up)
    t_down, c, m, f, b = tally_op(c, m, f, b, tc, tm, fo, bo, lat)
    return 0.0 + t_qkv, 0.0 + t_o, (0.0 + t_up) + t_down, c, m, f, b


def dense_constants(g: Sequence[float], T: float, rows: int) -> tuple[float, ...]:
    """The parts of a step of ``T`` tokens in ``rows`` rows that attention does not touch, as
    partial sums in the step's order of operations, in the slots ``D_*``: the GEMMs, the norms
    (memory-bound), the all-reduce, the embedding gather and the LM head (one sampling
    position per row), and the engine overhead."""
    L, lat, bw, h = g[G_LAYERS], g[G_LAT], g[G_BW], g[G_HIDDEN]
    t_qkv, t_o, t_mlp, c0, m0, f0, b0 = dense_gemms(g, T)
    s3 = t_qkv * L + t_o * L + t_mlp * L
    # two norms (+ residual), rope, activation: read+write activations, memory-bound
    elem = T * ACT_BYTES * (6 * h + g[G_Q_BYTES] / ACT_BYTES + 3 * g[G_DOWN_K])
    t_norm = elem / bw
    t_norm = (0.0 if 0.0 >= t_norm else t_norm) + 4 * lat
    comm = 0.0
    if g[G_TP] > 1:  # Megatron TP: one all-reduce after attention, one after the MLP
        one = allreduce_s(g[G_ALPHA], g[G_TP], T * h * ACT_BYTES, g[G_BUS])
        comm = 2 * (one if one >= g[G_AR_FLOOR] else g[G_AR_FLOOR])
    emb = T * h * g[G_WB]  # the embedding gather, then the LM head (one row per sequence)
    t_emb, c2, m2, f2, b2 = tally_op(0.0, 0.0, 0.0, 0.0, 0.0, emb / bw, 0.0, emb, lat)
    tc, tm, fl, bl = gemm_op(g, float(rows), g[G_LM_N], h, 1.0, float(rows))
    t_lm, c2, m2, f2, b2 = tally_op(c2, m2, f2, b2, tc, tm, fl, bl, lat)
    overhead = overhead_s(g[G_PER_STEP], g[G_PER_SEQ], g[G_PER_LAYER], rows, int(L))
    att_lat = g[G_ATT_LAT] + lat
    return (s3, c0, m0, f0, b0, att_lat, t_norm, elem, t_norm * L, comm * L, 0.0 + t_emb,
            0.0 + t_lm, overhead, c2, m2, f2, b2, rows * g[G_ROW_TOK],
            rows * (g[G_KVT] + g[G_Q_BYTES]), ((m0 + att_lat) + t_norm) * L + m2,
            c0 * L + c2)
