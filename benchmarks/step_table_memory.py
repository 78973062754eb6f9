"""Peak memory of a long low-load run with a full and with a bucketed step table.

At low load every request decodes almost alone, so a run makes about one step per output
token: tens of millions of short steps for a million requests. Each mode runs in a fresh
subprocess (its own peak RSS); the summary of the two runs is compared too.

    python benchmarks/step_table_memory.py                    # 300k requests
    python benchmarks/step_table_memory.py --requests 1000000 --modes buckets
"""
from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def one(n: int, rate: float, mode: str, policy: str) -> dict:
    """Run one point in this process; return its measurements and summary."""
    sys.path.insert(0, str(REPO))
    import numpy as np

    import sim
    from sim.workload.build import build_workload_arrays

    spec = {"arrival": {"process": "poisson", "rate": rate}, "num_requests": n,
            "lengths": {"dist": "empirical", "trace": "azure-conv"}}
    arrays = build_workload_arrays(spec, np.random.default_rng(0))
    cost = sim.build_cost_model(model="llama-3-8b", hardware="h100-sxm", tp=1, engine="vllm")
    t = time.perf_counter()
    res = sim.simulate(arrays, policy=policy, cost=cost, kv={"block_size": 16},
                       step_table=mode)
    wall = time.perf_counter() - t
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"mode": mode, "requests": n, "steps": int(res.summary["num_steps"]),
            "table_rows": len(res.steps), "wall_s": round(wall, 2),
            "peak_rss_mb": round(rss_mb, 1), "summary": res.summary}


def main() -> None:
    """Run both modes in subprocesses and print a table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=300_000)
    ap.add_argument("--rate", type=float, default=2.0, help="requests per second (low load)")
    ap.add_argument("--policy", default="continuous")
    ap.add_argument("--modes", nargs="+", default=["full", "buckets"],
                    choices=["full", "buckets"])
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.requests, args.rate, args.one, args.policy)))
        return
    # the compiled kernel is compiled (or loaded from its cache) once, outside the measurement
    subprocess.run([sys.executable, __file__, "--requests", "60000", "--rate",
                    str(args.rate), "--policy", args.policy, "--one", "buckets"],
                   check=True, capture_output=True)
    rows = []
    for mode in args.modes:
        out = subprocess.run([sys.executable, __file__, "--requests", str(args.requests),
                              "--rate", str(args.rate), "--policy", args.policy,
                              "--one", mode], check=True, capture_output=True, text=True)
        rows.append(json.loads(out.stdout))
    print(f"{'mode':8} {'requests':>9} {'steps':>10} {'table rows':>10} {'wall s':>7} "
          f"{'peak RSS MB':>11}")
    for r in rows:
        print(f"{r['mode']:8} {r['requests']:>9} {r['steps']:>10} {r['table_rows']:>10} "
              f"{r['wall_s']:>7} {r['peak_rss_mb']:>11}")
    if len(rows) < 2:
        return
    full, bucketed = rows[0]["summary"], rows[1]["summary"]
    worst = max((abs(bucketed[k] - v) / abs(v) for k, v in full.items()
                 if isinstance(v, float) and v and math.isfinite(v)), default=0.0)
    same = sum(bucketed[k] == v or (v != v and bucketed[k] != bucketed[k])
               for k, v in full.items())
    print(f"summary: {same}/{len(full)} fields identical, largest relative difference "
          f"{worst:.1e}")


if __name__ == "__main__":
    main()
