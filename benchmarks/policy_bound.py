"""The least time any engine must spend on a Python policy: its own ``schedule`` calls and the
views it is shown (not part of the test suite).

A policy written against the public interface is handed a fresh ``View`` every step, with one
immutable ``SeqView`` per running and waiting request, and returns a ``Plan``. Whatever the
engine does around it, those two costs stay. This benchmark runs ``sim.simulate`` on the
general engine (the workload of ``benchmarks/general_engine.py``), records every view the
policy was shown, then times, with the engine out of the picture:

- ``policy``: the policy's ``schedule`` replayed over the recorded views (they are immutable,
  so each call makes the plan it made in the run);
- ``views``: building the running requests' ``SeqView`` tuples from plain tuples, the cheapest
  form any engine could build them in (no attribute reads, no arrays);

and prints them with the whole run's time, so the speed-up an engine change can bring to this
policy is bounded by ``base / (policy + views)``::

    python benchmarks/policy_bound.py custom 5000
    python benchmarks/policy_bound.py chunked_prefill 5000 --base-s 2.9

Views are held in memory for the replay: keep the size to a few tens of thousands.
"""
from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    """Run, record, replay, print."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("policy", choices=["custom", "chunked_prefill"])
    ap.add_argument("size", type=int)
    ap.add_argument("--base-s", type=float, default=None,
                    help="CPU seconds of the same run on a base checkout, for the bound")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "benchmarks"))
    import numpy as np
    from general_engine import RATES, custom_policy

    import sim
    from policies.registry import make_policy
    from sim.core.types import SeqView, View
    from sim.workload.build import build_workload_arrays

    policy = (custom_policy() if args.policy == "custom" else make_policy(
        {"name": "chunked_prefill", "token_budget": 2048, "max_num_seqs": 256}))
    schedule = policy.schedule
    views: list[View] = []

    def recording(view: View):  # noqa: ANN202 - returns the policy's plan
        views.append(view)
        return schedule(view)

    spec = {"arrival": {"process": "poisson", "rate": RATES[args.policy]},
            "num_requests": args.size, "lengths": {"dist": "empirical", "trace": "azure-conv"}}
    arrays = build_workload_arrays(spec, np.random.default_rng(0))
    cost = sim.build_cost_model(model="llama-3-8b", hardware="h100-sxm", tp=1, engine="vllm")
    policy.schedule = recording  # type: ignore[method-assign]
    c0 = time.process_time()
    sim.simulate(arrays, policy=policy, cost=cost, kv={"block_size": 16}, fast_path=False)
    run_s = time.process_time() - c0
    policy.schedule = schedule  # type: ignore[method-assign]
    rows = [[tuple(s) for s in v.running] for v in views]
    gc.disable()  # the replay allocates no cycles; the run above had the collector on
    c0 = time.process_time()
    for view in views:
        schedule(view)
    policy_s = time.process_time() - c0
    make = SeqView._make
    c0 = time.process_time()
    for row in rows:
        tuple(map(make, row))
    views_s = time.process_time() - c0
    gc.enable()
    running = sum(map(len, rows)) / max(1, len(rows))
    line = (f"{args.policy} n={args.size} steps={len(views)} mean_running={running:.1f} "
            f"run_cpu_s={run_s:.2f} (recording views) policy_s={policy_s:.2f} "
            f"views_s={views_s:.2f} floor_s={policy_s + views_s:.2f}")
    if args.base_s:
        line += f" bound={args.base_s / (policy_s + views_s):.2f}x"
    print(line)


if __name__ == "__main__":
    main()
