"""Hardening regressions: user files under ``--out`` survive a run, invalid requests are
rejected before a simulation starts, and gzip-compressed traces load like plain ones."""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

import sim
import sim.experiments.results as results
from sim.api import run_experiment
from sim.core.arrays import TraceArrays
from sim.core.errors import InputError
from sim.engine.inputs import request_columns
from sim.experiments.results import atomic_write, is_temp_file, write_text
from sim.experiments.run import clean_temp_files
from tests.helpers import SMALL_EXPERIMENT as SMALL

# --- 1. only batchsim's own temporary files are cleaned ---------------------------------------

def test_run_keeps_user_dot_tmp_files_under_out(tmp_path):
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump(SMALL, sort_keys=False))
    out = tmp_path / "proj"
    (out / "runs" / "abc").mkdir(parents=True)
    (out / "notes").mkdir()
    mine = [out / ".draft.tmp", out / "notes" / ".draft.tmp", out / "runs" / "abc" / ".x.tmp",
            out / ".summary.csv.abc123.tmp"]
    for p in mine:
        p.write_text("mine\n")
    debris = [out / ".summary.csv.batchsim-q1w2e3.tmp",
              out / "runs" / "abc" / ".summary.json.batchsim-zz.tmp"]
    for p in debris:
        p.write_text("half")
    run_experiment(exp, out=out, quiet=True)
    for p in mine:
        assert p.read_text() == "mine\n", p
    for p in debris:
        assert not p.exists(), p


def test_clean_temp_files_only_in_batchsim_folders(tmp_path):
    out = tmp_path / "out"
    deep = out / "data" / "sub"
    deep.mkdir(parents=True)
    (out / "plots").mkdir()
    outside = deep / ".t.batchsim-abc.tmp"  # not a folder batchsim writes into
    outside.write_text("x")
    inside = out / "plots" / ".a.png.batchsim-abc.tmp"
    inside.write_text("x")
    assert clean_temp_files(out) == 1
    assert outside.exists() and not inside.exists()
    assert clean_temp_files(tmp_path / "missing") == 0


def test_atomic_write_names_its_temporary_file_and_fsyncs_before_rename(tmp_path, monkeypatch):
    events: list[str] = []
    seen: list[Path] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(results.os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd)))
    monkeypatch.setattr(results.os, "replace",
                        lambda a, b: (events.append("replace"), real_replace(a, b)))

    def write(p: Path) -> None:
        seen.append(p)
        p.write_text("data")

    atomic_write(tmp_path / "f.txt", write)
    assert events == ["fsync", "replace", "fsync"]  # the file, then its folder entry
    assert (tmp_path / "f.txt").read_text() == "data"
    assert seen[0].name.startswith(".f.txt.batchsim-") and seen[0].name.endswith(".tmp")
    assert is_temp_file(seen[0])
    assert not is_temp_file(Path(".draft.tmp")) and not is_temp_file(Path("a.batchsim-x.tmp"))
    write_text(tmp_path / "g.txt", "hi")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.txt", "g.txt"]


# --- 2. requests are validated before a simulation starts ------------------------------------

def _reqs(**bad):
    """Four good requests; ``bad`` replaces fields of the one with id 3 (position 2)."""
    rows = [sim.Request(0, 0.0, 5, 5), sim.Request(1, 0.5, 8, 3), sim.Request(3, 1.0, 4, 4),
            sim.Request(4, 2.0, 6, 2)]
    rows[2] = sim.Request(**{**{"id": 3, "arrival_s": 1.0, "num_prompt_tokens": 4,
                                "num_output_tokens": 4}, **bad})
    return rows


