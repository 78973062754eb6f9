"""Bit-identity guard for speed work: save, then compare, the outputs of a fixed set of runs.

    python benchmarks/reference.py save /tmp/ref      # before a change
    python benchmarks/reference.py check /tmp/ref     # after: every table and summary identical

Covers every policy, paged and slab KV, recompute and swap preemption, prefix caching, event
skipping on and off, and two replicas, on Azure-conversation-like traffic with a KV cache small
enough to preempt.
"""
from __future__ import annotations

import dataclasses
import pickle
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

import sim  # noqa: E402
from sim.workload.build import build_workload_arrays  # noqa: E402

POLICIES = {
    "cont": {"name": "continuous", "max_num_seqs": 64, "max_num_batched_tokens": 8192},
    "orca": {"name": "continuous", "max_num_seqs": 64, "mode": "orca"},
    "chunk": {"name": "chunked_prefill", "token_budget": 512, "max_num_seqs": 64},
    "static": {"name": "static", "batch_size": 16, "timeout_s": 0.5},
    "dynamic": {"name": "dynamic", "max_batch_size": 16, "max_wait_s": 0.1},
}
KVS = {
    "paged": {"block_size": 16, "num_blocks": 3000},
    "swap": {"block_size": 16, "num_blocks": 3000, "preemption": "swap"},
    "slab": {"block_size": 16, "num_blocks": 6000, "allocator": "slab",
             "slab_reserve": "prompt_plus_max_output", "max_output_tokens": 512},
    "prefix": {"block_size": 16, "num_blocks": 3000, "prefix_caching": True},
    "unlimited": None,
    "derived": {"block_size": 16},
}


def requests(n: int = 600, rate: float = 14.0, seed: int = 1, prefixes: bool = False):
    arrays = build_workload_arrays({"arrival": {"process": "poisson", "rate": rate},
                                    "num_requests": n,
                                    "lengths": {"dist": "empirical", "trace": "azure-conv"}},
                                   np.random.default_rng(seed))
    reqs = arrays.to_requests()
    if prefixes:
        rng = np.random.default_rng(seed + 7)
        reqs = [dataclasses.replace(r, prefix_id=f"p{int(rng.integers(8))}",
                                    num_prefix_tokens=min(r.num_prompt_tokens, 256))
                for r in reqs]
    return reqs


def cases():
    for pol in POLICIES:
        for kvn in KVS:
            if pol in ("static", "dynamic") and kvn in ("swap", "prefix"):
                continue
            for skip in (True, False):
                yield f"{pol}-{kvn}-{'skip' if skip else 'step'}", pol, kvn, skip, 1
    for pol in ("cont", "chunk", "static"):
        yield f"{pol}-paged-2rep", pol, "paged", True, 2


def run(name, pol, kvn, skip, reps):
    cost = sim.build_cost_model(model="llama-3-8b", hardware="h100-sxm", tp=1, engine="vllm")
    reqs = requests(prefixes=kvn == "prefix", rate=14.0 * reps)
    res = sim.simulate(reqs, policy=POLICIES[pol], cost=cost, kv=KVS[kvn],
                       event_skipping=skip, num_replicas=reps, warmup_s=2.0, cooldown_s=2.0)
    return {"requests": res.requests, "steps": res.steps, "summary": res.summary,
            "irregular": list(res.irregular_itl)}


def main() -> None:
    mode, folder = sys.argv[1], Path(sys.argv[2])
    only = sys.argv[3:] or None
    folder.mkdir(parents=True, exist_ok=True)
    bad = 0
    for name, *args in cases():
        if only and not any(o in name for o in only):
            continue
        out = run(name, *args)
        path = folder / f"{name}.pkl"
        if mode == "save":
            path.write_bytes(pickle.dumps(out))
            print("saved", name, len(out["steps"]), "steps", flush=True)
            continue
        ref = pickle.loads(path.read_bytes())
        try:
            pd.testing.assert_frame_equal(out["requests"], ref["requests"], check_exact=True)
            pd.testing.assert_frame_equal(out["steps"], ref["steps"], check_exact=True)
            a, b = out["summary"], ref["summary"]
            assert a.keys() == b.keys(), (a.keys() ^ b.keys())
            for k in a:
                assert a[k] == b[k] or (a[k] != a[k] and b[k] != b[k]), (k, a[k], b[k])
            assert out["irregular"] == ref["irregular"]
            print("ok  ", name, flush=True)
        except AssertionError as e:
            bad += 1
            print("DIFF", name, str(e)[:400], flush=True)
    if bad:
        sys.exit(f"{bad} run(s) differ")


if __name__ == "__main__":
    main()
