"""A Python policy's plans carried out on compiled steps give the reference's results.

Specification: for any policy that is not a preset of the scheduling specification (a user's
own ``schedule``, or a subclass of a preset), on paged KV with recompute preemption, a cost
model the compiled interpreter costs itself and any number of replicas, the general engine
carries out the plans on compiled steps (``sim.engine.planned``; ``SimResult.step_engine ==
"compiled"``) and gives the same request table, step table, irregular gaps and summary, bit
for bit, as the reference (``sim.engine.replica``) with its invariant checks on. The drawn
runs push it through admission, chunked prompts, preemption by the policy's own victims, the
``max_preemptions`` limit, the policy's rejections, wake-ups, steady promises, the horizon,
``max_model_len`` and event skipping off. A plan the compiled steps do not carry out (padding
rows, a broken rule) sends the whole run to the reference, which carries it out or raises
its error, and the run says so.
"""
from __future__ import annotations

import copy
import dataclasses
import importlib.util
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import sim
from policies.chunked_prefill import ChunkedPrefill
from policies.continuous import ContinuousBatching
from policies.registry import Policy, make_policy
from sim.core.types import PaddingRow, Plan, View
from sim.engine.coverage import planned_blocker
from sim.engine.validate import EngineError
from sim.kv.config import KVConfig
from tests.test_fastpath import ROOFLINE, assert_same_run, costs, traces


def _benchmark_policy() -> type[Policy]:
    """The user policy ``benchmarks/general_engine.py`` times, as it is written there."""
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "general_engine.py"
    spec = importlib.util.spec_from_file_location("general_engine_benchmark", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return type(module.custom_policy())


class Packer(_benchmark_policy()):  # type: ignore[misc]
    """Decodes first, then FCFS prompt chunks within the budget, the slots and the free blocks
    (the general-engine benchmark's user policy itself); prompts over ``reject_over`` are
    refused, and the packer plans as if they were not there."""

    name = "packer"

    def __init__(self, budget: int = 64, max_seqs: int = 8, reject_over: int | None = None
                 ) -> None:
        super().__init__(budget, max_seqs)
        self.reject_over = reject_over

    def schedule(self, view: View) -> Plan:
        reject = {s.id: "too long for this packer" for s in view.waiting
                  if self.reject_over is not None and s.num_prompt_tokens > self.reject_over}
        if not reject:
            return super().schedule(view)
        shown = dataclasses.replace(view, waiting=tuple(s for s in view.waiting
                                                         if s.id not in reject))
        return dataclasses.replace(super().schedule(shown), reject=reject)


class Evictor(Policy):
    """Runs every running request one step, preempting the lowest-priority running ones
    (newest among equals) when the KV would not hold them, then whole waiting prompts; says
    ``steady`` when it runs only decodes and nobody waits, and waits for a tick of
    ``tick_s`` before it starts a batch from an empty engine."""

    name = "evictor"

    def __init__(self, tick_s: float | None = None, max_seqs: int = 6) -> None:
        self.tick_s, self.max_num_seqs = tick_s, max_seqs

    def schedule(self, view: View) -> Plan:
        kv = view.kv
        if not view.running and view.waiting and self.tick_s is not None:
            tick = math.ceil(view.now_s / self.tick_s + 1e-9) * self.tick_s
            if tick > view.now_s and view.waiting[0].arrival_s > view.now_s - self.tick_s:
                return Plan(wake_at_s=tick)
        running = sorted(view.running, key=lambda s: (s.priority, -s.arrival_s))
        free = kv.free_blocks
        need = {s.id: kv.blocks_needed(s, s.num_uncomputed) for s in running}
        preempt: list[int] = []
        while running and sum(need[s.id] for s in running) > free:
            victim = running.pop(0)
            preempt.append(victim.id)
            free += victim.num_blocks
        run = {s.id: s.num_uncomputed for s in running}
        free -= sum(need[s.id] for s in running)
        if not preempt:
            for s in view.waiting:
                n = s.num_uncomputed
                blocks = kv.blocks_needed(s, n)
                if len(run) >= self.max_num_seqs or blocks > free:
                    break
                run[s.id] = n
                free -= blocks
        steady = bool(run) and not view.waiting and not preempt and all(
            s.num_uncomputed == 1 and s.num_generated for s in running)
        return Plan(run=run, preempt=tuple(preempt), steady=steady)


class MyChunked(ChunkedPrefill):
    """A user's subclass of the chunked-prefill preset: its Python ``schedule`` runs."""

    name = "my-chunked"


class MyContinuous(ContinuousBatching):
    """A user's subclass of the continuous preset (vLLM or Orca mode)."""

    name = "my-continuous"


policies_ = st.one_of(
    st.builds(Packer, budget=st.sampled_from([8, 64, 512]), max_seqs=st.integers(1, 10),
              reject_over=st.sampled_from([None, None, 50])),
    st.builds(Evictor, tick_s=st.sampled_from([None, 0.3]), max_seqs=st.integers(1, 8)),
    st.builds(MyChunked, token_budget=st.sampled_from([16, 64, 512]),
              max_num_seqs=st.integers(1, 12)),
    st.builds(MyContinuous, max_num_seqs=st.integers(1, 12),
              max_num_batched_tokens=st.sampled_from([64, 256, 8192]),
              mode=st.sampled_from(["vllm", "orca"])),
)
kv_configs = st.fixed_dictionaries(
    {"num_blocks": st.integers(4, 40), "block_size": st.sampled_from([1, 4, 16])},
    optional={"max_preemptions": st.sampled_from([None, 0, 1, 3])}) | st.none()


def _pair(reqs, policy, **kw):  # noqa: ANN001, ANN202
    """The run on compiled steps and on the reference with its checks."""
    fast = sim.simulate(reqs, policy=policy, fast_path="compiled", **kw)
    slow = sim.simulate(reqs, policy=policy, checks=True, **kw)
    return fast, slow


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=traces(), policy=policies_, kv=kv_configs, cost=costs,
       max_model_len=st.sampled_from([None, None, 60]),
       horizon_s=st.sampled_from([None, None, 0.5, 3.0]),
       num_replicas=st.sampled_from([1, 1, 2]), skipping=st.sampled_from([True, True, False]))
