"""The experiment lifecycle around runs: killed commands, damaged output folders, capacity
probes and output locations.

Each test is a problem found by using batchsim as a user would (kill a ``--jobs`` sweep with
``kill -9`` and re-run; ``batchsim plot`` on an edited folder; a damaged probe cache; a
``--split-gpus`` search of an experiment whose name is not a folder name) and fails without
its fix.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from sim.cli.main import main
from sim.experiments.capacity import run_capacity
from sim.experiments.outdir import OutputFolderError, OutputLock
from sim.experiments.run import run_experiment
from tests.helpers import dd1_experiment

REPO = Path(__file__).resolve().parents[1]

#: A command's stand-in: it locks an output folder, starts a pool as ``--jobs`` does, prints
#: the workers' pids and waits to be killed.
HOLDER = """
import os, sys, time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from sim.experiments.executors import worker_init
from sim.experiments.outdir import OutputLock

lock = OutputLock(Path(sys.argv[1])).__enter__()
pool = ProcessPoolExecutor(max_workers=2, initializer=worker_init)
pool.submit(os.getpid).result()
print(" ".join(map(str, pool._processes)), flush=True)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    """``pid`` runs (a zombie, exited but not yet reaped, does not count)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX locks and signals")
def test_a_kill_9_of_a_jobs_command_releases_its_folder(tmp_path: Path) -> None:
    """``kill -9`` of ``batchsim run --jobs 2`` left its pool workers alive forever (waiting
    on a queue they hold the write end of) and holding the inherited lock: every later
    command on the folder was refused, naming the dead pid."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    workers: list[int] = []
    try:
        assert proc.stdout is not None
        workers = [int(p) for p in proc.stdout.readline().split()]
        assert workers
        with pytest.raises(OutputFolderError, match="another batchsim command"):
            OutputLock(tmp_path).__enter__()
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 2.5
        while any(map(_alive, workers)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(map(_alive, workers)), "pool workers outlived their command"
        with OutputLock(tmp_path):  # the folder is free for the re-run
            pass
    finally:
        proc.kill()
        proc.wait()
        for pid in workers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture(scope="module")
def done(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished two-run experiment folder (no plots: the tests copy and damage it)."""
    folder = tmp_path_factory.mktemp("done")
    path = folder / "dd1.yaml"
    path.write_text(dd1_experiment(0.01, 5, 30, rates=[2, 4]))
    run_experiment(path, out=folder / "out", quiet=True)
    return folder / "out"


def _plot_error(done: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                damage: dict[str, bytes]) -> str:
    """Copy ``done``, write ``damage`` (relative path -> bytes), run ``batchsim plot``: it
    must exit 2 with one line, which is returned."""
    copy = tmp_path / "copy"
    shutil.copytree(done, copy)
    for rel, data in damage.items():
        (copy / rel).write_bytes(data)
    capsys.readouterr()
    assert main(["plot", str(copy)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("data", [b'run_id,label\n"unterminated', b"\x00\xff\xfe"],
                         ids=["unparseable", "binary"])
def test_plot_of_an_unreadable_summary_csv_names_it(done, tmp_path, capsys, data) -> None:
    """Was a pandas ParserError / UnicodeDecodeError traceback (exit 1)."""
    err = _plot_error(done, tmp_path, capsys, {"summary.csv": data})
    assert f"{tmp_path / 'copy' / 'summary.csv'}: cannot read it" in err
    assert "re-run the experiment" in err


def test_plot_of_a_summary_csv_cut_short_names_the_missing_columns(done, tmp_path,
                                                                   capsys) -> None:
    """A summary.csv without its metric columns was a KeyError traceback from a figure."""
    text = (done / "summary.csv").read_text()
    cut = "\n".join(",".join(line.split(",")[:3]) for line in text.splitlines()) + "\n"
    err = _plot_error(done, tmp_path, capsys, {"summary.csv": cut.encode()})
    assert "summary.csv: lacks column(s) of its runs: " in err
    assert "busy_fraction" in err


def test_plot_of_a_binary_experiment_yaml_names_it(done, tmp_path, capsys) -> None:
    """Was a UnicodeDecodeError traceback."""
    err = _plot_error(done, tmp_path, capsys, {"experiment.yaml": b"\xff\xfe"})
    assert "experiment.yaml: cannot rebuild the experiment: " in err


@pytest.mark.parametrize("data", [b": : [", b"[1, 2]"], ids=["bad-yaml", "a-list"])
def test_plot_of_a_damaged_run_config_names_it(done, tmp_path, capsys, data) -> None:
    """Runs that ``experiment.yaml`` does not describe (it was edited, or an input file
    changed) are drawn from their own ``config.yaml``; a damaged one was a YAML or
    AttributeError traceback."""
    record = yaml.safe_load((done / "experiment.yaml").read_text())
    record["overrides"] = ["workload.num_requests=31"]  # no run of the folder matches now
    rid = str(pd.read_csv(done / "summary.csv", dtype={"run_id": str})["run_id"][0])
    err = _plot_error(done, tmp_path, capsys, {
        "experiment.yaml": yaml.safe_dump(record).encode(),
        f"runs/{rid}/config.yaml": data})
    assert f"runs/{rid}/config.yaml: cannot read this run's resolved config" in err


def test_a_damaged_probe_cache_entry_is_redone(tmp_path: Path) -> None:
    """A cached probe that parses as JSON but is no probe summary (``{}``) was taken as a
    probe failing every SLO (NaN), changing the answer; it is simulated again instead."""
    exp = tmp_path / "dd1.yaml"
    exp.write_text(dd1_experiment(0.01, 10, 60))
    kwargs = {"slo": "ttft_p99_ms=500", "out": tmp_path / "cap", "quiet": True}
    first = run_capacity(exp, **kwargs)
    probes = sorted((tmp_path / "cap" / "probes").glob("*.json"))
    assert probes
    for p in probes:
        p.write_text("{}\n")
    again = run_capacity(exp, **kwargs)
    pd.testing.assert_frame_equal(first, again)
    search = pd.read_csv(tmp_path / "cap" / "search.csv")
    assert search["p99_ttft_ms"].notna().all()


def test_split_gpus_default_folder_stays_under_runs(tmp_path: Path, monkeypatch,
                                                    capsys) -> None:
    """``capacity --split-gpus`` named its default folder ``runs/<name>-split<N>`` without
    the check ``run`` makes, so ``name: ../../x`` wrote outside ``runs/``."""
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    text = (REPO / "experiments" / "quickstart.yaml").read_text()
    (work / "q.yaml").write_text(text.replace("name: quickstart", "name: ../../escaped"))
    monkeypatch.chdir(work)
    assert main(["capacity", "q.yaml", "--slo", "ttft_p99_ms=2000", "--quiet",
                 "--set", "workload.max_requests=20", "--split-gpus", "2"]) == 2
    err = capsys.readouterr().err
    assert "q.yaml: name: must be a plain folder name" in err, err
    assert not list(tmp_path.rglob("escaped*"))


def test_another_capacity_search_keeps_the_previous_answer(tmp_path: Path, capsys) -> None:
    """A second search into one folder (other SLOs) replaced capacity.csv and search.csv:
    the first answer was lost. It moves to previous/<n>/; the same search again is a resume
    and moves nothing."""
    exp = tmp_path / "dd1.yaml"
    exp.write_text(dd1_experiment(0.01, 10, 60))
    out = tmp_path / "cap"
    run_capacity(exp, slo="ttft_p99_ms=500", out=out, quiet=True)
    first = (out / "capacity.csv").read_text()
    run_capacity(exp, slo="ttft_p99_ms=500", out=out, quiet=True)  # a resume
    assert not (out / "previous").exists()
    capsys.readouterr()
    run_capacity(exp, slo="ttft_p99_ms=200", out=out)
    assert "held the answer of another capacity search" in capsys.readouterr().err
    kept = out / "previous" / "1"
    assert (kept / "capacity.csv").read_text() == first
    assert (kept / "search.csv").is_file()
    assert yaml.safe_load((kept / "capacity.yaml").read_text())["slos"]["percentiles"] == {
        "p99_ttft_ms": 500.0}
    assert (out / "capacity.csv").read_text() != first


def test_plot_removes_a_killed_commands_temporaries(done, tmp_path, capsys) -> None:
    """The docs promise the next command on a folder deletes batchsim's temporaries; plot
    (a command holding the folder's lock) left them."""
    copy = tmp_path / "copy"
    shutil.copytree(done, copy)
    (copy / "plots").mkdir(exist_ok=True)
    debris = [copy / ".report.md.batchsim-k1ll3d.tmp", copy / "plots" / ".x.png.batchsim-a.tmp"]
    mine = copy / ".notes.tmp"  # a user's own file: left alone
    for p in [*debris, mine]:
        p.write_text("half")
    assert main(["plot", str(copy)]) == 0
    assert not any(p.exists() for p in debris)
    assert mine.exists()


def test_plot_on_a_busy_folder_or_a_file_says_what_it_is(done, tmp_path, capsys) -> None:
    """``plot`` on a busy folder spoke of an ``--out`` it has not; on a file it said "no such
    folder"."""
    with OutputLock(done):
        assert main(["plot", str(done)]) == 2
    err = capsys.readouterr().err
    assert f"plot {done}: another batchsim command" in err and "--out" not in err, err
    file = tmp_path / "f"
    file.write_text("x")
    assert main(["plot", str(file)]) == 2
    assert capsys.readouterr().err.strip() == f"batchsim: error: {file}: not a folder"


def test_trace_of_a_bucketed_run_names_its_step_table(tmp_path: Path, capsys) -> None:
    """The refusal named the trace file it would have written (``.../trace.json: the run's
    step table is bucketed``), not the table that is the problem."""
    exp = tmp_path / "dd1.yaml"
    exp.write_text(dd1_experiment(0.01, 5, 20))
    summary = run_experiment(exp, overrides=["metrics.step_table=buckets"],
                             out=tmp_path / "out", quiet=True)
    run = tmp_path / "out" / "runs" / str(summary["run_id"][0])
    capsys.readouterr()
    assert main(["trace", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"batchsim: error: {run / 'steps.parquet'}: a bucketed step table"), err
    assert not (run / "trace.json").exists()


def _die(config: dict, base_dir: str) -> dict:
    """A probe whose worker process dies, as under the out-of-memory killer."""
    os._exit(9)


def test_a_dead_capacity_worker_is_one_line_not_a_bug(tmp_path: Path, monkeypatch,
                                                      capsys) -> None:
    """``capacity --jobs 2`` with a worker killed (OOM) printed a BrokenProcessPool traceback
    and "internal error (a bug)"; it is the machine's failure: one line, exit 1."""
    import multiprocessing

    import sim.experiments.capacity as capacity

    if multiprocessing.get_start_method() != "fork":
        pytest.skip("the patched probe reaches the workers by fork only")
    exp = tmp_path / "dd1.yaml"
    exp.write_text(dd1_experiment(0.01, 10, 60))
    monkeypatch.setattr(capacity, "probe", _die)
    assert main(["capacity", str(exp), "--slo", "ttft_p99_ms=500", "--jobs", "2", "--quiet",
                 "--out", str(tmp_path / "cap")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "a --jobs worker process died while it probed" in err


@pytest.mark.parametrize(("call", "kwargs", "message"), [
    ("capacity", {"quiet": "no"}, r"^quiet: expected true or false, got 'no'$"),
    ("split", {"num_gpus": 2, "quiet": "no"}, r"^quiet: expected true or false, got 'no'$"),
    ("split", {"num_gpus": "4"}, r"^--split-gpus: expected a whole number of GPUs, got '4'$"),
])
def test_capacity_api_flags_follow_run_experiments_rules(tmp_path, call, kwargs,
                                                         message) -> None:
    """``run_experiment(quiet="no")`` is refused, yet ``run_capacity(quiet="no")`` ran
    silently (a non-empty string is true), and ``run_split(num_gpus="4")`` was a TypeError."""
    from sim.core.errors import InputError
    from sim.experiments.capacity_split import run_split

    exp = tmp_path / "dd1.yaml"
    exp.write_text(dd1_experiment(0.01, 10, 60))
    func = run_capacity if call == "capacity" else run_split
    with pytest.raises(InputError, match=message):
        func(exp, slo="ttft_p99_ms=500", out=tmp_path / "cap", **kwargs)
    assert not (tmp_path / "cap").exists()


def test_plot_of_a_users_folder_leaves_no_lock_to_claim_it(tmp_path: Path, capsys) -> None:
    """``batchsim plot ~/notes`` took the lock before checking the folder, so it left
    ``.batchsim.lock`` there; that file marks a folder as batchsim's, and a later
    ``batchsim run --out ~/notes`` replaced the user's ``report.md``."""
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "report.md").write_text("mine")
    assert main(["plot", str(notes)]) == 2
    assert "not a batchsim output folder" in capsys.readouterr().err
    assert sorted(p.name for p in notes.iterdir()) == ["report.md"]


def test_trace_of_the_runs_folder_lists_its_runs(done, capsys) -> None:
    """``batchsim trace OUT/runs`` (one level short) listed nothing, unlike ``OUT`` or a wrong
    run id."""
    assert main(["trace", str(done / "runs")]) == 2
    err = capsys.readouterr().err
    ids = sorted(p.name for p in (done / "runs").iterdir())
    assert f"finished runs in {done / 'runs'}: {', '.join(ids)}" in err, err


def test_trace_of_a_damaged_run_does_not_offer_it_as_finished(done, tmp_path, capsys) -> None:
    """A run with a truncated table was refused as "not a finished run folder" and then
    listed among the "finished runs" (the list looked at summary.json alone)."""
    copy = tmp_path / "copy"
    shutil.copytree(done, copy)
    broken, fine = sorted(p.name for p in (copy / "runs").iterdir())
    (copy / "runs" / broken / "steps.parquet").write_bytes(b"PAR1")
    assert main(["trace", str(copy / "runs" / broken)]) == 2
    err = capsys.readouterr().err
    assert err.rstrip().endswith(f"finished runs in {copy / 'runs'}: {fine}"), err


def test_numpy_values_from_python_run_and_resume_as_python_numbers(tmp_path: Path) -> None:
    """``run_experiment(overrides={"workload.num_requests": np.int64(30)})`` is valid config,
    yet it ended in a yaml RepresenterError traceback (the --set note, experiment.yaml);
    ``run_capacity`` the same. The values now record as the numbers they hold: the same run
    ids as Python numbers, so the second command is a resume."""
    import numpy as np

    exp = tmp_path / "dd1.yaml"
    exp.write_text(dd1_experiment(0.01, 5, 20))
    out = tmp_path / "out"
    first = run_experiment(exp, overrides={"workload.num_requests": np.int64(30)},
                           sweeps={"workload.arrival.rate": [np.float64(2.0), 4.0]},
                           out=out, quiet=True)
    again = run_experiment(exp, overrides={"workload.num_requests": 30},
                           sweeps={"workload.arrival.rate": [2.0, 4.0]}, out=out, quiet=True)
    assert list(first["run_id"]) == list(again["run_id"]) and len(first) == 2
    assert not (out / "previous").exists()  # the same experiment: a resume
    table = run_capacity(exp, slo="ttft_p99_ms=500", out=tmp_path / "cap", quiet=True,
                         overrides={"workload.num_requests": np.int64(30)})
    assert len(table) == 1
