"""Short stretches (``sim.engine.skipping.short_stretch``): exact.

A stretch of at most ``SHORT_STEPS`` steps is costed and committed in Python scalars; every
table must come out bit for bit as when every step is its own event, and short stretches
must actually be taken (else the test proves nothing).
"""
from __future__ import annotations

import numpy as np
import pytest

import sim
from sim.cost.base import LinearCost
from sim.engine import skipping
from sim.workload.build import build_workload_arrays

ROOFLINE = sim.build_cost_model(model="llama-3-8b", hardware="h100-sxm", tp=1, engine="vllm")
CHUNKED = {"name": "chunked_prefill", "token_budget": 2048, "max_num_seqs": 256}


def _tables(res: sim.SimResult) -> tuple[str, str, str]:
    return res.requests.to_csv(), res.steps.to_csv(), repr(sorted(res.summary.items()))


@pytest.mark.parametrize("cost, kv", [
    (ROOFLINE, {"block_size": 16}),
    (ROOFLINE, {"block_size": 16, "num_blocks": 2500}),  # growth that does not always fit
    (ROOFLINE, {"block_size": 4, "num_blocks": 9000}),  # several blocks a row a stretch
    (ROOFLINE, {"block_size": 16, "num_blocks": 3000, "preemption": "swap"}),
    (LinearCost(0.01, 2e-5, 1e-4), {"block_size": 16, "num_blocks": 3000}),
])
@pytest.mark.parametrize("seed", [0, 1])
def test_short_stretches_equal_stepping(cost: object, kv: dict, seed: int,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    spec = {"arrival": {"process": "poisson", "rate": 12.0}, "num_requests": 250,
            "lengths": {"dist": "empirical", "trace": "azure-conv"}}
    arrays = build_workload_arrays(spec, np.random.default_rng(seed))
    taken = []
    short_stretch = skipping.short_stretch

    def counted(*args: object) -> object:
        out = short_stretch(*args)  # type: ignore[arg-type]
        if out is not None:
            taken.append(len(out[1]))  # a stretch costed in Python scalars
        return out

    monkeypatch.setattr(skipping, "short_stretch", counted)
    skipped = sim.simulate(arrays, policy=CHUNKED, cost=cost, kv=kv, fast_path=False,
                           checks=True)
    stepped = sim.simulate(arrays, policy=CHUNKED, cost=cost, kv=kv, fast_path=False,
                           checks=True, event_skipping=False)
    assert _tables(skipped) == _tables(stepped)
    assert taken
