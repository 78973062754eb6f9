"""Replicas on one clock behind a router (``sim.cluster``): exactness, queueing theory, and
what prefix-aware routing buys.

With ``ConstantCost(step_s=D)``, one-token outputs and ``max_num_seqs=1`` every replica is a
single FCFS server with deterministic service ``D`` (see tests/test_analytic.py). Poisson
arrivals split at random over ``N`` such replicas are ``N`` independent M/D/1 queues at rate
``lambda / N``: each replica's waits equal the Lindley recursion on the arrivals routed to it,
request by request, and their mean matches Pollaczek-Khinchine. The sample is sized so that
the 3 % tolerance is at least three standard errors (``C_MEAN`` of tests/test_analytic.py).
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from helpers import lindley_waits, poisson_arrivals

import sim
from routers import RouterError, make_router
from sim.cluster.simulate import RoutedDriver
from sim.core.arrays import TraceArrays
from sim.core.types import Request
from sim.engine.simulate import simulate as simulate_replicas
from sim.workload.conversations import conversations

D = 0.01
COST = sim.build_cost_model(model="llama-3-8b", hardware="h100-sxm", tp=1, engine="vllm")


def single_servers(arrivals: np.ndarray, num_replicas: int, router: str | dict,
                   seed: int = 0) -> sim.SimResult:
    """Every request one token long, each replica serving one at a time."""
    n = len(arrivals)
    reqs = TraceArrays(arrivals, np.full(n, 16, dtype=np.int64), np.ones(n, dtype=np.int64))
    return sim.simulate(reqs, policy={"name": "continuous", "max_num_seqs": 1},
                        cost=sim.ConstantCost(step_s=D), num_replicas=num_replicas,
                        router=router, seed=seed)


def mixed_requests(n: int = 160, seed: int = 3) -> list[Request]:
    rng = np.random.default_rng(seed)
    t = np.round(np.cumsum(rng.exponential(1 / 30, n)), 3)  # rounded: some arrivals tie
    return [Request(i, float(t[i]), int(rng.integers(20, 700)), int(rng.integers(1, 120)),
                    prefix_id=f"p{i % 4}" if i % 3 else None,
                    num_prefix_tokens=min(int(rng.integers(20, 700)), 48) if i % 3 else 0)
            for i in range(n)]


@pytest.mark.parametrize(("policy", "kv"), [
    ({"name": "continuous", "max_num_seqs": 16}, {"num_blocks": 300, "block_size": 16}),
    ({"name": "continuous", "max_num_seqs": 16, "mode": "orca"}, None),
    ({"name": "chunked_prefill", "token_budget": 256, "max_num_seqs": 16},
     {"num_blocks": 300, "block_size": 16, "max_preemptions": 3}),
    ({"name": "chunked_prefill", "token_budget": 512},
     {"num_blocks": 500, "block_size": 16, "prefix_caching": True}),
])
def test_round_robin_through_the_router_process_equals_the_static_split(policy, kv) -> None:
    """The router process changes nothing but who decides: the same choices give the very
    same tables as the engine's fixed split (policies that never look at ``more_arrivals``)."""
    reqs = mixed_requests()
    static = simulate_replicas(reqs, policy, COST, kv, num_replicas=3, checks=True)
    driver = RoutedDriver(make_router("round_robin"), seed=0)
    routed = simulate_replicas(reqs, policy, COST, kv, num_replicas=3, checks=True,
                               driver=driver)
    pd.testing.assert_frame_equal(routed.requests, static.requests)
    pd.testing.assert_frame_equal(routed.steps, static.steps)
    assert driver.log.replica == [i % 3 for i in range(len(reqs))]


def test_a_plain_round_robin_router_is_todays_run_bit_for_bit() -> None:
    reqs = mixed_requests()
    policy = {"name": "static", "batch_size": 4, "timeout_s": 0.2}
    plain = sim.simulate(reqs, policy=policy, cost=COST, num_replicas=2)
    routed = sim.simulate(reqs, policy=policy, cost=COST, num_replicas=2, router="round_robin")
    pd.testing.assert_frame_equal(routed.requests, plain.requests)
    assert routed.summary == plain.summary


def test_random_split_gives_independent_md1_queues_at_rate_lambda_over_n() -> None:
    rho, n_rep = 0.5, 4
    lam = n_rep * rho / D
    n = 140_000  # 3 x 3.7 / sqrt(n) <= 3 %
    assert 3 * 3.7 / math.sqrt(n - 4 * 250) <= 0.03
    arrivals = poisson_arrivals(lam, n, np.random.default_rng(5))
    res = single_servers(arrivals, n_rep, "random", seed=9)
    df = res.requests
    assert (df["status"] == "finished").all()
    pooled = []
    for k in range(n_rep):
        mine = df[df["replica"] == k]
        assert abs(len(mine) / n - 1 / n_rep) < 0.01  # the split is uniform
        w = (mine["first_scheduled_s"] - mine["arrival_s"]).to_numpy()
        exact = lindley_waits(mine["arrival_s"].to_numpy(), np.full(len(mine), D))
        np.testing.assert_allclose(w, exact, rtol=0, atol=1e-9 * arrivals[-1])
        pooled.append(w[250:])  # each queue starts empty
    w = np.concatenate(pooled)
    assert w.mean() == pytest.approx(rho * D / (2 * (1 - rho)), rel=0.03)


