"""Progress inside a run: the count of requests done is exact step by step, the bar is drawn
on a terminal only (never with --quiet, never into a log), and the results do not change."""
from __future__ import annotations

import io
import json
import sys

import numpy as np
import pytest
import yaml

import sim
import sim.engine.simulate as engine_simulate
import sim.experiments.run_progress as run_progress
from sim.experiments.run_progress import RunProgress, done_before, requests_done, steps_taken
from tests.helpers import poisson_arrivals, requests


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _run(fast_path: bool | str, monitor=None):
    rng = np.random.default_rng(3)
    n = 300
    reqs = requests(poisson_arrivals(40.0, n, rng), rng.integers(5, 200, n).tolist(),
                    rng.integers(1, 40, n).tolist())
    policy = {"name": "continuous", "max_num_seqs": 16} if fast_path else \
        {"name": "chunked_prefill", "token_budget": 512, "max_num_seqs": 256}
    return sim.simulate(reqs, policy=policy, cost=sim.LinearCost(base_s=0.005,
                        per_token_s=1e-5), kv=None, fast_path=fast_path, monitor=monitor)


@pytest.mark.parametrize("fast_path", [False, "interpreted"])
def test_requests_done_is_exact_at_every_step(fast_path):
    seen = {}

    def monitor(logs, arrivals):
        seen["logs"], seen["arrivals"] = logs, arrivals

    res = _run(fast_path, monitor)
    arrivals, steps, table = seen["arrivals"], res.steps, res.requests
    assert np.all(np.diff(arrivals) >= 0) and len(arrivals) == len(table)
    finish = np.sort(table["finish_s"].to_numpy())
    checked = 0
    for start, waiting, seqs, prefill in zip(steps["start_s"], steps["num_waiting"],
                                             steps["num_seqs"], steps["num_prefill_tokens"],
                                             strict=True):
        truth = int(np.searchsorted(finish, start, side="right"))
        estimate = done_before(arrivals, start, int(waiting), int(seqs))
        if not fast_path or prefill == 0:  # every running request runs in this step
            assert estimate == truth
            checked += 1
        else:  # a prefill-only step pauses the running decodes: they count as done
            assert truth <= estimate <= truth + 16
    assert checked > len(steps) / 2
    done, now = requests_done(seen["logs"], arrivals)
    last = steps.iloc[-1]
    assert now == last["start_s"] + last["duration_s"]
    assert done == len(table) - last["num_seqs"] - last["num_waiting"]


@pytest.mark.parametrize("fast_path", [False, "interpreted"])
def test_a_live_bar_changes_no_result(fast_path):
    plain = _run(fast_path)
    stream = Tty()
    with RunProgress("x", stream=stream, interval_s=0.001) as bar:
        watched = _run(fast_path, monitor=bar.attach)
    assert json.dumps(plain.summary, sort_keys=True) == json.dumps(watched.summary,
                                                                   sort_keys=True)
    assert plain.steps.equals(watched.steps) and plain.requests.equals(watched.requests)


class FakeBar:
    def __init__(self, **kwargs):
        self.kwargs, self.n, self.postfix, self.closed = kwargs, 0, "", False

    def set_postfix_str(self, text, refresh=True):
        self.postfix = text

    def update(self, k):
        self.n += k

    def refresh(self):
        pass

    def close(self):
        self.closed = True


def test_bar_shows_done_total_and_simulated_time():
    res = _run(False)
    bars = []

    def factory(**kw):
        bars.append(FakeBar(**kw))
        return bars[-1]

    p = RunProgress("[1/2] chunked", stream=Tty(), interval_s=3600, bar_factory=factory)
    p.attach([sim.engine.simulate.StepLog()], np.sort(res.requests["arrival_s"].to_numpy()))
    (bar,) = bars
    assert bar.kwargs["total"] == 300 and bar.kwargs["desc"] == "[1/2] chunked"
    assert bar.kwargs["delay"] == 3600  # nothing drawn before one interval
    p.update()
    assert bar.n == 0 and bar.postfix.startswith("sim 0.0 s")
    p.close()
    assert bar.closed and p.bar is None


def test_no_bar_when_stderr_is_not_a_terminal():
    p = RunProgress("x", stream=io.StringIO())
    assert not p.enabled
    p.attach([], np.arange(3.0))
    assert p.bar is None and p._thread is None
    p.close()


@pytest.fixture
def long_exp(tmp_path):
    path = tmp_path / "long.yaml"
    path.write_text(yaml.safe_dump({
        "name": "long", "cost": {"kind": "linear", "base_s": 0.005, "per_token_s": 1e-5},
        "kv": {"unlimited": True},
        "workload": {"arrival": {"process": "poisson", "rate": 50}, "num_requests": 1500,
                     "prompt_tokens": {"dist": "uniform", "lo": 10, "hi": 400},
                     "output_tokens": {"dist": "uniform", "lo": 2, "hi": 60}},
        "policy": {"name": "chunked_prefill", "token_budget": 256},
        "output": {"plots": False}}))
    return path


