"""Shared test helpers: request builders, the Lindley recursion and the result invariants.

``check_invariants`` is the one conformance check every simulation result must pass (used by
the property tests over every registered policy and by the analytic tests); ``lindley_waits``
is the exact single-server FCFS queue the engine must reproduce request by request.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

import sim
from policies.registry import Policy
from sim.core.types import Plan, View
from sim.kv.config import KVConfig

#: Float slack for "time moves forward" comparisons (sums of step durations round).
EPS = 1e-9


def requests(arrivals: Sequence[float], prompts: Sequence[int] | int,
             outputs: Sequence[int] | int) -> list[sim.Request]:
    """Requests ``0..n-1`` with the given arrival times and (scalar or per-request) lengths."""
    n = len(arrivals)
    p = np.broadcast_to(np.asarray(prompts), (n,))
    o = np.broadcast_to(np.asarray(outputs), (n,))
    return [sim.Request(id=i, arrival_s=float(arrivals[i]), num_prompt_tokens=int(p[i]),
                        num_output_tokens=int(o[i])) for i in range(n)]


def poisson_arrivals(rate: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` Poisson arrival times with rate ``rate``, the first at an exponential gap from 0."""
    return np.cumsum(rng.exponential(1.0 / rate, n))


def lindley_waits(arrivals: np.ndarray, service: np.ndarray) -> np.ndarray:
    """Exact FCFS single-server waiting times: ``W[k] = max(0, W[k-1] + S[k-1] - A[k])``.

    Vectorised through the random-walk form ``W[k] = X[k] - min(0, min_{j<=k} X[j])`` with
    ``X[k] = sum_{j<k} (S[j] - (t[j+1] - t[j]))``.
    """
    gaps = np.diff(arrivals)
    x = np.concatenate(([0.0], np.cumsum(service[:-1] - gaps)))
    return x - np.minimum.accumulate(np.minimum(x, 0.0))


def check_invariants(res: sim.SimResult, reqs: Sequence[sim.Request],
                     kv: KVConfig | None = None) -> None:
    """Assert what every finished simulation must satisfy, whatever the policy and cost model.

    - every request ended exactly once: finished with all its tokens, or rejected with a reason;
    - per request: arrival <= first scheduled < first token <= finish (TTFT <= E2E);
    - per replica: steps have positive durations, never overlap, and time moves forward;
    - KV never exceeds the cache; every step runs at least one sequence;
    - tokens: every finished request's prompt and all but its last output token were computed;
      without preemptions or mid-run rejections, exactly those tokens and no others.
    """
    df = res.requests
    steps = res.steps
    assert len(df) == len(reqs)
    assert sorted(df["id"]) == sorted(r.id for r in reqs)
    assert set(df["status"]) <= {"finished", "rejected"}, set(df["status"])
    fin = df[df["status"] == "finished"]
    rej = df[df["status"] == "rejected"]
    assert (fin["num_generated"] == fin["num_output_tokens"]).all()
    assert (fin["reason"] == "").all()
    assert (rej["reason"].str.len() > 0).all(), rej
    assert not rej["finish_s"].isna().any()
    assert (rej["finish_s"] >= rej["arrival_s"] - EPS).all()

    assert (fin["first_scheduled_s"] >= fin["arrival_s"]).all()
    assert (fin["first_token_s"] > fin["first_scheduled_s"]).all()
    assert (fin["finish_s"] >= fin["first_token_s"]).all()
    assert (fin["ttft_s"] <= fin["e2e_s"] + EPS).all()
    assert (fin["ttft_s"] > 0).all()
    assert (fin["max_itl_s"] <= fin["e2e_s"] - fin["ttft_s"] + EPS).all()
    single = fin["num_output_tokens"] == 1
    assert fin.loc[single, "tpot_s"].isna().all()
    assert (fin.loc[~single, "tpot_s"] >= 0).all()
    scheduled = df[df["first_scheduled_s"].notna()]
    assert (scheduled["first_scheduled_s"] >= scheduled["arrival_s"]).all()

    if len(steps):
        assert (steps["duration_s"] > 0).all()
        assert (steps["num_seqs"] >= 1).all()
        assert (steps["num_prefill_tokens"] + steps["num_decode_tokens"] >= steps["num_seqs"]
                ).all()
        for _, rep in steps.groupby("replica"):
            start = rep["start_s"].to_numpy()
            end = start + rep["duration_s"].to_numpy()
            assert (np.diff(start) > 0).all(), "steps of one replica start in order"
            assert (start[1:] >= end[:-1] - EPS).all(), "steps of one replica never overlap"
        last_end = float((steps["start_s"] + steps["duration_s"]).max())
        assert fin["finish_s"].max() <= last_end + EPS if len(fin) else True
        if kv is not None and not kv.unlimited:
            assert steps["kv_used_blocks"].max() <= kv.num_blocks

    by_id = {r.id: r for r in reqs}
    needed = sum(by_id[i].num_prompt_tokens + by_id[i].num_output_tokens - 1 for i in fin["id"])
    computed = int(steps["num_prefill_tokens"].sum() + steps["num_decode_tokens"].sum()) \
        if len(steps) else 0
    assert computed >= needed
    mid_run_rejects = rej["first_scheduled_s"].notna().any()
    if df["num_preemptions"].sum() == 0 and not mid_run_rejects:
        assert computed == needed, (computed, needed)


