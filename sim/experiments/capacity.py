"""``batchsim capacity``: the highest request rate that meets SLOs, per policy.

For each policy of an experiment (and each point of any other sweep), the arrival rate —
``workload.rate`` for trace replay (time-scaled), ``workload.arrival.rate`` for synthetic
traffic — is searched: a bracketing phase doubles it from the configured rate until a probe
fails (or halves it until one passes), then bisection narrows [highest pass, lowest fail] to a
relative ``tolerance``. With ``jobs`` > 1 each round probes ``jobs`` rates at once (doubling
several steps ahead, or cutting the interval into ``jobs + 1`` parts). A probe passes when the
run is stable — every request in the measured window finished: none unfinished at a horizon,
none rejected — and every SLO holds. Probe summaries are cached in ``OUT/probes/`` so a
re-run (say with a finer tolerance) reuses them. With ``intervals.draws`` set, each target's
search is repeated once per calibration draw (``sim.experiments.intervals``) and capacity.csv
gets ``max_rate_lo`` / ``max_rate_hi``, a prediction interval of the answer.
"""
from __future__ import annotations

import copy
import math
import sys
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, overload

import pandas as pd

from sim.core.errors import EnvironmentFailure, InputError
from sim.core.fields import check_flags, is_real
from sim.experiments.config import (
    RunSpec,
    config_path,
    expand_runs,
    load_yaml,
    parse_override,
    set_dotted,
)
from sim.experiments.executors import check_jobs
from sim.experiments.fleet import cost_per_mtok, fleet, fleet_label
from sim.experiments.results import plain_data, read_json, write_json, write_text
from sim.experiments.runner import build_requests, pin_inputs, run_id, simulate_config
from sim.experiments.slo import PER_REQUEST, CapacityError, Slos, fmt_value, parse_slos

__all__ = ["CapacityError", "Slos", "parse_slos", "run_capacity"]

#: Doublings (or halvings) of the configured rate tried before giving up on bracketing.
MAX_STEPS = 12
#: Swept keys a capacity search drops: the rate it searches over (and the trace's time scale).
RATE_KEYS = ("workload.rate", "workload.arrival.rate", "workload.time_scale")
SHOWN = ("request_throughput", "output_throughput")
#: Busy fraction below which a failing probe counts as near idle and halving stops: an SLO
#: that fails with the GPUs busy under 5% of the time fails for any useful load.
IDLE_BUSY = 0.05


def rate_key(workload: Any) -> str:
    """The dotted key that sets the arrival rate of ``workload``."""
    if isinstance(workload, dict) and "trace" in workload:
        return "workload.rate"
    if isinstance(workload, dict) and isinstance(workload.get("arrival"), dict) \
            and "rate" in workload["arrival"]:
        return "workload.arrival.rate"
    raise CapacityError("workload: no arrival rate to search over; capacity needs "
                        "workload.rate (trace replay) or workload.arrival.rate (synthetic)")


@dataclass(frozen=True)
class Target:
    """One capacity search: a policy (and other swept values) at a variable rate."""

    label: str
    swept: dict[str, Any]
    config: dict[str, Any]
    key: str
    start: float

    def at(self, rate: float) -> dict[str, Any]:
        """The run config at ``rate``."""
        cfg = copy.deepcopy(self.config)
        set_dotted(cfg, self.key, rate)
        return cfg


def find_targets(path: Path, overrides: Iterable[str] | Mapping[str, Any], slos: Slos,
                 sweeps: Mapping[str, Any] | None = None,
                 notify: Callable[[str], None] | None = None) -> tuple[dict, list[Target]]:
    """Expand the experiment (its rate sweep dropped) into capacity searches."""
    raw = copy.deepcopy(load_yaml(path))
    extra = [f"slos.{k}={slos.per_request.get(k, 'null')}" for k in PER_REQUEST] \
        if slos.attainment is not None else []
    for block in ("sweep", "zip"):
        if isinstance(raw.get(block), dict):
            for key in RATE_KEYS:
                raw[block].pop(key, None)
            if not raw[block]:
                raw.pop(block)
    merged: list[str] | dict[str, Any] = (
        {**overrides, **dict(parse_override(t) for t in extra)}
        if isinstance(overrides, Mapping) else [*overrides, *extra])
    base, runs = expand_runs(raw, merged, source=str(path), sweeps=sweeps, notify=notify)
    try:
        return base, [_target(spec, path) for spec in runs]
    except InputError as e:  # the experiment cannot be searched: say which file
        raise e.within(str(path)) from None


