"""Workload specs: trace slicing and scaling, synthetic processes, mixes, errors and stats."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.core.errors import InputError
from sim.workload import synthetic
from sim.workload.build import WorkloadError, build_workload
from sim.workload.trace_stats import format_trace_stats, trace_stats


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def check_order(reqs):
    assert [r.id for r in reqs] == list(range(len(reqs)))
    t = [r.arrival_s for r in reqs]
    assert t == sorted(t)
    assert all(r.num_prompt_tokens >= 1 and r.num_output_tokens >= 1 for r in reqs)


def test_trace_replay_whole():
    reqs = build_workload({"trace": "azure-conv"}, rng())
    assert len(reqs) == 19366
    check_order(reqs)


@pytest.mark.parametrize("rate", [0.5, 4.0, 20.0])
def test_rate_scaling_hits_requested_rate(rate):
    reqs = build_workload({"trace": "azure-conv", "max_requests": 3000, "rate": rate}, rng())
    assert trace_stats(reqs)["mean_rate_per_s"] == pytest.approx(rate, rel=1e-9)
    check_order(reqs)


def test_time_scale_multiplies_gaps():
    base = build_workload({"trace": "azure-code", "max_requests": 50}, rng())
    fast = build_workload({"trace": "azure-code", "max_requests": 50, "time_scale": 0.5}, rng())
    assert [f.arrival_s for f in fast] == pytest.approx([b.arrival_s * 0.5 for b in base])


def test_time_window_slicing():
    full = build_workload({"trace": "azure-conv"}, rng())
    win = build_workload({"trace": "azure-conv", "start_s": 600, "duration_s": 300}, rng())
    expect = [r for r in full if 600 <= r.arrival_s < 900]
    assert len(win) == len(expect) > 0
    assert win[0].arrival_s == pytest.approx(expect[0].arrival_s - 600)
    assert max(r.arrival_s for r in win) < 300
    assert win[0].num_prompt_tokens == expect[0].num_prompt_tokens


def test_caps_and_labels():
    reqs = build_workload({"trace": "azure-conv", "max_prompt_tokens": 2048,
                           "max_output_tokens": 64, "tenant": "chat", "priority": 2}, rng())
    assert max(r.num_prompt_tokens for r in reqs) == 2048
    assert max(r.num_output_tokens for r in reqs) == 64
    assert {(r.tenant, r.priority) for r in reqs} == {("chat", 2)}


def test_poisson_rate_and_cv():
    reqs = build_workload({"arrival": {"process": "poisson", "rate": 4.0}, "num_requests": 20000,
                           "prompt_tokens": {"dist": "fixed", "value": 100},
                           "output_tokens": {"dist": "exponential", "mean": 50}}, rng(3))
    s = trace_stats(reqs)
    assert s["mean_rate_per_s"] == pytest.approx(4.0, rel=0.03)
    assert s["interarrival_cv"] == pytest.approx(1.0, abs=0.05)
    assert reqs[0].arrival_s == 0.0


def test_gamma_cv_and_constant():
    t = synthetic.arrival_times("gamma", 2.0, rng(1), num_requests=20000, cv=3.0)
    gaps = np.diff(t)
    assert gaps.mean() == pytest.approx(0.5, rel=0.08)
    assert gaps.std() / gaps.mean() == pytest.approx(3.0, rel=0.1)
    c = synthetic.arrival_times("constant", 4.0, rng(), duration_s=10)
    assert c.tolist() == pytest.approx([i / 4 for i in range(40)])


def test_length_distributions():
    r = rng(5)
    ln = synthetic.lognormal(200000, r, mean=1000, sigma=1.0)
    assert ln.mean() == pytest.approx(1000, rel=0.03)
    assert np.median(synthetic.lognormal(200000, r, median=300, sigma=0.5)) == pytest.approx(
        300, rel=0.02)
    u = synthetic.uniform(3, 5, 10000, r)
    assert set(u.tolist()) == {3, 4, 5}
    assert synthetic.clamp_tokens(np.array([-5.0, 0.4, 7.6, 1e40]), 1, 100).tolist() == [
        1, 1, 8, 100]


def test_joint_empirical_keeps_pairs():
    from sim.workload.traces import load_trace_arrays
    tr = load_trace_arrays("azure-conv")
    pairs = set(zip(tr.num_prompt_tokens.tolist(), tr.num_output_tokens.tolist(), strict=True))
    reqs = build_workload({"arrival": {"rate": 5}, "num_requests": 500,
                           "lengths": {"dist": "empirical", "trace": "azure-conv"}}, rng())
    assert all((r.num_prompt_tokens, r.num_output_tokens) in pairs for r in reqs)


def test_mix_superposed():
    spec = {"mix": [{"trace": "azure-conv", "rate": 4.0, "tenant": "chat"},
                    {"arrival": {"process": "constant", "rate": 0.5}, "duration_s": 100,
                     "prompt_tokens": {"dist": "fixed", "value": 9000},
                     "output_tokens": {"dist": "fixed", "value": 10}, "tenant": "rag"}],
            "duration_s": 100}
    reqs = build_workload(spec, rng())
    check_order(reqs)
    rag = [r for r in reqs if r.tenant == "rag"]
    assert len(rag) == 50 and all(r.num_prompt_tokens == 9000 for r in rag)
    # The trace is non-stationary: its first 100 s run below the whole-trace mean rate.
    assert 150 < sum(r.tenant == "chat" for r in reqs) < 600
    assert max(r.arrival_s for r in reqs) < 100


def test_mix_by_fraction():
    spec = {"arrival": {"process": "gamma", "rate": 5, "cv": 2}, "num_requests": 4000,
            "mix": [{"fraction": 0.9, "trace": "azure-conv", "tenant": "chat"},
                    {"fraction": 0.1, "tenant": "rag",
                     "prompt_tokens": {"dist": "uniform", "lo": 8000, "hi": 16000},
                     "output_tokens": {"dist": "fixed", "value": 100}}]}
    reqs = build_workload(spec, rng())
    check_order(reqs)
    assert len(reqs) == 4000
    rag = [r for r in reqs if r.tenant == "rag"]
    assert 300 < len(rag) < 500
    assert all(8000 <= r.num_prompt_tokens <= 16000 for r in rag)


def test_trace_path_relative_to_base_dir(tmp_path):
    (tmp_path / "w.csv").write_text("arrival_s,num_prompt_tokens,num_output_tokens\n3,1,2\n4,5,6\n")
    reqs = build_workload({"trace": "w.csv"}, rng(), base_dir=tmp_path)
    assert [(r.arrival_s, r.num_prompt_tokens) for r in reqs] == [(0.0, 1), (1.0, 5)]


BAD = [
    ({"arrival": {"process": "poisson", "rate": -1}, "num_requests": 5,
      "prompt_tokens": {"dist": "fixed", "value": 1},
      "output_tokens": {"dist": "fixed", "value": 1}},
     "workload.arrival.rate: must be > 0, got -1"),
    ({"arrival": {"rate": 1}}, "workload.num_requests"),
    ({"arrival": {"rate": 1}, "num_requests": 2, "prompt_tokens": {"dist": "fixed", "value": 1}},
     "workload.output_tokens: required"),
    ({"arrival": {"process": "weibull", "rate": 1}, "num_requests": 2}, "workload.arrival.process"),
    ({"arrival": {"rate": 1, "cv": 2}, "num_requests": 2}, "workload.arrival.cv"),
    ({"trace": "azure-conv", "rate": 1, "time_scale": 2}, "workload.rate"),
    ({"trace": "azure-conv", "speed": 2}, "workload.speed: unknown key"),
    ({"trace": "azure-conv", "start_s": 1e6}, "workload.start_s"),
    ({"trace": "azure-conv", "max_requests": 2.5},
     "workload.max_requests: expected int, got float 2.5"),
    ({"trace": "no/such.csv"}, "workload.trace"),
    ({"arrival": {"rate": 1}, "num_requests": 2, "prompt_tokens": {"dist": "lognormal", "sigma": 1},
      "output_tokens": {"dist": "fixed", "value": 1}}, "workload.prompt_tokens.mean"),
    ({"arrival": {"rate": 1}, "num_requests": 2, "prompt_tokens": {"dist": "fixed", "value": 1},
      "output_tokens": {"dist": "uniform", "lo": 5, "hi": 2}}, "workload.output_tokens.hi"),
    ({"mix": [{"fraction": 0.5, "trace": "azure-conv"}]}, "workload.mix[0].fraction"),
    ({"arrival": {"rate": 1}, "num_requests": 2, "mix": [{"fraction": 0.5, "trace": "azure-conv"}]},
     "workload.mix: fractions must sum to 1"),
    ({"mix": [{"trace": "azure-conv", "rate": "fast"}]}, "workload.mix[0].rate"),
    ({}, "workload: needs one of"),
]


@pytest.mark.parametrize(("spec", "expected"), BAD)
def test_bad_specs_name_the_key(spec, expected):
    with pytest.raises(WorkloadError) as info:
        build_workload(spec, rng())
    assert str(info.value).startswith(expected.split(":")[0])
    assert expected in str(info.value)
    assert "\n" not in str(info.value)


dists = st.sampled_from([
    {"dist": "fixed", "value": 7},
    {"dist": "uniform", "lo": 1, "hi": 50},
    {"dist": "lognormal", "mean": 300, "sigma": 1.5, "max": 4096},
    {"dist": "lognormal", "median": 3, "sigma": 2.0},
    {"dist": "exponential", "mean": 2.0},
])


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), process=st.sampled_from(["poisson", "gamma", "constant"]),
       rate=st.floats(0.01, 1000), n=st.integers(1, 300), prompt=dists, output=dists)
def test_synthetic_sorted_positive_deterministic(seed, process, rate, n, prompt, output):
    arrival = {"process": process, "rate": rate} | ({"cv": 2.5} if process == "gamma" else {})
    spec = {"arrival": arrival, "num_requests": n, "prompt_tokens": prompt,
            "output_tokens": output}
    a = build_workload(spec, np.random.default_rng(seed))
    b = build_workload(spec, np.random.default_rng(seed))
    assert a == b
    assert len(a) == n
    check_order(a)
    cap = prompt.get("max")
    assert cap is None or max(r.num_prompt_tokens for r in a) <= cap


def test_trace_stats_and_format():
    s = trace_stats(build_workload({"trace": "azure-conv"}, rng()))
    assert s["count"] == 19366 and s["peak_per_min"] == 507
    assert s["span_s"] == pytest.approx(3501.7, abs=0.05)
    assert s["prompt_median"] == 1020 and s["output_p99"] == 601 and s["prompt_max"] == 14050
    text = format_trace_stats(s, "azure-conv")
    assert "19,366" in text and "507" in text
    empty = trace_stats([])
    assert empty["count"] == 0


@pytest.mark.parametrize(("spec", "message"), [
    ({"mix": [{"trace": "azure-conv", "rate": 1.0, "tenent": "a"}]},
     r"^workload\.mix\[0\]\.tenent: unknown key \(did you mean 'tenant'\?\); accepted: "),
    ({"conversations": {"num_conversations": 2, "turn": 2}},
     r"^workload\.conversations\.turn: unknown key \(did you mean 'turns'\?\); accepted: "),
    ({"arrival": {"rate": 4.0}, "num_request": 5,
      "prompt_tokens": {"dist": "fixed", "value": 5}, "output_tokens": {"dist": "fixed",
                                                                        "value": 5}},
     r"^workload\.num_request: unknown key \(did you mean 'num_requests'\?\)"),
])
def test_a_misspelt_workload_key_suggests_the_right_one(spec, message):
    """The workload's unknown-key message is the schema's (``sim.core.fields.unknown_key``):
    it listed the keys but suggested none."""
    with pytest.raises(InputError, match=message):
        build_workload(spec, np.random.default_rng(0))


def test_numpy_numbers_are_numbers_in_a_workload_spec():
    """As for every other key: a rate computed with numpy (``np.float64``) was refused."""
    spec = {"arrival": {"rate": np.float64(4.0)}, "num_requests": np.int64(5),
            "prompt_tokens": {"dist": "fixed", "value": np.int32(5)},
            "output_tokens": {"dist": "fixed", "value": 5}}
    plain = {"arrival": {"rate": 4.0}, "num_requests": 5,
             "prompt_tokens": {"dist": "fixed", "value": 5},
             "output_tokens": {"dist": "fixed", "value": 5}}
    assert build_workload(spec, np.random.default_rng(0)) == build_workload(
        plain, np.random.default_rng(0))