BAD_REQUESTS = [
    ({"arrival_s": float("nan")}, "requests[2].arrival_s: must be a finite number >= 0, got nan"),
    ({"arrival_s": float("inf")}, "requests[2].arrival_s: must be a finite number >= 0, got inf"),
    ({"arrival_s": -1.0}, "requests[2].arrival_s: must be a finite number >= 0, got -1.0"),
    ({"arrival_s": "1.0"}, "requests[2].arrival_s: must be a finite number >= 0, got '1.0'"),
    ({"num_prompt_tokens": 0}, "requests[2].num_prompt_tokens: must be an integer >= 1, got 0"),
    ({"num_output_tokens": -3}, "requests[2].num_output_tokens: must be an integer >= 1, got -3"),
    ({"num_output_tokens": 2.0}, "requests[2].num_output_tokens: must be an integer >= 1, got 2.0"),
    ({"num_prompt_tokens": "4"}, "requests[2].num_prompt_tokens: must be an integer >= 1, got '4'"),
    ({"num_prompt_tokens": True},
     "requests[2].num_prompt_tokens: must be an integer >= 1, got True"),
    # the other int64 columns and the labels (they ran, or failed after the whole run)
    ({"priority": "high"}, "requests[2].priority: must be an integer within int64, got 'high'"),
    ({"priority": 2**70}, "requests[2].priority: must be an integer within int64, got "
     f"{2**70}"),
    ({"tenant": 5}, "requests[2].tenant: must be a string or None, got 5"),
    ({"prefix_id": 7}, "requests[2].prefix_id: must be a string or None, got 7"),
    ({"prefix_id": "p", "num_prefix_tokens": 2.5}, "requests[2].num_prefix_tokens: must be an "
     "integer >= 0, got 2.5"),
    ({"num_prefix_tokens": -1}, "requests[2].num_prefix_tokens: must be an integer >= 0, "
     "got -1"),
]


@pytest.mark.parametrize("rid", ["a", 2**70, 1.0])
def test_request_ids_are_int64_integers(rid):
    """A string id, or one past int64, failed building the requests table after the run."""
    with pytest.raises(InputError) as info:
        sim.simulate(_reqs(id=rid), policy="continuous", cost=sim.ConstantCost(0.1))
    assert str(info.value) == (f"requests[2].id: must be an integer within int64, got "
                               f"{rid!r} (id {rid!r})")


@pytest.mark.parametrize("fast_path", [True, False])
@pytest.mark.parametrize(("bad", "message"), BAD_REQUESTS)
def test_simulate_rejects_bad_requests_naming_request_and_field(bad, message, fast_path):
    with pytest.raises(InputError) as info:
        sim.simulate(_reqs(**bad), policy="continuous", cost=sim.ConstantCost(0.1),
                     fast_path=fast_path)
    assert str(info.value) == message + " (id 3)"


@pytest.mark.parametrize("fast_path", [True, False])
def test_simulate_with_nan_arrival_in_columns_returns_an_error(fast_path):
    arrays = TraceArrays.from_requests(_reqs())
    arrival = arrays.arrival_s.copy()
    arrival[1] = np.nan
    with pytest.raises(InputError, match=r"^requests\[1\]\.arrival_s: must be a finite number "
                                         r">= 0, got nan$"):
        sim.simulate(arrays.with_arrivals(arrival), policy="continuous",
                     cost=sim.ConstantCost(0.1), fast_path=fast_path)


def test_columnar_token_counts_must_be_integers_at_least_one():
    base = TraceArrays.from_requests(_reqs())
    floats = TraceArrays(base.arrival_s, base.num_prompt_tokens.astype(float),
                         base.num_output_tokens)
    with pytest.raises(InputError, match=r"requests\[0\]\.num_prompt_tokens: must be an integer"):
        request_columns(floats)
    zero = base.num_output_tokens.copy()
    zero[3] = 0
    with pytest.raises(InputError, match=r"^requests\[3\]\.num_output_tokens: .* got 0$"):
        request_columns(TraceArrays(base.arrival_s, base.num_prompt_tokens, zero))
    # numpy integers of any width are fine, as Request fields and as columns
    ok = request_columns(TraceArrays(base.arrival_s, base.num_prompt_tokens.astype(np.int32),
                                     base.num_output_tokens.astype(np.uint16)))
    assert ok["num_prompt_tokens"].dtype == np.int64
    request_columns([sim.Request(0, np.float32(0.5), np.int32(3), np.uint8(2))])


def test_duplicate_ids_name_both_requests():
    reqs = [sim.Request(1, 0.0, 5, 5), sim.Request(2, 0.0, 5, 5), sim.Request(1, 1.0, 5, 5)]
    for fast_path in (True, False):
        with pytest.raises(InputError, match=r"^requests\[2\]\.id: request ids must be unique: "
                                             r"1 repeats requests\[0\]$"):
            sim.simulate(reqs, policy="continuous", cost=sim.ConstantCost(0.1),
                         fast_path=fast_path)