def _target(spec: RunSpec, path: Path) -> Target:
    """The capacity search of one run of the experiment at ``path``."""
    searched = set(spec.swept) & set(RATE_KEYS)
    if searched:
        raise CapacityError(f"sweep.{min(searched)}: capacity searches over the rate "
                            "itself; do not sweep it")
    cfg = spec.config
    key = rate_key(cfg["workload"])
    if key == "workload.rate" and cfg["workload"].get("rate") is None:
        reqs = build_requests(cfg, path.resolve().parent)
        span = max(r.arrival_s for r in reqs) - min(r.arrival_s for r in reqs)
        if len(reqs) < 2 or span <= 0:
            raise CapacityError("workload: the trace needs two distinct arrival times")
        cfg = copy.deepcopy(cfg)
        cfg["workload"].pop("time_scale", None)
        cfg["workload"]["rate"] = _round((len(reqs) - 1) / span)
    start = float(cfg["workload"]["rate"] if key == "workload.rate"
                  else cfg["workload"]["arrival"]["rate"])
    label = " ".join([spec.label] + [f"{k}={v}" for k, v in spec.swept.items()])
    cfg = pin_inputs(cfg, path.resolve().parent)
    return Target(label, dict(spec.swept), cfg, key, start)


def _round(rate: float) -> float:
    """Rates keep 6 significant digits, so probe configs (and their cache ids) are stable."""
    return float(f"{rate:.6g}")


def probe(config: dict[str, Any], base_dir: str) -> dict[str, Any]:
    """Simulate one probe and return its summary (a picklable top-level function)."""
    return simulate_config(config, Path(base_dir)).summary


@overload
def _walk(rates: list[float], oks: list[bool], up: bool, lo: float, hi: float
          ) -> tuple[float, float]: ...
@overload
def _walk(rates: list[float], oks: list[bool], up: bool, lo: float | None, hi: float | None
          ) -> tuple[float | None, float | None]: ...


def _walk(rates: list[float], oks: list[bool], up: bool, lo: float | None,
          hi: float | None) -> tuple[float | None, float | None]:
    """Update [lo, hi] from probes in scan order; stop at the first fail going up (first pass
    going down), ignoring probes beyond it."""
    for rate, ok in zip(rates, oks, strict=True):
        lo, hi = (rate, hi) if ok else (lo, rate)
        if ok != up:
            break
    return lo, hi


@dataclass(frozen=True)
class Outcome:
    """What a search found: the highest passing rate, the lowest failing rate above it, and
    the status (``STATUSES``)."""

    rate: float
    fail_rate: float
    status: str


#: found: a pass and a fail bracket the answer; infeasible: the lowest rate probed fails (the
#: SLOs fail even near idle); unbounded: the highest rate probed passes.
STATUSES = ("found", "infeasible", "unbounded")


def search(start: float, tolerance: float, width: int,
           evaluate: Callable[[list[float], str], list[bool]],
           near_idle: Callable[[float], bool] = lambda rate: False) -> Outcome:
    """Highest passing rate (bracket by doubling/halving, then bisect) and its status.

    ``evaluate(rates, phase)`` probes ``width`` rates at once and returns pass/fail for each.
    Halving stops at start / 2^MAX_STEPS, or as soon as a failing probe ran ``near_idle``
    (lower rates would only show the deployment idler still): the answer is then
    ``infeasible`` (NaN rate). Doubling stops at start × 2^MAX_STEPS (``unbounded``).
    """
    lo: float | None = None
    hi: float | None = None
    for up, e in ((True, 0), (False, 1)):  # up from the start; down only if the start failed
        while (hi is None if up else lo is None) and e <= MAX_STEPS:
            if not up and hi is not None and near_idle(hi):
                break  # a failure near idle: lower rates only idle the deployment more
            rates = [_round(start * 2.0 ** (k if up else -k))
                     for k in range(e, min(e + width, MAX_STEPS + 1))]
            lo, hi = _walk(rates, evaluate(rates, "bracket"), up, lo, hi)
            e += width
    if lo is None:
        return Outcome(math.nan, math.nan if hi is None else hi, "infeasible")
    if hi is None:
        return Outcome(lo, math.nan, "unbounded")
    while hi - lo > tolerance * lo:
        rates = [_round(lo + (hi - lo) * j / (width + 1)) for j in range(1, width + 1)]
        rates = [r for r in dict.fromkeys(rates) if lo < r < hi]
        if not rates:
            break
        lo, hi = _walk(rates, evaluate(rates, "bisect"), True, lo, hi)
    return Outcome(lo, hi, "found")


