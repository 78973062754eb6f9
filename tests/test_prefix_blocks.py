"""Prefix identity by block ids: sharing exactly the common leading blocks, one chain for the
cache and the routers, the trie cache's eviction order, and the trace formats that carry ids.

The shorthand (``prefix_id``) keeps its results: ``LegacyChains`` below is the per-chain cache
the trie replaced, frozen as an oracle, and a property test drives both with the same random
operations and compares every chain after each one.
"""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from collections import OrderedDict

import numpy as np
import pandas as pd
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import sim
from sim.cli.main import main
from sim.core.blocks import block_chain, block_hashes, prefix_chain
from sim.core.errors import InputError
from sim.core.state import Seq
from sim.kv.cache import BlockPool
from sim.kv.config import KVConfig
from sim.kv.prefix_cache import PrefixCache
from sim.workload.mooncake import FIELDS
from sim.workload.traces import TraceError, load_trace_arrays, write_native


def req(i, t, prompt, out, ids=()):
    return sim.Request(i, t, prompt, out, hash_ids=tuple(ids))


def cached(reqs, block_size=16, num_blocks=10_000, **kw):
    """Each request's cached prompt tokens, one request at a time (no overlap in time)."""
    res = sim.simulate(reqs, policy={"name": "continuous", "max_num_seqs": 4},
                       cost=sim.ConstantCost(1.0), checks=True,
                       kv={"num_blocks": num_blocks, "block_size": block_size,
                           "prefix_caching": True}, **kw)
    return res.requests.set_index("id")["num_cached_tokens"].to_dict()


# -- the sharing rule ----------------------------------------------------------------------------

