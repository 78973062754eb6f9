"""The replica core driven from outside (``advance_until`` / ``admit`` / ``close``) gives the
very tables ``sim.simulate`` gives, and its state and events agree with them.

The driver here owns the clock and the arrivals, as a cluster would: requests are handed out
round robin in arrival order, each replica advanced to the request's arrival time, the request
admitted, and every replica run to the end once the last one is in.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import simpy

import sim
from policies import make_policy
from sim.core.state import Seq
from sim.core.types import Request
from sim.engine.drive import EVENT_KINDS, ReplicaEvent
from sim.engine.replica import Replica
from sim.kv.config import resolve_kv
from sim.metrics.summary import StepLog, request_table

COST = sim.build_cost_model(model="llama-3-8b", hardware="h100-sxm", tp=1, engine="vllm")

POLICIES = {
    "static": {"name": "static", "batch_size": 8, "timeout_s": 0.3},
    "dynamic": {"name": "dynamic", "max_batch_size": 8, "max_wait_s": 0.05},
    "continuous": {"name": "continuous", "max_num_seqs": 16},
    "orca": {"name": "continuous", "max_num_seqs": 16, "mode": "orca"},
    "chunked_prefill": {"name": "chunked_prefill", "token_budget": 256, "max_num_seqs": 16},
}
#: A small cache (preemptions), swap preemption, and prefix caching.
KVS = {
    "tight": {"block_size": 16, "num_blocks": 260, "max_preemptions": 4},
    "swap": {"block_size": 16, "num_blocks": 260, "preemption": "swap", "swap_gbps": 25.0,
             "kv_bytes_per_token": 131072},
    "prefix": {"block_size": 16, "num_blocks": 400, "prefix_caching": True},
}


def workload(n: int = 120, seed: int = 1) -> list[Request]:
    """Poisson arrivals, mixed lengths, a few shared prefixes (some arrivals tie)."""
    rng = np.random.default_rng(seed)
    t = np.round(np.cumsum(rng.exponential(1 / 14, n)), 3)  # rounded: some share an instant
    prompts = rng.integers(20, 600, n)
    outputs = rng.integers(1, 160, n)
    return [Request(i, float(t[i]), int(prompts[i]), int(outputs[i]),
                    prefix_id=f"p{i % 3}" if i % 2 else None,
                    num_prefix_tokens=min(int(prompts[i]) - 1, 64) if i % 2 else 0)
            for i in range(n)]


def drive(reqs: list[Request], policy: dict, kv: dict, num_replicas: int,
          events: list[ReplicaEvent] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run ``reqs`` on replicas driven through advance_until / admit / close."""
    cfg = resolve_kv(kv, COST)
    log = StepLog()
    seqs: dict = {}
    limit = COST.model.max_position_embeddings
    reps = [Replica(k, (), make_policy(policy), COST, cfg, log, seqs, checks=True,
                    max_model_len=limit) for k in range(num_replicas)]
    if events is not None:
        for rep in reps:
            rep.listener = events.append
    order = sorted(reqs, key=lambda r: (r.arrival_s, r.id))
    last = {i % num_replicas: i for i in range(len(order))}
    for i, req in enumerate(order):
        rep = reps[i % num_replicas]
        rep.advance_until(req.arrival_s)
        rep.admit(req)
        if last[i % num_replicas] == i:
            rep.close()
    for rep in reps:
        rep.advance_until(math.inf)
    steps = log.table()
    if num_replicas > 1:
        steps = steps.sort_values(["start_s", "replica"], kind="stable").reset_index(drop=True)
    return request_table(sorted(seqs.values(), key=lambda s: s.req.id)), steps


@pytest.mark.parametrize("kv_name", sorted(KVS))
@pytest.mark.parametrize("name", sorted(POLICIES))
def test_driven_replicas_give_the_tables_of_simulate(name: str, kv_name: str) -> None:
    reqs = workload()
    for replicas in (1, 2):
        want = sim.simulate(reqs, policy=POLICIES[name], cost=COST, kv=KVS[kv_name],
                            num_replicas=replicas, checks=True, fast_path=False)
        requests, steps = drive(reqs, POLICIES[name], KVS[kv_name], replicas)
        pd.testing.assert_frame_equal(requests, want.requests)
        pd.testing.assert_frame_equal(steps, want.steps)


