"""General-engine speed for one policy, in this process: for interleaved A/B runs of two
checkouts (not part of the test suite).

Runs ``sim.simulate(..., fast_path=False)`` on Azure-conversation-like traffic (as
``benchmarks/scale.py``: Llama-3-8B on one H100, Poisson arrivals at about 80 % of the policy's
saturation) and prints CPU and wall seconds, steps, peak memory and a hash of the request and
step tables (runs under 20k requests), so two checkouts can be timed in turn and shown to agree::

    python benchmarks/general_engine.py chunked_prefill 10000
    python benchmarks/general_engine.py custom 10000 --repo /tmp/main   # another checkout
    python benchmarks/general_engine.py static 40000 --rate 6           # overloaded

``custom`` is a policy written as a user would: decodes first, then waiting prompts in FCFS
chunks while the budget, the slots and the free blocks allow; it never says ``steady``, so the
engine plans every step (without KV pressure it makes chunked prefill's plans).
"""
from __future__ import annotations

import argparse
import hashlib
import resource
import sys
import time
from pathlib import Path

RATES = {"chunked_prefill": 12.0, "custom": 12.0, "static": 2.6, "dynamic": 2.6}


def custom_policy():  # noqa: ANN201 - built after the checkout is on the path
    """A decode-first chunked packer written against the public policy interface."""
    from policies.registry import Policy
    from sim.core.types import Plan, View

    class UserChunked(Policy):
        """Decodes first, then FCFS prompt chunks within the budget, slots and free blocks."""

        name = "user-chunked"

        def __init__(self, budget: int = 2048, max_seqs: int = 256) -> None:
            self.max_num_seqs = max_seqs
            self.max_num_batched_tokens = budget

        def schedule(self, view: View) -> Plan:
            kv, free, tokens = view.kv, view.kv.free_blocks, self.max_num_batched_tokens
            run: dict[int, int] = {}
            for s in (*view.running, *view.waiting):
                if tokens < 1 or len(run) >= self.max_num_seqs:
                    break
                n = min(s.num_uncomputed, tokens)
                need = kv.blocks_needed(s, n)
                if need > free:
                    break
                run[s.id] = n
                tokens -= n
                free -= need
            return Plan(run=run)

    return UserChunked()


def main() -> None:
    """Run one point and print its measurements."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("policy", choices=sorted(RATES))
    ap.add_argument("size", type=int)
    ap.add_argument("--repo", default=str(Path(__file__).resolve().parent.parent),
                    help="checkout to import sim and policies from (default: this one)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rate", type=float, default=None,
                    help="requests per second (default: about 80%% of the policy's saturation; "
                         "more to time an overloaded run, whose queue grows)")
    args = ap.parse_args()
    sys.path.insert(0, args.repo)
    import numpy as np

    import sim
    from sim.workload.build import build_workload_arrays

    policies = {"chunked_prefill": {"name": "chunked_prefill", "token_budget": 2048,
                                    "max_num_seqs": 256},
                "static": {"name": "static", "batch_size": 32, "timeout_s": 0.5},
                "dynamic": {"name": "dynamic", "max_batch_size": 32, "max_wait_s": 0.1}}
    policy = policies.get(args.policy) or custom_policy()
    rate = RATES[args.policy] if args.rate is None else args.rate
    spec = {"arrival": {"process": "poisson", "rate": rate},
            "num_requests": args.size, "lengths": {"dist": "empirical", "trace": "azure-conv"}}
    arrays = build_workload_arrays(spec, np.random.default_rng(args.seed))
    cost = sim.build_cost_model(model="llama-3-8b", hardware="h100-sxm", tp=1, engine="vllm")
    t0, c0 = time.perf_counter(), time.process_time()
    res = sim.simulate(arrays, policy=policy, cost=cost, kv={"block_size": 16},
                       fast_path=False)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    digest = "-"
    if args.size < 20_000:
        text = res.requests.to_csv() + res.steps.to_csv()
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    engine = getattr(res, "engine", "general")  # older checkouts do not name it
    engine += "/" + getattr(res, "step_engine", "python")
    if getattr(res, "step_engine_reason", ""):
        print("steps:", res.step_engine_reason)
    print(f"{args.policy} n={args.size} rate={rate:g} sim={Path(sim.__file__).parent} "
          f"engine={engine} cpu_s={cpu:.2f} wall_s={wall:.2f} steps={res.summary['num_steps']} "
          f"peak_rss_mb={rss_mb:.0f} tables={digest}")


if __name__ == "__main__":
    main()