def test_compiled_steps_give_the_reference_results(reqs, policy, kv, cost, max_model_len,
                                                   horizon_s, num_replicas, skipping):
    if cost == "roofline":
        cost = ROOFLINE
        reqs = [sim.Request(r.id, r.arrival_s * 0.02, r.num_prompt_tokens,
                            r.num_output_tokens, r.id % 3) for r in reqs]
    else:
        reqs = [sim.Request(r.id, r.arrival_s, r.num_prompt_tokens, r.num_output_tokens,
                            r.id % 3) for r in reqs]
    kw = {"cost": cost, "kv": kv, "max_model_len": max_model_len, "horizon_s": horizon_s,
          "num_replicas": num_replicas, "event_skipping": skipping}
    try:
        slow = sim.simulate(reqs, policy=copy.deepcopy(policy), checks=True, **kw)
    except EngineError as stalled:  # a packer that never preempts can stall: the same error
        with pytest.raises(EngineError) as fast_error:
            sim.simulate(reqs, policy=policy, fast_path="compiled", **kw)
        assert str(fast_error.value) == str(stalled)
        event("stalled")
        return
    fast = sim.simulate(reqs, policy=policy, fast_path="compiled", **kw)
    assert (fast.engine, fast.step_engine, fast.step_engine_reason) == ("general", "compiled", "")
    assert slow.step_engine == "python" and "checks=True" in slow.step_engine_reason
    assert_same_run(fast, slow)
    event("preempted" if fast.summary["num_preemptions"] else "no preemption")


def _long_tail(n: int, seed: int) -> list[sim.Request]:
    import numpy as np
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(0.02, n))
    prompts = np.minimum(rng.lognormal(5.5, 1.0, n).astype(int) + 1, 2000)
    outputs = np.minimum(rng.lognormal(4.5, 1.0, n).astype(int) + 1, 1000)
    return [sim.Request(i, float(arrivals[i]), int(prompts[i]), int(outputs[i]), i % 4)
            for i in range(n)]


@pytest.mark.parametrize(("policy", "blocks"), [
    (Packer(budget=512, max_seqs=64, reject_over=1500), 3000),  # it never preempts
    (Evictor(max_seqs=48), 400), (MyChunked(token_budget=512), 400)],
    ids=["packer", "evictor", "chunked"])
def test_compiled_steps_under_kv_pressure_at_scale(policy, blocks):
    # 600 requests of long-tailed traffic on a small cache: preemptions and rejections
    reqs = _long_tail(600, 7)
    kw = {"cost": ROOFLINE,
          "kv": {"num_blocks": blocks, "block_size": 16, "max_preemptions": 3}}
    fast, slow = _pair(reqs, policy, **kw)
    assert fast.step_engine == "compiled"
    assert fast.summary["num_steps"] > 1000
    assert_same_run(fast, slow)


