"""Disaggregated prefill and decode: exact timings, KV transfers on links, back-pressure.

Constant and linear cost models make every time a closed form: a request's TTFT is its prefill
step, its KV lands ``latency + bytes / bandwidth`` later, and each further token is one decode
step, so E2E = prefill step + transfer + (n - 1) decode steps.
"""
from __future__ import annotations

import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

import sim
from sim.cost.base import ConstantCost, LinearCost

BPT = 1e6  # KV bytes per token
GBPS = 1.0  # 1 GB/s per link direction: 1e6 bytes per token -> 1 ms per token
LAT_US = 10.0


def kv(num_blocks: int = 256, **extra: object) -> dict:
    return {"num_blocks": num_blocks, "block_size": 16, "kv_bytes_per_token": BPT, **extra}


def cluster(prefill_cost: object, decode_cost: object, *, n_p: int = 1, n_d: int = 1,
            kv_p: dict | None = None, kv_d: dict | None = None, tp_p: int = 1,
            tp_d: int = 1, **net: object) -> dict:
    network = {"nvlink_gbps": GBPS, "nvlink_latency_us": LAT_US, "nic_gbps": GBPS / 2,
               "nic_latency_us": 2 * LAT_US, **net}
    return {"groups": [
        {"name": "p", "role": "prefill", "replicas": n_p, "cost": prefill_cost, "tp": tp_p,
         "kv": kv_p or kv()},
        {"name": "d", "role": "decode", "replicas": n_d, "cost": decode_cost, "tp": tp_d,
         "kv": kv_d or kv()}], "network": network}


def req(i: int, t: float = 0.0, prompt: int = 100, out: int = 5) -> sim.Request:
    return sim.Request(id=i, arrival_s=t, num_prompt_tokens=prompt, num_output_tokens=out)


def run(reqs: list[sim.Request], cl: dict, **kw: object) -> sim.SimResult:
    return sim.simulate(reqs, policy={"name": "continuous"}, cluster=cl, checks=True, **kw)


def wire_s(prompt: int, gbps: float = GBPS, lat_us: float = LAT_US) -> float:
    return lat_us * 1e-6 + prompt * BPT / (gbps * 1e9)


def test_one_request_decomposes_into_prefill_transfer_and_decode_steps() -> None:
    prefill = LinearCost(base_s=0.01, per_token_s=1e-4)  # 100 tokens: 20 ms
    res = run([req(0, t=0.5, prompt=100, out=5)], cluster(prefill, ConstantCost(step_s=0.008)))
    r = res.requests.iloc[0]
    transfer = wire_s(100)
    assert r.ttft_s == pytest.approx(0.02, abs=1e-12)
    assert r.kv_wait_s == 0
    assert r.kv_transfer_s == pytest.approx(transfer, abs=1e-12)
    assert r.kv_transfer_bytes == 100 * BPT
    assert r.decode_start_s == pytest.approx(0.5 + 0.02 + transfer, abs=1e-12)
    assert r.e2e_s == pytest.approx(0.02 + transfer + 4 * 0.008, abs=1e-12)
    # TPOT and the longest gap include the transfer, as a client sees them
    assert r.max_itl_s == pytest.approx(transfer + 0.008, abs=1e-12)
    assert (r.prefill_replica, r.decode_replica, r.replica, r.group) == (0, 1, 1, "d")
    assert res.summary["num_kv_transfers"] == 1 and res.summary["num_gpus"] == 2
    links = res.links.set_index("link")
    assert list(links.index) == ["gpu0.nvlink.out", "gpu1.nvlink.in"]
    assert links["busy_s"].tolist() == pytest.approx([100 * BPT / 1e9] * 2, abs=1e-12)
    assert (res.engine, res.engine_reason) == (
        "general", "group 'p': per-step invariant checks (checks=True); "
        "group 'd': per-step invariant checks (checks=True)")


def test_two_concurrent_transfers_on_one_link_each_take_twice_the_bandwidth_time() -> None:
    # two prefill replicas finish together and send to the one decode replica: its inbound
    # link is shared fairly, each flow at half the bandwidth
    res = run([req(0), req(1)], cluster(ConstantCost(step_s=0.02), ConstantCost(step_s=0.01),
                                        n_p=2), router="round_robin")
    t = res.requests.set_index("id")
    assert t.prefill_replica.tolist() == [0, 1]
    for i in (0, 1):
        assert t.kv_transfer_s[i] == pytest.approx(LAT_US * 1e-6 + 2 * 100 * BPT / 1e9,
                                                   abs=1e-12)