#: Entries every probe summary has that the search reads (stability, near idle), beside the
#: SLOs' own columns: a cached file without them is not a probe summary.
PROBE_KEYS = ("num_unfinished", "num_rejected", "busy_fraction")


def _cached(path: Path, needed: Iterable[str] = PROBE_KEYS) -> dict[str, Any] | None:
    """A cached probe summary, or ``None`` when absent or damaged (then it is redone): not
    JSON, not an object, or without one of the ``needed`` entries (an edited or foreign file
    would otherwise pass as a probe that failed every SLO, or one that was stable)."""
    try:
        data = read_json(path)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or any(k not in data for k in needed):
        return None
    return data


@dataclass
class _Prober:
    """Runs probes (cached in ``folder/probes``), checks them and keeps the search trace."""

    folder: Path
    base_dir: str
    slos: Slos
    pool: ProcessPoolExecutor | None
    show: Callable[..., None]
    pad: int
    trace: list[dict[str, Any]] = field(default_factory=list)
    seen: dict[float, dict[str, Any]] = field(default_factory=dict)

    def summaries(self, t: Target, rates: list[float]) -> list[dict[str, Any]]:
        """The summary of each probe, simulated (in parallel with a pool) unless cached."""
        paths = [self.folder / "probes" / f"{run_id(t.at(r))}.json" for r in rates]
        needed = (*PROBE_KEYS, *self.slos.columns())
        cached = [_cached(p, needed) for p in paths]
        todo = [(t.at(r), self.base_dir) for r, c in zip(rates, cached, strict=True)
                if c is None]
        new = iter(self.pool.map(probe, *zip(*todo, strict=True)) if self.pool and todo
                   else [probe(*a) for a in todo])
        out = []
        for path, c in zip(paths, cached, strict=True):
            if c is None:
                try:
                    c = next(new)
                except BrokenProcessPool:  # a worker killed (the OOM killer): not a bug
                    raise EnvironmentFailure(
                        "a --jobs worker process died while it probed (the usual cause is the "
                        "out-of-memory killer); the probes done so far are kept in "
                        f"{self.folder / 'probes'}: re-run, with a lower --jobs, to resume"
                        ) from None
                write_json(path, c)
            out.append(c)
        return out

    def evaluate(self, t: Target, rates: list[float], phase: str) -> list[bool]:
        """Probe ``rates`` of target ``t``; print and record each; return pass/fail."""
        cols, result = self.slos.columns(), []
        for r, s in zip(rates, self.summaries(t, rates), strict=True):
            ok, why = self.slos.check(s)
            self.seen[r] = s
            self.trace.append({"label": t.label, **t.swept, "phase": phase, "rate": r,
                               "passed": ok, "why": why,
                               **{c: s.get(c) for c in cols + list(SHOWN)},
                               **{c: s.get(c) for c in ("completed", "num_unfinished",
                                                        "num_rejected")}})
            values = "  ".join(f"{c}={fmt_value(s.get(c))}" for c in cols)
            self.show(f"  {t.label:<{self.pad}}  {phase:<7} rate={r:<8.4g} " + values
                      + ("  pass" if ok else f"  FAIL: {why}"), flush=True)
            result.append(ok)
        return result

    def near_idle(self, rate: float) -> bool:
        """True when the probe at ``rate`` kept the GPUs busy less than ``IDLE_BUSY``."""
        busy = self.seen.get(rate, {}).get("busy_fraction")
        return busy is not None and busy < IDLE_BUSY

    def row(self, t: Target, found: Outcome) -> dict[str, Any]:
        """The capacity.csv row of target ``t``: the metrics at the answer (at the failing
        lowest rate when infeasible), the binding SLO and the cost (found answers only)."""
        at = found.fail_rate if found.status == "infeasible" else found.rate
        s, gpus = self.seen.get(at, {}), fleet(t.config)
        fail = self.seen.get(found.fail_rate)
        return {"label": t.label, "policy": t.config["policy"].get("name"), **t.swept,
                "rate_key": t.key, "max_rate": found.rate, "status": found.status,
                "binding": self.slos.binding(fail) if fail is not None else None,
                "fail_rate": found.fail_rate,
                **{c: s.get(c, math.nan) for c in list(SHOWN) + self.slos.columns()},
                "busy_fraction": s.get("busy_fraction", math.nan),
                "gpus": sum(gpus.values()), "hardware": fleet_label(gpus),
                "cost_per_mtok_usd": cost_per_mtok(t.config, s.get("output_throughput", 0.0),
                                                   self.base_dir)
                if found.status == "found" else None}


