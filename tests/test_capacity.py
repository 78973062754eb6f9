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

STEP, OUT_TOKENS, N, TTFT_MS = 0.01, 10, 200, 1000.0
SERVICE = STEP * OUT_TOKENS

DD1 = f"""
name: dd1
cost: {{kind: constant, step_s: {STEP}}}
kv: {{unlimited: true}}
workload:
  arrival: {{process: constant, rate: 5}}
  num_requests: {N}
  prompt_tokens: {{dist: fixed, value: 10}}
  output_tokens: {{dist: fixed, value: {OUT_TOKENS}}}
policy: {{name: continuous, max_num_seqs: 1}}
sweep:
  workload.arrival.rate: [1, 2, 3]
output: {{plots: false}}
"""


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


def test_impossible_slo_reports_none(exp, tmp_path):
    table = run_capacity(exp, slo="ttft_p99_ms=5", out=tmp_path / "cap", quiet=True)
    assert table.loc[0, "status"] == "none" and math.isnan(table.loc[0, "max_rate"])


def test_search_statuses():
    def passes_below(limit):
        return lambda rates, phase: [r <= limit for r in rates]

    rate, status = search(1.0, 0.01, 1, passes_below(3.3))
    assert status == "found" and 3.3 / 1.01 <= rate <= 3.3
    rate, status = search(8.0, 0.01, 3, passes_below(0.7))
    assert status == "found" and 0.7 / 1.01 <= rate <= 0.7
    assert search(1.0, 0.01, 2, passes_below(math.inf)) == (4096.0, "at least")
    assert math.isnan(search(1.0, 0.01, 1, passes_below(0))[0])


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
