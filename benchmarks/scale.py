"""Simulator speed and scale benchmark (not part of the test suite).

Simulates N requests of Azure-conversation-like traffic — prompt/output pairs resampled from
the Azure LLM inference 2023 conversation trace, Poisson arrivals at a fixed share of the
deployment's measured saturation rate — for each N and policy, each in a fresh subprocess so
peak memory (max RSS) is its own. Prints which engine ran it (the compiled interpreter or the
general engine), requests simulated per second, steps (engine iterations: the events the
simulator processes) per second, peak memory, and writes a scaling plot and CSV. The compiled
interpreter is compiled (or loaded from numba's cache) once beforehand, in its own process.

    python benchmarks/scale.py                       # 10k, 100k, 1M of every policy
    python benchmarks/scale.py --sizes 10000 100000 --policies continuous
    python benchmarks/scale.py --output-scale 4      # same arrivals, outputs ×4
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

#: Default request rate per policy, about 80 % of what it sustains on this traffic (12 req/s
#: for the iteration-level policies; static and dynamic batching with batch 32 sustain about
#: 3.3 req/s, so 12 req/s would measure an ever-growing queue, not the simulator).
RATES = {"continuous": 12.0, "continuous_orca": 12.0, "chunked_prefill": 12.0,
         "chunked_prefill_512": 12.0,
         "scheduler_priority": 12.0, "scheduler_edf": 12.0, "static": 2.6, "dynamic": 2.6,
         "dynamic_buckets": 2.6}

POLICIES = {
    "continuous": {"name": "continuous", "max_num_seqs": 256, "max_num_batched_tokens": 16384},
    # Orca's iteration-level scheduling: whole prompts prefill in the decodes' step
    "continuous_orca": {"name": "continuous", "mode": "orca", "max_num_seqs": 256,
                        "max_num_batched_tokens": 16384},
    "chunked_prefill": {"name": "chunked_prefill", "token_budget": 2048, "max_num_seqs": 256},
    "chunked_prefill_512": {"name": "chunked_prefill", "token_budget": 512,
                            "max_num_seqs": 256},
    # vLLM v1-style decode-first chunked prefill, queue and victims by priority (classes 0-2)
    "scheduler_priority": {"name": "scheduler", "max_num_batched_tokens": 2048,
                           "order": "priority", "victim": "priority"},
    # earliest TTFT deadline first, per-class targets; the latest deadline is preempted
    "scheduler_edf": {"name": "scheduler", "max_num_batched_tokens": 2048, "order": "edf",
                      "victim": "deadline", "ttft_targets_s": {"0": 2.0, "1": 1.0, "2": 0.25}},
    "static": {"name": "static", "batch_size": 32, "timeout_s": 0.5},
    "dynamic": {"name": "dynamic", "max_batch_size": 32, "max_wait_s": 0.1},
    # padding-aware dynamic batching: prompts batched apart by length
    "dynamic_buckets": {"name": "dynamic", "max_batch_size": 32, "max_wait_s": 0.1,
                        "bucket_by_prompt": [128, 512, 2048]},
}
#: Policies the compiled interpreter runs (any other would run on the general engine).
COMPILED = {"continuous", "continuous_orca", "chunked_prefill", "chunked_prefill_512",
            "scheduler_priority", "scheduler_edf", "static", "dynamic", "dynamic_buckets"}


def one(size: int, policy: str, rate: float, output_scale: float, seed: int) -> dict:
    """Run one benchmark point in this process and return its measurements."""
    sys.path.insert(0, str(REPO))
    import numpy as np

    import sim
    from sim.workload.build import build_workload_arrays

    t0 = time.perf_counter()
    spec = {"arrival": {"process": "poisson", "rate": rate}, "num_requests": size,
            "lengths": {"dist": "empirical", "trace": "azure-conv"}}
    arrays = build_workload_arrays(spec, np.random.default_rng(seed))
    if output_scale != 1:
        arrays = type(arrays)(arrays.arrival_s, arrays.num_prompt_tokens,
                              np.maximum(1, np.round(arrays.num_output_tokens * output_scale)
                                         ).astype(np.int64), source=arrays.source)
    if policy.startswith("scheduler"):  # priority classes 0-2, drawn once per request
        import dataclasses

        pri = np.random.default_rng(seed + 1).integers(0, 3, len(arrays.arrival_s))
        arrays = dataclasses.replace(arrays, priority=pri)
    t_load = time.perf_counter() - t0
    cost = sim.build_cost_model(model="llama-3-8b", hardware="h100-sxm", tp=1, engine="vllm")
    t1, c1 = time.perf_counter(), time.process_time()
    # columnar requests: no Request objects unless the general engine needs them
    res = sim.simulate(arrays, policy=POLICIES[policy], cost=cost, kv={"block_size": 16})
    wall = time.perf_counter() - t1
    cpu = time.process_time() - c1  # less sensitive than wall time to a shared machine
    engine = res.engine
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"size": size, "policy": policy, "engine": engine,
            "output_scale": output_scale, "rate": rate,
            "wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "workload_s": round(t_load, 3),
            "requests_per_s": round(size / wall, 1), "steps": int(res.summary["num_steps"]),
            "steps_per_s": round(res.summary["num_steps"] / wall, 1),
            "completed": int(res.summary["completed"]), "peak_rss_mb": round(rss_mb, 1),
            "busy_fraction": round(res.summary["busy_fraction"], 3),
            "p99_ttft_ms": round(res.summary["p99_ttft_ms"], 1)}


def warm_kernel() -> float:
    """Compile the compiled interpreter into numba's on-disk cache (or load it, if cached) in
    this process, with the compiled code the general engine's large runs take (stretch and
    step costs, the ITL merge); return the seconds it took. Every benchmark process then
    loads it."""
    sys.path.insert(0, str(REPO))
    import numpy as np

    import sim
    from sim.core.types import BatchShape
    from sim.engine.compiled_series import CompiledSeries
    from sim.metrics.sorted_merge import compiled_merge_sorted

    cost = sim.build_cost_model(model="llama-3-8b", hardware="h100-sxm", tp=1, engine="vllm")
    t0 = time.perf_counter()
    sim.simulate([sim.Request(i, i * 0.01, 100, 20) for i in range(50)], policy="continuous",
                 cost=cost, fast_path="compiled")
    series = CompiledSeries(cost)
    series(BatchShape(np.ones(4, dtype=np.int64), np.arange(10, 14, dtype=np.int64)), 8)
    series.step(BatchShape(np.array([5, 1], dtype=np.int64), np.array([5, 40], dtype=np.int64)))
    values, counts = np.array([0.5, 1.0]), np.array([1, 2], dtype=np.int64)
    compiled_merge_sorted()(values, counts, values, counts)
    return time.perf_counter() - t0


def main() -> None:
    """Run every (size, policy) point in a subprocess and tabulate."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--policies", nargs="+", default=list(POLICIES))
    ap.add_argument("--rate", type=float, default=None,
                    help="req/s for every policy (default: RATES, ~80%% of each policy's "
                         "saturation on this traffic)")
    ap.add_argument("--output-scale", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-general-size", type=int, default=100_000,
                    help="largest N run for a policy on the general engine (a custom "
                         "policy's: minutes per 1M requests); default 100k")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--warm", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.warm:
        print(json.dumps({"kernel_ready_s": round(warm_kernel(), 2)}))
        return
    if args.one:
        size, policy = args.one.split(":")
        rate = args.rate if args.rate is not None else RATES[policy]
        print(json.dumps(one(int(size), policy, rate, args.output_scale, args.seed)))
        return
    # compile once (about 25 s on a 2-core machine; numba caches it on disk), outside any point
    warm = subprocess.run([sys.executable, __file__, "--warm"], capture_output=True, text=True)
    print(warm.stdout.strip() or warm.stderr, flush=True)
    rows = []
    for size in args.sizes:
        for policy in args.policies:
            if policy not in COMPILED and size > args.max_general_size:
                print(f"skipping {policy} at {size} (> --max-general-size)", flush=True)
                continue
            cmd = [sys.executable, __file__, "--one", f"{size}:{policy}", "--output-scale",
                   str(args.output_scale), "--seed", str(args.seed)]
            if args.rate is not None:
                cmd += ["--rate", str(args.rate)]
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode:
                print(p.stderr, file=sys.stderr)
                continue
            row = json.loads(p.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(json.dumps(row), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import pandas as pd

    df = pd.DataFrame(rows)
    tag = f"x{args.output_scale:g}"
    df.to_csv(out / f"scale_{tag}.csv", index=False)
    print(df.to_string(index=False))
    plot(df, out / f"scale_{tag}.png")


def plot(df, path: Path) -> None:  # noqa: ANN001
    """Wall time vs requests, one line per policy, log-log."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4), dpi=110)
    ax = fig.add_subplot()
    for policy, g in df.groupby("policy"):
        ax.loglog(g["size"], g["wall_s"], marker="o", label=policy)
    ax.set_xlabel("requests simulated")
    ax.set_ylabel("wall time (s)")
    ax.set_title("batchsim scaling (Llama-3-8B, H100, Azure-conv-like)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    main()
