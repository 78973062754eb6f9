"""Fit a GPU profile's roofline efficiencies to measured kernel timings by least squares.

The measured data are NVIDIA AIConfigurator kernel tables (vLLM 0.14 GEMMs, flash-attention
prefill and decode kernels, NCCL all-reduce); ``prepare_measurements`` copies the subset the
simulator's shapes need into ``hardware_profiles/measurements/<gpu>/``. ``calibrate`` predicts each
kernel with exactly the formulas ``sim.cost.roofline`` uses, fits the parameters on part of the
shapes in log space (so every kernel counts by its relative error), and reports the median
absolute percentage error (MdAPE) per operator class on the held-out shapes.

Hold-out design: whole shape families are held out, never single points of a family, so the
error measures transfer to weight shapes, head layouts and message sizes the fit never saw.
Every third distinct key (sorted) is held out: GEMMs by weight shape ``(n, k)`` (all token
counts ``m`` of that weight together), attention by head configuration ``(num_heads,
num_key_value_heads)`` per GPU (every batch size and length of it together: a stand-in for
unseen models and TP degrees), all-reduce by message size (all GPU counts together).
A GPU folder may also hold ``gemm_operators.csv.gz`` (``family,m,n,k,latency``): linear-layer
operator timings of another source (for H100, Vidur's per-operator profile of a vLLM-style
engine). The GEMM parameters are then fitted to both sources with equal weight (each source's
log residuals scaled by one over the square root of its rows), and the report gives the
held-out error of each (``gemm_operators`` holds out every third family, an operator at one TP
degree). The command line is ``batchsim calibrate`` (:mod:`sim.cli.calibrate`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from sim.core.paths import checkout_root
from sim.cost.calibration_input import CalibrationError, check_columns, read_csv
from sim.cost.profiles import GpuProfile, ProfileError, load_gpu
from sim.cost.roofline_terms import PREFILL_TILE_TOKENS

#: Parameter name → (initial value, lower bound, upper bound); the order is the fit vector's.
GEMM_PARAMS: dict[str, tuple[float, float, float]] = {
    "compute_eff_max": (0.8, 0.2, 1.0),
    "compute_m_half": (32.0, 0.0, 2048.0),
    "memory_eff": (0.85, 0.3, 1.0),
    "kernel_latency_us": (3.0, 0.0, 50.0),
}
ATTENTION_PARAMS: dict[str, tuple[float, float, float]] = {
    "attention_compute_eff": (0.5, 0.05, 1.0),
    "attention_m_half": (16.0, 0.0, 4096.0),
    "attention_memory_eff": (0.7, 0.05, 1.0),
    "attention_latency_us": (8.0, 0.0, 100.0),
    "attention_row_tokens": (16.0, 0.0, 4096.0),
    "attention_pad_tokens": (64.0, 0.0, 4096.0),
    "attention_prefill_par_half": (10.0, 0.0, 5000.0),
    "attention_decode_par_half": (10.0, 0.0, 5000.0),
    "attention_split_tokens": (2000.0, 16.0, 1e6),
    "attention_mha_split_tokens": (2000.0, 16.0, 1e6),
    "attention_gqa_latency_us": (2.0, 0.0, 50.0),
}
#: Values of trailing attention parameters a shorter theta leaves out: their neutral settings.
_ATTENTION_NEUTRAL = (0.0, 0.0, 0.0, float("inf"))
COMM_PARAMS: dict[str, tuple[float, float, float]] = {
    "allreduce_alpha_us": (8.0, 0.0, 200.0),
    "alpha_per_peer_us": (1.0, 0.0, 50.0),
    "comm_eff": (0.8, 0.05, 3.0),
}
#: Operator classes of the kernel-level fit, in report order.
CLASSES = ("gemm", "context_attention", "generation_attention", "allreduce")
_COLUMNS = {"gemm": ("m", "n", "k", "latency"),
            "context_attention": ("batch_size", "isl", "num_heads", "num_key_value_heads",
                                  "head_dim", "latency"),
            "generation_attention": ("batch_size", "step", "num_heads", "num_key_value_heads",
                                     "head_dim", "latency"),
            "allreduce": ("num_gpus", "message_size", "latency")}
_FILES = {"gemm": "gemm.csv.gz", "context_attention": "context_attention.csv.gz",
          "generation_attention": "generation_attention.csv.gz", "allreduce": "nccl.csv.gz"}

__all__ = ["CalibrationError"]  # defined with the input checks, raised from here too

#: Optional second GEMM source of a measurement folder (see the module docstring).
OPERATOR_FILE = "gemm_operators.csv.gz"
OPERATOR_CLASS = "gemm_operators"


@dataclass(frozen=True)
class CalibrationReport:
    """Outcome of one fit: parameters, per-class held-out MdAPE (%) and row counts.

    ``points`` maps each class to ``(predicted s, measured s, held-out mask)`` for plots;
    ``overall_*`` pool every class's rows; ``data`` names the measurement folder."""

    gpu: str
    params: dict[str, float]
    heldout_mdape_pct: dict[str, float]
    train_mdape_pct: dict[str, float]
    n_train: dict[str, int]
    n_heldout: dict[str, int]
    overall_heldout_mdape_pct: float = float("nan")
    overall_train_mdape_pct: float = float("nan")
    data: str = ""
    points: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(
        default_factory=dict, repr=False)


