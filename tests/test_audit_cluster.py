"""Audit of multi-replica deployments (routers, groups, disaggregation): each test pins one
input that used to crash, run or be ignored, and is now one clear error naming the key (an
``InputError`` from Python, exit code 2 from the CLI) before anything runs."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

import sim
from routers import RouterError, make_router
from sim.cli.main import main
from sim.core.errors import InputError
from sim.core.types import Request

COST = sim.build_cost_model(model="llama-3-8b", hardware="h100-sxm")
PD = [{"name": "p", "role": "prefill"}, {"name": "d", "role": "decode"}]


def reqs(n: int = 12) -> list[Request]:
    """A few short requests, 50 ms apart."""
    return [Request(i, i * 0.05, 100 + i, 8) for i in range(n)]


def run(cluster: dict, cost: object = COST, **kw: object) -> sim.SimResult:
    return sim.simulate(reqs(), policy={"name": "continuous"}, cost=cost, cluster=cluster,
                        **kw)


def cli(tmp_path: Path, capsys: pytest.CaptureFixture[str], cluster: str,
        router: str = "") -> tuple[int, str]:
    """``batchsim run`` of a tiny roofline experiment with ``cluster`` (YAML flow text)."""
    exp = tmp_path / "exp.yaml"
    exp.write_text(f"""
name: audit
model: llama-3-8b
hardware: h100-sxm
workload:
  arrival: {{process: poisson, rate: 20}}
  num_requests: 10
  prompt_tokens: {{dist: fixed, value: 100}}
  output_tokens: {{dist: fixed, value: 4}}
