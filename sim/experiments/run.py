"""Running an experiment: validate everything, run each sweep point once, rebuild the outputs.

A run's folder is keyed by the hash of its resolved config, so re-running the same command
skips finished runs and redoes unfinished or failed ones; ``summary.csv`` is rebuilt from the
finished runs every time. Runs go serially, over a local process pool (``jobs``) or to a Dask
cluster (``executor="dask"``) — the same function either way, so results are identical.
"""
from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd
import yaml

from sim.core.errors import EnvironmentFailure, InputError
from sim.core.fields import check_flags
from sim.cost.profiles import calibration_notes
from sim.cost.validity import VALIDITY_COLUMNS
from sim.experiments.config import ConfigError, RunSpec, config_path, expand_runs, load_yaml
from sim.experiments.executors import (
    check_executor,
    check_jobs,
    run_pool,
    run_serial,
    stop_pool,
    worker_init,
)
from sim.experiments.intervals import check_config_intervals
from sim.experiments.labels import swept_value
from sim.experiments.outdir import (
    OutputLock,
    clean_temp_files,
    finished_summary,
    keep_previous_outputs,
    output_folder,
    outputs_record,
)
from sim.experiments.progress import (
    Progress,
    fallback_message,
    partial_note,
    partial_phrase,
    rejected_note,
    rejected_phrase,
)
from sim.experiments.results import plain_data, write_text
from sim.experiments.runner import (
    build_cost,
    build_requests,
    cluster_args,
    engine_profile_of,
    kv_spec,
    pin_inputs,
    run_id,
)
from sim.metrics.summary import check_measurement_window

#: Re-exported for callers of this module (the capacity search, tests).
__all__ = ["clean_temp_files", "collect_summary", "preflight", "run_experiment",
           "seed_aggregate", "stop_pool", "worker_init"]


class ReportWriter(Protocol):
    """Draws an experiment's outputs (plots, ``report.md``) from its finished summary."""

    def __call__(self, out: Path, base: dict[str, Any], runs: list[RunSpec],
                 summary: pd.DataFrame, *, plots: bool) -> object:
        """Write the outputs into ``out``."""


#: Summary entries that vary between identical runs (timings) and stay out of summary.csv.
VOLATILE = ("wall_s", "sim_engine", "sim_engine_reason", "sim_step_engine",
            "sim_step_engine_reason")


def preflight(runs: list[RunSpec], base_dir: Path, source: str) -> None:
    """Build every run's policy, cost model, KV and workload once, before anything runs."""
    from policies import make_policy
    from routers import make_router
    from sim.cluster.deployment import check_step_table
    from sim.cluster.groups import parse_groups
    from sim.kv.config import resolve_kv

    arrivals: dict[str, np.ndarray] = {}  # one workload build per (workload, seed)
    for spec in runs:
        cfg = spec.config
        try:
            make_policy(cfg["policy"])
            if cfg.get("router") is not None:
                make_router(cfg["router"])
            if cfg.get("cluster") is not None:
                args = cluster_args(cfg)
                parse_groups(args["cluster"], policy=cfg["policy"], kv=kv_spec(cfg), cost=None,
                             cost_keys=args["cost_keys"], router=cfg.get("router"))
                check_step_table(cfg["metrics"]["step_table"])
            try:
                cost = build_cost(cfg, base_dir)
            except InputError as e:
                # A profile error names a model or GPU, not a key: say which keys it came from.
                if e.field is None:
                    where = "cost" if cfg["cost"]["kind"] != "roofline" else "model/hardware"
                    raise InputError(e.problem, field=where) from None
                raise
            resolve_kv(kv_spec(cfg), cost)
            check_config_intervals(cfg)
            key = json.dumps([cfg["workload"], cfg["seed"]], sort_keys=True, default=str)
            if key not in arrivals:
                arrivals[key] = np.array([r.arrival_s for r in build_requests(cfg, base_dir)])
            try:
                check_measurement_window(arrivals[key], cfg["metrics"]["warmup_s"],
                                         cfg["metrics"]["cooldown_s"])
            except InputError as e:
                raise InputError(e.problem, field=f"metrics.{e.field}") from None
        except InputError as e:
            raise ConfigError(str(e.within(source))) from None


def _execute(todo: list[tuple[str, dict[str, Any]]], base_dir: Path, out: Path, jobs: int,
             executor: str, address: str | None, on_done: Callable[[str, dict], None],
             labels: dict[str, str] | None = None) -> None:
    """Run ``todo`` serially, on a process pool or on Dask; ``labels`` (serial runs only):
    the progress label of each run id, for a bar inside each run."""
    args = [(cfg, str(base_dir), str(out / "runs" / rid)) for rid, cfg in todo]
    if executor == "dask":
        from sim.experiments.dask_executor import run_on_dask

        for rid, result in run_on_dask(args, address):
            on_done(rid, result)
    elif jobs <= 1 or len(args) <= 1:
        run_serial(args, on_done, labels)
    else:
        run_pool(args, jobs, on_done)


