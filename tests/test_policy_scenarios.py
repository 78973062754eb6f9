"""The batching story in numbers: each policy's signature behaviour, measured from the tables."""
from __future__ import annotations

import pytest

import sim

STEP = sim.ConstantCost(0.01)


def row(res: sim.SimResult, rid: int):
    """The request-table row of request ``rid``."""
    return res.requests.set_index("id").loc[rid]


# -- static batching: the two wastes ---------------------------------------------------------
def test_static_padded_prefill_costs_80x(trace) -> None:
    reqs = trace((0.0, 50, 3), (0.0, 4000, 3))
    res = sim.simulate(reqs, {"name": "static", "batch_size": 2}, STEP, checks=True)
    prefill = res.steps.iloc[0]
    assert prefill["num_prefill_tokens"] == 4050 and prefill["num_padding_rows"] == 1
    # The 50-token row is padded to the 4,000-token prompt: it computes 4,000 tokens.
    assert (50 + prefill["num_padding_tokens"]) / 50 == 80
    assert res.summary["padding_fraction"] == pytest.approx(3950 / (8000 + 2 * 2))


@pytest.mark.parametrize("event_skipping", [True, False])
def test_static_first_finisher_leaves_31_slots_padding(trace, event_skipping: bool) -> None:
    reqs = trace((0.0, 16, 2000), *[(0.0, 16, 20)] * 31)
    res = sim.simulate(reqs, {"name": "static", "batch_size": 32}, STEP, checks=True,
                       event_skipping=event_skipping)
    decode = res.steps[res.steps["num_prefill_tokens"] == 0]
    assert len(decode) == 1999  # the prefill samples token 1; each decode step one more
    # After token 20, 31 of 32 slots compute discarded tokens for 1,980 of 1,999 decode steps.
    wasted_steps = (decode["num_padding_rows"] == 31).mean()
    assert wasted_steps == pytest.approx(0.99, abs=0.01)
    slots = decode["num_padding_rows"] / (decode["num_padding_rows"] + decode["num_seqs"])
    assert slots.mean() == pytest.approx(31 * 1980 / (32 * 1999))
    busy_rows = 32 * 20 + 1980  # real rows over the 2,000 steps of the batch
    assert res.summary["slot_utilization"] == pytest.approx(busy_rows / (32 * 2000))


def test_static_waits_for_full_batch_and_admits_nobody_midway(trace) -> None:
    reqs = trace((0.0, 10, 5), (0.5, 10, 5), (0.52, 10, 5))
    res = sim.simulate(reqs, {"name": "static", "batch_size": 2}, STEP, checks=True)
    assert row(res, 0)["first_scheduled_s"] == row(res, 1)["first_scheduled_s"] == 0.5
    # Request 2 arrives while the batch runs and waits for it to end (5 steps); as no more
    # requests will come, it then goes as a partial batch rather than waiting forever.
    assert row(res, 2)["first_scheduled_s"] == pytest.approx(0.55)


def test_static_timeout_dispatches_partial_batch(trace) -> None:
    reqs = trace((0.0, 10, 2), (5.0, 10, 2))
    res = sim.simulate(reqs, {"name": "static", "batch_size": 4, "timeout_s": 0.2}, STEP,
                       checks=True)
    assert row(res, 0)["first_scheduled_s"] == 0.2
    assert res.summary["slot_utilization"] == pytest.approx(0.25)


def test_static_kv_limit_preempts_and_rejoins_same_batch(trace) -> None:
    reqs = trace((0.0, 8, 12), (0.0, 8, 12), (0.001, 8, 2))
    kv = {"num_blocks": 6, "block_size": 4}
    res = sim.simulate(reqs, {"name": "static", "batch_size": 2}, STEP, kv=kv, checks=True)
    assert (res.requests["status"] == "finished").all()
    assert row(res, 1)["num_preemptions"] >= 1
    # The newcomer never joins the batch in flight, even while a member is preempted.
    assert row(res, 2)["first_scheduled_s"] >= max(row(res, 0)["finish_s"],
                                                   row(res, 1)["finish_s"])