policy: {{name: continuous}}
{router}
cluster: {cluster}
output: {{plots: false}}
""")
    code = main(["run", str(exp), "--out", str(tmp_path / "o"), "--quiet"])
    return code, capsys.readouterr().err


def test_a_negative_seed_of_a_cluster_is_an_input_error() -> None:
    # was numpy's ValueError from the router's SeedSequence
    with pytest.raises(InputError, match=r"^seed: must be >= 0, got -1$"):
        run({"groups": [{"name": "a", "replicas": 2}]}, seed=-1)
    with pytest.raises(InputError, match=r"^seed: "):
        run({"groups": PD}, seed=-1)


def test_routing_latency_of_a_disaggregated_cluster_is_refused_up_front(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(InputError, match=r"^router\.latency_s: routing latency is not "):
        run({"groups": PD}, router={"name": "random", "latency_s": 0.1})
    # the decode router's own key, not the experiment router's
    with pytest.raises(InputError, match=r"^cluster\.decode_router\.latency_s: "):
        run({"groups": PD, "decode_router": {"name": "random", "latency_s": 0.1}})
    # the CLI refused it only once the run had started (exit code 1, a traceback file)
    code, err = cli(tmp_path, capsys, "{groups: [{name: p, role: prefill}, "
                    "{name: d, role: decode}], decode_router: {name: random, latency_s: 0.1}}")
    assert code == 2 and err.count("\n") == 1, err
    assert "exp.yaml: cluster.decode_router.latency_s: routing latency" in err


def test_prefill_and_decode_groups_must_serve_one_model(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    big = sim.build_cost_model(model="llama-3-70b", hardware="h100-sxm", tp=4)
    with pytest.raises(InputError, match=r"^cluster\.groups\[1\]\.model: group 'd' serves "
                       r"'llama-3-70b' but group 'p' serves 'llama-3-8b'"):
        run({"groups": [{"name": "p", "role": "prefill", "cost": COST},
                        {"name": "d", "role": "decode", "cost": big}]})
    code, err = cli(tmp_path, capsys, "{groups: [{name: p, role: prefill}, {name: d, role: "
                    "decode, model: llama-3-70b, tp: 4}]}")
    assert code == 2 and "exp.yaml: cluster.groups[1].model: group 'd' serves" in err, err
    # mixed groups behind one router may differ (a heterogeneous fleet); a GPU may differ too
    run({"groups": [{"name": "p", "role": "prefill"},
                    {"name": "d", "role": "decode", "cost": sim.build_cost_model(
                        model="llama-3-8b", hardware="a100-80gb")}]})


def test_a_group_name_may_not_be_empty() -> None:
    with pytest.raises(InputError, match=r"^cluster\.groups\[1\]\.name: must be a non-empty"):
        run({"groups": [{"name": "a"}, {"name": " "}]})


def test_keys_beside_a_ready_cost_model_must_agree_with_it() -> None:
    with pytest.raises(InputError, match=r"^cluster\.groups\[0\]\.tp: tp=4 does not match the "
                       r"group's cost model, built for tp=1$"):
        run({"groups": [{"name": "a", "cost": COST, "tp": 4}]})
    with pytest.raises(InputError, match=r"^cluster\.groups\[0\]\.model: 'llama-3-70b' is not "
                       r"used"):
        run({"groups": [{"name": "a", "cost": COST, "model": "llama-3-70b"}]})
    with pytest.raises(InputError, match=r"^cluster\.groups\[0\]\.hardware: 'a100-80gb' does "
                       r"not match the group's cost model, built for 'h100-sxm'$"):
        run({"groups": [{"name": "a", "cost": COST, "hardware": "a100-80gb"}]})
    # an analytic cost model has no TP of its own: ``tp`` says where its KV lives
    assert run({"groups": [{"name": "a", "cost": sim.ConstantCost(0.01), "tp": 2}]}).summary[
        "num_gpus"] == 2


def test_a_python_group_takes_the_cost_keys_it_leaves_out_from_the_cost_argument() -> None:
    # as a YAML group takes the experiment's: was "needs a model and a hardware profile"
    a100 = sim.build_cost_model(model="llama-3-8b", hardware="a100-80gb")
    inherited = run({"groups": [{"name": "a", "hardware": "a100-80gb"}]})
    direct = run({"groups": [{"name": "a"}]}, cost=a100)
    pd.testing.assert_frame_equal(inherited.requests, direct.requests)
    assert inherited.groups["hardware"].tolist() == ["a100-80gb"]
    assert run({"groups": [{"name": "a", "tp": 2}]}).summary["num_gpus"] == 2
    tuned = sim.build_cost_model(model="llama-3-8b", hardware="h100-sxm", memory_eff=0.5)
    with pytest.raises(InputError, match=r"^cluster\.groups\[0\]\.tp: simulate's cost "
                       r"argument has parameter overrides"):
        run({"groups": [{"name": "a", "tp": 2}]}, cost=tuned)
    with pytest.raises(InputError, match=r"^cluster\.groups\[0\]\.model: needs a model"):
        run({"groups": [{"name": "a", "tp": 2}]}, cost=sim.ConstantCost(0.01))


def test_router_options_that_would_do_nothing_are_refused() -> None:
    for name in ("round_robin", "random"):
        with pytest.raises(RouterError, match=rf"^router\.refresh_s: has no effect: {name} "
                           "reads no load signals"):
            make_router({"name": name, "refresh_s": 0.5})
        make_router({"name": name, "latency_s": 0.5})  # a latency still delays requests
    with pytest.raises(InputError, match=r"^cluster\.decode_router\.refresh_s: has no effect"):
        run({"groups": PD, "decode_router": {"name": "random", "refresh_s": 0.5}})
    # every weight 0: the tie-break alone (fewest requests) routed
    with pytest.raises(RouterError, match=r"^router\.scorers: needs a scorer with a weight > 0"):
        make_router({"name": "weighted", "scorers": {"queue": 0, "prefix": 0}})
    with pytest.raises(RouterError, match=r"^router\.index_blocks: has no effect: only the "
                       r"prefix scorer reads it"):
        make_router({"name": "weighted", "scorers": {"queue": 1}, "index_blocks": 64})
    make_router({"name": "weighted", "scorers": {"queue": 1, "prefix": 2}, "index_blocks": 64})


def test_a_missing_kv_size_names_the_prefill_group() -> None:
    cheap = sim.ConstantCost(0.01)
    with pytest.raises(InputError, match=r"^cluster\.groups\[1\]\.kv\.kv_bytes_per_token: "):
        run({"groups": [{"name": "d", "role": "decode"}, {"name": "p", "role": "prefill"}]},
            cost=cheap, kv={"num_blocks": 100})


def test_a_cluster_has_at_most_as_many_replicas_as_parallelism_replicas_allows() -> None:
    # each group was bounded (4096) but not their sum: 64 groups made 262,144 replicas
    with pytest.raises(InputError, match=r"^cluster\.groups: 4097 replicas in all; a cluster "
                       r"has at most 4096$"):
        run({"groups": [{"name": "a", "replicas": 4096}, {"name": "b"}]},
            cost=sim.ConstantCost(0.01))


def test_swept_cluster_blocks_must_be_told_apart(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # two deployments under one label were two rows nobody could tell apart
    exp = tmp_path / "exp.yaml"
    exp.write_text("""
