"""Prefix caching: reuse of shared prompt blocks, LRU eviction, conservation, conversations.

Exact scenarios use 4-token blocks and constant 1 s steps; the property tests drive the block
pool and prefix cache directly with random operation sequences and check, after every one,
that free + held + cached-unreferenced blocks add up to the total and every reference count
matches the sequences holding it.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim
from sim.core.state import Seq
from sim.kv.cache import BlockPool
from sim.kv.config import KVConfig
from sim.kv.prefix_cache import PrefixCache
from sim.workload.conversations import ConversationError, conversations

KV = {"num_blocks": 12, "block_size": 4, "prefix_caching": True}


def req(i, t, prompt, out, pid=None, shared=0):
    return sim.Request(id=i, arrival_s=t, num_prompt_tokens=prompt, num_output_tokens=out,
                       prefix_id=pid, num_prefix_tokens=shared)


def run(reqs, kv=KV, step_s=1.0):
    return sim.simulate(reqs, policy={"name": "continuous", "max_num_seqs": 4,
                                      "watermark": 0.0},
                        cost=sim.ConstantCost(step_s), kv=kv, checks=True)


def row(res, rid):
    return res.requests.set_index("id").loc[rid]


def test_a_later_request_reuses_the_cached_prefix_blocks():
    # A: 20 prompt tokens (16 shared), 2 outputs: [0,1) prefill, [1,2) decode; its 5 full
    # prompt blocks join chain "sys"; at its finish they stay cached, unreferenced.
    # B at t=5: 20 prompt tokens, 16 shared -> 4 cached blocks (capped by its shared prefix),
    # so its prefill computes only 4 tokens. Chain block 5 (A's own tokens 16..19) stays
    # cached but unused by B.
    res = run([req(0, 0.0, 20, 2, "sys", 16), req(1, 5.0, 20, 2, "sys", 16)])
    s = res.steps
    assert s["num_prefill_tokens"].tolist() == [20, 0, 4, 0]
    assert (row(res, 0)["num_cached_tokens"], row(res, 1)["num_cached_tokens"]) == (0, 16)
    assert res.summary["prefix_hit_rate"] == pytest.approx(16 / 40)
    # Blocks: A holds ceil(20/4)=5, then 6; B holds its 4 shared + 1 private, then 2 private.
    assert s["kv_used_blocks"].tolist() == [5, 6, 5, 6]
    assert s["kv_cached_blocks"].tolist() == [0, 0, 1, 1]
    # B's first step stores 20 tokens (16 of them shared, stored once).
    assert s["kv_live_tokens"].tolist() == [20, 21, 20, 21]


def test_concurrent_requests_share_blocks_once_cached():
    # A arrives first; B and C arrive at 1, after A's prompt blocks were cached: both hit
    # 4 blocks and hold them shared (reference count 3 while all three run). Admission still
    # budgets each its full 5 blocks (15 of 20), as policies count blocks unshared.
    res = run([req(0, 0.0, 17, 4, "p", 16), req(1, 1.0, 17, 4, "p", 16),
               req(2, 1.0, 17, 4, "p", 16)], {**KV, "num_blocks": 20})
    assert res.requests["num_cached_tokens"].tolist() == [0, 16, 16]
    s = res.steps
    # t=1: B and C prefill 1 token each (vLLM mode: a prefill-only step).
    assert s["num_prefill_tokens"].tolist()[:2] == [17, 2]
    # Shared blocks are held once: A's 5 blocks + B's and C's 1 private block each.
    assert s["kv_used_blocks"].iloc[1] == 7
    assert s["kv_live_tokens"].iloc[1] == 17 * 3 - 2 * 16


def test_without_prefix_caching_nothing_is_reused():
    res = run([req(0, 0.0, 20, 2, "sys", 16), req(1, 5.0, 20, 2, "sys", 16)],
              {**KV, "prefix_caching": False})
    assert res.steps["num_prefill_tokens"].tolist() == [20, 0, 20, 0]
    assert res.summary["prefix_hit_rate"] == 0.0


def test_unreferenced_blocks_are_evicted_least_recently_used_first():
    # 12 blocks of 4. A ("a", 16 tokens) then B ("b", 16 tokens) each leave 4 cached blocks;
    # C (no prefix, 32 prompt tokens = 8 blocks; 4 are free) needs 4 of them: "a" (used
    # longer ago) is evicted, tail first. D ("a") then misses, E ("b") hits.
    res = run([req(0, 0.0, 17, 1, "a", 16), req(1, 2.0, 17, 1, "b", 16),
               req(2, 4.0, 32, 1), req(3, 6.0, 17, 1, "a", 16), req(4, 8.0, 17, 1, "b", 16)])
    assert res.requests["num_cached_tokens"].tolist() == [0, 0, 0, 0, 16]
    assert res.steps["kv_cached_blocks"].tolist() == [0, 4, 4, 4, 4]
    # With 31 tokens C needs 8 blocks too; with 28 it needs 7, leaving 1 block of "a" (4 tokens).
    res = run([req(0, 0.0, 17, 1, "a", 16), req(1, 2.0, 17, 1, "b", 16),
               req(2, 4.0, 28, 1), req(3, 6.0, 17, 1, "a", 16), req(4, 8.0, 17, 1, "b", 16)])
    assert res.requests["num_cached_tokens"].tolist() == [0, 0, 0, 4, 16]


def test_conversations_share_their_history():
    rng = np.random.default_rng(3)
    spec = {"num_conversations": 20, "rate": 2.0, "turns": [2, 4], "think_time_s": 30.0,
            "user_tokens": [20, 80], "output_tokens": [10, 60]}
    reqs = conversations(spec, rng)
    assert [r.id for r in reqs] == list(range(len(reqs)))
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(reqs, reqs[1:], strict=False))
    by_conv: dict[str, list[sim.Request]] = {}
    for r in sorted(reqs, key=lambda r: r.arrival_s):
        by_conv.setdefault(r.prefix_id, []).append(r)
    for turns in by_conv.values():
        assert turns[0].num_prefix_tokens == 0
        for prev, nxt in zip(turns, turns[1:], strict=False):
            history = prev.num_prompt_tokens + prev.num_output_tokens
            assert nxt.num_prefix_tokens == history
            assert 20 <= nxt.num_prompt_tokens - history <= 80
    assert conversations(spec, np.random.default_rng(3)) == reqs  # same seed, same requests
    kv = {"num_blocks": 4000, "block_size": 16}
    cost = sim.LinearCost(base_s=0.005, per_token_s=1e-4)
    off = sim.simulate(reqs, "continuous", cost, kv=kv, checks=True)
    on = sim.simulate(reqs, "continuous", cost, kv={**kv, "prefix_caching": True},
                      checks=True)
    assert off.summary["prefix_hit_rate"] == 0.0
    assert on.summary["prefix_hit_rate"] > 0.3
    assert on.steps["num_prefill_tokens"].sum() < off.steps["num_prefill_tokens"].sum()
    assert on.summary["mean_ttft_ms"] < off.summary["mean_ttft_ms"]


def test_conversation_spec_errors_name_the_key():
    rng = np.random.default_rng(0)
    with pytest.raises(ConversationError, match="workload.conversations.num_conversations"):
        conversations({}, rng)
    with pytest.raises(ConversationError, match="workload.conversations.bogus"):
        conversations({"num_conversations": 2, "bogus": 1}, rng)
    with pytest.raises(ConversationError, match="workload.conversations.user_tokens"):
        conversations({"num_conversations": 2, "user_tokens": [5, 1]}, rng)


# -- the pool and cache driven directly ---------------------------------------------------------

def test_prefix_cache_counts_by_hand():
    c = PrefixCache()
    c.extend("x", 3)  # one holder of 3 blocks
    assert (c.referenced, c.evictable) == (3, 0)
    assert c.acquire("x", 2) == 0  # a second holder of 2: nothing revived
    assert c.release("x", 3) == 1  # the first leaves: block 2 unreferenced
    assert (c.referenced, c.evictable) == (2, 1)
    assert c.evict(5) == 1  # only the tail block could go
    assert c.length("x") == 2
    c.check({"x": [2]})


ops = st.lists(st.tuples(st.sampled_from(["admit", "admit", "finish", "evict"]),
                         st.sampled_from(["a", "b", "c", None]), st.integers(1, 40),
                         st.integers(0, 40), st.integers(0, 1000)), max_size=60)


@settings(max_examples=300, deadline=None)
@given(ops=ops, num_blocks=st.integers(1, 40), block_size=st.sampled_from([1, 2, 4, 16]))
def test_blocks_are_conserved_under_random_operations(ops, num_blocks, block_size):
    pool = BlockPool(KVConfig(num_blocks=num_blocks, block_size=block_size,
                              prefix_caching=True))
    running: list[Seq] = []
    for i, (op, pid, prompt, shared, pick) in enumerate(ops):
        if op == "admit":
            seq = Seq(sim.Request(i, 0.0, prompt, 1, prefix_id=pid,
                                  num_prefix_tokens=min(shared, prompt)))
            seq.offer_hit(pool.hit_blocks(seq) * block_size)
            need = -(-prompt // block_size)  # what a policy is charged: hit blocks included
            if need <= pool.view_free:
                if seq.hit_tokens:
                    pool.pin(seq, seq.hit_tokens // block_size)
                    seq.take_hit()
                pool.grow(seq, prompt)
                seq.num_computed = prompt  # the prefill ran
                pool.register(seq, prompt)
                running.append(seq)
        elif op == "finish" and running:
            seq = running.pop(pick % len(running))
            pool.register(seq, seq.num_computed)
            pool.release(seq)
        elif op == "evict" and pool.cache.evictable:
            pool.free += pool.cache.evict(1 + pick % pool.cache.evictable)
        pool.check(running)  # free + used + cached == total; holders match the counts
        assert pool.used <= pool.charged <= num_blocks
    for seq in running:
        pool.release(seq)
    pool.check([])
    assert pool.used == pool.charged == 0
    assert pool.free + pool.cached == num_blocks
