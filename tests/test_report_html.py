"""report.html in a real headless Chromium: no console errors, every chart rendered, the table's
numbers equal summary.csv, sorting and legend toggles work, and a broken chart is caught.

Chromium comes from Debian's package (``.ci/run`` installs it when missing). Without it this
test fails; outside CI (``CI`` not ``true``) ``BATCHSIM_SKIP_BROWSER=1`` lets it skip instead.
"""
from __future__ import annotations

import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from browser import find_chromium, load_page

from sim.api import run_experiment
from sim.experiments.config import expand_runs
from sim.report.context import build_context, fmt
from sim.report.plots import plan

EXPERIMENT = {
    "name": "browser",
    "cost": {"kind": "constant", "step_s": 0.01},
    "kv": {"unlimited": True},
    "slos": {"ttft_ms": 100},
    "workload": {"arrival": {"process": "poisson", "rate": 4.0}, "num_requests": 30,
                 "prompt_tokens": {"dist": "uniform", "lo": 10, "hi": 100},
                 "output_tokens": {"dist": "uniform", "lo": 5, "hi": 30}},
    "policies": [{"name": "continuous"},
                 {"name": "continuous", "mode": "orca", "max_num_seqs": 2,
                  "label": "$\\frac{$ <i>x</i> & 'q\""}],
    "sweep": {"workload.arrival.rate": [4.0, 16.0], "seed": [0, 1]},
}

#: What the page reports back: every chart div, the table cells, and the page's scripts.
PROBE = """JSON.stringify({
  charts: Array.from(document.querySelectorAll("div.chart .plotly-graph-div")).map(function (d) {
    var svg = d.querySelector(".main-svg"), r = svg ? svg.getBoundingClientRect() : null;
    return {id: d.id, svg: !!svg, w: r ? r.width : 0, h: r ? r.height : 0,
            traces: d.querySelectorAll(".scatterlayer .trace, .barlayer .trace").length};
  }),
  captions: document.querySelectorAll("div.chart .caption").length,
  rows: Array.from(document.querySelectorAll("#summary tbody tr")).map(function (tr) {
    return {run: tr.dataset.run, cells: Array.from(tr.querySelectorAll("td[data-col]")).map(
      function (td) { return [td.dataset.col, td.textContent, td.dataset.v,
                              td.offsetParent !== null]; })};
  }),
  headline: Array.from(document.querySelectorAll("#headline li")).map(function (li) {
    return li.textContent; }),
  links: Array.from(document.querySelectorAll("#summary a")).map(function (a) {
    return a.getAttribute("href"); }),
  external: Array.from(document.querySelectorAll("script[src], link[href]")).length
})"""
#: Sorts the table by its req/s column twice (ascending, then descending) and reports each
#: order of that column's values (run after ``PROBE``, on the same page load).
SORT = """(function () {
  var th = document.querySelector('#summary th[data-col="request_throughput"]');
  var col = function () { return Array.from(document.querySelectorAll(
      '#summary tbody td[data-col="request_throughput"]')).map(function (td) {
        return parseFloat(td.dataset.v); }); };
  th.click(); var up = col(); th.click(); var down = col();
  return JSON.stringify({up: up, down: down});
})()"""
#: Clicks the first legend entry of the latency chart (as a user would) and reports each
#: trace's legend group and visibility before and after.
TOGGLE = r"""(function () {
  var gd = document.getElementById("chart-latency_vs_load");
  var seen = function () { return gd.data.map(function (t) {
    return [t.legendgroup, t.visible === undefined ? true : t.visible]; }); };
  var before = seen(), el = gd.querySelector(".legend .traces .legendtoggle");
  var r = el.getBoundingClientRect();
  var at = {bubbles: true, cancelable: true, clientX: r.x + 5, clientY: r.y + 5, button: 0,
            view: window};
  ["mousedown", "mouseup", "click"].forEach(function (type) {
    el.dispatchEvent(new MouseEvent(type, at)); });
  return new Promise(function (done) { setTimeout(function () {
    done(JSON.stringify({before: before, after: seen()})); }, 500); });
})()"""
READY = ("document.querySelectorAll('div.chart .plotly-graph-div').length === "
         "document.querySelectorAll('div.chart .plotly-graph-div .main-svg').length")


def _chromium() -> None:
    if find_chromium():
        return
    if os.environ.get("CI") != "true" and os.environ.get("BATCHSIM_SKIP_BROWSER") == "1":
        pytest.skip("chromium not installed and BATCHSIM_SKIP_BROWSER=1")
    pytest.fail("chromium not found: install Debian's package (apt-get install chromium; "
                ".ci/run does) or, outside CI only, set BATCHSIM_SKIP_BROWSER=1 to skip")


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    _chromium()
    folder = tmp_path_factory.mktemp("html")
    (folder / "exp.yaml").write_text(yaml.safe_dump(EXPERIMENT), encoding="utf-8")
    run_experiment(folder / "exp.yaml", out=folder / "out", quiet=True)
    return folder / "out"