def _interval(t: Target, found: Outcome, prober: _Prober, tolerance: float, width: int
              ) -> dict[str, Any]:
    """``max_rate_lo`` / ``_hi`` of target ``t`` when its ``intervals.draws`` asks for them:
    one more search per calibration draw (``sim.experiments.intervals``), probes cached as
    the point search's are; each draw prints one line."""
    from sim.experiments.intervals import capacity_interval, draw_config

    settings = t.config["intervals"]
    if not settings["draws"]:
        return {}
    show = prober.show

    def one(k: int) -> float:
        d = Target(t.label, t.swept, draw_config(t.config, k), t.key, t.start)
        prober.show = lambda *a, **kw: None  # a draw's probes go to search.csv only
        try:
            rate = search(d.start, tolerance, width,
                          lambda rates, phase: prober.evaluate(d, rates, f"draw{k + 1}-{phase}"),
                          prober.near_idle).rate
        finally:
            prober.show = show
        show(f"  {t.label:<{prober.pad}}  draw {k + 1}/{settings['draws']}: max rate "
             f"{rate:.4g}", flush=True)
        return rate

    return capacity_interval(found.rate, one, settings["draws"], settings["level"])


def verdict(row: dict[str, Any], unit: str = "req/s") -> str:
    """One sentence on a capacity.csv row: the answer, what binds, and why there is no cost."""
    status, label = row["status"], row["label"]
    value = row.get(row["binding"]) if row["binding"] else None
    binding = f"{row['binding']}={fmt_value(value)}" if isinstance(value, float) \
        else row["binding"]
    if status == "found":
        lo, hi = row.get("max_rate_lo"), row.get("max_rate_hi")
        band = (f" ({row['interval_level']:.0%} prediction interval {lo:.4g}-{hi:.4g})"
                if lo is not None and lo == lo else "")
        return (f"{label}: found {row['max_rate']:.4g} {unit}{band}; binding: "
                f"{row['binding']} (fails first, at {row['fail_rate']:.4g} {unit})")
    if status == "infeasible":
        busy = row.get("busy_fraction")
        idle = f", GPUs busy {busy:.1%}" if busy == busy and busy is not None else ""
        return (f"{label}: infeasible: {binding} fails even at {row['fail_rate']:.4g} "
                f"{unit}, the lowest rate probed{idle}; no capacity and no cost")
    return (f"{label}: unbounded: meets the SLOs at {row['max_rate']:.4g} {unit}, the highest "
            f"rate probed (the workload's requests do not load the deployment: raise "
            f"workload.max_requests / num_requests); no cost")


def run_capacity(config: str | Path, slo: str, attainment: float | None = None,
                 overrides: Iterable[str] | Mapping[str, Any] | None = None,
                 out: str | Path | None = None, tolerance: float = 0.05, jobs: int = 1,
                 quiet: bool = False, sweeps: Mapping[str, Any] | None = None
                 ) -> pd.DataFrame:
    """Search the capacity of every policy of ``config``; write capacity.csv and search.csv
    into ``out`` (default ``runs/<name>-capacity``) and return the capacity table.
    ``overrides`` and ``sweeps`` are those of ``sim.run_experiment``."""
    from sim.experiments.outdir import OutputLock, output_folder
    from sim.experiments.run import preflight

    if not is_real(tolerance) or not 0.001 <= tolerance <= 0.5:
        raise CapacityError(f"--tolerance: must be a number in [0.001, 0.5], got {tolerance!r}")
    jobs = check_jobs(jobs)
    check_flags(quiet=quiet)  # run_experiment's rule: quiet="no" is not a silent yes
    overrides, sweeps = plain_data(overrides), plain_data(sweeps)  # as run_experiment does
    path = config_path(config)
    slos = parse_slos(slo, attainment)
    base, targets = find_targets(
        path, overrides or [], slos, sweeps,
        None if quiet else lambda text: print(f"batchsim: {text}", file=sys.stderr))
    base_dir = str(path.resolve().parent)
    preflight([RunSpec(t.at(t.start), t.swept, t.label) for t in targets], Path(base_dir),
              str(path))
    folder = output_folder(out, base["name"], str(path), suffix="-capacity",
                           subfolder="probes")
    record = search_record(path, overrides, sweeps, slos, tolerance)
    with OutputLock(folder):
        return _search_all(base, targets, folder, base_dir, slos, tolerance, jobs, quiet,
                           record)