#: The step shapes the subset ``prepare_measurements`` keeps covers (the ``calibration.fit.range``
#: of a fitted GPU, read by ``sim.cost.validity``): GEMMs and prefill up to 8192 tokens, decode
#: batches up to 2048 sequences of up to 32768 tokens, all-reduce over up to 8 GPUs, bf16 only.
MEASURED_RANGE = {"max_tokens": 8192, "max_rows": 2048, "max_context_tokens": 32768,
                  "max_tp": 8, "dtypes": ["bf16"]}


def prepare_measurements(source_dir: str | Path, out_dir: str | Path) -> dict[str, int]:
    """Copy the simulator-relevant subset of one AIConfigurator system folder (e.g.
    ``.../aiconfigurator/h100_sxm``) to ``out_dir``: bf16 GEMMs with m ≤ 8192 and n, k ≥ 256,
    bf16-KV attention with at most 8192 prefill tokens (decode history ≤ 32767), and NCCL
    half-precision all-reduce. Returns rows written per file."""
    src, out = Path(source_dir), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    def one(pattern: str) -> pd.DataFrame:
        hits = sorted(src.glob(pattern))
        if not hits:
            raise ProfileError(f"{src}: no file matches {pattern}")
        return pd.read_csv(hits[0])

    g = one("gemm_*/gemm_perf.csv.gz")
    g = g[(g.gemm_dtype == "bfloat16") & (g.m <= 8192) & (g.n >= 256) & (g.k >= 256)]
    c = one("attention_*/context_attention_perf.csv.gz")
    c = c[(c.kv_cache_dtype == "bfloat16") & (c.batch_size * c.isl <= 8192)]
    d = one("attention_*/generation_attention_perf.csv.gz")
    d = d[(d.kv_cache_dtype == "bfloat16") & (d.step <= 32767)]
    n = one("comm_*/nccl_perf.csv.gz")
    n = n[(n.op_name == "all_reduce") & (n.nccl_dtype == "half")]
    counts = {}
    for key, frame in zip(_FILES, (g, c, d, n), strict=True):
        frame.to_csv(out / _FILES[key], index=False, compression={"method": "gzip", "mtime": 0})
        counts[_FILES[key]] = len(frame)
    return counts


def _load(data_dir: Path) -> dict[str, pd.DataFrame]:
    """Read and check the four measurement tables of one GPU (``CalibrationError`` if bad)."""
    if not data_dir.is_dir():
        raise CalibrationError(f"measurement folder not found: {data_dir}")
    missing = [f for f in _FILES.values() if not (data_dir / f).is_file()]
    if missing:
        raise CalibrationError(f"{data_dir}: missing measurement file(s) {missing}")
    out = {}
    for key, name in _FILES.items():
        frame = read_csv(data_dir / name)
        lacking = [c for c in _COLUMNS[key] if c not in frame.columns]
        if lacking:
            raise CalibrationError(f"{data_dir / name}: missing column(s) {lacking}")
        cols = list(_COLUMNS[key])
        # every size a whole number >= 1 (a decode's step may be 0), latencies finite and
        # in [0, MAX_LATENCY_MS] ms; a latency of 0 marks an untimed shape and is skipped
        frame = check_columns(frame, data_dir / name, cols[:-1], "latency", {"step": 0})
        frame = frame[frame["latency"] > 0].reset_index(drop=True)
        if len(frame) < 3:
            raise CalibrationError(f"{data_dir / name}: fewer than 3 timed rows")
        out[key] = frame
    extra = data_dir / OPERATOR_FILE
    if extra.is_file():
        try:
            frame = pd.read_csv(extra)
        except (OSError, ValueError, UnicodeDecodeError, EOFError) as e:
            raise CalibrationError(f"{extra}: cannot read CSV ({e})") from e
        cols = ["family", "m", "n", "k", "latency"]
        lacking = [c for c in cols if c not in frame.columns]
        if lacking:
            raise CalibrationError(f"{extra}: missing column(s) {lacking}")
        if frame[cols[1:]].apply(pd.to_numeric, errors="coerce").isna().any().any():
            raise CalibrationError(f"{extra}: non-numeric or empty values in {cols[1:]}")
        out[OPERATOR_CLASS] = frame[frame["latency"] > 0].reset_index(drop=True)
    return out