class NoSkip(Policy):
    """Wraps a policy and withdraws its ``steady`` promise, so the engine runs every step as
    its own event (the reference that event skipping must reproduce exactly)."""

    name = "no-skip"

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = inner.name
        self.max_num_seqs = inner.max_num_seqs
        self.max_num_batched_tokens = inner.max_num_batched_tokens

    def schedule(self, view: View) -> Plan:
        plan = self.inner.schedule(view)
        if getattr(plan, "steady", False):
            plan = dataclasses.replace(plan, steady=False)
        return plan


#: A small experiment (constant-cost, 30 requests, no plots) for tests of the run machinery:
#: sweeps, resume, output folders.
SMALL_EXPERIMENT = {
    "name": "small",
    "cost": {"kind": "constant", "step_s": 0.01},
    "kv": {"num_blocks": 400, "block_size": 16},
    "workload": {"arrival": {"process": "poisson", "rate": 20}, "num_requests": 30,
                 "prompt_tokens": {"dist": "uniform", "lo": 10, "hi": 200},
                 "output_tokens": {"dist": "uniform", "lo": 2, "hi": 30}},
    "policy": {"name": "continuous", "max_num_seqs": 8},
    "output": {"plots": False},
}


def tiny_experiment(name: str = "tiny", num_requests: int = 40) -> str:
    """A tiny experiment file's text: constant 10 ms steps, 400 KV blocks, continuous batching
    of up to 8 sequences, uniform lengths, two swept Poisson rates (10 and 40 req/s), no
    plots: what CLI tests run end to end and edit field by field."""
    return f"""
name: {name}
seed: 1
cost: {{kind: constant, step_s: 0.01}}
kv: {{num_blocks: 400, block_size: 16}}
workload:
  arrival: {{process: poisson, rate: 20}}
  num_requests: {num_requests}
  prompt_tokens: {{dist: uniform, lo: 10, hi: 200}}
  output_tokens: {{dist: uniform, lo: 2, hi: 30}}
policy: {{name: continuous, max_num_seqs: 8}}
sweep:
  workload.arrival.rate: [10, 40]
output: {{plots: false}}
"""


def dd1_experiment(step_s: float, output_tokens: int, num_requests: int,
                   rates: list[float] | None = None) -> str:
    """A D/D/1 queue as an experiment file's text: constant arrivals, one sequence at a time,
    fixed lengths, a constant step, unlimited KV (a request takes ``output_tokens`` steps), no
    plots; ``rates`` swept when given. Capacity tests compare its searches with the closed
    form."""
    sweep = f"sweep:\n  workload.arrival.rate: {rates}\n" if rates else ""
    return f"""
name: dd1
cost: {{kind: constant, step_s: {step_s}}}
kv: {{unlimited: true}}
workload:
  arrival: {{process: constant, rate: 5}}
  num_requests: {num_requests}
  prompt_tokens: {{dist: fixed, value: 10}}
  output_tokens: {{dist: fixed, value: {output_tokens}}}
policy: {{name: continuous, max_num_seqs: 1}}
{sweep}output: {{plots: false}}
"""

