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
    memory tally; the bound is the largest of compute, memory, all-reduce and overhead time,
    ties going to the later of ``BOUND_NAMES`` order "overhead" > "memory" > "compute" >
    "comm" (the order of the names, as ``max`` over ``(seconds, name)`` pairs takes it)."""
    c, m, f, b = d[D_C0], d[D_M0], d[D_F0], d[D_B0]
    t = tc0 if tc0 > tm0 else tm0
    if tc0 > tm0:
        c += t
    else:
        m += t
    f += f0
    b += b0
    att = t
    if count == 2:
        t = tc1 if tc1 > tm1 else tm1
        if tc1 > tm1:
            c += t
        else:
            m += t
        f += f1
        b += b1
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
