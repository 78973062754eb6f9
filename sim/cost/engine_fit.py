"""Fit the tensor-parallel terms of the ``vllm-v0`` engine profile to public measurements.

Two data sets, both from Vidur (``hardware_profiles/measurements/engines/``, provenance in
``docs/data.md``):

* **CPU overheads per iteration** of a vLLM v0 engine on A100 (six models, TP 1/2/4, batch
  8-128): schedule, sampler, input preparation, model-execution launch, output processing and
  the Ray worker round trip. The engine pays ``per_step + per_seq · rows + per_layer_launch ·
  layers`` at every TP and, at TP > 1, ``tp_per_step + tp_per_rank · (tp − 2) + tp_per_seq ·
  rows`` more (Ray RPC to the workers and the broadcast of the prepared inputs). The TP 1 terms
  are the ones the profile has always had (a line over Llama-2-7B); the TP > 1 terms are fitted
  here on what the TP 1 terms leave unexplained. Held out: one model per TP degree (the second
  in name order), so the error is that of an unseen model at a seen TP.
* **Framework-level all-reduce** (``torch.distributed`` on one DGX A100 / H100 node, 2-8 GPUs,
  fp16 payloads up to 4 MiB, the decode range): the engine's all-reduce takes ``max(kernel-level
  time of the GPU profile, floor)``, one floor per GPU fitted by least absolute
  log error (L1). Held out: every third message size, all GPU counts.

``python -m sim.cost.engine_fit`` prints both fits with their held-out MdAPE / MAPE; the
numbers are copied by hand into ``hardware_profiles/engines/vllm-v0.yaml`` and the fidelity
table of ``docs/cost-model.md``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from sim.core.paths import checkout_root

#: Folder of the engine-level measurements.
DATA_DIR = checkout_root() / "hardware_profiles" / "measurements" / "engines"
CPU_FILE = "vidur_cpu_overheads_a100.csv"
#: GPU profile name -> framework-level all-reduce table.
ALLREDUCE_FILES = {"a100-80gb": "vidur_all_reduce_a100-80gb.csv",
                   "h100-sxm": "vidur_all_reduce_h100-sxm.csv"}
#: Decoder layers of the models in the CPU-overhead table (their Hugging Face config.json).
LAYERS = {"meta-llama/Llama-2-7b-hf": 32, "microsoft/phi-2": 32,
          "codellama/CodeLlama-34b-Instruct-hf": 48, "internlm/internlm-20b": 60,
          "meta-llama/Llama-2-70b-hf": 80, "Qwen/Qwen-72B": 80}
#: The CPU-side parts of one iteration that run serially with the forward pass (medians, ms).
_SERIAL = ("schedule_median", "sampler_e2e_median", "prepare_inputs_e2e_median",
           "process_model_outputs_median", "model_execution_e2e_median")


@dataclass(frozen=True)
class FitError:
    """Held-out and train error of one group of a fit (percent)."""

    group: str
    n_heldout: int
    heldout_mdape_pct: float
    heldout_mape_pct: float
    train_mdape_pct: float


def _errors(group: str, pred: np.ndarray, meas: np.ndarray, held: np.ndarray) -> FitError:
    """MdAPE / MAPE of ``pred`` against ``meas`` on the held-out and train rows."""
    err = np.abs(pred - meas) / meas * 100
    tr = ~held
    return FitError(group, int(held.sum()), float(np.median(err[held])),
                    float(np.mean(err[held])),
                    float(np.median(err[tr])) if tr.any() else float("nan"))


def cpu_overhead_table(path: Path | None = None) -> pd.DataFrame:
    """The CPU-overhead table with ``layers``, ``tp``, ``rows`` and the serial total
    ``measured_ms`` (the serial parts, plus the Ray round trip where TP > 1: at TP 1 vLLM v0 runs
    the worker inside the driver process, so the recorded Ray time is not on the step's path)."""
    df = pd.read_csv(path or DATA_DIR / CPU_FILE)
    df["layers"] = df["model_name"].map(LAYERS)
    df["tp"] = df["tensor_parallel_degree"].astype(int)
    df["rows"] = df["batch_size"].astype(int)
    df["measured_ms"] = df[list(_SERIAL)].sum(axis=1) + np.where(
        df["tp"] > 1, df["ray_comm_time_mean"], 0.0)
    return df


def _heldout_models(df: pd.DataFrame) -> set[str]:
    """One model per TP degree is held out: the second in name order."""
    held = set()
    for _, names in df.groupby("tp")["model_name"]:
        ordered = sorted(set(names))
        if len(ordered) > 1:
            held.add(ordered[1])
    return held


def fit_cpu_overheads(per_step_s: float, per_seq_s: float, per_layer_launch_s: float,
                      df: pd.DataFrame | None = None
                      ) -> tuple[dict[str, float], list[FitError]]:
    """Fit ``tp_per_step_s``, ``tp_per_rank_s`` and ``tp_per_seq_s`` given the TP 1 terms;
    return them and the error per TP degree (non-negative least squares on relative error)."""
    from scipy.optimize import lsq_linear

    df = cpu_overhead_table() if df is None else df
    held = df["model_name"].isin(_heldout_models(df)).to_numpy()
    tp, rows, layers = (df[c].to_numpy(float) for c in ("tp", "rows", "layers"))
    base = (per_step_s + per_seq_s * rows + per_layer_launch_s * layers) * 1e3
    meas = df["measured_ms"].to_numpy(float)
    multi = (tp > 1).astype(float)
    x = np.column_stack([multi, multi * np.maximum(tp - 2, 0), multi * rows])
    fit = (~held) & (tp > 1)
    sol = lsq_linear(x[fit] / meas[fit, None], (meas[fit] - base[fit]) / meas[fit],
                     bounds=(0.0, np.inf))
    pred = base + x @ sol.x
    params = {"tp_per_step_s": sol.x[0] * 1e-3, "tp_per_rank_s": sol.x[1] * 1e-3,
              "tp_per_seq_s": sol.x[2] * 1e-3}
    errs = [_errors(f"tp{int(t)}", pred[tp == t], meas[tp == t], held[tp == t])
            for t in sorted(set(tp))]
    return params, errs


def allreduce_table(gpu: str) -> pd.DataFrame:
    """The framework-level all-reduce table of ``gpu`` (times in ms, sizes in bytes)."""
    return pd.read_csv(DATA_DIR / ALLREDUCE_FILES[gpu])


def _kernel_allreduce_ms(gpu: str, n: np.ndarray, size: np.ndarray) -> np.ndarray:
    """The GPU profile's kernel-level all-reduce time (the roofline's formula), in ms."""
    from sim.cost.roofline import allreduce_seconds, build_cost_model

    cm = build_cost_model("llama-2-7b", gpu, 1, engine="ideal")
    p, ic = cm.params, cm.gpu.interconnect
    bus = ic.bus_bw_gbps * 1e9 * p.comm_eff
    return np.array([allreduce_seconds(p.allreduce_alpha_s + p.alpha_per_peer_s * max(0, k - 2),
                                       int(k), float(s), bus) for k, s in zip(n, size, strict=True)]
                    ) * 1e3


def fit_framework_allreduce() -> tuple[dict[str, float], list[FitError]]:
    """Fit the framework-level all-reduce floor of each GPU: a collective called from the
    framework takes ``max(kernel-level time, floor)`` (the host's dispatch and synchronisation
    of the call hides the kernel when that is shorter). Return ``{gpu: floor_us}`` and the error
    per GPU and GPU count."""
    floors: dict[str, float] = {}
    errs = []
    for gpu in ALLREDUCE_FILES:
        df = allreduce_table(gpu)
        sizes = np.sort(df["size_bytes"].unique())
        held = df["size_bytes"].isin(sizes[2::3]).to_numpy()
        n = df["num_workers"].to_numpy()
        kern = _kernel_allreduce_ms(gpu, n, df["size_bytes"].to_numpy(float))
        meas = df["median_ms"].to_numpy(float)

        # one parameter: a grid search for the least mean absolute log error (L1 is robust to
        # the table's bimodal rows, where a call either waits for the host or not; the log keeps
        # over- and under-prediction symmetric, as relative error would not)
        grid = np.arange(0.25, 150.0, 0.25)
        tr_k, tr_m = kern[~held], meas[~held]
        cost = [np.mean(np.abs(np.log(np.maximum(tr_k, f * 1e-3) / tr_m))) for f in grid]
        floors[gpu] = float(grid[int(np.argmin(cost))])
        pred = np.maximum(kern, floors[gpu] * 1e-3)
        errs += [_errors(f"{gpu} n={k}", pred[n == k], meas[n == k], held[n == k])
                 for k in sorted(set(n))]
    return floors, errs


def error_table(title: str, errs: list[FitError]) -> str:
    """Markdown table of ``errs``."""
    lines = [f"{title}", "", "| group | held-out rows | held-out MdAPE % | held-out MAPE % "
             "| train MdAPE % |", "|---|---|---|---|---|"]
    lines += [f"| {e.group} | {e.n_heldout} | {e.heldout_mdape_pct:.1f} | "
              f"{e.heldout_mape_pct:.1f} | {e.train_mdape_pct:.1f} |" for e in errs]
    return "\n".join(lines)


def main() -> None:
    """Print both fits of the ``vllm-v0`` TP terms."""
    from sim.cost.profiles import load_engine

    eng = load_engine("vllm-v0")
    params, errs = fit_cpu_overheads(eng.per_step_s, eng.per_seq_s, eng.per_layer_launch_s)
    print({k: f"{v:.4g}" for k, v in params.items()})
    print(error_table("CPU overhead per iteration (Vidur, A100)", errs))
    ar, ar_errs = fit_framework_allreduce()
    print({k: f"{v:.4g}" for k, v in ar.items()})
    print(error_table("Framework-level all-reduce (Vidur, DGX A100 / H100)", ar_errs))


if __name__ == "__main__":
    main()
