"""Running an experiment: validate everything, run each sweep point once, rebuild the outputs.

A run's folder is keyed by the hash of its resolved config, so re-running the same command
skips finished runs and redoes unfinished or failed ones; ``summary.csv`` is rebuilt from the
finished runs every time. Runs go serially, over a local process pool (``jobs``) or to a Dask
cluster (``executor="dask"``) — the same function either way, so results are identical.
"""
from __future__ import annotations

import json
import signal
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Protocol

import pandas as pd
import yaml

from sim.core.errors import InputError
from sim.experiments.config import ConfigError, RunSpec, expand_runs, load_yaml
from sim.experiments.progress import Progress
from sim.experiments.results import TEMP_GLOB, is_temp_file, read_json, write_text
from sim.experiments.runner import (
    build_cost,
    build_requests,
    cluster_args,
    engine_profile_of,
    execute_run,
    kv_spec,
    run_id,
)


class ReportWriter(Protocol):
    """Draws an experiment's outputs (plots, ``report.md``) from its finished summary."""

    def __call__(self, out: Path, base: dict[str, Any], runs: list[RunSpec],
                 summary: pd.DataFrame, *, plots: bool) -> object:
        """Write the outputs into ``out``."""


#: Summary entries that vary between identical runs (timings) and stay out of summary.csv.
VOLATILE = ("wall_s",)


def preflight(runs: list[RunSpec], base_dir: Path, source: str) -> None:
    """Build every run's policy, cost model, KV and workload once, before anything runs."""
    from policies import make_policy
    from routers import make_router
    from sim.cluster.groups import parse_groups
    from sim.kv.config import resolve_kv

    seen: set[str] = set()
    for spec in runs:
        cfg = spec.config
        try:
            make_policy(cfg["policy"])
            if cfg.get("router") is not None:
                make_router(cfg["router"])
            if cfg.get("cluster") is not None:
                args = cluster_args(cfg)
                parse_groups(args["cluster"], policy=cfg["policy"], kv=kv_spec(cfg), cost=None,
                             cost_keys=args["cost_keys"])
            try:
                cost = build_cost(cfg)
            except InputError as e:
                # A profile error names a model or GPU, not a key: say which keys it came from.
                if e.field is None:
                    where = "cost" if cfg["cost"]["kind"] != "roofline" else "model/hardware"
                    raise InputError(e.problem, field=where) from None
                raise
            resolve_kv(kv_spec(cfg), cost)
            key = json.dumps([cfg["workload"], cfg["seed"]], sort_keys=True, default=str)
            if key not in seen:
                seen.add(key)
                build_requests(cfg, base_dir)
        except InputError as e:
            raise ConfigError(str(e.within(source))) from None


def clean_temp_files(out: Path) -> int:
    """Delete batchsim's temporary files (``.NAME.batchsim-XXXX.tmp``) left by a killed run.

    Only the folders batchsim writes into are looked at (``out``, ``out/runs/*``,
    ``out/plots``) and only files ``atomic_write`` names are deleted: a user's own ``.*.tmp``
    files stay. Final names are only ever created by an atomic rename, so such a temporary
    file is never anything but debris; two commands must not share one output folder at the
    same time. Returns how many files were deleted.
    """
    if not out.is_dir():
        return 0
    folders = [out, out / "plots", *sorted(p for p in (out / "runs").glob("*") if p.is_dir())]
    count = 0
    for folder in folders:
        for tmp in folder.glob(TEMP_GLOB):
            if is_temp_file(tmp) and tmp.is_file() and not tmp.is_symlink():
                tmp.unlink(missing_ok=True)
                count += 1
    return count