# -- dynamic batching ------------------------------------------------------------------------
def test_dynamic_timeout_late_joiner_and_full_batch(trace) -> None:
    reqs = trace((0.0, 10, 1), (0.03, 10, 1), *[(0.5, 10, 1)] * 4, (2.0, 10, 1))
    res = sim.simulate(reqs, {"name": "dynamic", "max_batch_size": 4, "max_wait_s": 0.05},
                       STEP, checks=True)
    # Dispatched exactly at the oldest's arrival + max_wait_s; the late arrival joined.
    assert row(res, 0)["first_scheduled_s"] == 0.05
    assert row(res, 1)["first_scheduled_s"] == 0.05
    assert res.steps.iloc[0]["num_seqs"] == 2
    for rid in range(2, 6):  # a full batch goes at once
        assert row(res, rid)["first_scheduled_s"] == 0.5


def test_dynamic_buckets_batch_similar_prompts(trace) -> None:
    reqs = trace((0.0, 10, 1), (0.01, 1000, 1), (0.02, 20, 1), (3.0, 10, 1))
    spec = {"name": "dynamic", "max_batch_size": 8, "max_wait_s": 0.05,
            "bucket_by_prompt": [64]}
    res = sim.simulate(reqs, spec, STEP, checks=True)
    assert row(res, 0)["first_scheduled_s"] == row(res, 2)["first_scheduled_s"] == 0.05
    assert row(res, 1)["first_scheduled_s"] == pytest.approx(0.06)
    assert res.steps.iloc[0]["num_padding_tokens"] == 10  # 10 padded to 20, not to 1000
    plain = sim.simulate(reqs, {"name": "dynamic", "max_batch_size": 8}, STEP, checks=True)
    assert plain.steps.iloc[0]["num_padding_tokens"] == 990 + 980


# -- chunked prefill -------------------------------------------------------------------------
def test_chunked_prefill_bounds_decode_stall(trace) -> None:
    cost = sim.LinearCost(base_s=0.002, per_token_s=2e-5)
    reqs = trace(*[(0.0, 32, 300)] * 4, (0.05, 6000, 5))
    budget_step = cost.step_time([512], [512])
    chunked = sim.simulate(reqs, {"name": "chunked_prefill", "token_budget": 512}, cost,
                           checks=True)
    cont = sim.simulate(reqs, {"name": "continuous", "mode": "vllm"}, cost, checks=True)
    short = [0, 1, 2, 3]
    assert (chunked.requests["status"] == "finished").all()
    assert chunked.requests.loc[short, "max_itl_s"].max() <= budget_step + 1e-12
    steps = chunked.steps
    assert (steps["num_prefill_tokens"] + steps["num_decode_tokens"]).max() <= 512
    long_prefill = cost.step_time([6000], [6000])
    assert cont.requests.loc[short, "max_itl_s"].max() >= long_prefill


def test_chunked_prefill_chunk_size_caps_each_request(trace) -> None:
    res = sim.simulate(trace((0.0, 250, 2)), {"name": "chunked_prefill", "chunk_size": 100},
                       STEP, checks=True)
    assert list(res.steps["num_prefill_tokens"]) == [100, 100, 50, 0]


# -- continuous: vLLM (prefill-first) vs Orca (mixed) ----------------------------------------
@pytest.mark.parametrize("mode", ["vllm", "orca"])
def test_continuous_modes(trace, mode: str) -> None:
    reqs = trace((0.0, 100, 50), (0.05, 100, 10))
    res = sim.simulate(reqs, {"name": "continuous", "mode": mode}, STEP, checks=True)
    steps = res.steps
    mixed = ((steps["num_prefill_tokens"] > 0) & (steps["num_decode_tokens"] > 0)).any()
    assert mixed == (mode == "orca")
    # vLLM pauses the running decode for the newcomer's prefill; Orca never stalls it.
    assert row(res, 0)["max_itl_s"] == pytest.approx(0.02 if mode == "vllm" else 0.01)


# -- ordering --------------------------------------------------------------------------------
ONE_SLOT = {"static": {"batch_size": 1}, "dynamic": {"max_batch_size": 1},
            "continuous": {"max_num_seqs": 1}, "chunked_prefill": {"max_num_seqs": 1}}


@pytest.mark.parametrize("ordering", ["fcfs", "spf"])
@pytest.mark.parametrize("name", sorted(ONE_SLOT))
def test_spf_admits_shorter_prompt_first(trace, name: str, ordering: str) -> None:
    reqs = trace((0.0, 1000, 3), (0.0, 10, 3))
    spec = {"name": name, "ordering": ordering, **ONE_SLOT[name]}
    res = sim.simulate(reqs, spec, STEP, checks=True)
    first = 1 if ordering == "spf" else 0
    assert row(res, first)["first_scheduled_s"] == 0.0
    assert row(res, 1 - first)["first_scheduled_s"] > 0.0
