"""Building and executing one run: config → workload, cost model, KV → ``simulate`` → files.

``execute_run`` is a plain top-level function of picklable arguments so that the local process
pool and a Dask cluster run exactly the same code and produce byte-identical results.
"""
from __future__ import annotations

import hashlib
import json
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from sim.cluster.simulate import simulate
from sim.core.errors import InputError, environment_failure
from sim.core.fields import set_off_default
from sim.core.paths import resolve_from
from sim.core.types import Request
from sim.core.version import __version__
from sim.cost.base import ConstantCost, CostModel, LinearCost
from sim.engine.simulate import SimResult
from sim.experiments.results import atomic_write, write_json, write_table, write_text
from sim.experiments.run_progress import RunProgress
from sim.kv.config import AUTO, KV_FIELDS, unused_kv_keys


def run_id(config: dict[str, Any]) -> str:
    """A stable hash of a resolved run config (its folder name); ``pin_inputs`` puts the
    digests of the run's input files into the config, so editing one makes a new run.
    Prediction intervals switched off (``intervals.draws: 0``, the default) are left out, so
    a run without them keeps the id it had before the block existed (older folders resume,
    result hashes compare)."""
    if (config.get("intervals") or {}).get("draws") == 0:
        config = {k: v for k, v in config.items() if k != "intervals"}
    blob = json.dumps(config, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


#: Digests already computed, by (path, size, mtime, inode): a sweep hashes each file once.
_DIGESTS: dict[tuple[str, int, int, int], str] = {}


def file_digest(path: Path) -> str:
    """The SHA-256 of a file's bytes (first 16 hex digits), cached while it is unchanged."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino)
    if key not in _DIGESTS:
        h = hashlib.sha256()
        with path.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        _DIGESTS[key] = h.hexdigest()[:16]
    return _DIGESTS[key]


def input_files(config: dict[str, Any], base_dir: Path | None) -> dict[str, Path]:
    """The user files a run reads, by the dotted key that names them: every ``trace`` of the
    workload that is a file (built-in traces are not: they come with batchsim) and, for the
    roofline model, a ``model``, ``hardware`` or ``engine`` given as a file."""
    from sim.cost.profiles import profile_file
    from sim.workload.traces import BUILTIN_TRACES, resolve_trace

    found: dict[str, Path] = {}
    stack: list[tuple[Any, str]] = [(config.get("workload"), "workload")]
    while stack:
        node, where = stack.pop()
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "trace" and isinstance(v, str) and v not in BUILTIN_TRACES:
                    try:
                        found[f"{where}.trace"] = resolve_trace(v, base_dir)
                    except InputError:
                        pass  # preflight reports it
                else:
                    stack.append((v, f"{where}.{k}"))
        elif isinstance(node, list):
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(node))
    if config.get("cost", {}).get("kind") == "roofline":
        for key in ("model", "hardware", "engine"):
            value = config.get(key)
            path = profile_file(resolve_from(value, base_dir)) if isinstance(value, str) else None
            if path is not None:
                found[key] = path
    return found


def pin_inputs(config: dict[str, Any], base_dir: Path | None) -> dict[str, Any]:
    """``config`` with ``inputs: {dotted key: digest}`` for each file it reads (unchanged
    when it reads none), so the run id changes whenever an input file does."""
    files = input_files(config, base_dir)
    if not files:
        return config
    return {**config, "inputs": {k: file_digest(p) for k, p in sorted(files.items())}}


def build_cost(config: dict[str, Any], base_dir: Path | None = None) -> CostModel:
    """The cost model a run config asks for; relative profile paths (``model``, ``hardware``,
    ``engine``) resolve from ``base_dir``, the experiment file's folder."""
    c = config["cost"]
    if c["kind"] == "constant":
        if c["step_s"] is None:
            raise InputError("required for the constant cost model", field="cost.step_s")
        return ConstantCost(step_s=c["step_s"])
    if c["kind"] == "linear":
        return LinearCost(base_s=c["base_s"], per_token_s=c["per_token_s"],
                          per_seq_s=c["per_seq_s"])
    from sim.cost.roofline import build_cost_model

    try:
        return build_cost_model(model=resolve_from(config["model"], base_dir),
                                hardware=resolve_from(config["hardware"], base_dir),
                                tp=config["parallelism"]["tp"],
                                engine=resolve_from(config["engine"], base_dir),
                                weight_dtype=c["weight_dtype"], kv_dtype=c["kv_dtype"])
    except InputError as e:  # name the YAML key, not the argument it became
        if e.field in YAML_KEY_OF_ARGUMENT and e.source is None:
            raise InputError(e.problem, field=YAML_KEY_OF_ARGUMENT[e.field]) from None
        raise


def engine_profile_of(config: dict[str, Any]) -> str:
    """The engine overhead profile a run config uses (``"none"`` for analytic cost models),
    as ``SimResult.engine_profile`` reports it."""
    if config["cost"]["kind"] != "roofline":
        return "none"
    from sim.cost.profiles import engine_name  # an alias (``vllm``) names its target

    return engine_name(str(config["engine"]))


def cluster_args(config: dict[str, Any]) -> dict[str, Any]:
    """``simulate``'s ``cluster`` arguments of a run config (none without a ``cluster`` block):
    the block, and the experiment's cost keys that its groups default to."""
    if config.get("cluster") is None:
        return {}
    c = config["cost"]
    if c["kind"] != "roofline":
        raise InputError("a cluster needs the roofline cost model (each group names its GPU)",
                         field="cluster")
    keys = {**group_defaults(config), "weight_dtype": c["weight_dtype"],
            "kv_dtype": c["kv_dtype"]}
    return {"cluster": config["cluster"], "cost_keys": keys}


def group_defaults(config: dict[str, Any]) -> dict[str, Any]:
    """The values a run config gives the cost keys its cluster groups may leave out
    (``sim.cluster.groups.COST_KEYS``, merged by ``sim.cluster.groups.inherit``)."""
    return {"model": config["model"], "hardware": config["hardware"],
            "tp": config["parallelism"]["tp"], "engine": config["engine"]}


def kv_spec(config: dict[str, Any]) -> dict[str, Any] | str | None:
    """The ``kv`` argument of ``simulate`` (``None`` = unlimited), less the keys this run does
    not read (``unused_kv_keys``: an experiment refuses those no run reads; a sweep's other
    runs read the rest). A block that sets nothing is ``simulate``'s own default, ``"auto"``
    (capacity from HBM, unlimited for an analytic cost model), so a YAML without ``kv:`` runs
    as ``sim.simulate`` without ``kv`` does."""
    if not any(set_off_default(config["kv"], KV_FIELDS, name) for name in KV_FIELDS):
        return AUTO
    kv = dict(config["kv"])
    if kv.pop("unlimited"):
        return None
    unused = {u.field.removeprefix("kv.") for u in unused_kv_keys(config["kv"])}
    return {k: v for k, v in kv.items() if v is not None and k not in unused}


def build_requests(config: dict[str, Any], base_dir: Path | None) -> list[Request]:
    """The run's requests, drawn with ``numpy.random.default_rng(seed)``."""
    from sim.workload.build import build_workload

    rng = np.random.default_rng(config["seed"])
    return build_workload(config["workload"], rng, base_dir=base_dir)


def simulate_config(config: dict[str, Any], base_dir: Path | None,
                    requests: list[Request] | None = None,
                    monitor: Callable[..., None] | None = None) -> SimResult:
    """Simulate one resolved run config and return its result (``monitor``: see
    ``simulate``). A config with ``interval_draw: [seed, k]`` (made by
    ``sim.experiments.intervals.draw_config``) runs on calibration draw ``k`` of the cost model.
    """
    if requests is None:
        requests = build_requests(config, base_dir)
    cost = build_cost(config, base_dir)
    cluster = cluster_args(config)
    if config.get("interval_draw") is not None:
        from sim.experiments.intervals import draw_cluster, draw_cost

        cost = draw_cost(cost, *config["interval_draw"])
        if cluster:
            cluster["cluster"] = draw_cluster(cluster["cluster"], cluster["cost_keys"],
                                              config["policy"], kv_spec(config),
                                              *config["interval_draw"])
    slos = {k: v for k, v in config["slos"].items() if v is not None}
    try:
        return simulate(requests, policy=config["policy"], cost=cost, kv=kv_spec(config),
                        seed=config["seed"],
                        # beside a cluster block, parallelism.replicas was noted once already
                        num_replicas=1 if cluster else config["parallelism"]["replicas"],
                        router=config.get("router"), **cluster,
                        warmup_s=config["metrics"]["warmup_s"],
                        cooldown_s=config["metrics"]["cooldown_s"], slos=slos or None,
                        step_table=config["metrics"]["step_table"],
                        horizon_s=config["limits"]["horizon_s"],
                        wall_clock_s=config["limits"]["wall_clock_s"],
                        max_model_len=config["limits"]["max_model_len"] or "model",
                        monitor=monitor)
    except InputError as e:  # name the YAML key, not the ``simulate`` argument it became
        if e.field in YAML_KEY_OF_ARGUMENT and e.source is None:
            raise InputError(e.problem, field=YAML_KEY_OF_ARGUMENT[e.field]) from None
        raise


#: ``simulate`` and ``build_cost_model`` arguments that a run config sets, by the YAML key
#: that sets them.
YAML_KEY_OF_ARGUMENT = {"warmup_s": "metrics.warmup_s", "cooldown_s": "metrics.cooldown_s",
                        "step_table": "metrics.step_table", "horizon_s": "limits.horizon_s",
                        "wall_clock_s": "limits.wall_clock_s",
                        "max_model_len": "limits.max_model_len", "tp": "parallelism.tp",
                        "weight_dtype": "cost.weight_dtype", "kv_dtype": "cost.kv_dtype"}


def execute_run(config: dict[str, Any], base_dir: str | None, run_dir: str,
                progress: str | None = None) -> dict[str, Any]:
    """Run one config into ``run_dir``; return its summary (or ``{"error": ...}``).

    ``progress``: a label to show a progress bar under while the run goes (on a terminal
    only; ``sim.experiments.run_progress``).

    Files are written atomically and ``summary.json`` last, so a folder without it is an
    unfinished run that a resume will redo.
    """
    folder = Path(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    rid = folder.name
    # a damaged earlier attempt's marker goes first: it must never stand beside new files
    (folder / "summary.json").unlink(missing_ok=True)
    write_text(folder / "config.yaml", yaml.safe_dump(config, sort_keys=False))
    (folder / "error.txt").unlink(missing_ok=True)
    t0 = time.perf_counter()
    try:
        with RunProgress(progress or "", enabled=None if progress else False) as bar:
            folder_in = Path(base_dir) if base_dir else None
            # the monitor only when a bar is drawn: a plain run calls simulate_config as before
            res = (simulate_config(config, folder_in, monitor=bar.attach) if bar.enabled
                   else simulate_config(config, folder_in))
    except Exception as e:  # noqa: BLE001 - a failed run is recorded, the sweep goes on
        if environment_failure(e) is not None:
            raise  # out of memory, a full disk: the machine's problem, it stops the sweep
        write_text(folder / "error.txt", f"{type(e).__name__}: {e}\n\n{traceback.format_exc()}")
        return {"error": f"{type(e).__name__}: {e}"}
    meta = {"version": __version__, "config_hash": rid, "seed": config["seed"]}
    write_table(folder / "requests", res.requests, meta)
    write_table(folder / "steps", res.steps, meta)
    for name, extra in (("replicas", res.replicas), ("groups", res.groups),
                        ("links", res.links)):
        if extra is not None:  # routed runs: one row per replica, per group, per KV link
            write_table(folder / name, extra, meta)
    gaps, counts = res.irregular_itl_runs  # one row per run: (gap seconds, tokens)
    itl = np.column_stack([np.asarray(gaps, dtype=float), np.asarray(counts, dtype=float)])

    def save_itl(path: Path) -> None:
        with path.open("wb") as fh:
            np.save(fh, itl)

    atomic_write(folder / "itl_irregular.npy", save_itl)
    summary = {**res.summary, "run_id": rid, "batchsim_version": __version__,
               "wall_s": round(time.perf_counter() - t0, 3),
               "num_blocks": res.kv.num_blocks if res.kv and not res.kv.unlimited else None,
               # which simulator engine ran and why no faster one did (not a result: kept
               # out of summary.csv, reported on the console)
               "sim_engine": res.engine, "sim_engine_reason": res.engine_reason,
               "sim_step_engine": res.step_engine,
               "sim_step_engine_reason": res.step_engine_reason}
    if config.get("intervals", {}).get("draws"):  # prediction intervals: the run's draws
        from sim.experiments.intervals import config_intervals

        try:
            summary |= config_intervals(config, Path(base_dir) if base_dir else None,
                                        res.summary)
        except Exception as e:  # noqa: BLE001 - recorded like a failed run
            if environment_failure(e) is not None:
                raise
            write_text(folder / "error.txt",
                       f"{type(e).__name__}: {e}\n\n{traceback.format_exc()}")
            return {"error": f"{type(e).__name__}: {e}"}
        summary["wall_s"] = round(time.perf_counter() - t0, 3)  # the draws included
    write_json(folder / "summary.json", summary)
    return {**summary, "first_rejection": first_rejection(res.requests)}


def first_rejection(requests: Any) -> str:
    """Why the first rejected request of a run's requests table was rejected ('' if none): the
    console names it (the table's ``reason`` column has every one)."""
    if "status" not in requests or "reason" not in requests:
        return ""
    rejected = requests["reason"][requests["status"] == "rejected"]
    return str(rejected.iloc[0]) if len(rejected) else ""
