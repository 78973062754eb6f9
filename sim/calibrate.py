"""Fit a GPU profile's roofline efficiencies to measured kernel timings by least squares.

The measured data are NVIDIA AIConfigurator kernel tables (vLLM 0.14 GEMMs, flash-attention
prefill and decode kernels, NCCL all-reduce); ``prepare_measurements`` copies the subset the
simulator's shapes need into ``hardware_profiles/measurements/<gpu>/``. ``calibrate`` predicts each
kernel with exactly the formulas ``sim.roofline`` uses, fits the parameters on part of the
shapes in log space (so every kernel counts by its relative error), and reports the median
absolute percentage error (MdAPE) per operator class on the held-out shapes.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from sim.hardware import GpuProfile, ProfileError, load_gpu

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
}
COMM_PARAMS: dict[str, tuple[float, float, float]] = {
    "allreduce_alpha_us": (8.0, 0.0, 200.0),
    "alpha_per_peer_us": (1.0, 0.0, 50.0),
    "comm_eff": (0.8, 0.05, 3.0),
}
_FILES = {"gemm": "gemm.csv.gz", "context_attention": "context_attention.csv.gz",
          "generation_attention": "generation_attention.csv.gz", "allreduce": "nccl.csv.gz"}


@dataclass(frozen=True)
class CalibrationReport:
    """Outcome of one fit: parameters, per-class held-out MdAPE (%) and row counts."""

    gpu: str
    params: dict[str, float]
    heldout_mdape_pct: dict[str, float]
    train_mdape_pct: dict[str, float]
    n_train: dict[str, int]
    n_heldout: dict[str, int]


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
    """Read the four measurement tables of one GPU."""
    missing = [f for f in _FILES.values() if not (data_dir / f).is_file()]
    if missing:
        raise ProfileError(f"{data_dir}: missing measurement file(s) {missing}")
    return {k: pd.read_csv(data_dir / f) for k, f in _FILES.items()}


def _heldout(keys: pd.DataFrame) -> np.ndarray:
    """Deterministic split by shape: every third distinct shape key is held out."""
    codes = keys.astype(str).agg("|".join, axis=1)
    uniq = {k: i for i, k in enumerate(sorted(codes.unique()))}
    return (codes.map(uniq).to_numpy() % 3) == 2


def _predict_gemm(theta: np.ndarray, gpu: GpuProfile, g: pd.DataFrame) -> np.ndarray:
    """Seconds per measured GEMM under ``theta`` (``GEMM_PARAMS`` order), as ``sim.roofline``."""
    eff_max, m_half, mem_eff, lat_us = theta
    peak, bw = gpu.peak_flops("bf16"), gpu.hbm_bytes_per_s * mem_eff
    m, n, k = (g[c].to_numpy(float) for c in ("m", "n", "k"))
    return np.maximum(2 * m * n * k / (peak * eff_max * m / (m + m_half)),
                      (2 * n * k + 2 * m * (n + k)) / bw) + lat_us * 1e-6


def _predict_attention(theta: np.ndarray, gpu: GpuProfile, a: pd.DataFrame, prefill: bool
                       ) -> np.ndarray:
    """Seconds per measured attention kernel under ``theta`` (``ATTENTION_PARAMS`` order):
    prefill rows are ``batch_size`` causal chunks of ``isl`` tokens, decode rows attend
    ``step + 1`` keys; same FLOP and byte counts as ``sim.roofline``."""
    att_eff, att_half, mem_eff, lat_us, row_tokens = theta
    peak, bw = gpu.peak_flops("bf16"), gpu.hbm_bytes_per_s * mem_eff
    b, hq, hkv, hd = (a[c].to_numpy(float) for c in
                      ("batch_size", "num_heads", "num_key_value_heads", "head_dim"))
    kvt, qb = 2 * hkv * hd * 2, 2 * hq * hd * 2  # KV bytes per token, Q read + O write
    if prefill:
        s = a["isl"].to_numpy(float)
        flops = 4 * hq * hd * b * s * (s + 1) / 2
        nbytes = kvt * b * (2 * s + row_tokens) + qb * b * s
        eff = att_eff * s / (s + att_half)
    else:
        ctx = a["step"].to_numpy(float) + 1
        flops = 4 * hq * hd * b * ctx
        nbytes = kvt * b * (ctx + row_tokens) + b * (kvt + qb)
        eff = att_eff
    return np.maximum(flops / (peak * eff), nbytes / bw) + lat_us * 1e-6


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
    profile = gpu if isinstance(gpu, GpuProfile) else load_gpu(gpu)
    folder = Path(data_dir) if data_dir is not None else _default_dir(profile.name)
    data = _load(folder)
    data = {k: v[v["latency"] > 0].reset_index(drop=True) for k, v in data.items()}
    split = {
        "gemm": _heldout(data["gemm"][["n", "k"]]),
        "context_attention": _heldout(data["context_attention"][["num_heads",
                                                                 "num_key_value_heads"]]),
        "generation_attention": _heldout(data["generation_attention"][["num_heads",
                                                                       "num_key_value_heads"]]),
        "allreduce": _heldout(data["allreduce"][["message_size"]]),
    }
    meas = {k: v["latency"].to_numpy(float) * 1e-3 for k, v in data.items()}  # ms → s
    tr = {k: ~split[k] for k in split}

    def predict(key: str, theta: np.ndarray, rows: np.ndarray | slice = slice(None)
                ) -> np.ndarray:
        frame = data[key][rows]
        if key == "gemm":
            return _predict_gemm(theta, profile, frame)
        if key == "allreduce":
            return _predict_comm(theta, profile, frame)
        return _predict_attention(theta, profile, frame, key == "context_attention")

    def residual(keys: tuple[str, ...]):
        return lambda t: np.concatenate([np.log(predict(k, t, tr[k]) / meas[k][tr[k]])
                                         for k in keys])

    attn = ("context_attention", "generation_attention")
    groups = ((("gemm",), GEMM_PARAMS), (attn, ATTENTION_PARAMS), (("allreduce",), COMM_PARAMS))
    params: dict[str, float] = {}
    pred: dict[str, np.ndarray] = {}
    for keys, spec in groups:  # each operator class has its own parameters: fit them apart
        theta = _fit(residual(keys), spec)
        params.update(zip(spec, map(float, theta), strict=True))
        pred.update({k: predict(k, theta) for k in keys})
    report = CalibrationReport(
        gpu=profile.name, params=params,
        heldout_mdape_pct={k: _mdape(pred[k][split[k]], meas[k][split[k]]) for k in pred},
        train_mdape_pct={k: _mdape(pred[k][~split[k]], meas[k][~split[k]]) for k in pred},
        n_train={k: int((~split[k]).sum()) for k in pred},
        n_heldout={k: int(split[k].sum()) for k in pred})
    return params, report


def _default_dir(gpu_name: str) -> Path:
    """The built-in measurement folder of ``gpu_name`` in the source checkout."""
    folder = Path(__file__).resolve().parent.parent / "hardware_profiles" / "measurements"
    if not (folder / gpu_name).is_dir():
        known = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
        raise ProfileError(f"no built-in measurements for {gpu_name!r}; known: {known}; "
                           "pass data_dir")
    return folder / gpu_name


def report_table(reports: list[CalibrationReport] | CalibrationReport) -> str:
    """A Markdown table of fitted parameters and held-out MdAPE per operator class."""
    reports = [reports] if isinstance(reports, CalibrationReport) else list(reports)
    classes = ["gemm", "context_attention", "generation_attention", "allreduce"]
    lines = ["| gpu | " + " | ".join(f"{c} MdAPE % (held-out / train, n)" for c in classes)
             + " | params |", "|---" * (len(classes) + 2) + "|"]
    for r in reports:
        cells = [f"{r.heldout_mdape_pct[c]:.1f} / {r.train_mdape_pct[c]:.1f} ({r.n_heldout[c]})"
                 for c in classes]
        params = ", ".join(f"{k}={v:.3g}" for k, v in r.params.items())
        lines.append(f"| {r.gpu} | " + " | ".join(cells) + f" | {params} |")
    return "\n".join(lines)
