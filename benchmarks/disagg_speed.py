"""Speed of a disaggregated cluster: N requests through 2 prefill + 2 decode replicas.

Azure-conversation-like traffic (prompt/output pairs resampled from the Azure LLM inference
2023 conversation trace, Poisson arrivals) on Llama-3-8B, H100, TP1; prefill replicas run
continuous batching, decode replicas continuous batching with 256 sequences; KV over NVLink.
Prints wall seconds, requests per second and the profile's top entries with ``--profile``.

    python benchmarks/disagg_speed.py                  # 100k requests
    python benchmarks/disagg_speed.py --size 20000 --profile
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run(size: int, rate: float, seed: int = 0) -> dict:
    """Simulate ``size`` requests and return the measurements."""
    sys.path.insert(0, str(REPO))
    import numpy as np

    import sim
    from sim.workload.build import build_workload_arrays

    spec = {"arrival": {"process": "poisson", "rate": rate}, "num_requests": size,
            "lengths": {"dist": "empirical", "trace": "azure-conv"}}
    arrays = build_workload_arrays(spec, np.random.default_rng(seed))
    cost = sim.build_cost_model(model="llama-3-8b", hardware="h100-sxm", tp=1, engine="vllm")
    cluster = {"groups": [
        {"name": "prefill", "role": "prefill", "replicas": 2, "cost": cost,
         "policy": {"name": "continuous", "max_num_seqs": 64,
                    "max_num_batched_tokens": 8192}},
        {"name": "decode", "role": "decode", "replicas": 2, "cost": cost,
         "policy": {"name": "continuous", "max_num_seqs": 256}}],
        "decode_router": {"name": "least_kv_usage"}}
    t0 = time.perf_counter()
    res = sim.simulate(arrays, policy="continuous", kv={"block_size": 16}, cluster=cluster,
                       router="least_outstanding_tokens")
    wall = time.perf_counter() - t0
    s = res.summary
    return {"requests": size, "wall_s": round(wall, 2), "req_per_s": round(size / wall),
            "steps": len(res.steps), "completed": s["completed"],
            "p99_ttft_ms": round(s["p99_ttft_ms"], 1), "p99_tpot_ms": round(s["p99_tpot_ms"], 2),
            "mean_kv_transfer_ms": round(s["mean_kv_transfer_ms"], 3)}


def main() -> None:
    """Parse arguments, run, print."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=100_000)
    p.add_argument("--rate", type=float, default=20.0)
    p.add_argument("--profile", action="store_true")
    a = p.parse_args()
    if a.profile:
        prof = cProfile.Profile()
        out = prof.runcall(run, a.size, a.rate)
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    else:
        out = run(a.size, a.rate)
    print(out)


if __name__ == "__main__":
    main()
