"""What the docs say, held to what the code does: ``batchsim trace``'s run listing and its
``--out`` check, a mixed fleet's ``slot_utilization``, and the figures and lists the docs quote
(the 70B decode-step table, the iteration example's fit, the layer table, summary.csv's column
order, the fidelity table's labels, a config comment's default)."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

import sim
from sim.cli.main import main
from sim.core.types import Request
from sim.metrics.stream import step_sums
from sim.metrics.summary import SUM_INPUTS
from tests.helpers import tiny_experiment

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"

TINY = tiny_experiment("quickstart", 12)


@pytest.fixture(scope="module")
def default_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished experiment in ``<tmp>/runs/quickstart``: where ``batchsim run`` writes by
    default, an output folder whose parent is named ``runs``."""
    root = tmp_path_factory.mktemp("project")
    exp = root / "exp.yaml"
    exp.write_text(TINY)
    out = root / "runs" / "quickstart"
    assert main(["run", str(exp), "--out", str(out), "--quiet"]) == 0
    return out


def _run_ids(out: Path) -> list[str]:
    return sorted(pd.read_csv(out / "summary.csv", dtype={"run_id": str})["run_id"])


# --- batchsim trace (docs/experiments.md) ---------------------------------------------------

def test_trace_of_the_default_output_folder_lists_its_runs(default_out: Path, capsys) -> None:
    """``batchsim trace runs/quickstart`` looked in ``runs/`` (the folder's parent, named
    ``runs``) and listed nothing; it lists the finished runs of ``runs/quickstart/runs``."""
    ids = _run_ids(default_out)
    assert len(ids) == 2
    assert main(["trace", str(default_out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"finished runs in {default_out / 'runs'}: " + ", ".join(ids) in err


def test_trace_of_a_mistyped_run_id_lists_its_siblings(default_out: Path, capsys) -> None:
    ids = _run_ids(default_out)
    assert main(["trace", str(default_out / "runs" / "nope")]) == 2
    err = capsys.readouterr().err
    assert f"finished runs in {default_out / 'runs'}: " + ", ".join(ids) in err


def test_trace_to_an_unusable_place_exits_2_before_reading_the_run(
        default_out: Path, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--out`` under a file (or anywhere it cannot be written) was found only when the trace
    was written, after all the work, and exited 1 as a machine failure; it is one exit-2 line
    naming the path, before the run's tables are read."""
    import sim.experiments.results as results

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the run's tables were read before --out was checked")

    run = default_out / "runs" / _run_ids(default_out)[0]
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    target = blocker / "sub" / "trace.json"
    with monkeypatch.context() as m:
        m.setattr(results, "read_table", never)
        assert main(["trace", str(run), "--out", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"batchsim: error: --out {target}: cannot write the trace there"), err
    assert err.count("\n") == 1
    assert not list(tmp_path.glob("**/*.tmp"))  # the probe leaves nothing behind
    good = tmp_path / "new" / "t.json"  # a folder that does not exist yet is made, as before
    assert main(["trace", str(run), "--out", str(good)]) == 0
    assert good.is_file() and [p.name for p in good.parent.iterdir()] == ["t.json"]


# --- a mixed fleet's slot_utilization (docs/metrics.md, docs/routing.md) --------------------

def _workload(n: int = 160, rate: float = 40.0, seed: int = 2) -> list[Request]:
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate, n))
    return [Request(i, float(t[i]), int(rng.integers(50, 1500)), int(rng.integers(5, 200)))
            for i in range(n)]


def test_a_fleet_of_different_slot_capacities_counts_each_step_against_its_own() -> None:
    """The routing.md groups example (256-row chunked prefill beside 64-row continuous
    batching): the fleet's slot_utilization read 1.0 (each step's slots were its own rows)
    while the groups read a few percent; it is each step's rows over its own replica's slots,
    time-weighted over busy time, so it lies between the groups' values."""
    cluster = {"groups": [
        {"name": "h100", "replicas": 4, "model": "llama-3-8b", "hardware": "h100-sxm"},
        {"name": "a100", "replicas": 4, "model": "llama-3-8b", "hardware": "a100-80gb",
         "tp": 2, "policy": {"name": "continuous", "max_num_seqs": 64}}]}
    res = sim.simulate(_workload(), policy={"name": "chunked_prefill"}, cluster=cluster,
                       router="least_outstanding_tokens")
    st = res.steps
    slots = np.where(st["group"] == "h100", 256, 64)
    dur = st["duration_s"].to_numpy(float)
    expected = float((dur * st["num_seqs"].to_numpy(float) / slots).sum() / dur.sum())
    fleet = res.summary["slot_utilization"]
    assert fleet == pytest.approx(expected, rel=1e-12)
    groups = res.groups.set_index("group")["slot_utilization"]
    assert min(groups) < fleet < max(groups) < 0.5
    # each group's own value is the same rule over its own steps
    mine = st["group"] == "a100"
    assert groups["a100"] == pytest.approx(
        float((dur[mine] * st["num_seqs"][mine] / 64).sum() / dur[mine].sum()), rel=1e-12)


def test_per_step_slot_capacities_equal_one_capacity_when_they_agree() -> None:
    """The per-step form is the single-policy metric where every step has the same slots, and
    a 0 (an unbounded policy) falls back to the step's rows and padding rows, as ``None``."""
    rng = np.random.default_rng(0)
    n = 50
    cols = {k: rng.integers(0, 40, n).astype(float) for k in SUM_INPUTS}
    cols["duration_s"] = rng.uniform(1e-3, 1e-2, n)
    one = step_sums(cols, 64, 16)
    assert step_sums(cols, np.full(n, 64.0), 16)["slot_s"] == pytest.approx(one["slot_s"],
                                                                             rel=1e-14)
    assert step_sums(cols, np.zeros(n), 16)["slot_s"] == pytest.approx(
        step_sums(cols, None, 16)["slot_s"], rel=1e-14)


# --- figures and lists the docs quote -------------------------------------------------------

def _decode_32_ms(gpu: str, tp: int, engine: str) -> float:
    """tests/test_engine_profiles.py's 70B decode step: 32 sequences at 512 tokens."""
    cm = sim.build_cost_model("llama-2-70b", gpu, tp, engine=engine)
    return cm.step_time([1] * 32, [512] * 32) * 1e3


def test_cost_model_70b_decode_table_is_what_the_cost_model_computes() -> None:
    text = (DOCS / "cost-model.md").read_text()
    assert "So a 70B decode step (`llama-2-70b`, 32 sequences, 512 tokens of context)" in text
    for label, gpu in (("A100-80GB", "a100-80gb"), ("H100 SXM", "h100-sxm")):
        row = re.search(rf"^\| {label} \| (.*) \|$", text, re.M)
        assert row, label
        v0 = " | ".join(f"{_decode_32_ms(gpu, tp, 'vllm-v0'):.1f} ms" for tp in (2, 4, 8))
        ideal = " / ".join(f"{_decode_32_ms(gpu, tp, 'ideal'):.1f}" for tp in (2, 4, 8))
        assert row.group(1) == f"{v0} | {ideal} ms"


def test_cost_model_quotes_the_iteration_examples_fit(tmp_path: Path, capsys) -> None:
    report = tmp_path / "fit"
    assert main(["calibrate", "--data",
                 str(REPO / "hardware_profiles/measurements/iteration_example.csv"),
                 "--report", str(report)]) == 0
    row = (report / "report.md").read_text().strip().splitlines()[-3]
    cells = [c.strip() for c in row.strip("|").split("|")]
    held, train, scale = cells[1], cells[2], cells[3]
    text = (DOCS / "cost-model.md").read_text()
    assert (f"The iteration example fits with {held} % held-out MdAPE (train {train} %; "
            f"scale {scale},") in " ".join(text.split())
    assert f"is a sum of kernels: {held} % held-out)" in " ".join(text.split())


def test_architecture_layer_table_names_every_module() -> None:
    text = (DOCS / "architecture.md").read_text()
    for folder in sorted(p for p in (REPO / "sim").iterdir()
                         if p.is_dir() and (p / "__init__.py").is_file()):
        row = re.search(rf"^\| \d+ \| `sim/{folder.name}/` \| (.*) \|$", text, re.M)
        assert row, folder.name
        for module in sorted(folder.glob("*.py")):
            if module.name != "__init__.py":
                assert f"`{module.name}`" in row.group(1), f"sim/{folder.name}/{module.name}"
    assert "is the next step" not in text  # the compiled replica is wired into sim.cluster


def test_experiments_doc_says_how_many_timelines_the_report_draws() -> None:
    from sim.report.plots import MAX_TIMELINES

    words = {4: "four", 5: "five", 6: "six", 8: "eight"}
    text = " ".join((DOCS / "experiments.md").read_text().split())
    assert f"for each of the first {words[MAX_TIMELINES]} series" in text


def test_summary_csv_columns_are_the_keys_then_summary_json_sorted(default_out: Path) -> None:
    """docs/metrics.md: after ``tp`` the rest of summary.json in alphabetical order (so
    ``num_blocks`` sits among the metrics, not before them)."""
    cols = list(pd.read_csv(default_out / "summary.csv").columns)
    assert cols[:7] == ["run_id", "label", "policy", "workload.arrival.rate", "model",
                        "hardware", "tp"]
    assert cols[7:] == sorted(cols[7:]) and cols[7] == "batchsim_version"
    assert cols.index("num_blocks") > cols.index("mfu")
    text = " ".join((DOCS / "metrics.md").read_text().split())
    assert "`tp`, then the rest of the run's `summary.json` in alphabetical order" in text


def test_kv_layout_comment_quotes_the_livelock_guards_default() -> None:
    from sim.kv.config import KV_FIELDS

    text = (REPO / "experiments" / "kv_layout.yaml").read_text()
    quoted = re.findall(r"livelock guard \(default (\d+)\)", text)
    assert quoted == [str(KV_FIELDS["max_preemptions"].default)]


def test_correctness_doc_names_every_type_checked_package() -> None:
    files = yaml.safe_load("x: " + re.search(r'^files = (\[.*\])$',
                                             (REPO / "pyproject.toml").read_text(),
                                             re.M).group(1))["x"]
    bullet = next(line for line in (DOCS / "correctness.md").read_text().splitlines()
                  if line.startswith("- **Types**"))
    for package in files:
        assert f"`{package}/`" in bullet, package


def test_fidelity_script_prints_the_docs_table(capsys) -> None:
    """benchmarks/fidelity_table.py printed other labels (TP "1-8" for the 2-8 GPU NCCL
    all-reduce, "per GPU" for Vidur's TP 1-8 operators); every row it prints is the doc's."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import fidelity_table
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    fidelity_table.ROWS.clear()
    fidelity_table.COVERAGE.clear()
    fidelity_table.main()
    printed = capsys.readouterr().out.split("\n\n")[0].splitlines()
    doc = (DOCS / "cost-model.md").read_text().splitlines()
    start = doc.index(printed[0])
    table = doc[start:doc.index("", start)]
    # the one row read from ../shared (Vidur's A100 operators) is left out where it is absent
    assert printed == [line for line in table if line in printed]
    assert [line for line in table if line not in printed] in (
        [], [next(line for line in table if "never fitted on" in line)])