def _heldout(keys: pd.DataFrame, *others: pd.DataFrame) -> np.ndarray:
    """Deterministic split by shape family: every third distinct key (sorted over ``keys`` and
    ``others`` together, so tables sharing parameters hold out the same families)."""
    def codes(frame: pd.DataFrame) -> pd.Series:
        return frame.astype(str).agg("|".join, axis=1)

    every = pd.concat([codes(f) for f in (keys, *others)]).unique()
    uniq = {k: i for i, k in enumerate(sorted(every))}
    return (codes(keys).map(uniq).to_numpy() % 3) == 2


def _predict_gemm(theta: np.ndarray, gpu: GpuProfile, g: pd.DataFrame) -> np.ndarray:
    """Seconds per measured GEMM under ``theta`` (``GEMM_PARAMS`` order), as the roofline."""
    eff_max, m_half, mem_eff, lat_us = theta
    peak, bw = gpu.peak_flops("bf16"), gpu.hbm_bytes_per_s * mem_eff
    m, n, k = (g[c].to_numpy(float) for c in ("m", "n", "k"))
    return np.maximum(2 * m * n * k / (peak * eff_max * m / (m + m_half)),
                      (2 * n * k + 2 * m * (n + k)) / bw) + lat_us * 1e-6


def _predict_attention(theta: np.ndarray | tuple[float, ...], gpu: GpuProfile, a: pd.DataFrame,
                       prefill: bool) -> np.ndarray:
    """Seconds per measured attention kernel under ``theta`` (``ATTENTION_PARAMS`` order; a
    5-long theta leaves padding and occupancy out): prefill rows are ``batch_size`` causal chunks
    of ``isl`` tokens, decode rows attend ``step + 1`` keys; same formulas as ``sim.cost.roofline``,
    which also treats a one-token prefill row (``isl == 1``) as decode. A 9-long theta gives
    multi-head layouts the grouped-query split length and no swap latency."""
    theta = tuple(theta) + _ATTENTION_NEUTRAL[len(theta) - 5:] if len(theta) < 9 else theta
    if len(theta) < 10:  # no separate multi-head split length: the grouped-query one
        theta = (*theta, theta[8])
    if len(theta) < 11:
        theta = (*theta, 0.0)
    (att_eff, att_half, mem_eff, lat_us, row_tokens, pad, pf_half, dec_half, split, mha_split,
     gqa_lat) = theta
    peak, bw = gpu.peak_flops("bf16"), gpu.hbm_bytes_per_s * mem_eff
    b, hq, hkv, hd = (a[c].to_numpy(float) for c in
                      ("batch_size", "num_heads", "num_key_value_heads", "head_dim"))
    kvt, qb = 2 * hkv * hd * 2, 2 * hq * hd * 2  # KV bytes per token, Q read + O write
    s = a["isl"].to_numpy(float) if prefill else np.ones(len(a))
    ctx = s if prefill else a["step"].to_numpy(float) + 1
    # decode (and one-token "prefill" rows, which the simulator runs as decode)
    flops = 4 * hq * hd * b * ctx
    nbytes = kvt * b * (ctx + row_tokens) + b * (kvt + qb)
    # FlashAttention-2 splits the KV of multi-head (hq == hkv) decode by its own rule
    par = hkv * (b + b * ctx / np.where(hq == hkv, mha_split, split))
    t_row = np.maximum(flops / (peak * att_eff), nbytes / bw)
    tail = t_row * dec_half / par  # every row streams its KV (see RooflineCost._attention)
    t = t_row + tail + np.where((hkv > 1) & (hq > hkv), gqa_lat * 1e-6, 0.0)
    if prefill:
        flops = 4 * hq * hd * b * (s * (s + 1) / 2 + pad * s)
        nbytes = kvt * b * (2 * s + row_tokens) + qb * b * s
        eff = att_eff * s / (s + att_half)
        par = hq * b * (1 + s / PREFILL_TILE_TOKENS)
        t_pf = np.maximum(flops / (peak * eff), nbytes / bw)
        t = np.where(s > 1, t_pf + np.maximum(tail, t_pf * pf_half / par), t)
    return t + lat_us * 1e-6


