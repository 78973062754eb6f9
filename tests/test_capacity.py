"""``batchsim capacity``: bisection against a closed-form capacity, CLI output and files.

The analytic setup is D/D/1: constant arrivals at rate λ, one batch row (``max_num_seqs: 1``),
a constant step ``s`` and ``O`` output tokens per request, so each request holds the server for
``S = O·s``. Above 1/S the queue grows linearly: request ``i`` (from 0) waits ``i·d`` with
``d = S − 1/λ``, so its TTFT is ``s + i·d``. numpy's linear-interpolation p99 over ``n``
requests is then ``s + 0.99·(n−1)·d`` exactly, and ``p99 ≤ L`` holds up to
``λ* = 1 / (S − (L − s) / (0.99·(n−1)))``. With a per-request TTFT limit ``L`` and an
attainment goal ``A``, requests ``i ≤ (L − s)/d`` meet it, so
``λ* = 1 / (S − (L − s)/(⌈A·n⌉ − 1))``.
"""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from sim.cli.main import main
from sim.experiments.capacity import CapacityError, parse_slos, run_capacity, search
from tests.helpers import dd1_experiment

STEP, OUT_TOKENS, N, TTFT_MS = 0.01, 10, 200, 1000.0
SERVICE = STEP * OUT_TOKENS

DD1 = dd1_experiment(STEP, OUT_TOKENS, N, rates=[1, 2, 3])


@pytest.fixture
def exp(tmp_path: Path) -> Path:
    path = tmp_path / "dd1.yaml"
    path.write_text(DD1)
    return path


def p99_capacity() -> float:
    return 1 / (SERVICE - (TTFT_MS / 1e3 - STEP) / (0.99 * (N - 1)))


def attainment_capacity(goal: float) -> float:
    return 1 / (SERVICE - (TTFT_MS / 1e3 - STEP) / (math.ceil(goal * N) - 1))


@pytest.mark.parametrize("jobs", [1, 2])
def test_bisection_finds_the_closed_form_p99_capacity(exp, tmp_path, jobs):
    tol = 0.01
    table = run_capacity(exp, slo=f"ttft_p99_ms={TTFT_MS}", tolerance=tol, jobs=jobs,
                         out=tmp_path / f"cap{jobs}", quiet=True)
    (row,) = table.to_dict("records")
    exact = p99_capacity()
    assert row["status"] == "found"
    assert exact / (1 + tol) <= row["max_rate"] <= exact
    assert row["p99_ttft_ms"] <= TTFT_MS
    search_csv = pd.read_csv(tmp_path / f"cap{jobs}" / "search.csv")
    assert not search_csv[search_csv["rate"] > exact]["passed"].any()
    assert search_csv[search_csv["rate"] <= row["max_rate"]]["passed"].all()


def test_attainment_search_matches_the_per_request_closed_form(exp, tmp_path):
    tol = 0.01
    table = run_capacity(exp, slo=f"ttft_ms={TTFT_MS}", attainment=0.9, tolerance=tol,
                         out=tmp_path / "cap", quiet=True)
    exact = attainment_capacity(0.9)
    rate = table.loc[0, "max_rate"]
    assert exact / (1 + tol) <= rate <= exact
    assert table.loc[0, "slo_attainment"] >= 0.9