def collect_summary(out: Path, runs: Iterable[RunSpec]) -> pd.DataFrame:
    """One row per finished run, in sweep order: run_id, label, swept keys, metrics."""
    rows, seen = [], set()
    for spec in runs:
        rid = run_id(spec.config)
        if rid in seen:
            continue
        seen.add(rid)
        s = finished_summary(out / "runs" / rid)
        if s is None:
            continue
        cfg = spec.config
        # a swept whole policy is its label and name already, not a column of its own
        row = {"run_id": rid, "label": spec.label, "policy": cfg["policy"].get("name"),
               **{k: swept_value(v) for k, v in spec.swept.items() if k != "policy"},
               "model": cfg["model"],
               "hardware": cfg["hardware"], "tp": cfg["parallelism"]["tp"]}
        row.update({k: v for k, v in s.items() if k not in VOLATILE and k not in row})
        rows.append(row)
    return pd.DataFrame(rows)


def seed_aggregate(summary: pd.DataFrame) -> pd.DataFrame | None:
    """Mean and 95% confidence half-width of each metric across seeds (when seed is swept)."""
    if "seed" not in summary.columns or summary["seed"].nunique() < 2:
        return None

    keys = [c for c in summary.columns if c in ("label", "policy") or
            (c not in ("run_id", "seed") and not pd.api.types.is_float_dtype(summary[c])
             and c not in ("completed", "num_steps", "num_rejected", "num_unfinished",
                           "num_preemptions", "num_blocks", *VALIDITY_COLUMNS))]
    metrics = [c for c in summary.columns if c not in keys and c not in ("run_id", "seed")
               and pd.api.types.is_numeric_dtype(summary[c])]
    g = summary.groupby(keys, sort=False, dropna=False)[metrics]
    mean, sem, n = g.mean(), g.sem(), g.count()
    # consolidated before the keys go back in: with a wide summary (prediction intervals add
    # ~60 columns) pandas would otherwise warn that the frame is fragmented
    return mean.join(ci95_half(sem, n).add_suffix("_ci95")).copy().reset_index()


def ci95_half(sem: Any, n: Any) -> Any:
    """Half-width of the Student-t 95% interval of a mean (NaN with fewer than two values);
    ``sem`` and ``n`` are pandas frames or series of standard errors and counts."""
    from scipy import stats  # only sweeps over seeds need it

    return (sem * stats.t.ppf(0.975, (n - 1).clip(lower=1))).where(n > 1)


def _run_labels(runs: list[RunSpec], todo: list[tuple[str, dict[str, Any]]]
                ) -> dict[str, str]:
    """``[i/n] label key=value`` of each run to do, for its progress bar."""
    names = {run_id(s.config): " ".join([s.label, *(f"{k}={v}" for k, v in s.swept.items())])
             for s in runs}
    return {rid: f"[{i}/{len(todo)}] {names.get(rid, rid)}" for i, (rid, _) in
            enumerate(todo, 1)}


def _note(text: str) -> None:
    """One line on stderr (an override that replaced a sweep)."""
    print(f"batchsim: {text}", file=sys.stderr)