def test_the_drawn_policies_reach_the_hard_cases():
    """Preemptions, the preemption limit, the policy's rejections, wake-ups and steady
    stretches all happen in runs like the drawn ones (so the test above can fail)."""
    reqs = _long_tail(300, 3)
    kv = {"num_blocks": 200, "block_size": 16, "max_preemptions": 1}
    evicted = sim.simulate(reqs, policy=Evictor(tick_s=0.05), cost=ROOFLINE, kv=kv,
                           fast_path="compiled")
    reasons = set(evicted.requests["reason"])
    assert evicted.summary["num_preemptions"] > 10
    assert any(r.startswith("preempted") for r in reasons)
    packed = sim.simulate(reqs, policy=Packer(budget=512, max_seqs=32, reject_over=1000),
                          cost=ROOFLINE, kv={"num_blocks": 3000, "block_size": 16},
                          fast_path="compiled")
    assert "too long for this packer" in set(packed.requests["reason"])
    # a steady stretch logs several steps for one plan: fewer plans than steps
    calls = []
    chunked = MyChunked(token_budget=512)
    plan = chunked.schedule
    chunked.schedule = lambda view: calls.append(1) or plan(view)  # type: ignore[method-assign]
    steady = sim.simulate(reqs, policy=chunked, cost=ROOFLINE, fast_path="compiled")
    assert steady.step_engine == "compiled" and len(calls) < steady.summary["num_steps"] / 2


class PadsOnce(Packer):
    """A packer that, once, adds a padding row: a plan the compiled steps do not take."""

    name = "pads-once"

    def __init__(self) -> None:
        super().__init__(budget=64, max_seqs=8)
        self.padded = False

    def schedule(self, view: View) -> Plan:
        plan = super().schedule(view)
        if plan.run and not self.padded and view.now_s > 0.5:
            self.padded = True
            return Plan(run=plan.run, padding=(PaddingRow(1, 4),))
        return plan


def test_a_plan_with_padding_sends_the_run_to_the_reference_and_says_so():
    reqs = _long_tail(200, 5)
    policy = PadsOnce()
    fast = sim.simulate(reqs, policy=policy, cost=ROOFLINE, fast_path="compiled")
    slow = sim.simulate(reqs, policy=PadsOnce(), cost=ROOFLINE, checks=True)
    assert fast.step_engine == "python"
    assert "padding rows" in fast.step_engine_reason
    assert "carried out again in Python" in fast.step_engine_reason
    assert fast.steps["num_padding_tokens"].sum() == 1
    assert_same_run(fast, slow)


class Broken(Packer):
    """A packer that, at its ``at``-th plan, breaks one rule of ``validate_plan`` — or, as
    ``limit_past_int64``, sets a token limit past what int64 holds, which breaks none."""

    name = "broken"

    def __init__(self, how: str, at: int = 10) -> None:
        super().__init__(budget=64, max_seqs=8)
        self.how, self.at, self.calls = how, at, 0

    def schedule(self, view: View) -> Plan:
        self.calls += 1
        if self.how == "limit_past_int64":
            if self.calls == self.at:
                self.max_num_batched_tokens = 2**70
            return super().schedule(view)
        plan = super().schedule(view)
        if self.calls < self.at or not plan.run:
            return plan
        sid, n = next(iter(plan.run.items()))
        run = dict(plan.run)
        if self.how == "too_many_tokens":
            run[sid] = n + 10_000
        elif self.how == "float_tokens":
            run[sid] = float(n)
        elif self.how == "unknown_request":
            run[10**9] = 1
        elif self.how == "preempt_waiting":
            return Plan(run=run, preempt=(view.waiting[0].id,) if view.waiting else (sid,))
        elif self.how == "over_budget":
            self.max_num_batched_tokens = 1
        elif self.how == "wake_in_the_past":
            return Plan(wake_at_s=view.now_s)
        elif self.how == "negative_limit":  # no limit is None: -1 allows no sequence at all
            self.max_num_seqs = -1
        return Plan(run=run)


@pytest.mark.parametrize("how", ["too_many_tokens", "float_tokens", "unknown_request",
                                 "preempt_waiting", "over_budget", "wake_in_the_past",
                                 "negative_limit"])
def test_a_broken_plan_raises_the_reference_error(how):
    reqs = _long_tail(100, 2)
    with pytest.raises(EngineError) as fast:
        sim.simulate(reqs, policy=Broken(how), cost=ROOFLINE, fast_path="compiled")
    with pytest.raises(EngineError) as slow:
        sim.simulate(reqs, policy=Broken(how), cost=ROOFLINE, checks=True)
    assert str(fast.value) == str(slow.value)


@pytest.mark.parametrize("at", [1, 5])
def test_a_limit_past_int64_runs_on_the_reference(at):
    reqs = _long_tail(100, 3)
    fast = sim.simulate(reqs, policy=Broken("limit_past_int64", at), cost=ROOFLINE,
                        fast_path="compiled")
    slow = sim.simulate(reqs, policy=Broken("limit_past_int64", at), cost=ROOFLINE,
                        checks=True)
    assert fast.step_engine == "python"
    assert "int64" in fast.step_engine_reason
    assert_same_run(fast, slow)