def _predict_comm(theta: np.ndarray, gpu: GpuProfile, nccl: pd.DataFrame) -> np.ndarray:
    """Seconds per all-reduce: α + α_peer·(n−2) + 2(n−1)/n · bytes / (bus × comm_eff).
    ``message_size`` is taken as bytes: read as elements, the A100 8-GPU rows would exceed
    NVLink's physical bus bandwidth (see measurements PROVENANCE.md)."""
    alpha, per_peer, comm_eff = theta
    ngpu, size = nccl["num_gpus"].to_numpy(float), nccl["message_size"].to_numpy(float)
    bus = gpu.interconnect.bus_bw_gbps * 1e9 * comm_eff
    return (alpha + per_peer * (ngpu - 2)) * 1e-6 + 2 * (ngpu - 1) / ngpu * size / bus


def _mdape(pred: np.ndarray, meas: np.ndarray) -> float:
    """Median absolute percentage error."""
    return float(np.median(np.abs(pred - meas) / meas) * 100) if len(meas) else float("nan")


def _fit(residual, spec: dict[str, tuple[float, float, float]]) -> np.ndarray:
    """Bounded least squares in log space, soft-L1 so a few odd kernels cannot dominate."""
    from scipy.optimize import least_squares  # optional dependency: only calibration needs it

    x0, lo, hi = (np.array(v) for v in zip(*spec.values(), strict=True))
    return least_squares(residual, x0, bounds=(lo, hi), loss="soft_l1", f_scale=0.1).x


def calibrate(gpu: str | GpuProfile, data_dir: str | Path | None = None
              ) -> tuple[dict[str, float], CalibrationReport]:
    """Fit ``gpu``'s calibration parameters to its measured kernels in ``data_dir`` (default:
    the built-in ``hardware_profiles/measurements/<gpu>/``). Two thirds of the shapes train,
    one third is held out. Returns the fitted parameters (GPU-YAML names: the ``calibration:``
    keys plus ``allreduce_alpha_us``/``alpha_per_peer_us`` of ``interconnect:``) and a report."""
    if isinstance(gpu, GpuProfile):
        profile = gpu
    else:
        try:
            profile = load_gpu(gpu)
        except ProfileError as e:
            raise CalibrationError(str(e)) from e
    folder = Path(data_dir) if data_dir is not None else default_data_dir(profile.name)
    data = _load(folder)
    heads = ["num_heads", "num_key_value_heads"]
    ctx_heads, gen_heads = data["context_attention"][heads], data["generation_attention"][heads]
    split = {
        "gemm": _heldout(data["gemm"][["n", "k"]]),
        "context_attention": _heldout(ctx_heads, gen_heads),
        "generation_attention": _heldout(gen_heads, ctx_heads),
        "allreduce": _heldout(data["allreduce"][["message_size"]]),
    }
    if OPERATOR_CLASS in data:
        split[OPERATOR_CLASS] = _heldout(data[OPERATOR_CLASS][["family"]])
    meas = {k: v["latency"].to_numpy(float) * 1e-3 for k, v in data.items()}  # ms → s
    tr = {k: ~split[k] for k in split}

    def predict(key: str, theta: np.ndarray, rows: np.ndarray | slice = slice(None)
                ) -> np.ndarray:
        frame = data[key][rows]
        if key in ("gemm", OPERATOR_CLASS):
            return _predict_gemm(theta, profile, frame)
        if key == "allreduce":
            return _predict_comm(theta, profile, frame)
        return _predict_attention(theta, profile, frame, key == "context_attention")

    def residual(keys: tuple[str, ...]):
        # with two sources of one class, each counts as one whatever its number of rows
        weight = {k: 1.0 / np.sqrt(tr[k].sum()) if len(keys) > 1 and k.startswith("gemm")
                  else 1.0 for k in keys}
        return lambda t: np.concatenate([np.log(predict(k, t, tr[k]) / meas[k][tr[k]])
                                         * weight[k] for k in keys])

    attn = ("context_attention", "generation_attention")
    gemms = ("gemm", OPERATOR_CLASS) if OPERATOR_CLASS in data else ("gemm",)
    groups = ((gemms, GEMM_PARAMS), (attn, ATTENTION_PARAMS), (("allreduce",), COMM_PARAMS))
    params: dict[str, float] = {}
    pred: dict[str, np.ndarray] = {}
    for keys, spec in groups:  # each operator class has its own parameters: fit them apart
        theta = _fit(residual(keys), spec)
        params.update(zip(spec, map(float, theta), strict=True))
        pred.update({k: predict(k, theta) for k in keys})
    def pooled(held: bool) -> float:
        return _mdape(*(np.concatenate([(pred[k] if i == 0 else meas[k])[split[k] == held]
                                        for k in CLASSES]) for i in (0, 1)))

    report = CalibrationReport(
        gpu=profile.name, params=params,
        heldout_mdape_pct={k: _mdape(pred[k][split[k]], meas[k][split[k]]) for k in pred},
        train_mdape_pct={k: _mdape(pred[k][~split[k]], meas[k][~split[k]]) for k in pred},
        n_train={k: int((~split[k]).sum()) for k in pred},
        n_heldout={k: int(split[k].sum()) for k in pred},
        overall_heldout_mdape_pct=pooled(True), overall_train_mdape_pct=pooled(False),
        data=str(folder), points={k: (pred[k], meas[k], split[k]) for k in pred})
    return params, report


