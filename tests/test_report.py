"""Plots, report.md, ``batchsim plot`` regeneration and the Chrome trace export."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from sim.api import run_experiment
from sim.experiments.config import expand_runs
from sim.experiments.results import read_table
from sim.experiments.runner import run_id
from sim.report.context import build_context
from sim.report.markdown import regenerate, write_outputs
from sim.report.tables import markdown_table
from sim.report.trace_export import export_chrome_trace

PNG = b"\x89PNG\r\n\x1a\n"

EXPERIMENT = {
    "name": "tiny",
    "description": "Two policies at two loads.",
    "cost": {"kind": "constant", "step_s": 0.01},
    "kv": {"unlimited": True},
    "slos": {"ttft_ms": 200},
    "workload": {"arrival": {"process": "poisson", "rate": 4.0}, "num_requests": 50,
                 "prompt_tokens": {"dist": "uniform", "lo": 10, "hi": 100},
                 "output_tokens": {"dist": "uniform", "lo": 5, "hi": 50}},
    # the second label is invalid mathtext, markdown and HTML all at once: drawn as typed
    "policies": [{"name": "continuous"}, {"name": "continuous", "mode": "orca",
                                          "max_num_seqs": 4, "label": "$\\frac{$ <b>|&"}],
    "sweep": {"workload.arrival.rate": [4.0, 8.0]},
}


def _run(folder: Path, experiment: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "exp.yaml"
    path.write_text(yaml.safe_dump(experiment), encoding="utf-8")
    run_experiment(path, out=folder / "out", quiet=True)
    return folder / "out"


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _run(tmp_path_factory.mktemp("report"), EXPERIMENT)


def _pngs(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((out / "plots").glob("*.png"))}


def _series(out: Path) -> list[str]:
    raw = yaml.safe_load((out / "experiment.yaml").read_text())["experiment"]
    base, runs = expand_runs(raw)
    summary = pd.read_csv(out / "summary.csv", dtype={"run_id": str})
    return build_context(out, base, runs, summary).series


def test_plots_and_report(out: Path) -> None:
    pngs = _pngs(out)
    for name in ("latency_vs_load", "throughput_vs_latency", "latency_cdf", "utilization",
                 "goodput_vs_load"):
        assert f"{name}.png" in pngs
    assert sum(n.startswith("timeline_") for n in pngs) == 2
    assert all(data.startswith(PNG) and len(data) > 5000 for data in pngs.values())
    report = (out / "report.md").read_text(encoding="utf-8")
    assert report.startswith("# tiny\n")
    assert "Two policies at two loads." in report
    assert "| policy | rate | done |" in report
    assert report.count("\n| continuous |") == 2 * 2  # compact and full table, two rates
    assert report.count("\n| $\\frac{$ &lt;b>\\|&") == 2 * 2  # pipe and tag escaped
    assert len(set(_series(out))) == 2
    for name in pngs:
        assert f"](plots/{name})" in report
    assert "Failed" not in report


def test_report_headline_links_and_captions(out: Path) -> None:
    """report.md opens with the per-policy answer, links every run, explains every plot and
    keeps the first table compact (the full one folded away)."""
    report = (out / "report.md").read_text(encoding="utf-8")
    head = report.split("## Setup")[0]
    assert "Highest swept request rate meeting the SLOs (p99 TTFT ≤ 200 ms" in head
    for name in _series(out):
        assert f"- {name.replace('|', chr(92) + '|').replace('<', '&lt;')}: " in head
    summary = pd.read_csv(out / "summary.csv", dtype={"run_id": str})
    for rid in summary["run_id"]:
        assert f"[{rid}](runs/{rid}/) · [config](runs/{rid}/config.yaml)" in report
    tables = report.split("## Summary")[1].split("## Plots")[0]
    compact, full = tables.split("<details>")
    header = next(line for line in compact.splitlines() if line.startswith("| policy"))
    assert header.count("|") - 1 <= 11 and "SLOs met" in header
    assert "<summary>All columns</summary>" in full and "p50 TTFT ms" in full
    plots = report.split("## Plots")[1]
    blocks = [b for b in plots.split("\n\n") if b.strip()]
    for i, block in enumerate(blocks):
        if block.startswith("!["):
            assert blocks[i - 1].endswith(".") and not blocks[i - 1].startswith("![")


def test_report_html_written(out: Path) -> None:
    page = (out / "report.html").read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    assert "<script src" not in page and "<link" not in page  # self-contained: nothing fetched
    assert page.count('class="plotly-graph-div"') == len(_pngs(out))
    assert "&lt;b&gt;|&amp;" in page and "<b>|&" not in page  # the label is escaped
    assert not list(out.glob(".*.tmp"))


def test_regenerate_reproduces(out: Path) -> None:
    report = (out / "report.md").read_text(encoding="utf-8")
    page = (out / "report.html").read_text(encoding="utf-8")
    names = set(_pngs(out))
    shutil.rmtree(out / "plots")
    (out / "report.md").unlink()
    (out / "report.html").unlink()
    regenerate(out)
    assert (out / "report.md").read_text(encoding="utf-8") == report
    assert (out / "report.html").read_text(encoding="utf-8") == page
    assert set(_pngs(out)) == names


def test_regenerate_rejects_other_folders(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a batchsim output folder"):
        regenerate(tmp_path)


def test_failed_runs_listed(out: Path, tmp_path: Path) -> None:
    raw = yaml.safe_load((out / "experiment.yaml").read_text())["experiment"]
    base, runs = expand_runs(raw)
    summary = pd.read_csv(out / "summary.csv", dtype={"run_id": str})
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    bad = run_id(runs[1].config)
    (copy / "runs" / bad / "summary.json").unlink()
    (copy / "runs" / bad / "error.txt").write_text("RuntimeError: boom\n\ntraceback...")
    write_outputs(copy, base, runs, summary[summary["run_id"] != bad], plots=False)
    report = (copy / "report.md").read_text(encoding="utf-8")
    assert (f"- `{bad}` ([error.txt](runs/{bad}/error.txt)) (continuous "
            "workload.arrival.rate=8.0): RuntimeError: boom") in report
    assert "](plots/" not in report


def test_without_load_axis_draws_bars(tmp_path: Path) -> None:
    exp = {k: v for k, v in EXPERIMENT.items() if k not in ("sweep", "slos")}
    out = _run(tmp_path, exp)
    pngs = _pngs(out)
    assert "goodput.png" not in pngs and "goodput_vs_load.png" not in pngs
    assert "throughput_vs_latency.png" not in pngs  # single runs: no one-point frontier
    assert {"latency.png", "utilization.png", "latency_cdf.png"} <= set(pngs)
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "x axis: none (single)" in report
    assert "Best output throughput per policy:" in report


def test_markdown_table_formatting() -> None:
    df = pd.DataFrame({"name": ["a|b", "c"], "n": [3, 40], "x": [0.012345, 1234.567],
                       "y": [float("nan"), 12.345]})
    text = markdown_table(df, ["name", "n", "x", "y", "missing"], {"n": "count"})
    lines = text.splitlines()
    assert lines[0] == "| name | count | x | y |"
    assert lines[1] == "|:---|---:|---:|---:|"
    assert lines[2] == "| a\\|b | 3 | 0.0123 | – |"
    assert lines[3] == "| c | 40 | 1,235 | 12.3 |"


def test_a_trace_export_never_replaces_a_file_it_did_not_write(out: Path, tmp_path: Path,
                                                                capsys) -> None:
    """``batchsim trace RUN --out FILE`` replaced any file (a user's, or the folder's own
    summary.csv) and at a folder failed with exit 1; a trace it wrote is still rewritten."""
    from sim.cli.main import main

    run = next(p for p in (out / "runs").iterdir() if (p / "summary.json").is_file())
    mine = tmp_path / "mine.json"
    mine.write_text("mine")
    for target, words in [(mine, "exists and is not a trace batchsim wrote, so it is not "
                                 "replaced: remove it or give another file name"),
                          (out / "summary.csv", "exists and is not a trace batchsim wrote"),
                          (tmp_path, f"a folder; give the trace's file name (e.g. "
                                     f"{tmp_path / 'trace.json'})")]:
        before = target.read_bytes() if target.is_file() else None
        assert main(["trace", str(run), "--out", str(target)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"batchsim: error: --out {target}: {words}"), err
        assert before is None or target.read_bytes() == before
    ours = tmp_path / "t.json"
    assert main(["trace", str(run), "--out", str(ours)]) == 0
    assert main(["trace", str(run), "--out", str(ours)]) == 0


def test_chrome_trace(out: Path, tmp_path: Path) -> None:
    run = out / "runs" / str(pd.read_csv(out / "summary.csv", dtype={"run_id": str})
                             ["run_id"].iloc[0])
    steps, requests = read_table(run / "steps"), read_table(run / "requests")
    path = export_chrome_trace(steps, tmp_path / "trace.json", requests, max_requests=20)
    doc = json.loads(path.read_text(encoding="utf-8"))
    events = doc["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == len(steps)
    assert {e["name"] for e in complete} <= {"prefill", "decode", "mixed", "idle"}
    first = complete[0]
    assert first["ts"] == pytest.approx(steps["start_s"].iloc[0] * 1e6)
    assert first["dur"] == pytest.approx(steps["duration_s"].iloc[0] * 1e6)
    assert {"num_seqs", "prefill_tokens", "decode_tokens", "padding_tokens",
            "bound"} <= set(first["args"])
    counters = {e["name"] for e in events if e["ph"] == "C"}
    assert counters == {"batch size", "queue length", "KV blocks"}
    begins = [e for e in events if e["ph"] == "b"]
    ends = [e for e in events if e["ph"] == "e"]
    assert len(begins) == len(ends) == 3 * 20
    assert sum(e["name"].startswith("request ") for e in begins) == 20
    assert any(e["ph"] == "M" and e["args"].get("name") == "replica 0" for e in events)
    assert doc["otherData"]["requests_total"] == len(requests)


@pytest.mark.parametrize(("text", "words"), [
    ("- 1\n- 2\n", "expected the mapping batchsim writes, with the experiment under "
                   "'experiment:' (the file was edited or replaced)"),
    ("source: x\n", "expected the mapping batchsim writes"),
    ("[1, 2", "while parsing a flow sequence"),
])
def test_plot_of_a_folder_with_a_damaged_experiment_yaml_says_so(out: Path, tmp_path: Path,
                                                                 capsys, text, words) -> None:
    """A list there read "list indices must be integers or slices, not str"."""
    import shutil

    from sim.cli.main import main

    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    (copy / "experiment.yaml").write_text(text)
    assert main(["plot", str(copy)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"batchsim: error: {copy / 'experiment.yaml'}: cannot rebuild the "
                          f"experiment: {words}"), err
