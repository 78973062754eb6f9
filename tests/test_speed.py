"""Speed-work regression tests: optimizations must not change a single output bit.

No timing assertions (they flake on shared machines); instead the outputs of a fixed config
are pinned to hashes taken before the hot path was optimized, and the work a steady decode
stretch costs is counted in policy calls, not seconds.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import sim
from policies import make_policy
from sim.core.types import StepCost
from sim.metrics.summary import STEP_COLUMNS, StepLog
from tests import golden


@pytest.mark.parametrize("name", sorted(golden.CASES))
def test_outputs_bit_identical_to_pinned(name: str) -> None:
    """The golden cases' tables equal their pinned hashes (``tests/golden/outputs.json``, taken
    before the hot path was optimized). After a deliberate change of the cost model or a metric,
    ``python tests/golden.py`` prints what changed and ``--write`` re-pins it.

    The steps hashes changed once, on purpose: skipped steps now record their clock interval
    (end - start) as ``duration_s``, as stepped ones always did, instead of the cost model's
    seconds (the two can differ in the last bit); every other column is unchanged."""
    assert golden.compute(name) == golden.load()[name]


def test_steady_decode_stretch_costs_constant_policy_calls() -> None:
    """A lone decode of any length is one prefill step, one launched decode step and a few
    skips (``MAX_SKIP_STEPS`` each): the policy is asked O(1) times, not once per token."""
    calls = {}
    for n_out in (300, 3000):
        policy = make_policy({"name": "continuous"})
        count = [0]
        inner = policy.schedule

        def counted(view, inner=inner, count=count):  # noqa: ANN001, ANN202
            count[0] += 1
            return inner(view)

        object.__setattr__(policy, "schedule", counted)
        req = sim.Request(id=0, arrival_s=0.0, num_prompt_tokens=100, num_output_tokens=n_out)
        res = sim.simulate([req], policy=policy, cost=sim.ConstantCost(0.01), kv=None)
        assert len(res.steps) == n_out  # every step still logged
        calls[n_out] = count[0]
    assert calls[3000] <= calls[300] + 2
    assert calls[300] <= 3


def test_step_log_typed_columns_match_list_table() -> None:
    log = StepLog()
    log.record(0, 0.0, 0.5, 2, 10, 1, 0, 0, 3, 7, StepCost(0.5, 1.0, 2.0, "memory"), 1,
               kv_live_tokens=11, kv_cached_blocks=0, swap_s=0.25, swapped_bytes=8.0)
    series = type("S", (), {"flops": np.array([1.5, 2.5]), "bytes": np.array([3.0, 4.0]),
                            "bound": ("memory", "compute")})
    log.extend(1, np.array([0.5, 1.0]), np.array([0.5, 0.5]), 2, 2, 0, 0, 1,
               np.array([8, 9]), series, 2, kv_live_tokens=np.array([12, 14]))
    table = log.table()
    expected = pd.DataFrame({
        "replica": [0, 1, 1], "start_s": [0.0, 0.5, 1.0], "duration_s": [0.5, 0.5, 0.5],
        "num_seqs": [2, 2, 2], "num_prefill_tokens": [10, 0, 0], "num_decode_tokens": [1, 2, 2],
        "num_padding_tokens": [0, 0, 0], "num_padding_rows": [0, 0, 0], "num_waiting": [3, 1, 1],
        "kv_used_blocks": [7, 8, 9], "flops": [1.0, 1.5, 2.5], "bytes": [2.0, 3.0, 4.0],
        "bound": ["memory", "memory", "compute"], "num_regular_itl": [1, 2, 2],
        "kv_live_tokens": [11, 12, 14], "kv_cached_blocks": [0, 0, 0],
        "num_recomputed_tokens": [0, 0, 0], "swap_s": [0.25, 0.0, 0.0],
        "swapped_bytes": [8.0, 0.0, 0.0]}, columns=list(STEP_COLUMNS))
    pd.testing.assert_frame_equal(table, expected, check_exact=True)
    assert list(StepLog().table().columns) == list(STEP_COLUMNS)


@pytest.mark.parametrize("policy", [{"name": "static", "batch_size": 8},
                                    {"name": "dynamic", "max_batch_size": 8, "max_wait_s": 0.0}])
def test_a_long_queue_is_shown_without_building_its_views_again(monkeypatch, policy) -> None:
    """2,000 requests arrive at once: the queue changes at every one of the 250 batches, and
    a changed queue's tuple is copied from the views kept as requests join (each request's
    view is built when it joins, and again while it runs), not built request by request for
    the whole queue each time, which made an overloaded run quadratic in its queue."""
    from sim.core import state
    from sim.engine import replica

    calls = [0]
    view = state.Seq.view

    def counted(self):  # noqa: ANN001, ANN202
        calls[0] += 1
        return view(self)

    monkeypatch.setattr(state.Seq, "view", counted)
    monkeypatch.setattr(replica, "_SEQ_VIEW", counted)
    n = 2000
    reqs = [sim.Request(id=i, arrival_s=0.0, num_prompt_tokens=50 + i % 7,
                        num_output_tokens=5 + i % 11) for i in range(n)]
    res = sim.simulate(reqs, policy=policy, cost=sim.ConstantCost(0.01), kv=None)
    assert res.summary["completed"] == n
    # every batch of 8 is a prefill plan and a decode plan over its 8 rows (a few views a
    # request), against about n * n / 16 = 250,000 when the whole queue was built each batch
    assert calls[0] <= 10 * n