def jsq_reference(arrivals: np.ndarray, service: np.ndarray, n: int) -> np.ndarray:
    """Waits of FCFS servers fed by join-shortest-queue (requests in system, ties to the lowest
    index), simulated directly: the independent check of the router process."""
    in_system: list[list[float]] = [[] for _ in range(n)]
    free_at = [0.0] * n
    waits = np.empty(len(arrivals))
    for j, (a, s) in enumerate(zip(arrivals.tolist(), service.tolist(), strict=True)):
        for k in range(n):
            in_system[k] = [f for f in in_system[k] if f > a]
        k = min(range(n), key=lambda i: (len(in_system[i]), i))
        start = max(a, free_at[k])
        free_at[k] = start + s
        in_system[k].append(start + s)
        waits[j] = start - a
    return waits


def multi_token_servers(arrivals: np.ndarray, outputs: np.ndarray, router: str | dict
                        ) -> np.ndarray:
    n = len(arrivals)
    reqs = TraceArrays(arrivals, np.full(n, 16, dtype=np.int64), outputs)
    df = sim.simulate(reqs, policy={"name": "continuous", "max_num_seqs": 1},
                      cost=sim.ConstantCost(step_s=D), num_replicas=4, router=router).requests
    return (df["first_scheduled_s"] - df["arrival_s"]).to_numpy()


def test_join_shortest_queue_is_exact_and_waits_less_than_random_and_round_robin() -> None:
    """M/G/4 at 80 % load (geometric outputs, mean 4 steps): JSQ's waits equal a direct
    simulation request by request, and JSQ < round robin < random in mean wait."""
    outputs = np.random.default_rng(4).geometric(0.25, 8_000).astype(np.int64)
    arrivals = poisson_arrivals(4 * 0.8 / (4 * D), len(outputs), np.random.default_rng(2))
    jsq = multi_token_servers(arrivals, outputs, "least_outstanding_requests")
    np.testing.assert_allclose(jsq, jsq_reference(arrivals, outputs * D, 4), atol=1e-9)
    forced_rr = {"name": "round_robin", "latency_s": 1e-12}  # through the router process
    rr = multi_token_servers(arrivals, outputs, forced_rr)
    rand = multi_token_servers(arrivals, outputs, "random")
    assert jsq.mean() < 0.6 * rr.mean() < 0.6 * rand.mean()
    p2 = multi_token_servers(arrivals, outputs, "power_of_two")
    assert jsq.mean() < p2.mean() < rand.mean()


def test_with_deterministic_service_round_robin_beats_join_shortest_queue() -> None:
    """Not a bug: with constant service times round robin turns Poisson arrivals into Erlang
    ones (far smoother queues), while JSQ by request count cannot see which busy server
    finishes first. The engine agrees with the direct simulation."""
    arrivals = poisson_arrivals(4 * 0.8 / D, 8_000, np.random.default_rng(2))
    ones = np.ones(len(arrivals), dtype=np.int64)
    jsq = multi_token_servers(arrivals, ones, "least_outstanding_requests")
    np.testing.assert_allclose(jsq, jsq_reference(arrivals, ones * D, 4), atol=1e-9)
    rr = multi_token_servers(arrivals, ones, {"name": "round_robin", "latency_s": 1e-12})
    assert rr.mean() < jsq.mean() < multi_token_servers(arrivals, ones, "random").mean()


def test_routing_latency_delays_the_request_by_exactly_that_long() -> None:
    reqs = [Request(0, 1.0, 16, 3), Request(1, 1.0, 16, 3)]
    res = sim.simulate(reqs, policy={"name": "continuous"}, cost=sim.ConstantCost(step_s=D),
                       num_replicas=2, router={"name": "least_outstanding_requests",
                                               "latency_s": 0.25})
    df = res.requests
    np.testing.assert_allclose(df["first_scheduled_s"], [1.25, 1.25])
    np.testing.assert_allclose(df["finish_s"], [1.25 + 3 * D] * 2)
    # both decisions were taken at 1.0, before either request reached a queue: same replica
    assert df["replica"].tolist() == [0, 0]


def test_stale_load_signals_herd_a_burst_onto_one_replica() -> None:
    arrivals = np.array([0.0, 0.001, 0.002, 0.003, 0.5, 0.501])
    live = single_servers(arrivals, 3, "least_outstanding_requests").requests
    stale = single_servers(arrivals, 3, {"name": "least_outstanding_requests",
                                         "refresh_s": 0.1}).requests
    assert live["replica"].tolist() == [0, 1, 2, 0, 0, 1]
    # the picture of t=0 (all idle) serves the whole burst; the one of t=0.5 the next two
    assert stale["replica"].tolist() == [0, 0, 0, 0, 0, 0]