def test_a_node_boundary_sends_over_the_nic() -> None:
    res = run([req(0)], cluster(ConstantCost(step_s=0.02), ConstantCost(step_s=0.01),
                                gpus_per_node=1))
    assert res.requests.kv_transfer_s[0] == pytest.approx(wire_s(100, GBPS / 2, 2 * LAT_US),
                                                          abs=1e-12)
    assert sorted(res.links["link"]) == ["gpu0.nic.out", "gpu1.nic.in"]


@pytest.mark.parametrize(("tp_p", "tp_d", "num_links", "seconds_per_byte"), [
    (2, 2, 4, 0.5),  # GPU i to GPU i: two flows of half the bytes in parallel
    (2, 1, 3, 1.0),  # two halves into one GPU: its inbound link carries everything
    (1, 2, 3, 1.0),  # one GPU sends both halves: its outbound link carries everything
    # head ranges halves onto thirds: 2 + 3 - gcd = 4 flows of 2/6, 1/6, 1/6, 2/6 of the
    # bytes; each sender's two flows share its link until the 1/6 ones end, then the 2/6 ones
    # run alone: 0.5 of the bytes' time in all
    (2, 3, 5, 0.5),
])
def test_different_tp_moves_the_same_bytes_in_more_or_fewer_flows(tp_p, tp_d, num_links,
                                                                  seconds_per_byte) -> None:
    res = run([req(0)], cluster(ConstantCost(step_s=0.02), ConstantCost(step_s=0.01),
                                tp_p=tp_p, tp_d=tp_d))
    r = res.requests.iloc[0]
    assert r.kv_transfer_bytes == 100 * BPT
    out = res.links[res.links["link"].str.endswith(".out")]
    assert out["bytes"].sum() == pytest.approx(100 * BPT)
    assert len(res.links) == num_links
    assert r.kv_transfer_s == pytest.approx(
        LAT_US * 1e-6 + seconds_per_byte * 100 * BPT / 1e9, abs=1e-12)


def test_a_full_decode_pool_holds_finished_prefills_on_the_prefill_replica() -> None:
    # decode pool: 4 blocks of 16; each request needs 2 for its 32-token prompt and 3 at its
    # end (32 + 2 decoded tokens), so the second waits until the first has finished
    step_p, step_d = 0.02, 0.01
    cl = cluster(ConstantCost(step_s=step_p), ConstantCost(step_s=step_d), kv_d=kv(4))
    res = run([req(0, prompt=32, out=3), req(1, prompt=32, out=3)], cl)
    t = res.requests.set_index("id")
    wire = wire_s(32)
    assert t.kv_wait_s[0] == 0 and t.kv_transfer_s[0] == pytest.approx(wire, abs=1e-12)
    first_done = step_p + wire + 2 * step_d
    assert t.finish_s[0] == pytest.approx(first_done, abs=1e-12)
    assert t.kv_wait_s[1] == pytest.approx(first_done - step_p, abs=1e-12)
    assert t.kv_transfer_s[1] == pytest.approx(first_done - step_p + wire, abs=1e-12)
    assert t.finish_s[1] == pytest.approx(first_done + wire + 2 * step_d, abs=1e-12)
    assert res.summary["completed"] == 2


def test_held_kv_limits_the_prefill_replicas_admissions() -> None:
    # prefill pool of 4 blocks: two 32-token prompts fill it; a third prompt that arrives
    # meanwhile is admitted only when their KV has been sent (both at once, sharing the link)
    cl = cluster(ConstantCost(step_s=0.02), ConstantCost(step_s=0.01), kv_p=kv(4))
    res = run([req(0, prompt=32), req(1, prompt=32), req(2, t=0.001, prompt=32)], cl)
    t = res.requests.set_index("id")
    landed = 0.02 + LAT_US * 1e-6 + 2 * 32 * BPT / 1e9
    assert t.kv_transfer_s[0] == t.kv_transfer_s[1] == pytest.approx(landed - 0.02, abs=1e-12)
    assert t.first_scheduled_s[2] == pytest.approx(landed, abs=1e-12)
    assert (t.status == "finished").all()


def test_a_request_of_one_output_token_never_leaves_the_prefill_replica() -> None:
    res = run([req(0, out=1)], cluster(ConstantCost(step_s=0.02), ConstantCost(step_s=0.01)))
    r = res.requests.iloc[0]
    assert r.status == "finished" and r.replica == 0 and r.decode_replica == -1
    assert res.summary["num_kv_transfers"] == 0