def measurements_root() -> Path:
    """``hardware_profiles/measurements`` of the source checkout."""
    return checkout_root() / "hardware_profiles" / "measurements"


def measured_gpus() -> list[str]:
    """GPUs with built-in kernel measurements (sorted names of the folders holding kernel
    tables; ``engines/`` holds engine-level data, not a GPU's)."""
    root = measurements_root()
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / _FILES["gemm"]).is_file())


def default_data_dir(gpu_name: str) -> Path:
    """The built-in measurement folder of ``gpu_name``; ``CalibrationError`` when none."""
    folder = measurements_root() / gpu_name
    if not folder.is_dir():
        raise CalibrationError(f"no built-in measurements for {gpu_name!r}; known: "
                               f"{measured_gpus()}; pass --data DIR")
    return folder


def report_table(reports: list[CalibrationReport] | CalibrationReport) -> str:
    """Markdown table: held-out / train MdAPE (%) per operator class and pooled, per GPU."""
    reports = [reports] if isinstance(reports, CalibrationReport) else list(reports)
    lines = ["| gpu | " + " | ".join(CLASSES) + " | overall |", "|---" * (len(CLASSES) + 2) + "|"]
    for r in reports:
        cells = [f"{r.heldout_mdape_pct[c]:.1f} / {r.train_mdape_pct[c]:.1f} ({r.n_heldout[c]})"
                 for c in CLASSES]
        cells.append(f"{r.overall_heldout_mdape_pct:.1f} / {r.overall_train_mdape_pct:.1f} "
                     f"({sum(r.n_heldout.values())})")
        lines.append(f"| {r.gpu} | " + " | ".join(cells) + " |")
    notes = [f"{r.gpu} {c} (second GEMM source): {r.heldout_mdape_pct[c]:.1f} / "
             f"{r.train_mdape_pct[c]:.1f} ({r.n_heldout[c]})"
             for r in reports for c in r.heldout_mdape_pct if c not in CLASSES]
    return "\n".join(lines + [*([""] + notes if notes else []), "",
                               "Cells: MdAPE % held-out / train (held-out rows)."])


def params_table(reports: list[CalibrationReport] | CalibrationReport) -> str:
    """Markdown table of the fitted parameters, one column per GPU."""
    reports = [reports] if isinstance(reports, CalibrationReport) else list(reports)
    names = list(reports[0].params) if reports else []
    lines = ["| parameter | " + " | ".join(r.gpu for r in reports) + " |",
             "|---" * (len(reports) + 1) + "|"]
    lines += [f"| {n} | " + " | ".join(f"{r.params.get(n, float('nan')):.4g}" for r in reports)
              + " |" for n in names]
    return "\n".join(lines)
