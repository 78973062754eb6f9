"""Per-run data behind the per-run figures: latency samples for CDFs and a bucketed timeline.

Both renderers (the PNGs and ``report.html``) draw from these, so a CDF or a timeline shows
the same numbers in either.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from sim.experiments.results import read_table
from sim.metrics.stream import is_bucketed
from sim.metrics.summary import itl_sample

#: Latency metrics of the CDF figures: (key, name, requests column or None for ITL).
CDF_METRICS = (("ttft", "TTFT", "ttft_s"), ("tpot", "TPOT", "tpot_s"), ("itl", "ITL", None),
               ("e2el", "E2E", "e2e_s"))
#: Most points of one drawn CDF or timeline (quantiles / buckets beyond are merged).
MAX_POINTS = 1000
TIMELINE_BUCKETS = 300


def latency_samples(run_dir: Path) -> dict[str, tuple[np.ndarray, np.ndarray]] | None:
    """Per metric of ``CDF_METRICS``: (values in ms, weights) over the run's finished requests
    (ITL: every inter-token gap, step durations weighted by the tokens they emitted; from a
    bucketed step table, each bucket's mean step duration); ``None`` when the run's tables
    cannot be read."""
    try:
        req = read_table(run_dir / "requests")
        steps = read_table(run_dir / "steps")
        irregular = np.load(run_dir / "itl_irregular.npy")
    except (OSError, ValueError):
        return None
    done = req[req["status"] == "finished"]
    if is_bucketed(steps):  # per-step durations are gone: each bucket's mean step stands in
        steps = pd.DataFrame({
            "duration_s": steps["duration_s_sum"] / np.maximum(steps["num_steps"], 1),
            "num_regular_itl": steps["num_regular_itl_sum"]})
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for key, _, col in CDF_METRICS:
        if col is None:
            gaps = irregular.reshape(-1, 2) if irregular.size else np.zeros((0, 2))
            vals, counts = itl_sample(steps, gaps[:, 0], gaps[:, 1])
            out[key] = (vals * 1e3, counts.astype(float))
        else:
            vals = done[col].to_numpy(float) * 1e3
            out[key] = (vals, np.ones(vals.size))
    return out


def ecdf(values: np.ndarray, weights: np.ndarray,
         max_points: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """The weighted empirical CDF of the positive finite ``values``: (sorted values, fraction
    of weight at or below each), thinned to at most ``max_points`` points (last one kept)."""
    keep = np.isfinite(values) & (values > 0) & (weights > 0)
    order = np.argsort(values[keep], kind="stable")
    v, w = values[keep][order], weights[keep][order]
    if not v.size:
        return v, v
    p = np.cumsum(w) / w.sum()
    if v.size > max_points:
        idx = np.unique(np.linspace(0, v.size - 1, max_points).astype(int))
        v, p = v[idx], p[idx]
    return v, p


def bucket_steps(steps: pd.DataFrame, buckets: int = TIMELINE_BUCKETS) -> pd.DataFrame:
    """One replica's step log in at most ``buckets`` equal time buckets.

    Columns: ``t_s`` (bucket start), ``prefill_tok_s`` / ``decode_tok_s`` / ``padding_tok_s``
    (tokens per second of the bucket, so a prefill spike cannot hide decode work),
    ``decode_batch`` (mean decode batch size over the steps that decode), ``num_waiting`` and
    ``kv_used_blocks`` (means over the bucket's steps). A bucket without
    steps (idle) has zero token rates and NaN means; steps are binned by their start.
    """
    cols = ["t_s", "prefill_tok_s", "decode_tok_s", "padding_tok_s", "decode_batch",
            "num_waiting", "kv_used_blocks"]
    if not len(steps):
        return pd.DataFrame({c: [] for c in cols})
    if is_bucketed(steps):
        return _from_buckets(steps)
    start = steps["start_s"].to_numpy(float)
    t0 = float(start.min())
    t1 = float((start + steps["duration_s"].to_numpy(float)).max())
    n = max(1, min(buckets, len(steps)))
    edges = np.linspace(t0, t1, n + 1) if t1 > t0 else np.array([t0, t0 + 1.0])
    n = edges.size - 1
    idx = np.clip(np.searchsorted(edges, start, side="right") - 1, 0, n - 1)
    width = np.diff(edges)

    def total(col: str | np.ndarray) -> np.ndarray:
        v = steps[col].to_numpy(float) if isinstance(col, str) else col
        return np.bincount(idx, weights=v, minlength=n)

    count = np.bincount(idx, minlength=n).astype(float)
    decode = steps["num_decode_tokens"].to_numpy(float)
    decoding = total((decode > 0).astype(float))
    with np.errstate(invalid="ignore", divide="ignore"):
        out = {"t_s": edges[:-1],
               "prefill_tok_s": total("num_prefill_tokens") / width,
               "decode_tok_s": total(decode) / width,
               "padding_tok_s": total("num_padding_tokens") / width,
               "decode_batch": np.where(decoding > 0, total(decode) / decoding, np.nan),
               **{c: np.where(count > 0, total(c) / count, np.nan)
                  for c in ("num_waiting", "kv_used_blocks")}}
    return pd.DataFrame(out)


def _from_buckets(buckets: pd.DataFrame) -> pd.DataFrame:
    """``bucket_steps``' columns from a bucketed step table (``metrics.step_table: buckets``):
    token rates from the buckets' sums; the decode batch, queue and KV as per-step means (a
    bucket does not record how many of its steps decoded, so prefill-only steps count too)."""
    width = buckets["bucket_s"].to_numpy(float)
    steps = np.maximum(buckets["num_steps"].to_numpy(float), 1.0)

    def col(name: str) -> np.ndarray:
        return buckets[f"{name}_sum"].to_numpy(float)

    idle = buckets["num_steps"].to_numpy() == 0
    return pd.DataFrame({
        "t_s": buckets["start_s"].to_numpy(float),
        "prefill_tok_s": col("num_prefill_tokens") / width,
        "decode_tok_s": col("num_decode_tokens") / width,
        "padding_tok_s": col("num_padding_tokens") / width,
        **{name: np.where(idle, np.nan, col(src) / steps) for name, src in (
            ("decode_batch", "num_decode_tokens"), ("num_waiting", "num_waiting"),
            ("kv_used_blocks", "kv_used_blocks"))}})


def kv_use(d: pd.DataFrame, num_blocks: float | None) -> tuple[np.ndarray, str]:
    """A bucketed timeline's KV use: the fraction of ``num_blocks`` when known, else blocks;
    with its axis title."""
    kv = d["kv_used_blocks"].to_numpy(float)
    if num_blocks:
        return kv / num_blocks, "KV used"
    return kv, "KV blocks"