def test_a_request_no_decode_replica_can_hold_is_rejected_and_its_kv_freed() -> None:
    res = run([req(0, prompt=100, out=5), req(1, prompt=20, out=5)],
              cluster(ConstantCost(step_s=0.02), ConstantCost(step_s=0.01), kv_d=kv(4)))
    t = res.requests.set_index("id")
    assert t.status[0] == "rejected" and "decode replica" in t.reason[0]
    assert t.status[1] == "finished"


@settings(max_examples=40, deadline=None)
# cases found before: a preemption-only plan, a queue head stuck behind landed KV, a stall
# broken at the instant after the replicas planned
@example([(0.0, 22, 60), (0.0625, 1, 2)], 6, 1, 1, False, 1, "recompute")
@example([(0.0, 54, 60), (0.125, 80, 2)], 12, 1, 1, False, 2, "recompute")
@example([(0.17765049564062085, 59, 13), (0.18241652384523754, 71, 38),
          (0.19855472251340178, 1, 59), (0.19486655091321603, 40, 49),
          (0.17133947579898587, 56, 42)], 11, 1, 2, False, 2, "recompute")
@given(st.lists(st.tuples(st.floats(0, 0.2), st.integers(1, 80), st.integers(1, 60)),
                min_size=1, max_size=25),
       st.integers(6, 12), st.integers(1, 2), st.integers(1, 2), st.booleans(),
       st.sampled_from([1, 2, 64]), st.sampled_from(["recompute", "swap"]))
def test_nothing_is_lost_and_nothing_decodes_before_its_kv_lands(rows, decode_blocks, n_p, n_d,
                                                                 chunked, decode_seqs,
                                                                 preemption) -> None:
    # tiny pools on both sides: back-pressure, decode-side preemption, and requests that
    # landed but wait for a batch slot while the replica's queue head cannot fit
    reqs = [req(i, t, p, o) for i, (t, p, o) in enumerate(rows)]
    swap = {"swap_gbps": 1.0} if preemption == "swap" else {}  # recompute refuses a bandwidth
    cl = cluster(LinearCost(base_s=0.004, per_token_s=1e-5), ConstantCost(step_s=0.003),
                 n_p=n_p, n_d=n_d, kv_p=kv(12, preemption=preemption, **swap),
                 kv_d=kv(decode_blocks, preemption=preemption, **swap))
    cl["groups"][1]["policy"] = {"name": "continuous", "max_num_seqs": decode_seqs}
    policy = ({"name": "chunked_prefill", "token_budget": 32, "max_num_seqs": 8} if chunked
              else {"name": "continuous"})
    res = sim.simulate(reqs, policy=policy, cluster=cl, checks=True,  # invariants every step
                       router="least_outstanding_requests",
                       )
    t = res.requests.set_index("id")
    assert len(t) == len(reqs)
    for r in reqs:
        row = t.loc[r.id]
        if row.status == "rejected":  # never silently dropped: rejected only with a reason
            assert row.reason in ("context outgrew the KV cache",) or "blocks" in row.reason
            continue
        assert row.status == "finished" and row.num_generated == r.num_output_tokens
        if r.num_output_tokens > 1:
            assert row.kv_wait_s >= 0 and row.kv_transfer_s >= row.kv_wait_s
            assert row.kv_landed_s > row.first_token_s
            assert row.decode_start_s >= row.kv_landed_s  # no decode before its KV landed
            assert row.kv_transfer_bytes == r.num_prompt_tokens * BPT
    # each request's KV went once (a decode-side preemption recomputes there instead)
    assert res.summary["num_kv_transfers"] == t.kv_transfer_s.notna().sum()
    assert res.summary["kv_transfer_bytes"] == t.kv_transfer_bytes.sum()


def test_decode_side_preemption_recomputes_there_and_sends_nothing_again() -> None:
    # two long decodes outgrow a 9-block decode pool: one is preempted and recomputed on the
    # decode replica (its prompt and generated tokens), its KV was sent once
    cl = cluster(ConstantCost(step_s=0.02), ConstantCost(step_s=0.01), kv_d=kv(9))
    res = run([req(0, prompt=32, out=60), req(1, prompt=32, out=60)], cl)
    t = res.requests.set_index("id")
    assert (t.status == "finished").all()
    assert t.num_preemptions.sum() >= 1
    assert res.summary["num_kv_transfers"] == 2
    recomputed = res.steps[res.steps["group"] == "d"]["num_recomputed_tokens"].sum()
    assert recomputed > 0