def test_cli_prints_trace_and_table_and_writes_files(exp, tmp_path, capsys):
    out = tmp_path / "cap"
    code = main(["capacity", str(exp), "--slo", "ttft_p99_ms=1000,tpot_p99_ms=50",
                 "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0
    assert "bracket" in text and "bisect" in text and "FAIL" in text and "pass" in text
    assert "max_rate" in text and "cost_per_mtok_usd" in text
    cap = pd.read_csv(out / "capacity.csv")
    assert list(cap["label"]) == ["continuous"]
    assert cap.loc[0, "rate_key"] == "workload.arrival.rate"
    # cost = price × GPUs / (output tokens per hour) × 1e6; h100-sxm's list price is set
    from sim.cost.profiles import load_gpu

    price = load_gpu("h100-sxm").price_per_gpu_hour_usd
    assert cap.loc[0, "cost_per_mtok_usd"] == pytest.approx(
        price / (cap.loc[0, "output_throughput"] * 3600) * 1e6)
    trace = pd.read_csv(out / "search.csv")
    assert {"phase", "rate", "passed", "p99_ttft_ms", "p99_tpot_ms"} <= set(trace.columns)
    assert not any(p.name.endswith(".tmp") for p in out.rglob("*"))
    # the probes are cached: a re-run simulates nothing new and gives the same table
    assert main(["capacity", str(exp), "--slo", "ttft_p99_ms=1000,tpot_p99_ms=50",
                 "--out", str(out), "--quiet"]) == 0
    assert pd.read_csv(out / "capacity.csv").equals(cap)


def test_one_entry_per_policy(exp, tmp_path):
    text = exp.read_text().replace(
        "policy: {name: continuous, max_num_seqs: 1}",
        "policies: [{name: continuous, max_num_seqs: 1}, "
        "{name: continuous, max_num_seqs: 2, label: two}]")
    exp.write_text(text)
    table = run_capacity(exp, slo=f"ttft_p99_ms={TTFT_MS}", tolerance=0.05,
                         out=tmp_path / "cap", quiet=True)
    assert list(table["label"]) == ["continuous", "two"]
    assert table.loc[1, "max_rate"] > table.loc[0, "max_rate"]  # two rows: more capacity


def test_impossible_slo_is_infeasible_with_no_cost(exp, tmp_path, capsys):
    # one step (10 ms) is already more than the 5 ms TTFT limit: it fails at every rate
    code = main(["capacity", str(exp), "--slo", "ttft_p99_ms=5", "--out", str(tmp_path / "c")])
    text = capsys.readouterr().out
    assert code == 0
    cap = pd.read_csv(tmp_path / "c" / "capacity.csv")
    row = cap.iloc[0]
    assert row["status"] == "infeasible" and math.isnan(row["max_rate"])
    assert row["binding"] == "p99_ttft_ms" and math.isnan(row["cost_per_mtok_usd"])
    trace = pd.read_csv(tmp_path / "c" / "search.csv")
    assert row["fail_rate"] == trace["rate"].min() and not trace["passed"].any()
    assert "infeasible: p99_ttft_ms=" in text and "no capacity and no cost" in text
    assert "found" not in text


def passes_below(limit):
    return lambda rates, phase: [r <= limit for r in rates]


def test_search_statuses():
    out = search(1.0, 0.01, 1, passes_below(3.3))
    assert out.status == "found" and 3.3 / 1.01 <= out.rate <= 3.3 < out.fail_rate
    assert out.fail_rate <= out.rate * 1.01
    out = search(8.0, 0.01, 3, passes_below(0.7))
    assert out.status == "found" and 0.7 / 1.01 <= out.rate <= 0.7
    out = search(1.0, 0.01, 2, passes_below(math.inf))
    assert (out.rate, out.status) == (4096.0, "unbounded") and math.isnan(out.fail_rate)
    out = search(1.0, 0.01, 1, passes_below(0))
    assert out.status == "infeasible" and math.isnan(out.rate)
    assert out.fail_rate == pytest.approx(1 / 4096, rel=1e-5)


@pytest.mark.parametrize("width", [1, 3])
def test_halving_stops_at_the_first_failure_near_idle(width):
    probed: list[float] = []

    def evaluate(rates, phase):
        probed.extend(rates)
        return [False] * len(rates)

    out = search(8.0, 0.01, width, evaluate, near_idle=lambda r: r <= 1.0)
    assert out.status == "infeasible" and math.isnan(out.rate) and out.fail_rate <= 1.0
    assert min(probed) >= 1.0 / 2 ** (width - 1)  # no halving past the first idle failure
    # a failure that is not near idle keeps halving, and a pass below it is still found
    out = search(8.0, 0.01, width, passes_below(0.3), near_idle=lambda r: r <= 0.1)
    assert out.status == "found" and 0.3 / 1.01 <= out.rate <= 0.3


def test_binding_metric_is_the_worst_failing_slo():
    slos = parse_slos("ttft_p99_ms=100,tpot_p99_ms=10")
    assert slos.binding({"p99_ttft_ms": 150.0, "p99_tpot_ms": 30.0}) == "p99_tpot_ms"
    assert slos.binding({"p99_ttft_ms": 150.0, "p99_tpot_ms": 5.0}) == "p99_ttft_ms"
    assert slos.binding({"p99_ttft_ms": 50.0, "p99_tpot_ms": 5.0}) is None
    assert slos.binding({"p99_ttft_ms": 50.0, "p99_tpot_ms": 5.0,
                         "num_unfinished": 3}) == "stability"
    assert slos.binding({"p99_ttft_ms": None, "p99_tpot_ms": 5.0}) == "p99_ttft_ms"


def test_found_rate_names_the_binding_metric_and_prices_it(exp, tmp_path, capsys):
    # TTFT binds first (the queue builds up), TPOT (one step per token) never fails
    table = run_capacity(exp, slo=f"ttft_p99_ms={TTFT_MS},tpot_p99_ms=50", tolerance=0.02,
                         out=tmp_path / "cap")
    row = table.iloc[0]
    assert row["status"] == "found" and row["binding"] == "p99_ttft_ms"
    assert row["max_rate"] < p99_capacity() < row["fail_rate"] <= row["max_rate"] * 1.02
    assert row["cost_per_mtok_usd"] > 0
    assert "binding: p99_ttft_ms" in capsys.readouterr().out


def test_unbounded_when_the_highest_rate_passes(exp, tmp_path, capsys):
    # 3 requests of 10 steps in one batch: no rate can queue them
    text = exp.read_text().replace(f"num_requests: {N}", "num_requests: 3").replace(
        "max_num_seqs: 1", "max_num_seqs: 8")
    exp.write_text(text)
    table = run_capacity(exp, slo="ttft_p99_ms=1000", out=tmp_path / "cap")
    row = table.iloc[0]
    assert row["status"] == "unbounded" and row["max_rate"] == 5 * 2 ** 12
    assert row["cost_per_mtok_usd"] is None and row["binding"] is None
    assert "unbounded: meets the SLOs" in capsys.readouterr().out


def test_issue_llama70b_8xh100_azure_code_tpot_50ms_is_infeasible(tmp_path, capsys):
    """The reported case: Llama-3-70B on 8 H100s (TP 8), the Azure code trace, continuous
    batching without chunking, p99 TPOT <= 50 ms. Long code prompts stall running decodes,
    so TPOT fails whenever two requests overlap; halving the rate used to run 12 times and
    report a near-idle rate as "found" at $41,897 per million tokens."""
    exp = tmp_path / "llama70b.yaml"
    exp.write_text("""
name: llama70b-code
model: llama-3-70b
hardware: h100-sxm
parallelism: {tp: 8}
workload: {trace: azure-code, max_requests: 100}
policy: {name: continuous}
""")
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    code = main(["capacity", str(exp), "--slo", "tpot_p99_ms=50", "--out", str(tmp_path / "c")])
    text = capsys.readouterr().out
    assert code == 0
    row = pd.read_csv(tmp_path / "c" / "capacity.csv").iloc[0]
    assert row["status"] == "infeasible" and math.isnan(row["max_rate"])
    assert row["binding"] == "p99_tpot_ms" and row["p99_tpot_ms"] > 50
    assert math.isnan(row["cost_per_mtok_usd"]) and row["busy_fraction"] < 0.05
    trace = pd.read_csv(tmp_path / "c" / "search.csv")
    assert len(trace) <= 5 and not trace["passed"].any()
    assert "infeasible: p99_tpot_ms=" in text and "found" not in text


@pytest.mark.parametrize("slo,fragment", [
    ("ttft_p98_ms=10", "unknown SLO metric"),
    ("ttft_p99_ms", "NAME=LIMIT"),
    ("ttft_p99_ms=fast", "NAME=LIMIT"),
    ("ttft_p99_ms=-1", "NAME=LIMIT"),
    ("goodput=3", "unknown SLO metric"),
    ("ttft_ms=100", "needs --attainment"),
    ("", "no SLO"),
    ("ttft_p99_ms=1,ttft_p99_ms=2", "twice"),
])
def test_bad_slo_strings_exit_2(exp, tmp_path, capsys, slo, fragment):
    code = main(["capacity", str(exp), "--slo", slo, "--out", str(tmp_path / "cap")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err and fragment in err, err


def test_bad_attainment_tolerance_and_missing_rate_exit_2(exp, tmp_path, capsys):
    assert main(["capacity", str(exp), "--slo", "ttft_ms=1", "--attainment", "1.5"]) == 2
    assert main(["capacity", str(exp), "--slo", "ttft_p99_ms=1", "--attainment", "0.9"]) == 2
    assert main(["capacity", str(exp), "--slo", "ttft_p99_ms=1", "--tolerance", "0"]) == 2
    mix = tmp_path / "mix.yaml"
    mix.write_text(DD1.split("workload:")[0] + """workload:
  mix:
    - {arrival: {process: constant, rate: 2}, num_requests: 5,
       prompt_tokens: {dist: fixed, value: 4}, output_tokens: {dist: fixed, value: 4}}
policy: {name: continuous}
""")
    assert main(["capacity", str(mix), "--slo", "ttft_p99_ms=1"]) == 2
    err = capsys.readouterr().err
    assert "workload.arrival.rate" in err.splitlines()[-1]
    with pytest.raises(CapacityError):
        parse_slos("ttft_p99_ms=1", attainment=0)


def test_overrides_and_sweeps_follow_the_run_rules(exp, tmp_path, capsys):
    # a mapping of overrides works as --set does; --sweep of another key gives one search each
    table = run_capacity(exp, slo=f"ttft_p99_ms={TTFT_MS}", tolerance=0.5,
                         overrides={"workload.num_requests": 50},
                         sweeps={"policy.max_num_seqs": [1, 2]}, out=tmp_path / "c", quiet=True)
    assert list(table["policy.max_num_seqs"]) == [1, 2]
    assert list(table["label"]) == ["continuous policy.max_num_seqs=1",
                                    "continuous policy.max_num_seqs=2"]
    # sweeping the searched rate itself is refused, in one line
    code = main(["capacity", str(exp), "--slo", "ttft_p99_ms=10", "--sweep",
                 "workload.arrival.rate=[1,2]", "--out", str(tmp_path / "d")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "capacity searches over the rate" in err


def test_an_experiment_without_a_rate_to_search_names_its_file(tmp_path, capsys):
    """A mix workload has no one rate: the message names the experiment file (it named only
    ``workload``), exit code 2."""
    exp = tmp_path / "mix.yaml"
    exp.write_text("cost: {kind: constant, step_s: 0.01}\nkv: {num_blocks: 1000}\n"
                   "workload: {mix: [{trace: azure-conv, rate: 2, max_requests: 20}, "
                   "{trace: azure-code, rate: 1, max_requests: 20}]}\n")
    assert main(["capacity", str(exp), "--slo", "ttft_p99_ms=2000", "--out",
                 str(tmp_path / "o"), "--quiet"]) == 2
    assert capsys.readouterr().err == (
        f"batchsim: error: {exp}: workload: no arrival rate to search over; capacity needs "
        "workload.rate (trace replay) or workload.arrival.rate (synthetic)\n")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"tolerance": "x"}, r"^--tolerance: must be a number in \[0\.001, 0\.5\], got 'x'$"),
    ({"tolerance": float("nan")}, r"^--tolerance: must be a number in \[0\.001, 0\.5\]"),
    ({"slo": "ttft_ms=100", "attainment": "0.9"}, r"^--attainment: must be a number in "
     r"\(0, 1\], got '0\.9'$"),
    ({"slo": 5}, r"^--slo: expected text such as 'ttft_p99_ms=2000', got 5$"),
])
def test_run_capacity_misuse_is_one_capacity_error(exp, tmp_path, kwargs, message):
    """From Python the same checks as the flags: they were TypeErrors and AttributeErrors."""
    with pytest.raises(CapacityError, match=message):
        run_capacity(exp, **{"slo": "ttft_p99_ms=100", **kwargs}, out=tmp_path / "o")