def run_experiment(path: str | Path,
                   overrides: Iterable[str] | Mapping[str, Any] | None = None,
                   out: str | Path | None = None, jobs: int = 1, executor: str = "local",
                   address: str | None = None, plots: bool | None = None,
                   quiet: bool = False, report: ReportWriter | None = None, *,
                   sweeps: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """Run (or resume) the experiment at ``path``; return its summary table.

    ``overrides`` and ``sweeps`` follow ``sim.experiments.overrides``' rules (a note on stderr
    says when an override replaces a sweep, unless ``quiet``). ``report`` draws the plots and
    ``report.md`` once the runs are done (the report layer sits above this one, so the caller
    hands it in; ``sim.run_experiment`` always does).
    """
    jobs = check_jobs(jobs)
    check_executor(executor, address)
    check_flags(quiet=quiet, plots=plots if plots is not None else False)
    # numpy values from Python (np.int64(8)) as the numbers they hold: the --set notes and
    # experiment.yaml are YAML, which cannot write them, and a run id must not depend on
    # whether a value came as a numpy or a Python number
    overrides, sweeps = plain_data(overrides), plain_data(sweeps)
    path = config_path(path)
    raw = load_yaml(path)
    base, runs = expand_runs(raw, overrides, source=str(path), sweeps=sweeps,
                             notify=None if quiet else _note)
    base_dir = path.resolve().parent
    preflight(runs, base_dir, str(path))
    runs = [RunSpec(pin_inputs(s.config, base_dir), s.swept, s.label) for s in runs]
    folder = output_folder(out, base["name"], str(path))
    with OutputLock(folder):
        return _run_locked(path, raw, overrides, sweeps, base, runs, base_dir, folder, jobs,
                           executor, address, plots, quiet, report)


def _run_locked(path: Path, raw: dict[str, Any],
                overrides: Iterable[str] | Mapping[str, Any] | None,
                sweeps: Mapping[str, Any] | None, base: dict[str, Any], runs: list[RunSpec],
                base_dir: Path, out: Path, jobs: int, executor: str, address: str | None,
                plots: bool | None, quiet: bool, report: ReportWriter | None) -> pd.DataFrame:
    """``run_experiment`` once the output folder is checked and locked."""
    clean_temp_files(out)
    record = outputs_record(path, base_dir, overrides, sweeps, raw)
    kept = keep_previous_outputs(out, record)
    if kept is not None and not quiet:
        _note(f"{out} held the outputs of another experiment: its summary, report and plots "
              f"are kept in {kept} (the runs stay shared in {out / 'runs'})")
    write_text(out / "experiment.yaml", yaml.safe_dump(record, sort_keys=False))
    todo: list[tuple[str, dict[str, Any]]] = []
    seen: set[str] = set()
    for spec in runs:
        rid = run_id(spec.config)
        if rid not in seen:
            seen.add(rid)
            if finished_summary(out / "runs" / rid) is None:
                todo.append((rid, spec.config))
    progress = Progress(base["name"], len(todo), quiet=quiet)
    engines = ", ".join(dict.fromkeys(engine_profile_of(spec.config) for spec in runs))
    same = len(runs) - len(seen)  # entries that describe a run already listed: run once
    merged = f", {same} duplicate{'s' if same > 1 else ''} run once" if same else ""
    progress.message(f"batchsim: {base['name']}: {len(seen)} runs{merged}, "
                     f"{len(seen) - len(todo)} already done (engine profile: {engines})")
    for note in calibration_notes([str(spec.config["hardware"]) for spec in runs
                                   if spec.config["cost"]["kind"] == "roofline"]):
        progress.message(f"batchsim: {note}")
    progress.start()

    general: dict[str, int] = {}  # why runs fell back to the general engine -> how many
    rejected: list[str] = []  # the runs that rejected requests, one phrase each
    partial: list[str] = []  # the runs a limit stopped early, one phrase each
    labels = {run_id(spec.config): spec.label for spec in runs}

    def on_done(rid: str, result: dict[str, Any]) -> None:
        error = result.get("error")
        if error is None and finished_summary(out / "runs" / rid) is None:
            # a worker said "done" but this machine cannot see the files: never log it ok
            raise EnvironmentFailure(
                f"run {rid} finished on a worker but its files are missing or incomplete in "
                f"{out / 'runs' / rid}; the workers must write into this folder (a shared "
                "filesystem mounted at the same path)")
        progress.advance(rid, error)
        if result.get("num_rejected"):
            rejected.append(rejected_phrase(labels.get(rid, rid), rid, result))
        if result.get("partial"):
            partial.append(partial_phrase(labels.get(rid, rid), rid, result))
        if result.get("sim_engine") == "general":
            why = result.get("sim_engine_reason") or "unknown"
            if result.get("sim_step_engine") == "compiled":
                why += " (its plans carried out on compiled steps)"
            general[why] = general.get(why, 0) + 1

    try:
        _execute(todo, base_dir, out, jobs, executor, address, on_done,
                 _run_labels(runs, todo) if progress.bar else None)
    except BaseException:
        progress.close()
        clean_temp_files(out)
        raise
    progress.close()
    failed = progress.failed
    summary = collect_summary(out, runs)
    write_text(out / "summary.csv", summary.to_csv(index=False))
    agg = seed_aggregate(summary) if len(summary) else None
    if agg is not None:
        write_text(out / "summary_by_seed.csv", agg.to_csv(index=False))
    draw = base["output"]["plots"] if plots is None else plots
    if len(summary) and report is not None:
        report(out, base, runs, summary, plots=draw)
    if general:
        progress.message(fallback_message(general))
    if rejected:  # requests that can never run here: not a failure, but never silent
        progress.message(rejected_note(rejected))
    if partial:
        progress.message(partial_note(partial))
    if failed:
        progress.message(f"batchsim: {failed} run(s) failed; see runs/*/error.txt")
    # Runs that failed this time or earlier: their first error line, for the CLI to report.
    summary.attrs["errors"] = [
        f"{p.parent.name}: {(p.read_text(encoding='utf-8').splitlines() or ['?'])[0]}"
        for p in sorted((out / "runs").glob("*/error.txt"))
        if p.parent.name in seen and finished_summary(p.parent) is None]
    summary.attrs["out"] = str(out)
    return summary