@pytest.mark.parametrize("quiet", [False, True])
def test_a_long_run_draws_progress_on_a_terminal_unless_quiet(long_exp, tmp_path, monkeypatch,
                                                              quiet):
    monkeypatch.setattr(run_progress, "INTERVAL_S", 0.02)
    # on the general engine: the compiled interpreter fills its log only when a replica ends,
    # and with numba already loaded this run can end within one interval and draw nothing
    monkeypatch.setattr(engine_simulate, "COMPILED_MIN_REQUESTS", 10**9)
    err = Tty()
    monkeypatch.setattr(sys, "stderr", err)
    sim.run_experiment(long_exp, out=tmp_path / "out", quiet=quiet)
    text = err.getvalue()
    if quiet:
        assert text == ""
    else:
        assert "[1/1] chunked_prefill" in text and "req/s" in text and "/1500" in text
        assert "sim " in text and "steps" in text


def test_no_progress_in_a_log(long_exp, tmp_path, monkeypatch):
    monkeypatch.setattr(run_progress, "INTERVAL_S", 0.02)
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    sim.run_experiment(long_exp, out=tmp_path / "out")
    assert "req/s" not in err.getvalue() and "\r" not in err.getvalue()
    assert "[1/1] run" in err.getvalue()  # the sweep's own log line


@pytest.mark.parametrize("fast_path", ["interpreted", "compiled"])
def test_a_disaggregated_run_counts_every_replicas_steps_and_requests(fast_path):
    # a request ends on its decode replica (or its prefill one), and a compiled pool fills
    # its step log only at the end: the run counts for itself (``sim.metrics.live``)
    from routers.balance import RoundRobin

    seen, samples = {}, []

    class Watching(RoundRobin):  # reads the progress at each arrival, as the bar's thread would
        def route(self, request, loads):
            done, reached = requests_done(seen["logs"], seen["arrivals"])
            samples.append((request.arrival_s, done, reached, steps_taken(seen["logs"])))
            return super().route(request, loads)

    def monitor(logs, arrivals):
        seen["logs"], seen["arrivals"] = logs, arrivals

    rng = np.random.default_rng(3)
    n = 300
    reqs = requests(poisson_arrivals(40.0, n, rng), rng.integers(5, 200, n).tolist(),
                    rng.integers(1, 40, n).tolist())
    kv = {"num_blocks": 60, "block_size": 16, "kv_bytes_per_token": 1e5}
    cluster = {"groups": [
        {"name": "p", "role": "prefill", "replicas": 2, "kv": kv,
         "cost": sim.LinearCost(base_s=0.004, per_token_s=1e-5)},
        {"name": "d", "role": "decode", "replicas": 2, "kv": kv,
         "cost": sim.LinearCost(base_s=0.005, per_token_s=1e-6)}]}
    res = sim.simulate(reqs, policy={"name": "continuous", "max_num_seqs": 16}, cluster=cluster,
                       router=Watching(), fast_path=fast_path, monitor=monitor)
    assert res.engine == ("compiled" if fast_path == "compiled" else "general")
    finish = np.sort(res.requests["finish_s"].to_numpy())
    for at, done, reached, _ in samples:
        truth = int(np.searchsorted(finish, at, side="right"))
        if fast_path == "compiled":  # a compiled step's requests settle as it is launched
            assert truth <= done <= int(np.searchsorted(finish, reached, side="right"))
        else:
            assert done == truth
    assert [s[3] for s in samples] == sorted(s[3] for s in samples)
    assert samples[len(samples) // 2][3] > 0 and samples[len(samples) // 2][1] > 0
    last = res.steps["start_s"] + res.steps["duration_s"]
    assert requests_done(seen["logs"], seen["arrivals"]) == (n, last.max())
    assert steps_taken(seen["logs"]) == len(res.steps)


def test_a_compiled_run_counts_its_requests_and_steps_as_it_goes(monkeypatch):
    # a compiled replica's step log fills only at its end: the run counts from its arrays, and
    # a watched run returns to Python every DEADLINE_STEPS steps so a display thread can read
    import sim.engine.compiled as compiled
    import sim.engine.compiled_loop as loop

    seen, samples = {}, []
    real = loop.run

    def run(*args):  # noqa: ANN002, ANN202 - the compiled loop, sampled after each return
        code = real(*args)
        done, reached = requests_done(seen["logs"], seen["arrivals"])
        samples.append((done, reached, steps_taken(seen["logs"])))
        return code

    def monitor(logs, arrivals):  # noqa: ANN001, ANN202
        seen["logs"], seen["arrivals"] = logs, arrivals

    monkeypatch.setattr(loop, "run", run)
    monkeypatch.setattr(compiled, "DEADLINE_STEPS", 64)
    rng = np.random.default_rng(5)
    n = 400
    reqs = requests(poisson_arrivals(40.0, n, rng), rng.integers(5, 200, n).tolist(),
                    rng.integers(1, 40, n).tolist())
    kw = {"policy": {"name": "continuous", "max_num_seqs": 16},
          "cost": sim.LinearCost(base_s=0.005, per_token_s=1e-5), "kv": None,
          "fast_path": "compiled", "num_replicas": 2}
    res = sim.simulate(reqs, **kw, monitor=monitor)
    assert res.engine == "compiled" and len(samples) > 10
    finish = np.sort(res.requests["finish_s"].to_numpy())
    assert [s[0] for s in samples] == sorted(s[0] for s in samples)
    assert [s[2] for s in samples] == sorted(s[2] for s in samples)
    for done, reached, _ in samples:  # never more than had ended by the clock reached
        assert done <= int(np.searchsorted(finish, reached, side="right"))
    assert 0 < samples[len(samples) // 4][0] < n and samples[-1][0] == n
    assert samples[-1][2] == len(res.steps)
    assert sim.simulate(reqs, **kw).requests.equals(res.requests)  # unwatched: the same