def worker_init() -> None:
    """Pool worker initializer: Ctrl-C is handled by the parent, which stops the workers."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def stop_pool(pool: ProcessPoolExecutor) -> None:
    """Stop the workers now and drop queued runs (runs in flight are redone on resume).

    The worker list is read before ``shutdown``, which forgets it; ``ProcessPoolExecutor`` has
    no public way to stop busy workers before Python 3.14.
    """
    procs = list((getattr(pool, "_processes", None) or {}).values())
    for proc in procs:
        proc.terminate()
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in procs:
        proc.join(timeout=5)


def _execute(todo: list[tuple[str, dict[str, Any]]], base_dir: Path, out: Path, jobs: int,
             executor: str, address: str | None, on_done: Callable[[str, dict], None]) -> None:
    args = [(cfg, str(base_dir), str(out / "runs" / rid)) for rid, cfg in todo]
    if executor == "dask":
        from sim.experiments.dask_executor import run_on_dask

        for rid, result in run_on_dask(args, address):
            on_done(rid, result)
        return
    if jobs <= 1 or len(args) <= 1:
        for a in args:
            on_done(Path(a[2]).name, execute_run(*a))
        return
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(args)), initializer=worker_init)
    try:
        futures = {pool.submit(execute_run, *a): Path(a[2]).name for a in args}
        for fut in as_completed(futures):
            on_done(futures[fut], fut.result())
    except BaseException:
        stop_pool(pool)
        raise
    pool.shutdown(wait=True)


def collect_summary(out: Path, runs: Iterable[RunSpec]) -> pd.DataFrame:
    """One row per finished run, in sweep order: run_id, label, swept keys, metrics."""
    rows, seen = [], set()
    for spec in runs:
        rid = run_id(spec.config)
        path = out / "runs" / rid / "summary.json"
        if rid in seen or not path.exists():
            continue
        seen.add(rid)
        s = read_json(path)
        cfg = spec.config
        row = {"run_id": rid, "label": spec.label, "policy": cfg["policy"].get("name"),
               **spec.swept, "model": cfg["model"], "hardware": cfg["hardware"],
               "tp": cfg["parallelism"]["tp"]}
        row.update({k: v for k, v in s.items() if k not in VOLATILE and k not in row})
        rows.append(row)
    return pd.DataFrame(rows)


def seed_aggregate(summary: pd.DataFrame) -> pd.DataFrame | None:
    """Mean and 95% confidence half-width of each metric across seeds (when seed is swept)."""
    if "seed" not in summary.columns or summary["seed"].nunique() < 2:
        return None
    from scipy import stats

    keys = [c for c in summary.columns if c in ("label", "policy") or
            (c not in ("run_id", "seed") and not pd.api.types.is_float_dtype(summary[c])
             and c not in ("completed", "num_steps", "num_rejected", "num_unfinished",
                           "num_preemptions", "num_blocks"))]
    metrics = [c for c in summary.columns if c not in keys and c not in ("run_id", "seed")
               and pd.api.types.is_numeric_dtype(summary[c])]
    g = summary.groupby(keys, sort=False, dropna=False)[metrics]
    mean, sem, n = g.mean(), g.sem(), g.count()
    half = sem * stats.t.ppf(0.975, (n - 1).clip(lower=1))
    return mean.join(half.add_suffix("_ci95")).reset_index()


def run_experiment(path: str | Path, overrides: list[str] | None = None,
                   out: str | Path | None = None, jobs: int = 1, executor: str = "local",
                   address: str | None = None, plots: bool | None = None,
                   quiet: bool = False, report: ReportWriter | None = None) -> pd.DataFrame:
    """Run (or resume) the experiment at ``path``; return its summary table.

    ``report`` draws the plots and ``report.md`` once the runs are done (the report layer sits
    above this one, so the caller hands it in; ``sim.run_experiment`` always does).
    """
    path = Path(path)
    raw = load_yaml(path)
    base, runs = expand_runs(raw, overrides, source=str(path))
    base_dir = path.resolve().parent
    preflight(runs, base_dir, str(path))
    out = Path(out) if out else Path("runs") / base["name"]
    (out / "runs").mkdir(parents=True, exist_ok=True)
    clean_temp_files(out)
    write_text(out / "experiment.yaml", yaml.safe_dump(
        {"source": str(path), "overrides": overrides or [], "experiment": raw},
        sort_keys=False))
    todo: list[tuple[str, dict[str, Any]]] = []
    for spec in runs:
        rid = run_id(spec.config)
        if not (out / "runs" / rid / "summary.json").exists() and all(
                rid != r for r, _ in todo):
            todo.append((rid, spec.config))
    progress = Progress(base["name"], len(todo), quiet=quiet)
    engines = ", ".join(dict.fromkeys(engine_profile_of(spec.config) for spec in runs))
    progress.message(f"batchsim: {base['name']}: {len(runs)} runs, "
                     f"{len(runs) - len(todo)} already done (engine profile: {engines})")
    progress.start()

    def on_done(rid: str, result: dict[str, Any]) -> None:
        progress.advance(rid, result.get("error"))

    try:
        _execute(todo, base_dir, out, jobs, executor, address, on_done)
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
    if failed:
        progress.message(f"batchsim: {failed} run(s) failed; see runs/*/error.txt")
    # Runs that failed this time or earlier: their first error line, for the CLI to report.
    summary.attrs["errors"] = [
        f"{p.parent.name}: {p.read_text(encoding='utf-8').splitlines()[0]}"
        for p in sorted((out / "runs").glob("*/error.txt"))
        if not (p.parent / "summary.json").exists()]
    summary.attrs["out"] = str(out)
    return summary
