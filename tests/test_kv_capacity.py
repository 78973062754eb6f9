"""KV capacity from first principles, checked against hand calculations written out below.

Common rule (bf16 weights and KV, 2 bytes; gpu_memory_utilization 0.9; 1 GB activation
reserve per GPU; 16-token blocks):

    free per GPU   = HBM × 0.9 − weights per GPU − 1e9
    KV per token   = 2 (K, V) × layers × KV heads per GPU × head_dim × 2 bytes
    tokens         = floor(free / KV per token);  blocks = floor(tokens / 16)

Weights per GPU (the cost model's count): per layer the Q and O projections and the MLP are
split over TP, the K and V projections keep ``ceil(kv_heads / tp)`` heads per GPU, plus the
router (MoE) and two norm vectors; embedding and LM head are split over TP; one final norm.
"""
from __future__ import annotations

import math

import pytest

import sim
from sim.kv.capacity import describe_capacity, kv_capacity


def test_llama_3_8b_on_one_h100():
    # 32 layers, hidden 4096, 32 heads, 8 KV heads, head_dim 128, MLP 14336, vocab 128256.
    # attention: 4096 × (4096 + 2 × 8 × 128) + 4096 × 4096 = 25,165,824 + 16,777,216
    attn = 4096 * (4096 + 2 * 8 * 128) + 4096 * 4096
    assert attn == 41_943_040
    mlp = 3 * 4096 * 14336  # gated: gate, up, down = 176,160,768
    layer = attn + mlp + 2 * 4096  # + two RMSNorm vectors = 218,112,000
    params = 32 * layer + 2 * 128256 * 4096 + 4096  # + embedding and LM head, final norm
    assert params == 8_030_261_248
    weights = params * 2  # 16.06 GB
    free = 80e9 * 0.9 - weights - 1e9  # 54.94 GB
    kv_per_token = 2 * 32 * 8 * 128 * 2
    assert kv_per_token == 131_072  # 128 KiB per token
    tokens = math.floor(free / kv_per_token)
    assert tokens == 419_154
    c = kv_capacity("llama-3-8b", "h100-sxm", tp=1)
    assert c.weight_bytes_per_gpu == weights
    assert c.kv_bytes_per_token_per_gpu == kv_per_token
    assert c.num_blocks == tokens // 16 == 26_197
    assert c.max_tokens == 26_197 * 16
    # 4k-token sequences need 256 blocks each: 26,197 // 256 = 102 fit at once.
    assert c.max_seqs(4096) == 102


def test_llama_3_70b_on_four_h100():
    # 80 layers, hidden 8192, 64 heads, 8 KV heads, head_dim 128, MLP 28672, vocab 128256;
    # TP 4: 16 query heads and 2 KV heads per GPU.
    attn = 8192 * (8192 / 4 + 2 * 2 * 128) + (8192 / 4) * 8192  # 20,971,520 + 16,777,216
    mlp = 3 * 8192 * 28672 / 4  # 176,160,768
    layer = attn + mlp + 2 * 8192
    params = 80 * layer + 2 * 128256 * 8192 / 4 + 8192
    weights = params * 2
    assert weights == pytest.approx(35.28e9, rel=1e-3)
    kv_per_token = 2 * 80 * 2 * 128 * 2  # per GPU
    assert kv_per_token == 81_920
    tokens = math.floor((80e9 * 0.9 - weights - 1e9) / kv_per_token)
    c = kv_capacity("llama-3-70b", "h100-sxm", tp=4)
    assert c.weight_bytes_per_gpu == pytest.approx(weights, rel=1e-12)
    assert c.kv_bytes_per_token_per_gpu == kv_per_token
    assert c.kv_bytes_per_token == 4 * 81_920  # the replica's 8 heads over 4 GPUs
    assert c.num_blocks == tokens // 16 == 27_253


def test_llama_2_7b_mha_on_one_a100_80gb():
    # Multi-head attention: 32 KV heads, so KV per token is 4× Llama-3-8B's.
    attn = 4096 * (4096 + 2 * 32 * 128) + 4096 * 4096  # 4 × 4096²
    mlp = 3 * 4096 * 11008
    params = 32 * (attn + mlp + 2 * 4096) + 2 * 32000 * 4096 + 4096
    assert params == 6_738_415_616  # the published 6.74B
    weights = params * 2
    kv_per_token = 2 * 32 * 32 * 128 * 2
    assert kv_per_token == 524_288  # 512 KiB per token
    tokens = math.floor((80e9 * 0.9 - weights - 1e9) / kv_per_token)
    c = kv_capacity("llama-2-7b", "a100-80gb", tp=1)
    assert c.weight_bytes_per_gpu == weights
    assert c.num_blocks == tokens // 16 == 6_857
    assert c.max_seqs(4096) == 26  # only 26 sequences of 4k tokens fit


def test_mixtral_on_two_h200():
    # 8 experts (all stored), top-2; 8 KV heads → 4 per GPU at TP 2; vocab 32000; 141 GB HBM.
    attn = 4096 * (4096 / 2 + 2 * 4 * 128) + (4096 / 2) * 4096  # 20,971,520
    experts = 8 * 3 * 4096 * 14336 / 2  # 704,643,072
    router = 4096 * 8
    params = 32 * (attn + experts + router + 2 * 4096) + 2 * 32000 * 4096 / 2 + 4096
    assert params == 23_352_053_760
    weights = params * 2  # 46.70 GB per GPU
    kv_per_token = 2 * 32 * 4 * 128 * 2  # 65,536 per GPU
    tokens = math.floor((141e9 * 0.9 - weights - 1e9) / kv_per_token)
    c = kv_capacity("mixtral-8x7b", "h200", tp=2)
    assert c.weight_bytes_per_gpu == weights
    assert c.num_blocks == tokens // 16 == 75_527


def test_simulate_derives_the_same_number_of_blocks():
    cost = sim.build_cost_model(model="llama-3-8b", hardware="h100-sxm", tp=1)
    res = sim.simulate([sim.Request(0, 0.0, 10, 2)], policy="continuous", cost=cost,
                       kv={"block_size": 16})
    assert res.kv.num_blocks == kv_capacity("llama-3-8b", "h100-sxm").num_blocks


def test_describe_capacity_prints_every_figure():
    text = describe_capacity("llama-3-8b", "h100-sxm", 1, 16, 0.9)
    for needle in ("weights per GPU", "16.06 GB", "KV bytes per token", "131.1 kB per GPU",
                   "activation reserve", "26,197", "419,152", "1k: 409", "4k: 102", "8k: 51"):
        assert needle in text, needle
    # Half the memory fraction leaves far less for KV: fewer blocks.
    assert kv_capacity("llama-3-8b", "h100-sxm", gpu_memory_utilization=0.5).num_blocks < 26_197