def test_which_runs_take_the_compiled_steps():
    cost, paged = sim.ConstantCost(0.1), KVConfig(num_blocks=100)
    assert planned_blocker(Packer(), paged, cost, checks=False) == ""
    assert planned_blocker(MyChunked(), paged, ROOFLINE, checks=False) == ""
    for policy, kv, c, checks, words in [
        (make_policy("static"), paged, cost, False, "pads its batches"),
        (make_policy("dynamic"), paged, cost, False, "pads its batches"),
        (Packer(), KVConfig(num_blocks=100, prefix_caching=True), cost, False,
         "kv.prefix_caching=True is not covered by the compiled steps"),
        (Packer(), KVConfig(num_blocks=100, preemption="swap", swap_s_per_token=1e-6,
                            kv_bytes_per_token=1.0), cost, False, "kv.preemption='swap'"),
        (Packer(), paged, cost, True, "checks=True"),
        (Packer(), paged, object(), False, "cost model"),
    ]:
        assert words in planned_blocker(policy, kv, c, checks=checks)
    # small runs stay in Python unless asked; "interpreted" keeps everything in Python
    reqs = _long_tail(50, 1)
    small = sim.simulate(reqs, policy=Packer(), cost=cost)
    assert small.step_engine == "python" and "fewer than" in small.step_engine_reason
    kept = sim.simulate(reqs, policy=Packer(), cost=cost, fast_path="interpreted")
    assert kept.step_engine == "python" and "interpreted" in kept.step_engine_reason
    compiled = sim.simulate(reqs, policy={"name": "continuous"}, cost=cost,
                            fast_path="compiled")
    assert (compiled.engine, compiled.step_engine, compiled.step_engine_reason) == (
        "compiled", "compiled", "")


def test_a_bucketed_step_table_keeps_every_summary_metric():
    reqs = _long_tail(400, 11)
    kw = {"cost": ROOFLINE, "kv": {"num_blocks": 3000, "block_size": 16},
          "step_table": "buckets"}
    fast, slow = _pair(reqs, Packer(budget=512, max_seqs=32), **kw)
    assert fast.step_engine == "compiled" and fast.step_table == "buckets"
    assert_same_run(fast, slow)


class NotAPlan(Packer):
    """Returns the run mapping itself instead of a ``Plan``."""

    name = "not-a-plan"

    def schedule(self, view: View) -> Plan:
        return super().schedule(view).run  # type: ignore[return-value]


def test_a_policy_that_returns_no_plan_fails_as_on_the_reference():
    reqs = _long_tail(20, 2)
    with pytest.raises(AttributeError) as fast:
        sim.simulate(reqs, policy=NotAPlan(), cost=ROOFLINE, fast_path="compiled")
    with pytest.raises(AttributeError) as slow:
        sim.simulate(reqs, policy=NotAPlan(), cost=ROOFLINE, checks=True)
    assert str(fast.value) == str(slow.value)


class Uncopyable(Packer):
    """A packer holding something ``copy.deepcopy`` refuses (a generator)."""

    name = "uncopyable"

    def __init__(self) -> None:
        super().__init__(budget=64, max_seqs=8)
        self.ticks = (i for i in range(10**9))


def test_a_policy_that_cannot_be_copied_keeps_its_plans_in_python():
    reqs = _long_tail(50, 4)
    res = sim.simulate(reqs, policy=Uncopyable(), cost=ROOFLINE, fast_path="compiled")
    assert res.step_engine == "python" and "cannot be copied" in res.step_engine_reason


def test_progress_is_read_from_the_compiled_arrays_as_the_run_goes():
    # the step log fills only at the end: the run counts for itself (``sim.metrics.live``)
    from sim.experiments.run_progress import requests_done, steps_taken

    seen, samples = {}, []

    class Watched(Packer):  # reads the progress at each plan, as the bar's thread would
        def schedule(self, view: View) -> Plan:
            if "logs" in seen:
                done, reached = requests_done(seen["logs"], seen["arrivals"])
                samples.append((view.now_s, done, reached, steps_taken(seen["logs"])))
            return super().schedule(view)

    def monitor(logs, arrivals):  # noqa: ANN001, ANN202
        seen["logs"], seen["arrivals"] = logs, arrivals

    reqs = _long_tail(300, 8)
    res = sim.simulate(reqs, policy=Watched(budget=512, max_seqs=32), cost=ROOFLINE,
                       kv={"num_blocks": 3000, "block_size": 16}, fast_path="compiled",
                       monitor=monitor)
    assert res.step_engine == "compiled"
    finish = res.requests["finish_s"].to_numpy()
    ends = (res.steps["start_s"] + res.steps["duration_s"]).to_numpy()
    for now, done, reached, steps in samples:  # exact at every scheduling point
        assert (done, reached, steps) == (int((finish <= now).sum()), now,
                                          int((ends <= now).sum()))
    assert samples[-1][1] > len(reqs) / 2