def test_prefix_aware_routing_raises_hit_rate_and_lowers_ttft_on_conversations() -> None:
    reqs = conversations({"num_conversations": 60, "rate": 2.0, "turns": [3, 6],
                          "think_time_s": 3.0}, np.random.default_rng(0))
    kv = {"prefix_caching": True, "num_blocks": 2500, "block_size": 16}
    out = {}
    for router in ("round_robin", "prefix_affinity", "session_affinity"):
        res = sim.simulate(reqs, policy={"name": "continuous", "max_num_seqs": 32}, cost=COST,
                           kv=kv, num_replicas=4, router=router)
        df = res.requests
        out[router] = (df["num_cached_tokens"].sum() / df["num_prompt_tokens"].sum(),
                       res.summary["mean_ttft_ms"])
    for router in ("prefix_affinity", "session_affinity"):
        assert out[router][0] > 2 * out["round_robin"][0]
        assert out[router][1] < out["round_robin"][1]


def test_routed_runs_report_imbalance_and_a_table_per_replica() -> None:
    arrivals = poisson_arrivals(300.0, 2000, np.random.default_rng(1))
    res = single_servers(arrivals, 4, "random")
    s = res.summary
    assert s["router"] == "random" and s["imbalance_max_mean"] > 1.0
    assert 0 < s["imbalance_cv"] < 0.2
    table = res.replicas
    assert table["replica"].tolist() == [0, 1, 2, 3]
    assert table["num_requests"].sum() == 2000 == table["completed"].sum()
    again = single_servers(arrivals, 4, "random")
    pd.testing.assert_frame_equal(again.requests, res.requests)  # same seed, same choices
    other = single_servers(arrivals, 4, "random", seed=1)
    assert not other.requests["replica"].equals(res.requests["replica"])


def test_a_bad_router_is_one_input_error_from_python_and_yaml(tmp_path) -> None:
    with pytest.raises(RouterError, match=r"router\.name: unknown router 'jsq'"):
        sim.simulate([Request(0, 0.0, 8, 2)], policy="continuous", cost=COST,
                     router={"name": "jsq"})
    exp = tmp_path / "exp.yaml"
    exp.write_text("workload: {synthetic: {num_requests: 5, rate: 1, prompt_tokens: 8, "
                   "output_tokens: 2}}\nrouter: {name: power_of_two, choices: 0}\n")
    with pytest.raises(sim.InputError, match=r"exp\.yaml: router\.choices: must be >= 1"):
        sim.run_experiment(str(exp), out=str(tmp_path / "out"))


ROUTED_EXPERIMENT = """\
name: routed
seed: 5
cost: {kind: linear, base_s: 0.004, per_token_s: 2.0e-5}
parallelism: {replicas: 3}
kv: {num_blocks: 200, block_size: 16}
workload:
  arrival: {process: gamma, rate: 80, cv: 2.0}
  num_requests: 90
  prompt_tokens: {dist: lognormal, median: 60, sigma: 0.9, max: 600}
  output_tokens: {dist: exponential, mean: 12, max: 80}
policy: {name: chunked_prefill, token_budget: 128, max_num_seqs: 8}
sweep:
  router.name: [power_of_two, random]
output: {plots: false}
"""


@pytest.mark.parametrize("mode", ["jobs", "dask"])
def test_routed_runs_are_identical_across_processes_jobs_and_dask(tmp_path, mode) -> None:
    exp = tmp_path / "routed.yaml"
    exp.write_text(ROUTED_EXPERIMENT)
    sim.run_experiment(str(exp), out=str(tmp_path / "one"))
    if mode == "dask":
        pytest.importorskip("dask.distributed")
        sim.run_experiment(str(exp), out=str(tmp_path / "two"), executor="dask")
    else:
        sim.run_experiment(str(exp), out=str(tmp_path / "two"), jobs=2)
    one, two = ((tmp_path / d / "summary.csv").read_text() for d in ("one", "two"))
    assert one == two
    summary = pd.read_csv(tmp_path / "one" / "summary.csv")
    assert list(summary["router"]) == ["power_of_two", "random"]


def test_routing_decisions_appear_in_the_perfetto_export(tmp_path) -> None:
    import json

    from sim.report.trace_export import export_chrome_trace

    arrivals = np.array([0.0, 0.001, 0.002, 0.003])
    res = single_servers(arrivals, 2, "least_outstanding_requests")
    path = export_chrome_trace(res.steps, tmp_path / "trace.json", res.requests)
    events = json.loads(path.read_text())["traceEvents"]
    routed = [e for e in events if e.get("cat") == "routing"]
    assert [e["args"]["replica"] for e in routed] == res.requests["replica"].tolist()
    assert [e["ts"] for e in routed] == [0.0, 1000.0, 2000.0, 3000.0]
    single = single_servers(arrivals, 1, "least_outstanding_requests")
    events = json.loads(export_chrome_trace(single.steps, tmp_path / "one.json",
                                            single.requests).read_text())["traceEvents"]
    assert not [e for e in events if e.get("cat") == "routing"]
