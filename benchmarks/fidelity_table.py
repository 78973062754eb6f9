"""Print the fidelity table of docs/cost-model.md: held-out MdAPE and MAPE per data source, GPU,
TP degree and engine profile, from the shipped measurements (a minute or two: it refits every
calibrated GPU)::

    python benchmarks/fidelity_table.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

if __package__ in (None, ""):  # run as a script: make the checkout importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim.cost import calibrate as cal
from sim.cost.engine_fit import fit_cpu_overheads, fit_framework_allreduce
from sim.cost.profiles import load_engine, load_gpu

ROWS: list[tuple[str, ...]] = []


def _row(source: str, gpu: str, tp: str, engine: str, pred: np.ndarray, meas: np.ndarray
         ) -> None:
    err = np.abs(pred - meas) / meas * 100
    ROWS.append((source, gpu, tp, engine, str(len(meas)), f"{np.median(err):.1f}",
                 f"{np.mean(err):.1f}"))


COVERAGE: list[str] = []
#: The table's name of each kernel class (``calibrate``'s names are the file stems).
SOURCES = {"gemm": "AIConfigurator GEMM", "context_attention": "AIConfigurator prefill attention",
           "generation_attention": "AIConfigurator decode attention",
           "allreduce": "AIConfigurator NCCL all-reduce",
           cal.OPERATOR_CLASS: "Vidur operators (GEMM)"}
#: The TP degrees each class was measured at: NCCL all-reduce on 2, 4 and 8 GPUs
#: (``num_gpus`` of nccl.csv.gz), Vidur's operators at TP 1, 2, 4 and 8 (their ``@tpN``
#: families); the other kernels run on one GPU.
TP_LABELS = {"allreduce": "2-8", cal.OPERATOR_CLASS: "1-8"}


def coverage(gpu: str, points: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]) -> None:
    """How often the held-out kernels' errors fall inside the 90 % interval of one draw's
    factor (``sim.cost.uncertainty``): per operator class from the training-residual table,
    pooled, and under the older single-normal rule (σ from the held-out MdAPE)."""
    from sim.cost.roofline import build_cost_model
    from sim.cost.uncertainty import KERNEL_CLASS, RESIDUAL_PROBS, residual_quantiles, step_sigma

    table = residual_quantiles(points)  # training rows only, as batchsim calibrate records

    def inside(level: float) -> dict[str, np.ndarray]:
        lo_i = RESIDUAL_PROBS.index(round((1 - level) / 2, 3))
        hi_i = RESIDUAL_PROBS.index(round((1 + level) / 2, 3))
        out: dict[str, list[np.ndarray]] = {}
        for kernel, (p, m, h) in points.items():
            c = KERNEL_CLASS[kernel]
            r = np.log(m[h] / p[h])
            out.setdefault(c, []).append((r >= table[c][lo_i]) & (r <= table[c][hi_i]))
        return {c: np.concatenate(v) for c, v in out.items()}

    def pooled(level: float) -> float:
        return float(np.mean(np.concatenate(list(inside(level).values()))) * 100)

    logs = np.concatenate([np.abs(np.log(m[h] / p[h])) for p, m, h in points.values()])
    sigma = step_sigma(build_cost_model("llama-2-7b", gpu, 1, engine="ideal"))
    old = np.mean(logs <= 1.645 * sigma) * 100
    at90 = inside(0.9)
    cells = [f"{np.mean(at90[c]) * 100:.1f} ({len(at90[c])})"
             for c in ("linear", "attention", "comm")]
    COVERAGE.append(f"| {gpu} | " + " | ".join(cells)
                    + f" | {pooled(0.9):.1f} | {pooled(0.8):.1f} / {pooled(0.95):.1f} | "
                    f"{old:.1f} (σ = {sigma:.3f}) |")


def kernels() -> None:
    """AIConfigurator kernels (and H100's Vidur operators), held-out rows, per GPU and class;
    and how often the 90 % interval of ``sim.cost.uncertainty`` contains them."""
    for gpu in cal.measured_gpus():
        _, rep = cal.calibrate(gpu)
        coverage(gpu, rep.points)
        for cls, (pred, meas, held) in rep.points.items():
            _row(SOURCES.get(cls, f"AIConfigurator {cls}"), gpu, TP_LABELS.get(cls, "per GPU"),
                 "(kernels)", pred[held], meas[held])
        if gpu == "a100-80gb":  # the table lists A100's never-fitted operators beside its kernels
            vidur_a100_gemm()


def vidur_a100_gemm() -> None:
    """Vidur's A100 operator profile, never fitted on: all rows are held out."""
    from sim.cost.calibrate import _predict_gemm

    gpu = load_gpu("a100-80gb")
    c = gpu.calibration
    theta = np.array([c.compute_eff_max, c.compute_m_half, c.memory_eff, c.kernel_latency_us])
    root = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "profiling" / "vidur"
    path = root / "compute" / "a100" / "meta-llama" / "Llama-2-7b-hf" / "mlp.csv"
    if not path.is_file():
        return
    df = pd.read_csv(path)
    rows = []
    for _, r in df.iterrows():
        tp, d, e = r.num_tensor_parallel_workers, r.n_embd, r.n_expanded_embd
        for op, n, k in (("attn_pre_proj", 3 * d / tp, d), ("attn_post_proj", d, d / tp),
                         ("mlp_up_proj", 2 * e / tp, d), ("mlp_down_proj", d, e / tp)):
            rows.append((r.num_tokens, n, k, r[f"time_stats.{op}.median"]))
    g = pd.DataFrame(rows, columns=["m", "n", "k", "latency"])
    _row("Vidur operators (GEMM), never fitted on", "a100-80gb", "1-8", "(kernels)",
         _predict_gemm(theta, gpu, g) * 1e3, g["latency"].to_numpy(float))


def engine() -> None:
    """vllm-v0 CPU overheads and framework all-reduce floors, held-out rows."""
    eng = load_engine("vllm-v0")
    _, errs = fit_cpu_overheads(eng.per_step_s, eng.per_seq_s, eng.per_layer_launch_s)
    for e in errs:
        ROWS.append(("Vidur CPU overheads per step", "a100-80gb", e.group[2:], "vllm-v0",
                     str(e.n_heldout), f"{e.heldout_mdape_pct:.1f}", f"{e.heldout_mape_pct:.1f}"))
    _, errs = fit_framework_allreduce()
    by_gpu: dict[str, list] = {}
    for e in errs:  # one row per GPU, its GPU counts side by side as the table shows them
        gpu, n = e.group.split(" n=")
        by_gpu.setdefault(gpu, []).append((n, e))
    for gpu, parts in by_gpu.items():
        rows = {str(e.n_heldout) for _, e in parts}
        ROWS.append(("Vidur framework all-reduce", gpu, " / ".join(n for n, _ in parts),
                     "vllm-v0", f"{rows.pop()} each" if len(rows) == 1
                     else " / ".join(str(e.n_heldout) for _, e in parts),
                     " / ".join(f"{e.heldout_mdape_pct:.1f}" for _, e in parts),
                     " / ".join(f"{e.heldout_mape_pct:.1f}" for _, e in parts)))


def main() -> None:
    """Compute and print every row."""
    kernels()
    engine()
    print("| data source | GPU | TP | engine profile | held-out rows | MdAPE % | MAPE % |")
    print("|---|---|---|---|---|---|---|")
    for r in ROWS:
        print("| " + " | ".join(r) + " |")
    print()
    print("| GPU | linear % (rows) | attention % (rows) | all-reduce % (rows) | pooled % | "
          "pooled at 80 % / 95 % | older single-normal rule % |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(COVERAGE))


if __name__ == "__main__":
    main()
