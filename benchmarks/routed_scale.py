"""Routed-run speed benchmark (not part of the test suite): N requests over R replicas.

The traffic of ``benchmarks/scale.py`` (Azure-conversation-like prompt/output pairs, Poisson
arrivals at about 80 % of what R Llama-3-8B/H100 replicas sustain: 12 req/s each) routed by
each router, on the compiled replicas (``sim.engine.compiled_drive``) or the general engine,
each point in a fresh subprocess. Prints the wall time, requests per second and the engine.

    python benchmarks/routed_scale.py --sizes 100000 1000000 --routers least_outstanding_tokens
    python benchmarks/routed_scale.py --sizes 100000 --engines compiled general
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RATE_PER_REPLICA = 12.0  # req/s: about 80 % of a replica's saturation (benchmarks/scale.py)
POLICY = {"name": "continuous", "max_num_seqs": 256, "max_num_batched_tokens": 16384}


def one(size: int, router: str, replicas: int, engine: str, seed: int) -> dict:
    """Run one point in this process and return its measurements."""
    sys.path.insert(0, str(REPO))
    import numpy as np

    import sim
    from sim.workload.build import build_workload_arrays

    spec = {"arrival": {"process": "poisson", "rate": RATE_PER_REPLICA * replicas},
            "num_requests": size, "lengths": {"dist": "empirical", "trace": "azure-conv"}}
    arrays = build_workload_arrays(spec, np.random.default_rng(seed))
    cost = sim.build_cost_model(model="llama-3-8b", hardware="h100-sxm", tp=1, engine="vllm")
    t0, c0 = time.perf_counter(), time.process_time()
    res = sim.simulate(arrays, policy=POLICY, cost=cost, kv={"block_size": 16},
                       num_replicas=replicas, router={"name": router},
                       fast_path="compiled" if engine == "compiled" else False)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0  # less sensitive than wall time to a shared machine
    return {"size": size, "router": router, "replicas": replicas, "engine": res.engine,
            "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
            "requests_per_s": round(size / wall, 1),
            "completed": int(res.summary["completed"]),
            "p99_ttft_ms": round(res.summary["p99_ttft_ms"], 1)}


def main() -> None:
    """Run every (size, router, engine) point in a subprocess and print a JSON line each."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--routers", nargs="+", default=["least_outstanding_tokens", "round_robin"])
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--engines", nargs="+", default=["compiled"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--point", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.point:
        size, router, engine = args.point.split(",")
        print(json.dumps(one(int(size), router, args.replicas, engine, args.seed)))
        return
    for size in args.sizes:
        for router in args.routers:
            for engine in args.engines:
                out = subprocess.run(
                    [sys.executable, __file__, "--point", f"{size},{router},{engine}",
                     "--replicas", str(args.replicas), "--seed", str(args.seed)],
                    capture_output=True, text=True, check=True)
                print(out.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