def search_record(path: Path, overrides: Iterable[str] | Mapping[str, Any] | None,
                  sweeps: Mapping[str, Any] | None, slos: Slos, tolerance: float
                  ) -> dict[str, Any]:
    """What ``capacity.yaml`` records of a search (``outdir.outputs_record``): the experiment
    as loaded and everything that decides the answer (``outdir.CAPACITY_DEFINING``), so a
    re-run of the same search compares equal (a resume) and any other search does not."""
    from sim.experiments.outdir import outputs_record

    return outputs_record(path, path.resolve().parent, overrides, sweeps, load_yaml(path),
                          slos={"percentiles": slos.percentiles,
                                "per_request": slos.per_request,
                                "attainment": slos.attainment},
                          tolerance=tolerance)


def _search_all(base: dict[str, Any], targets: list[Target], folder: Path, base_dir: str,
                slos: Slos, tolerance: float, jobs: int, quiet: bool,
                record: dict[str, Any]) -> pd.DataFrame:
    """``run_capacity`` once the output folder is checked and locked."""
    import yaml

    from sim.experiments.executors import stop_pool, worker_init
    from sim.experiments.outdir import (
        CAPACITY_DEFINING,
        CAPACITY_OUTPUTS,
        clean_temp_files,
        keep_previous_outputs,
    )

    clean_temp_files(folder)
    # another search's answer (other SLOs, tolerance, overrides) is moved aside, never
    # replaced; re-running the same search is a resume and moves nothing
    kept = keep_previous_outputs(folder, record, CAPACITY_OUTPUTS, CAPACITY_DEFINING)
    if kept is not None and not quiet:
        print(f"batchsim: {folder} held the answer of another capacity search: its "
              f"capacity.csv and search.csv are kept in {kept} (the probes stay shared in "
              f"{folder / 'probes'})", file=sys.stderr)
    write_text(folder / "capacity.yaml", yaml.safe_dump(record, sort_keys=False))
    show = (lambda *a, **k: None) if quiet else print
    show(f"capacity: {base['name']}: {len(targets)} search(es) over {targets[0].key}; pass = "
         f"every request finished and {slos.describe()}")
    pool = ProcessPoolExecutor(max_workers=jobs, initializer=worker_init) if jobs > 1 else None
    prober = _Prober(folder, base_dir, slos, pool, show, max(len(t.label) for t in targets))
    rows = []
    try:
        for t in targets:
            found = search(t.start, tolerance, jobs, partial(prober.evaluate, t),
                           prober.near_idle)
            rows.append(prober.row(t, found) | _interval(t, found, prober, tolerance, jobs))
    except BaseException:
        if pool is not None:
            stop_pool(pool)
        raise
    if pool is not None:
        pool.shutdown()
    table = pd.DataFrame(rows)
    write_text(folder / "capacity.csv", table.to_csv(index=False))
    write_text(folder / "search.csv", pd.DataFrame(prober.trace).to_csv(index=False))
    shown = table.drop(columns=["rate_key", "hardware", "policy", "fail_rate"])
    shown["cost_per_mtok_usd"] = [f"{v:.3f}" if v is not None and v == v else "n/a"
                                  for v in table["cost_per_mtok_usd"]]
    show("\n" + shown.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    show("")
    for r in rows:
        show(verdict(r))
    show(f"\nwrote {folder / 'capacity.csv'} and {folder / 'search.csv'}")
    return table