@pytest.mark.parametrize(("kw", "field"), [
    ({"horizon_s": float("nan")}, "horizon_s"), ({"horizon_s": -1.0}, "horizon_s"),
    ({"wall_clock_s": float("nan")}, "wall_clock_s"),
    ({"wall_clock_s": float("inf")}, "wall_clock_s"),
    # the YAML's rules (one table, LIMIT_FIELDS): None, not inf, means no limit
    ({"horizon_s": float("inf")}, "horizon_s"), ({"horizon_s": "10"}, "horizon_s"),
    ({"max_model_len": 0}, "max_model_len"), ({"max_model_len": 2**60}, "max_model_len")])
def test_simulate_rejects_bad_run_limits(kw, field):
    with pytest.raises(InputError, match=f"^{field}: (must be|expected)"):
        sim.simulate(_reqs(), policy="continuous", cost=sim.ConstantCost(0.1), **kw)


def test_valid_limits_still_run():
    res = sim.simulate(_reqs(), policy="continuous", cost=sim.ConstantCost(0.1),
                       horizon_s=1e6, wall_clock_s=60.0)
    assert res.summary["num_unfinished"] == 0


def test_validating_a_million_columnar_requests_takes_milliseconds():
    n = 1_000_000
    arrays = TraceArrays(np.linspace(0.0, 1000.0, n), np.full(n, 100, dtype=np.int64),
                         np.full(n, 50, dtype=np.int64))
    request_columns(arrays)  # warm up
    t0 = time.perf_counter()
    cols = request_columns(arrays)
    assert time.perf_counter() - t0 < 0.5  # about 10 ms; generous for a loaded machine
    assert len(cols["id"]) == n


@pytest.mark.parametrize("fast_path", [True, False])
@pytest.mark.parametrize(("column", "bad", "message"), [
    ("priority", np.array([0, 1, "high", 3], dtype=object),
     "requests[2].priority: must be an integer within int64, got 'high'"),
    ("priority", np.array([0, 1, 2**70, 3], dtype=object),
     f"requests[2].priority: must be an integer within int64, got {2**70}"),
    ("priority", np.array([0.0, 1.0, 2.5, 3.0]),
     "requests[0].priority: must be an integer within int64, got 0.0"),
    ("tenant", np.array(["a", None, 5, "b"], dtype=object),
     "requests[2].tenant: must be a string or None, got 5"),
    ("prefix_id", [None, None, 7, None], "requests[2].prefix_id: must be a string or None, got 7"),
    ("num_prefix_tokens", np.array([0, 0, -1, 0]),
     "requests[2].num_prefix_tokens: must be an integer >= 0, got -1"),
])
def test_columnar_priorities_and_labels_are_checked_as_requests_are(column, bad, message,
                                                                   fast_path):
    """A ``TraceArrays`` built by hand skipped the priority, prefix-length and label checks of
    the ``Request`` path (a string priority or an int tenant ran, or failed after the run);
    both now run ``_check_extras``, with the same message (ids are the row numbers)."""
    import dataclasses

    base = TraceArrays.from_requests([sim.Request(i, float(i), 5, 3) for i in range(4)])
    with pytest.raises(InputError) as info:
        sim.simulate(dataclasses.replace(base, **{column: bad}), policy="continuous",
                     cost=sim.ConstantCost(0.1), fast_path=fast_path)
    assert str(info.value) == message
    rows = base.to_requests()
    value = bad[2] if column != "priority" or message.startswith("requests[2]") else bad[0]
    at = 2 if message.startswith("requests[2]") else 0
    rows[at] = dataclasses.replace(rows[at], **{column: value})
    with pytest.raises(InputError) as info:
        sim.simulate(rows, policy="continuous", cost=sim.ConstantCost(0.1), fast_path=fast_path)
    assert str(info.value) == message
    # good columns of every kind still run: numpy ints of any width, string arrays
    good = dataclasses.replace(base, priority=np.arange(4, dtype=np.uint8),
                               tenant=np.array(["x", "y", "x", "y"]))
    sim.simulate(good, policy="continuous", cost=sim.ConstantCost(0.1), fast_path=fast_path)