def _probe(page: Path) -> tuple[list[str], dict[str, Any]]:
    """Load ``page`` once: (console errors, the ``PROBE`` result with the ``sort`` and
    ``toggle`` results added)."""
    errors, value = load_page(page, f"Promise.all([{PROBE}, {SORT}, {TOGGLE}])", READY)
    probe = json.loads(value[0])
    probe["sort"], probe["toggle"] = json.loads(value[1]), json.loads(value[2])
    return errors, probe


@pytest.fixture(scope="module")
def page(out: Path) -> tuple[list[str], dict[str, Any]]:
    return _probe(out / "report.html")


def chart_failures(probe: dict[str, Any], expected: list[str]) -> list[str]:
    """Why the page's charts do not match ``expected`` chart ids (empty when all rendered)."""
    got = {c["id"]: c for c in probe["charts"]}
    bad = [f"{name}: missing" for name in expected if name not in got]
    for name, c in got.items():
        if not (c["svg"] and c["w"] > 100 and c["h"] > 100 and c["traces"] > 0):
            bad.append(f"{name}: not rendered ({c})")
    return bad


def _expected_charts(out: Path) -> list[str]:
    raw = yaml.safe_load((out / "experiment.yaml").read_text())["experiment"]
    base, runs = expand_runs(raw)
    summary = pd.read_csv(out / "summary.csv", dtype={"run_id": str})
    return [f"chart-{c.name}" for c in plan(build_context(out, base, runs, summary))]


def test_report_renders_in_chromium(out: Path, page: tuple[list[str], dict[str, Any]]) -> None:
    errors, probe = page
    assert errors == []
    expected = _expected_charts(out)
    assert len(expected) >= 6  # latency, frontier, CDF, utilization, goodput, timelines
    assert chart_failures(probe, expected) == []
    assert probe["captions"] == len(expected)
    assert probe["external"] == 0
    assert len(probe["headline"]) == 2
    assert probe["headline"][1].startswith("$\\frac{$ <i>x</i> & 'q\": ")  # shown as typed


def test_table_numbers_equal_summary_csv(out: Path,
                                         page: tuple[list[str], dict[str, Any]]) -> None:
    _, probe = page
    summary = pd.read_csv(out / "summary.csv", dtype={"run_id": str}).set_index("run_id")
    assert sorted(r["run"] for r in probe["rows"]) == sorted(summary.index)
    checked = 0
    for row in probe["rows"]:
        for col, shown, exact, _ in row["cells"]:
            if col not in summary.columns or not isinstance(summary.at[row["run"], col],
                                                            (int, float)):
                continue
            value = float(summary.at[row["run"], col])
            if math.isnan(value):
                assert shown == "–"
                continue
            assert float(exact) == value, (row["run"], col)
            assert shown == fmt(value), (row["run"], col)
            assert abs(float(shown.replace(",", "")) - value) <= 0.005 * abs(value) + 0.5, col
            checked += 1
        assert any(v for *_, v in row["cells"])  # the compact columns are shown
    assert checked >= len(summary) * 10
    links = set(probe["links"])
    for rid in summary.index:
        assert {f"runs/{rid}/", f"runs/{rid}/config.yaml", f"runs/{rid}/summary.json"} <= links


def test_table_sorts(page: tuple[list[str], dict[str, Any]]) -> None:
    order = page[1]["sort"]
    assert order["up"] == sorted(order["up"]) and order["down"] == sorted(order["down"])[::-1]


def test_legend_click_toggles_a_series_in_every_panel(
        page: tuple[list[str], dict[str, Any]]) -> None:
    toggle = page[1]["toggle"]
    first = toggle["before"][0][0]
    assert all(visible is True for _, visible in toggle["before"])
    hidden = [group for group, visible in toggle["after"] if visible == "legendonly"]
    assert hidden == [first] * 6  # p50 and p99 in each of the three panels
    assert sum(group != first for group, _ in toggle["after"]) > 0


def test_a_broken_chart_fails_the_check(out: Path, tmp_path: Path) -> None:
    """The check must catch a chart that does not render: here one chart's script targets a
    missing element, so plotly throws and its div stays empty."""
    text = (out / "report.html").read_text(encoding="utf-8")
    call = re.compile(r'Plotly\.newPlot\(\s*"chart-latency_cdf"')
    assert len(call.findall(text)) == 1
    broken = tmp_path / "report.html"
    broken.write_text(call.sub('Plotly.newPlot("no-such-chart"', text), encoding="utf-8")
    errors, probe = _probe(broken)
    assert errors  # the uncaught exception is reported
    failures = chart_failures(probe, _expected_charts(out))
    assert len(failures) == 1 and failures[0].startswith("chart-latency_cdf: not rendered")


def test_missing_chromium_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    """Never a silent skip: without Chromium the test fails, in CI always; elsewhere it skips
    only when BATCHSIM_SKIP_BROWSER=1 says so."""
    monkeypatch.setattr(sys.modules[__name__], "find_chromium", lambda: None)
    monkeypatch.setenv("BATCHSIM_SKIP_BROWSER", "1")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception):
        _chromium()
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception):
        _chromium()
    monkeypatch.delenv("BATCHSIM_SKIP_BROWSER")
    with pytest.raises(pytest.fail.Exception):
        _chromium()
