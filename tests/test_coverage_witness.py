"""The allow-list cannot be widened wrongly without a test failing: a witness per blocked value.

``sim.engine.coverage`` lists the values the compiled interpreter covers; every other value runs
on the general engine. If someone widened the list to a value the interpreter does not
implement, it would silently run the covered behaviour instead. For every value the list blocks
today (derived from the specification's and the ``kv`` block's own domains, so a new value or
field is included without anyone listing it) this test widens the list on purpose and shows
that one witness workload — a burst of requests with priorities, TTFT classes, shared
prefixes and a KV cache small enough to preempt — then gives results that differ from the
general engine's. So the differential tests can see every such widening.
"""
from __future__ import annotations

import numpy as np
import pytest

import sim
from sim.core.scheduling import domains
from sim.core.types import Request
from sim.engine import coverage
from sim.kv.config import KV_FIELDS

COST = sim.build_cost_model(model="llama-3-8b", hardware="h100-sxm")
POLICY = {"name": "scheduler", "composition": "prefill_first", "admission": "whole",
          "max_num_seqs": 8, "max_num_batched_tokens": 2048,
          "ttft_targets_s": {"0": 5.0, "1": 0.5, "2": 2.0, "3": 0.2}}
KV = {"num_blocks": 120, "block_size": 16}
#: Settings a blocked value needs beside it to be a valid configuration.
COMPANIONS = {
    ("spec", "composition", "decode_first"): {"admission": "chunked",
                                              "max_num_batched_tokens": 512},
    ("spec", "admission", "chunked"): {"composition": "decode_first",
                                       "max_num_batched_tokens": 512},
    ("kv", "allocator", "slab"): {"reserve_tokens": 2048},
    ("kv", "preemption", "swap"): {"swap_gbps": 25.0, "kv_bytes_per_token": 131072},
}


def witness() -> list[Request]:
    rng = np.random.default_rng(3)
    t = np.sort(rng.uniform(0, 0.4, 80))
    return [Request(i, float(t[i]), int(rng.integers(16, 900)), int(rng.integers(4, 80)),
                    priority=i % 4, prefix_id=f"p{i % 3}", num_prefix_tokens=64)
            for i in range(80)]


def blocked() -> list[tuple[str, str, object]]:
    """Every (table, field, value) the allow-list refuses, from the fields' own domains."""
    out: list[tuple[str, str, object]] = []
    for name, dom in domains().items():
        allowed = coverage.COMPILED_SPEC[name]
        out += [("spec", name, v) for v in dom.choices if allowed is not None and v not in allowed]
    for name, key in KV_FIELDS.items():
        allowed = coverage.COMPILED_KV.get(name)
        values = key.choices or ((True, False) if key.types == (bool,) else ())
        out += [("kv", name, v) for v in values if allowed is not None and v not in allowed]
    return out


def test_there_are_blocked_values_to_witness() -> None:
    names = {field for _, field, _ in blocked()}
    # every specification value is covered since the compiled interpreter: KV values remain
    assert {"allocator", "preemption", "prefix_caching"} <= names


@pytest.mark.parametrize(("table", "field", "value"), blocked(),
                         ids=lambda x: str(x))
def test_a_wrong_widening_of_the_allow_list_changes_the_results(monkeypatch, table, field,
                                                                value) -> None:
    policy, kv = dict(POLICY), dict(KV)
    extra = COMPANIONS.get((table, field, value), {})
    (policy if table == "spec" else kv)[field] = value
    for name, v in extra.items():
        (kv if name in KV_FIELDS else policy)[name] = v
    reqs = witness()
    general = sim.simulate(reqs, policy=policy, cost=COST, kv=kv, fast_path=False)
    for name in (field, *extra):  # widen: the fast path would now accept these values
        monkeypatch.setitem(coverage.COMPILED_KV if name in KV_FIELDS else coverage.COMPILED_SPEC,
                            name, coverage.ANY)
    widened = sim.simulate(reqs, policy=policy, cost=COST, kv=kv, fast_path="compiled")
    assert widened.engine != "general", widened.engine_reason
    assert not widened.requests.equals(general.requests), (
        f"{field}={value!r}: the witness cannot tell the fast path from the general engine")