@pytest.mark.parametrize("block_size", [16, 48, 512, 1024])
def test_requests_share_exactly_their_common_leading_ids(block_size):
    a = req(0, 0, 2048, 1, [1, 2, 3, 4])
    b = req(1, 100, 2048, 1, [1, 2, 9, 4])   # shares ids 1, 2: 1024 tokens
    c = req(2, 200, 2048, 1, [7, 2, 3, 4])   # equal ids after a difference share nothing
    d = req(3, 300, 700, 1, [1, 2])          # a short prompt: 700 tokens, all within ids 1, 2
    got = cached([a, b, c, d], block_size)
    bs = block_size
    assert got == {0: 0, 1: 1024 // bs * bs, 2: 0, 3: (700 - 1) // bs * bs}


def test_a_prompt_tail_without_ids_is_never_shared():
    a = req(0, 0, 1500, 1, [5])   # only the first 512 tokens have an identity
    b = req(1, 100, 1500, 1, [5])
    assert cached([a, b]) == {0: 0, 1: 512}


def test_router_hashes_and_cache_hits_count_the_same_blocks():
    ids = [[1, 2, 3], [1, 2, 4], [1, 5], [6], [1, 2, 3, 8]]
    reqs = [req(i, 100 * i, 512 * len(x) - 7, 1, x) for i, x in enumerate(ids)]
    got = cached(reqs)
    for r in reqs:
        mine = block_hashes(r, 16)
        assert len(mine) == block_chain(r, 16).hit_limit
        best = max((sum(1 for _ in _common(mine, block_hashes(o, 16)))
                    for o in reqs[:r.id]), default=0)
        # the cache also stops one token short of the prompt (the last token is computed)
        assert got[r.id] == min(best, (r.num_prompt_tokens - 1) // 16) * 16


def _common(a, b):
    for x, y in zip(a, b, strict=False):
        if x != y:
            return
        yield x


def test_shorthand_hashes_are_the_routers_chain():
    r = sim.Request(0, 0, 100, 1, prefix_id="conv3", num_prefix_tokens=70)
    assert block_hashes(r, 16) == prefix_chain("conv3", 64, 16)
    assert block_hashes(sim.Request(0, 0, 100, 1), 16) == ()


def test_lru_evicts_the_least_recently_touched_branch_and_keeps_the_shared_root():
    # 4-token blocks, 512-token ids: a shared first id, then two branches
    sys_a = req(0, 0, 1024, 1, [1, 2])
    sys_b = req(1, 10, 1024, 1, [1, 3])
    again_a = req(2, 20, 1024, 1, [1, 2])   # touches branch 2 after branch 3
    # 258 blocks with 130 free: evicts exactly branch 3's 128 blocks, not the shared root
    big = req(3, 30, 258 * 4, 1)
    probe_b, probe_a = req(4, 40, 1024, 1, [1, 3]), req(5, 50, 1024, 1, [1, 2])
    got = cached([sys_a, sys_b, again_a, big, probe_b, probe_a], block_size=4,
                 num_blocks=3 * 128 + 130)
    assert got[2] == 1020 and got[4] == 512 and got[5] == 1020


# -- conservation with branching chains ------------------------------------------------------------

ops = st.lists(st.tuples(st.sampled_from(["admit", "admit", "finish", "evict"]),
                         st.lists(st.integers(0, 2), max_size=4), st.integers(1, 2048),
                         st.integers(0, 1000)), max_size=50)


@settings(max_examples=200, deadline=None)
@given(ops=ops, num_blocks=st.integers(1, 300), block_size=st.sampled_from([16, 64, 200]))
def test_trie_blocks_are_conserved_under_random_operations(ops, num_blocks, block_size):
    pool = BlockPool(KVConfig(num_blocks=num_blocks, block_size=block_size,
                              prefix_caching=True))
    running: list[Seq] = []
    for i, (op, ids, prompt, pick) in enumerate(ops):
        if op == "admit":
            ids = ids[:-(-prompt // 512)]
            seq = Seq(req(i, 0.0, prompt, 1, ids))
            seq.offer_hit(pool.hit_blocks(seq) * block_size)
            if -(-prompt // block_size) <= pool.view_free:
                if seq.hit_tokens:
                    pool.pin(seq, seq.hit_tokens // block_size)
                    seq.take_hit()
                pool.grow(seq, prompt)
                seq.num_computed = prompt
                pool.register(seq, prompt)
                running.append(seq)
        elif op == "finish" and running:
            seq = running.pop(pick % len(running))
            pool.register(seq, seq.num_computed)
            pool.release(seq)
        elif op == "evict" and pool.cache.evictable:
            pool.free += pool.cache.evict(1 + pick % pool.cache.evictable)
        pool.check(running)
    for seq in running:
        pool.release(seq)
    pool.check([])
    assert pool.used == pool.charged == 0 and pool.free + pool.cached == num_blocks


# -- the shorthand keeps its results: the per-chain cache it replaced, as an oracle -------------

class LegacyChains:
    """The per-``prefix_id`` cache before the trie (reference counts per chain, LRU chains)."""

    def __init__(self):
        self.chains: dict[str, list[int]] = {}
        self.lru: OrderedDict[str, None] = OrderedDict()
        self.evictable = self.referenced = 0

    def length(self, pid):
        return len(self.chains.get(pid) or ())

    def _touch(self, pid, chain):
        if chain and chain[-1] == 0:
            self.lru[pid] = None
            self.lru.move_to_end(pid)
        else:
            self.lru.pop(pid, None)

    def acquire(self, pid, n):
        chain, revived = self.chains[pid], 0
        for j in range(n):
            revived += chain[j] == 0
            chain[j] += 1
        self.evictable -= revived
        self.referenced += revived
        self._touch(pid, chain)

    def release(self, pid, n):
        chain, dropped = self.chains[pid], 0
        for j in range(n):
            chain[j] -= 1
            dropped += chain[j] == 0
        self.evictable += dropped
        self.referenced -= dropped
        self._touch(pid, chain)

    def extend(self, pid, n):
        chain = self.chains.setdefault(pid, [])
        if n > len(chain):
            self.referenced += n - len(chain)
            chain.extend([1] * (n - len(chain)))

    def evict(self, n):
        evicted = 0
        while evicted < n and self.lru:
            pid = next(iter(self.lru))
            chain = self.chains[pid]
            while evicted < n and chain and chain[-1] == 0:
                chain.pop()
                evicted += 1
            if not chain or chain[-1] != 0:
                del self.lru[pid]
            if not chain:
                del self.chains[pid]
        self.evictable -= evicted
        return evicted


legacy_ops = st.lists(st.tuples(st.sampled_from(["hold", "hold", "leave", "evict"]),
                                st.sampled_from("abcd"), st.integers(0, 12),
                                st.integers(0, 100)), max_size=80)


@settings(max_examples=400, deadline=None)
@given(ops=legacy_ops)
def test_shorthand_chains_evict_exactly_as_the_per_chain_cache_did(ops):
    new, old = PrefixCache(), LegacyChains()
    holders: list[tuple[str, int]] = []
    for op, pid, n, pick in ops:
        if op == "hold":  # a hit on what is cached, then (holding all of it) maybe extend
            k = min(n, old.length(pid))
            if k:
                new.acquire(pid, k)
                old.acquire(pid, k)
            if k == old.length(pid) and n > k:
                if k:
                    new.release(pid, k)  # the holder's hit becomes its extension's prefix
                    old.release(pid, k)
                    new.acquire(pid, k)
                    old.acquire(pid, k)
                new.extend(pid, n)
                old.extend(pid, n)
                k = n
            if k:
                holders.append((pid, k))
        elif op == "leave" and holders:
            pid, k = holders.pop(pick % len(holders))
            new.release(pid, k)
            old.release(pid, k)
        elif op == "evict":
            assert new.evict(pick % 7) == old.evict(pick % 7)
        assert {p: new.length(p) for p in "abcd"} == {p: old.length(p) for p in "abcd"}
        assert (new.evictable, new.referenced) == (old.evictable, old.referenced)
        held: dict[str, list[int]] = {}
        for p, k in holders:
            held.setdefault(p, []).append(k)
        new.check(held)


# -- trace formats -----------------------------------------------------------------------------

def write_jsonl(path, rows, raw_lines=()):
    text = "".join(json.dumps(r) + "\n" for r in rows) + "".join(raw_lines)
    path.write_text(text)
    return path


ROWS = [{"timestamp": 0, "input_length": 1100, "output_length": 10, "hash_ids": [0, 1, 2]},
        {"timestamp": 250.5, "input_length": 600, "output_length": 4, "hash_ids": [0, 7]},
        {"timestamp": 900, "input_length": 300, "output_length": 2, "hash_ids": []}]


def test_mooncake_jsonl_loads_plain_and_gzipped(tmp_path):
    plain = write_jsonl(tmp_path / "t.jsonl", ROWS)
    packed = tmp_path / "t.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    for path in (plain, packed):
        tr = load_trace_arrays(path)
        assert tr.arrival_s.tolist() == [0.0, 0.2505, 0.9]
        assert tr.num_prompt_tokens.tolist() == [1100, 600, 300]
        assert tr.num_output_tokens.tolist() == [10, 4, 2]
        assert tr.hash_ids.tolist() == [(0, 1, 2), (0, 7), ()]
    assert [r.hash_ids for r in load_trace_arrays(plain).to_requests()][1] == (0, 7)


BAD = [
    ('{"timestamp": 0, "input_length": 10, "output_length": 1}', "line 2: field hash_ids: "
     "missing"),
    ('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [], "x": 1}',
     "line 2: field x: unknown"),
    ('{"timestamp": 0, "input_length": 10.5, "output_length": 1, "hash_ids": []}',
     "line 2: field input_length: must be a whole number"),
    ('{"timestamp": 0, "input_length": 10, "output_length": 0, "hash_ids": []}',
     "line 2: field output_length: must be in [1,"),
    ('{"timestamp": -1, "input_length": 10, "output_length": 1, "hash_ids": []}',
     "line 2: field timestamp: must be in [0,"),
    ('{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2, 3]}',
     "line 2: field hash_ids: 3 ids for a 600-token prompt"),
    ('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [-4]}',
     "line 2: field hash_ids: ids must be whole numbers"),
    ('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": "1 2"}',
     "line 2: field hash_ids: must be a list"),
    ('{"timestamp": 0, "input_length": true, "output_length": 1, "hash_ids": []}',
     "line 2: field input_length: must be a whole number, got true"),
    ('{"timestamp": 0, "timestamp": 1, "input_length": 9, "output_length": 1, "hash_ids": []}',
     "line 2: not valid JSON (key 'timestamp' given twice)"),
    ('[1, 2]', "line 2: expected a JSON object"),
    ('{"timestamp": 0,', "line 2: not valid JSON"),
    ('\n{"timestamp": 5, "input_length": 9, "output_length": 1, "hash_ids": []}',
     "line 2: empty line inside the trace"),
]


@pytest.mark.parametrize(("line", "message"), BAD)
def test_a_bad_mooncake_line_names_file_line_and_field(tmp_path, line, message):
    path = write_jsonl(tmp_path / "bad.jsonl", [ROWS[0]], [line + "\n"])
    with pytest.raises(TraceError) as err:
        load_trace_arrays(path)
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value)


def test_mooncake_time_order_and_sort(tmp_path, capsys):
    path = write_jsonl(tmp_path / "o.jsonl", [ROWS[1], ROWS[0]])
    with pytest.raises(TraceError, match="line 2: field timestamp: earlier than the previous"):
        load_trace_arrays(path)
    assert load_trace_arrays(path, sort=True).num_prompt_tokens.tolist() == [1100, 600]
    assert main(["trace-stats", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "line 2: field timestamp" in err and len(err.splitlines()) == 1


def test_native_hash_ids_column_round_trips_and_is_checked(tmp_path):
    reqs = [req(0, 0.0, 1100, 3, [4, 5, 6]), req(1, 1.0, 40, 2)]
    path = tmp_path / "n.csv"
    write_native(path, reqs)
    assert load_trace_arrays(path).to_requests() == reqs
    for cell, message in (("4 x", "row 1: column hash_ids: not a whole number: 'x'"),
                          ("1 2 3", "row 1: column hash_ids: 3 ids for a 600-token prompt"),
                          (str(2**63), "row 1: column hash_ids: ids must be at most")):
        path.write_text(f"arrival_s,num_prompt_tokens,num_output_tokens,hash_ids\n0,600,1,{cell}\n")
        with pytest.raises(TraceError, match=message):
            load_trace_arrays(path)
    path.write_text("arrival_s,num_prompt_tokens,num_output_tokens,num_prefix_tokens,hash_ids\n"
                    "0,600,1,10,1\n")
    with pytest.raises(TraceError, match="row 1: column hash_ids: .* not both"):
        load_trace_arrays(path)


@pytest.mark.parametrize(("ids", "message"), [
    ([1, 2], "must be a tuple"), ((1, "a"), "must hold integers"), ((-1,), "must be in"),
    ((1, 2, 3), "3 ids for a 600-token prompt")])
def test_simulate_checks_hash_ids(ids, message):
    with pytest.raises(InputError, match=message) as err:
        sim.simulate([req(0, 0, 10, 1), sim.Request(1, 0, 600, 1, hash_ids=ids)],
                     policy="continuous", cost=sim.ConstantCost(1.0))
    assert err.value.field == "requests[1].hash_ids"


def test_prefix_affinity_on_hash_ids_finds_the_replica_holding_the_document():
    """Requests reading one of 12 long documents (4 shared ids) plus a private question: the
    router's chain is the cache's, so routing by prefix raises the hit rate and cuts TTFT."""
    rng = np.random.default_rng(1)
    reqs = []
    for i in range(240):
        doc = int(rng.integers(12))
        ids = [1000 * doc + j for j in range(4)] + [10**6 + i]
        reqs.append(req(i, i * 0.05, 4 * 512 + int(rng.integers(50, 500)), 20, ids))
    cost = sim.build_cost_model(model="llama-3-8b", hardware="h100-sxm", tp=1, engine="vllm")
    kv = {"prefix_caching": True, "num_blocks": 1200, "block_size": 16}
    hit = {}
    for router in ({"name": "round_robin", "latency_s": 1e-12}, "prefix_affinity"):
        res = sim.simulate(reqs, policy={"name": "continuous", "max_num_seqs": 32}, cost=cost,
                           kv=kv, num_replicas=4, router=router)
        hit[str(router)] = (res.summary["prefix_hit_rate"], res.summary["mean_ttft_ms"])
    rr, pa = hit[str({"name": "round_robin", "latency_s": 1e-12})], hit["prefix_affinity"]
    assert pa[0] > 1.5 * rr[0] and pa[0] > 0.6  # measured: 0.84 against 0.49
    assert pa[1] < 0.7 * rr[1]  # mean TTFT: 18 ms against 35 ms


def test_a_mooncake_trace_runs_from_yaml_and_a_bad_line_exits_2(tmp_path, capsys):
    rows = [{"timestamp": 100 * i, "input_length": 1000 + i, "output_length": 3,
             "hash_ids": [7, i]} for i in range(6)]
    write_jsonl(tmp_path / "t.jsonl", rows)
    exp = {"name": "mc", "cost": {"kind": "constant", "step_s": 0.01},
           "kv": {"num_blocks": 2000, "block_size": 16, "prefix_caching": True},
           "workload": {"trace": "t.jsonl", "max_prompt_tokens": 500},
           "policy": {"name": "continuous"}, "output": {"plots": False}}
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(exp))
    assert main(["run", str(tmp_path / "exp.yaml"), "--out", str(tmp_path / "o"), "--quiet"]) == 0
    done = pd.read_csv(tmp_path / "o" / "summary.csv")
    assert done["completed"].iloc[0] == 6 and 0 < done["prefix_hit_rate"].iloc[0] < 1
    write_jsonl(tmp_path / "t.jsonl", rows, ['{"timestamp": 900, "input_length": 5}\n'])
    assert main(["run", str(tmp_path / "exp.yaml"), "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "t.jsonl: line 7: field output_length: missing" in err[0]


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from([*FIELDS, "extra"]),
                       st.one_of(st.none(), st.booleans(), st.integers(-5, 2**70),
                                 st.floats(allow_nan=True), st.text(max_size=3),
                                 st.lists(st.integers(-3, 2**64), max_size=4)), max_size=5),
       st.integers(0, 80))
def test_any_mooncake_line_loads_or_is_one_trace_error(row, cut):
    import tempfile
    from pathlib import Path
    line = json.dumps(row)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "f.jsonl"
        path.write_text(line[:cut] + "\n" if cut < len(line) else line + "\n")
        try:
            tr = load_trace_arrays(path)
        except TraceError as err:
            assert str(err).startswith(f"{path}: ") and "\n" not in str(err)
        else:
            assert len(tr) == 1 and tr.num_prompt_tokens[0] >= 1


def test_prefix_routed_runs_on_hash_ids_are_identical_across_hash_seeds(tmp_path):
    """Python salts str hashes per process; nothing the trie or the routers decide may depend
    on dict or set order: two processes with different seeds give the same tables."""
    rows = [{"timestamp": 40 * i, "input_length": 700 + 37 * (i % 9), "output_length": 4 + i % 5,
             "hash_ids": [i % 3, 10 + i % 4]} for i in range(60)]
    write_jsonl(tmp_path / "t.jsonl", rows)
    exp = {"name": "seeded", "cost": {"kind": "constant", "step_s": 0.01},
           "parallelism": {"replicas": 3},
           "kv": {"num_blocks": 300, "block_size": 16, "prefix_caching": True},
           "workload": {"trace": "t.jsonl"}, "policy": {"name": "continuous"},
           "sweep": {"router.name": ["prefix_affinity", "weighted"]},
           "output": {"plots": False}}
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(exp))
    code = ("import sys; from sim.cli.main import main; "
            "sys.exit(main(['run', sys.argv[1], '--out', sys.argv[2], '--quiet']))")
    tables = []
    for seed in ("1", "2"):
        out = tmp_path / f"o{seed}"
        subprocess.run([sys.executable, "-c", code, str(tmp_path / "exp.yaml"), str(out)],
                       check=True, env={**os.environ, "PYTHONHASHSEED": seed})
        summary = pd.read_csv(out / "summary.csv").drop(
            columns=["wall_s", "wall_time_s", "sim_wall_s"], errors="ignore")
        runs = sorted(out.glob("runs/*/requests.parquet"))
        tables.append((summary, [pd.read_parquet(p) for p in runs]))
    pd.testing.assert_frame_equal(tables[0][0], tables[1][0])
    for a, b in zip(tables[0][1], tables[1][1], strict=True):
        pd.testing.assert_frame_equal(a, b)
    assert tables[0][0]["prefix_hit_rate"].min() > 0