@pytest.mark.parametrize("kv_name", sorted(KVS))
@pytest.mark.parametrize("name", sorted(POLICIES))
def test_a_replica_run_alone_equals_its_simpy_process(name: str, kv_name: str) -> None:
    """``Replica.run_alone`` (one replica, no SimPy event a step) is the SimPy process."""
    reqs = sorted(workload(), key=lambda r: (r.arrival_s, r.id))
    cfg = resolve_kv(KVS[kv_name], COST)
    tables = []
    for alone in (True, False):
        log, seqs = StepLog(), {r.id: Seq(r) for r in reqs}
        rep = Replica(0, reqs, make_policy(POLICIES[name]), COST, cfg, log, seqs, checks=True,
                      max_model_len=COST.model.max_position_embeddings)
        if alone:
            rep.run_alone()
        else:
            env = simpy.Environment()
            env.process(rep.process(env))
            env.run()
        tables.append((request_table(sorted(seqs.values(), key=lambda s: s.req.id)),
                       log.table()))
    for got, want in zip(*tables, strict=True):
        pd.testing.assert_frame_equal(got, want, check_exact=True)


def test_the_workloads_exercise_preemption_swaps_prefix_hits_and_skipping() -> None:
    """The equivalence above covers the hard cases (so it could fail on them)."""
    reqs = workload()
    tight = sim.simulate(reqs, policy=POLICIES["chunked_prefill"], cost=COST, kv=KVS["tight"])
    swap = sim.simulate(reqs, policy=POLICIES["continuous"], cost=COST, kv=KVS["swap"])
    prefix = sim.simulate(reqs, policy=POLICIES["continuous"], cost=COST, kv=KVS["prefix"])
    assert tight.summary["num_preemptions"] > 0
    assert swap.summary["num_swaps"] > 0
    assert prefix.requests["num_cached_tokens"].sum() > 0
    skipped = sim.simulate(reqs, policy=POLICIES["continuous"], cost=COST, kv=KVS["prefix"],
                           event_skipping=False)
    assert skipped.summary["num_steps"] == prefix.summary["num_steps"]


def test_events_match_the_request_table() -> None:
    reqs = workload()
    events: list[ReplicaEvent] = []
    requests, _ = drive(reqs, POLICIES["chunked_prefill"], KVS["tight"], 2, events)
    assert {e.kind for e in events} <= set(EVENT_KINDS)
    table = requests.set_index("id")
    for kind, column in (("first_token", "first_token_s"), ("prefill_done", "first_token_s")):
        got = {e.request_id: e.time_s for e in events if e.kind == kind}
        want = table[column].dropna()
        assert got == want.to_dict()
    finished = {e.request_id: e.time_s for e in events if e.kind == "finish"}
    done = table[table["status"] == "finished"]
    assert finished == done["finish_s"].to_dict()
    rejected = {e.request_id for e in events if e.kind == "rejected"}
    assert rejected == set(table.index[table["status"] == "rejected"])
    for e in events:
        assert e.replica == table.loc[e.request_id, "replica"]


def test_state_reports_queue_tokens_kv_and_a_straddling_step() -> None:
    cfg = resolve_kv({"block_size": 16, "num_blocks": 100, "prefix_caching": True}, COST)
    rep = Replica(0, (), make_policy({"name": "continuous"}), COST, cfg, StepLog(), {})
    empty = rep.state()
    assert (empty.num_waiting, empty.num_running, empty.kv_used_blocks) == (0, 0, 0)
    assert empty.kv_total_blocks == 100 and empty.step_end_s is None
    rep.advance_until(1.0)
    rep.admit(Request(0, 1.0, 100, 3, prefix_id="sys", num_prefix_tokens=64))
    rep.admit(Request(1, 1.0, 50, 2))
    s = rep.state()
    assert (s.clock_s, s.num_waiting, s.num_running) == (1.0, 2, 0)
    assert (s.num_prefill_tokens, s.num_decode_tokens) == (150, 5)
    rep.advance_until(1.0 + 1e-9)  # the prefill starts at 1.0 and straddles this time
    s = rep.state()
    assert s.num_running == 2 and s.num_waiting == 0 and s.step_end_s is not None
    assert s.step_end_s > 1.0 + 1e-9 and s.clock_s == 1.0 + 1e-9
    assert s.kv_used_blocks == math.ceil(101 / 16) + math.ceil(51 / 16)
    assert s.num_prefill_tokens == 150  # in flight: nothing committed yet
    end = s.step_end_s
    rep.advance_until(end)  # the step is committed at its end; the next plan waits for t > end
    s = rep.state()
    assert s.num_prefill_tokens == 0 and s.num_decode_tokens == 3 and s.step_end_s is None
    rep.close()
    rep.advance_until(math.inf)
    s = rep.state()
    assert (s.num_waiting, s.num_running, s.kv_used_blocks) == (0, 0, 0)
    # a finished request's full blocks join its chain: 100 + 2 computed tokens, 6 full blocks
    assert dict(s.cached_prefixes) == {"sys": 6}
    with pytest.raises(ValueError, match="cannot go back"):
        rep.advance_until(0.0)