def test_a_disaggregated_run_is_deterministic() -> None:
    reqs = [req(i, t=0.01 * i, prompt=20 + 7 * i % 50, out=3 + i % 9) for i in range(40)]
    cl = cluster(LinearCost(base_s=0.004, per_token_s=1e-5), ConstantCost(step_s=0.003),
                 n_p=2, n_d=2, kv_d=kv(20))
    cl["decode_router"] = {"name": "random"}
    a = sim.simulate(reqs, policy="continuous", cluster=cl, router="random", seed=3)
    b = sim.simulate(reqs, policy="continuous", cluster=cl, router="random", seed=3)
    assert a.requests.equals(b.requests) and a.steps.equals(b.steps)
    assert a.summary == b.summary or str(a.summary) == str(b.summary)


@pytest.mark.parametrize(("change", "message"), [
    ({"groups": [{"name": "p", "role": "prefil"}]}, r"cluster\.groups\[0\]\.role"),
    ({"groups": [{"name": "p", "role": "prefill"}]}, r"needs a group with role decode"),
    ({"groups": [{"name": "p", "role": "prefill"}, {"name": "d", "role": "decode"},
                 {"name": "m"}]}, r"cluster\.groups\[2\]\.role: mixed groups"),
    ({"groups": [{"name": "m"}], "network": {}}, r"cluster\.network: needs groups"),
    ({"network": {"nic_gb": 1}}, r"cluster\.network\.nic_gb: unknown key"),
    ({"network": {"nic_gbps": 0}}, r"cluster\.network\.nic_gbps: must be >= 0\.001"),
    ({"network": {"nvlink_gbps": 1e-12}}, r"cluster\.network\.nvlink_gbps: must be >= 0\.001"),
    ({"decode_router": {"name": "nope"}}, r"cluster\.decode_router"),
])
def test_every_disaggregation_key_is_checked_with_its_path(change, message) -> None:
    cl = cluster(ConstantCost(step_s=0.02), ConstantCost(step_s=0.01))
    for g in change.get("groups", []):
        g.setdefault("cost", ConstantCost(step_s=0.01))
        g.setdefault("kv", kv())
    cl.update(change)
    with pytest.raises(sim.InputError, match=message):
        run([req(0)], cl)


@pytest.mark.parametrize(("change", "words"), [
    ({"decode_router": "nope"}, "cluster.decode_router.name: unknown router 'nope'"),
    ({"network": {"nic_gbps": 0}}, "cluster.network.nic_gbps: must be >= 0.001, got 0"),
    ({"network": {"nic_gpbs": 5}}, "cluster.network.nic_gpbs: unknown key (did you mean "
     "'nic_gbps'?)"),
    ({"network": {"gpus_per_node": 1}}, "cluster.network.gpus_per_node: replica 0 has tp=2"),
])
def test_a_bad_disaggregation_key_in_a_yaml_exits_2_before_any_run(tmp_path, capsys, change,
                                                                   words) -> None:
    """``decode_router`` and ``network`` are checked with the rest of the config, so a bad one
    is exit code 2 naming the file and key, not a failed run (exit 1)."""
    from sim.cli.main import main

    block = {"groups": [{"name": "p", "role": "prefill"},
                        {"name": "d", "role": "decode"}], **change}
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump({
        "model": "llama-3-8b", "parallelism": {"tp": 2}, "cluster": block,
        "workload": {"arrival": {"rate": 10}, "num_requests": 3,
                     "prompt_tokens": {"dist": "fixed", "value": 8},
                     "output_tokens": {"dist": "fixed", "value": 4}}}))
    assert main(["run", str(exp), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"batchsim: error: {exp}: {words}") and err.count("\n") == 1, err
    assert not (tmp_path / "o").exists()


def test_a_horizon_cuts_a_disaggregated_run_short_and_says_so() -> None:
    reqs = [req(i, t=0.01 * i, prompt=40, out=30) for i in range(30)]
    cl = cluster(ConstantCost(step_s=0.02), ConstantCost(step_s=0.01), kv_d=kv(12))
    res = run(reqs, cl, horizon_s=0.3)
    t = res.requests
    assert res.summary["partial"] and res.summary["num_unfinished"] > 0
    assert set(t.status) <= {"finished", "waiting", "running"}
    assert (t[t.status == "finished"].num_generated == 30).all()  # only true finishes count
