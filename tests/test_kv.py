"""KV cache as the binding constraint: slab vs paged, swap vs recompute, the preemption bound.

Exact scenarios first (constant 1 s steps, timings worked out by hand in the comments), then
property tests over random traces, every registered policy and every allocator / preemption /
prefix-caching combination: blocks conserved every step (``checks=True``), no sequence runs
without its KV, and token accounting exact — the steps compute every needed token once, plus
exactly the recomputed ones, minus exactly the ones found in the prefix cache.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import check_invariants, requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import policies
import sim
from sim.core.types import KVView, SeqView
from sim.experiments.config import ConfigError, expand_runs
from sim.kv.config import KVConfig

NAMES = sorted(policies.registered())


def run(reqs, kv, policy=None, step_s=1.0):
    spec = policy or {"name": "continuous", "max_num_seqs": 4, "watermark": 0.0}
    return sim.simulate(reqs, policy=spec, cost=sim.ConstantCost(step_s), kv=kv, checks=True)


def row(res, rid):
    return res.requests.set_index("id").loc[rid]


# -- slab vs paged -----------------------------------------------------------------------------

def test_slab_reserves_at_admission_and_paged_grows_on_demand():
    # One request of 4 prompt + 3 output tokens, 4-token blocks. Stored tokens at the end of
    # each step: 4, 5, 6. Paged holds 1, 2, 2 blocks; a slab of 16 tokens holds 4 throughout.
    reqs = requests([0.0], 4, 3)
    paged = run(reqs, {"num_blocks": 8, "block_size": 4})
    slab = run(reqs, {"num_blocks": 8, "block_size": 4, "allocator": "slab",
                      "reserve_tokens": 16})
    assert paged.steps["kv_used_blocks"].tolist() == [1, 2, 2]
    assert slab.steps["kv_used_blocks"].tolist() == [4, 4, 4]
    assert paged.steps["kv_live_tokens"].tolist() == [4, 5, 6]
    assert slab.steps["kv_live_tokens"].tolist() == [4, 5, 6]
    # Live fraction: 15 stored / 20 held slots (paged), 15 / 48 (slab).
    assert paged.summary["mean_kv_live_fraction"] == pytest.approx(15 / 20)
    assert slab.summary["mean_kv_live_fraction"] == pytest.approx(15 / 48)
    # Internal fragmentation: held-but-empty slots over the 32 slots of the cache, per step.
    assert paged.summary["kv_internal_fragmentation"] == pytest.approx((0 + 3 + 2) / 96)
    assert slab.summary["kv_internal_fragmentation"] == pytest.approx((12 + 11 + 10) / 96)


def test_slab_admits_fewer_sequences_at_once():
    # 4 requests of 4 + 4 tokens, 8 blocks of 4. Paged: each needs at most 2 blocks, all 4 run
    # together. Slab of 16 tokens (4 blocks each): 2 at a time. Slab of prompt + 4 output
    # tokens (2 blocks each): all 4 again — the reservation matches the real need.
    reqs = requests([0.0] * 4, 4, 4)
    base = {"num_blocks": 8, "block_size": 4}
    paged = run(reqs, base)
    slab = run(reqs, {**base, "allocator": "slab", "reserve_tokens": 16})
    tight = run(reqs, {**base, "allocator": "slab", "slab_reserve": "prompt_plus_max_output",
                       "max_output_tokens": 4})
    assert paged.steps["num_seqs"].max() == 4
    assert slab.steps["num_seqs"].max() == 2
    assert tight.steps["num_seqs"].max() == 4
    for res in (paged, slab, tight):
        check_invariants(res, reqs, res.kv)
        assert (res.requests["status"] == "finished").all()
    assert slab.summary["duration"] > paged.summary["duration"]


def test_kv_view_blocks_needed_with_a_per_sequence_slab():
    kv = KVView(total_blocks=100, free_blocks=100, block_size=16, reserve_output_tokens=64)
    seq = SeqView(id=0, arrival_s=0.0, num_prompt_tokens=100, num_generated=0,
                  num_computed_tokens=0)
    assert kv.blocks_needed(seq, 100) == math.ceil(164 / 16)  # prompt + 64 reserved
    fixed = KVView(total_blocks=100, free_blocks=100, block_size=16, reserve_tokens=512)
    assert fixed.blocks_needed(seq, 100) == 32


def test_slab_rejects_a_prompt_longer_than_its_reservation():
    res = run(requests([0.0, 0.0], [20, 4], 2), {"num_blocks": 8, "block_size": 4,
                                                 "allocator": "slab", "reserve_tokens": 16})
    assert row(res, 0)["status"] == "rejected"
    assert "exceeds the slab reservation of 16 tokens" in row(res, 0)["reason"]
    assert row(res, 1)["status"] == "finished"


# -- preemption: swap vs recompute -------------------------------------------------------------

SWAP = {"num_blocks": 3, "block_size": 4, "preemption": "swap", "swap_gbps": 4.0,
        "kv_bytes_per_token": 1e9}  # 1e9 B / 4e9 B/s: 0.25 s per token, each way


def test_swap_moves_kv_out_and_back_at_pcie_cost_with_exact_timings():
    # Two requests of 4 prompt + 6 output tokens, 3 blocks of 4 (as test_engine_exact's
    # recompute scenario).
    #   [0,1)  both prefilled, first tokens at 1.
    #   t=1    each decode needs a 2nd block, 1 free: 1 is swapped out (4 tokens, 1 s of PCIe),
    #          charged to the step: [1,3). 0's second token at 3.
    #   [3,7)  0 decodes alone, finishes at 7; 1 needs 2 blocks to come back, only 1 is free.
    #   [7,9)  1 swaps 4 tokens back in (1 s) and decodes: token 2 at 9, no recompute.
    #   [9,13) 1 decodes tokens 3..6, finishes at 13.
    res = run(requests([0.0, 0.0], 4, 6), SWAP, {"name": "continuous", "max_num_seqs": 2,
                                                  "watermark": 0.0})
    a, b = row(res, 0), row(res, 1)
    assert (a["first_token_s"], a["finish_s"]) == (1.0, 7.0)
    assert (b["first_token_s"], b["finish_s"], b["max_itl_s"]) == (1.0, 13.0, 8.0)
    assert (b["num_preemptions"], b["num_swaps"]) == (1, 1)
    s = res.steps
    assert s["duration_s"].tolist() == [1, 2, 1, 1, 1, 1, 2, 1, 1, 1, 1]
    assert s["swap_s"].tolist() == [0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0]
    assert s["swapped_bytes"].sum() == 8e9
    # Swapping keeps the computed tokens: exactly 2 × (4 + 5) tokens computed, none redone.
    assert int(s["num_prefill_tokens"].sum() + s["num_decode_tokens"].sum()) == 18
    assert s["num_recomputed_tokens"].sum() == 0
    sm = res.summary
    assert (sm["num_swaps"], sm["swapped_bytes"]) == (1, 8e9)
    assert sm["preemption_time_lost_s"] == pytest.approx(2.0)
    assert sm["max_num_preemptions"] == 1


def test_recompute_time_lost_is_the_recomputed_share_of_the_step():
    # The recompute scenario: at [6,7) request 1 computes 5 tokens, 4 of which it had before.
    res = run(requests([0.0, 0.0], 4, 6), {"num_blocks": 3, "block_size": 4},
              {"name": "continuous", "max_num_seqs": 2, "watermark": 0.0})
    assert res.steps["num_recomputed_tokens"].tolist() == [0] * 6 + [4] + [0] * 4
    assert res.summary["preemption_time_lost_s"] == pytest.approx(1.0 * 4 / 5)
    assert res.summary["num_swaps"] == 0 and res.summary["swapped_bytes"] == 0


def test_swap_rate_comes_from_the_hardware_profile():
    cost = sim.build_cost_model(model="llama-3-70b", hardware="h100-sxm", tp=4)
    res = sim.simulate([sim.Request(0, 0.0, 10, 2)], policy="continuous", cost=cost,
                       kv={"num_blocks": 100, "preemption": "swap"})
    # 81,920 B per token per GPU over each GPU's 64 GB/s PCIe link, the 4 GPUs in parallel.
    assert res.kv.kv_bytes_per_token == 4 * 81_920
    assert res.kv.swap_s_per_token == pytest.approx(81_920 / 64e9)
    with pytest.raises(ValueError, match="kv.swap_gbps"):
        sim.simulate([sim.Request(0, 0.0, 10, 2)], policy="continuous",
                     cost=sim.ConstantCost(1.0), kv={"num_blocks": 100, "preemption": "swap"})


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_repeated_preemption_is_bounded(mode):
    # max_preemptions=0: the first preemption rejects the victim, with the reason.
    kv = {**SWAP, "preemption": mode, "max_preemptions": 0}
    res = run(requests([0.0, 0.0], 4, 6), kv, {"name": "continuous", "max_num_seqs": 2,
                                                "watermark": 0.0})
    b = row(res, 1)
    assert b["status"] == "rejected"
    assert b["reason"] == "preempted 1 time (kv.max_preemptions=0)"
    assert row(res, 0)["status"] == "finished"
    # A tight cache under load: nobody is preempted more than max_preemptions + 1 times.
    rng = np.random.default_rng(5)
    reqs = requests(np.cumsum(rng.exponential(0.01, 120)), rng.integers(1, 60, 120),
                    rng.integers(1, 60, 120))
    kv = {**SWAP, "preemption": mode, "num_blocks": 20, "max_preemptions": 2}
    res = run(reqs, kv, {"name": "chunked_prefill", "token_budget": 64, "max_num_seqs": 8},
              step_s=0.01)
    check_invariants(res, reqs, res.kv)
    assert res.requests["num_preemptions"].max() <= 3
    assert res.summary["max_num_preemptions"] == res.requests["num_preemptions"].max()
    bounded = res.requests["reason"].str.startswith("preempted 3 times")
    assert (res.requests.loc[bounded, "num_preemptions"] == 3).all()


def test_kv_config_and_schema_reject_bad_values():
    with pytest.raises(ValueError, match="kv.preemption"):
        KVConfig(num_blocks=4, preemption="drop")
    with pytest.raises(ValueError, match="kv.max_output_tokens"):
        KVConfig(num_blocks=4, allocator="slab", slab_reserve="prompt_plus_max_output")
    base = {"workload": {"arrival": {"process": "poisson", "rate": 1.0}}}
    _, runs = expand_runs({**base, "kv": {"preemption": "swap", "prefix_caching": True,
                                          "max_preemptions": 3}})
    assert runs[0].config["kv"]["preemption"] == "swap"
    with pytest.raises(ConfigError, match="kv.preemption"):
        expand_runs({**base, "kv": {"preemption": "drop"}})


# -- properties --------------------------------------------------------------------------------

@st.composite
def traces(draw, max_requests=10):
    n = draw(st.integers(1, max_requests))
    gaps = draw(st.lists(st.sampled_from([0.0, 0.0, 0.25, 1.0]) | st.floats(0.0, 2.0),
                         min_size=n, max_size=n))
    arrivals = np.cumsum(gaps)
    reqs = []
    for i in range(n):
        prompt = draw(st.integers(1, 48))
        reqs.append(sim.Request(
            id=i, arrival_s=float(arrivals[i]), num_prompt_tokens=prompt,
            num_output_tokens=draw(st.integers(1, 16)),
            prefix_id=draw(st.sampled_from([None, "a", "b"])),
            num_prefix_tokens=draw(st.integers(0, prompt))))
    return reqs


kv_modes = st.fixed_dictionaries({
    "num_blocks": st.integers(4, 40),
    "block_size": st.sampled_from([1, 2, 4, 16]),
    "preemption": st.sampled_from(["recompute", "swap"]),
    "prefix_caching": st.booleans(),
    "max_preemptions": st.sampled_from([None, 0, 2, 8]),
    "swap_gbps": st.just(1.0),
    "kv_bytes_per_token": st.sampled_from([1e6, 1e8]),
}) | st.fixed_dictionaries({
    "num_blocks": st.integers(4, 40),
    "block_size": st.sampled_from([2, 4, 16]),
    "allocator": st.just("slab"),
    "slab_reserve": st.sampled_from(["max_model_len", "prompt_plus_max_output"]),
    "reserve_tokens": st.integers(8, 64),
    "max_output_tokens": st.integers(1, 24),
    "preemption": st.sampled_from(["recompute", "swap"]),
    "prefix_caching": st.booleans(),
    "swap_gbps": st.just(1.0),
    "kv_bytes_per_token": st.just(1e6),
})


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=traces(), kv=kv_modes, step=st.sampled_from([0.25, 1.0]))
def test_every_kv_mode_conserves_blocks_and_tokens(name, reqs, kv, step):
    res = sim.simulate(reqs, policy=name, cost=sim.LinearCost(base_s=step, per_token_s=1e-3),
                       kv=kv, checks=True)  # checks: conservation, nobody runs without KV
    df, steps = res.requests, res.steps
    if df["num_cached_tokens"].sum() == 0:  # its token count knows nothing of cache hits
        check_invariants(res, reqs, res.kv)
    assert set(df["status"]) <= {"finished", "rejected"}
    assert (df.loc[df["status"] == "rejected", "reason"].str.len() > 0).all()
    fin = df[df["status"] == "finished"]
    computed = int(steps["num_prefill_tokens"].sum() + steps["num_decode_tokens"].sum())
    needed = int((fin["num_prompt_tokens"] + fin["num_output_tokens"] - 1).sum())
    mid_run_rejects = (df["status"] == "rejected") & df["first_scheduled_s"].notna()
    if not mid_run_rejects.any():
        # Every needed token computed once, plus the recomputed, minus the cache hits.
        assert computed - int(steps["num_recomputed_tokens"].sum()) == \
            needed - int(fin["num_cached_tokens"].sum())
    if kv["preemption"] == "swap":
        assert steps["num_recomputed_tokens"].sum() == 0
        assert (df["num_swaps"] == df["num_preemptions"]).all() or mid_run_rejects.any() \
            or (df["reason"].str.startswith("preempted")).any()
    else:
        assert df["num_swaps"].sum() == 0
    if not kv["prefix_caching"]:
        assert df["num_cached_tokens"].sum() == 0
        assert steps["kv_cached_blocks"].sum() == 0
    if kv.get("max_preemptions") is not None:
        assert df["num_preemptions"].max() <= kv["max_preemptions"] + 1
    held = steps["kv_used_blocks"] * kv["block_size"]
    assert (steps["kv_live_tokens"] <= held).all()
    assert (steps["kv_used_blocks"] + steps["kv_cached_blocks"] <= kv["num_blocks"]).all()