model: llama-3-8b
workload: {arrival: {process: poisson, rate: 20}, num_requests: 5,
           prompt_tokens: {dist: fixed, value: 100}, output_tokens: {dist: fixed, value: 4}}
sweep:
  cluster: [{label: x, groups: [{name: a}]}, {label: x, groups: [{name: a, replicas: 2}]}]
output: {plots: false}
""")
    assert main(["run", str(exp), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "exp.yaml: sweep.cluster[1].label: label 'x' is used by sweep.cluster[0] too" in err
    with pytest.raises(InputError, match=r"^cluster\.label: expected a non-empty label"):
        run({"label": " ", "groups": [{"name": "a"}]})


def test_a_router_object_routes_every_run_alike() -> None:
    # its state (a round-robin counter, session homes) carried over from the run before: a
    # different split, or an IndexError for a home on a replica the next run does not have
    cost = sim.ConstantCost(0.01)
    sessions = [Request(i, i * 0.01, 100, 20, prefix_id=str(i % 7)) for i in range(30)]
    for spec in ({"name": "round_robin", "latency_s": 0.001}, "session_affinity"):
        router = make_router(spec)
        first = sim.simulate(sessions, cost=cost, num_replicas=3, router=router)
        sim.simulate(sessions[:5], cost=cost, num_replicas=8, router=router)
        again = sim.simulate(sessions, cost=cost, num_replicas=3, router=router)
        assert again.requests["replica"].tolist() == first.requests["replica"].tolist()


def test_a_prefill_policy_waiting_for_a_full_batch_runs_its_last_one() -> None:
    # static batching without a timeout waits for arrivals that may come; a prefill replica
    # was told none would only once it was empty, so its last partial batch never ran and
    # the run ended in "disaggregated cluster stalled" (an EngineError)
    res = sim.simulate(reqs(11), policy="continuous", cost=COST, checks=True, cluster={
        "groups": [{"name": "p", "role": "prefill", "policy": {"name": "static",
                                                                "batch_size": 4}},
                   {"name": "d", "role": "decode"}]})
    assert res.summary["completed"] == 11 and res.summary["num_kv_transfers"] == 11
    # the last three prompts run together, once the last request has arrived
    table = res.requests.sort_values("id")
    assert table["first_scheduled_s"].iloc[-3:].nunique() == 1
    assert table["first_scheduled_s"].iloc[-1] >= table["arrival_s"].iloc[-1]


def test_one_replica_behind_a_router_with_a_latency_is_not_noted_unused() -> None:
    # the latency still delays every request (500 ms more TTFT), yet the note said the
    # router was not used
    from sim.experiments.config import expand_runs

    raw = {"cost": {"kind": "constant", "step_s": 0.01},
           "workload": {"arrival": {"process": "poisson", "rate": 20}, "num_requests": 5,
                        "prompt_tokens": {"dist": "fixed", "value": 10},
                        "output_tokens": {"dist": "fixed", "value": 2}}}
    for router, noted in (({"name": "random", "latency_s": 0.5}, False), ("random", True)):
        notes: list[str] = []
        expand_runs({**raw, "router": router}, notify=notes.append)
        assert any("router is not used" in n for n in notes) is noted, notes
