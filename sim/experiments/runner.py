"""Building and executing one run: config → workload, cost model, KV → ``simulate`` → files.

``execute_run`` is a plain top-level function of picklable arguments so that the local process
pool and a Dask cluster run exactly the same code and produce byte-identical results.
"""
from __future__ import annotations

import hashlib
import json
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from sim.cluster.simulate import simulate
from sim.core.errors import InputError
from sim.core.types import Request
from sim.core.version import __version__
from sim.cost.base import ConstantCost, CostModel, LinearCost
from sim.engine.simulate import SimResult
from sim.experiments.results import atomic_write, write_json, write_table, write_text


def run_id(config: dict[str, Any]) -> str:
    """A stable hash of a resolved run config (its folder name)."""
    blob = json.dumps(config, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def build_cost(config: dict[str, Any]) -> CostModel:
    """The cost model a run config asks for."""
    c = config["cost"]
    if c["kind"] == "constant":
        if c["step_s"] is None:
            raise InputError("required for the constant cost model", field="cost.step_s")
        return ConstantCost(step_s=c["step_s"])
    if c["kind"] == "linear":
        return LinearCost(base_s=c["base_s"], per_token_s=c["per_token_s"],
                          per_seq_s=c["per_seq_s"])
    from sim.cost.roofline import build_cost_model

    return build_cost_model(model=config["model"], hardware=config["hardware"],
                            tp=config["parallelism"]["tp"], engine=config["engine"],
                            weight_dtype=c["weight_dtype"], kv_dtype=c["kv_dtype"])


def engine_profile_of(config: dict[str, Any]) -> str:
    """The engine overhead profile a run config uses (``"none"`` for analytic cost models),
    as ``SimResult.engine_profile`` reports it."""
    return str(config["engine"]) if config["cost"]["kind"] == "roofline" else "none"


def cluster_args(config: dict[str, Any]) -> dict[str, Any]:
    """``simulate``'s ``cluster`` arguments of a run config (none without a ``cluster`` block):
    the block, and the experiment's cost keys that its groups default to."""
    if config.get("cluster") is None:
        return {}
    c = config["cost"]
    if c["kind"] != "roofline":
        raise InputError("a cluster needs the roofline cost model (each group names its GPU)",
                         field="cluster")
    keys = {"model": config["model"], "hardware": config["hardware"],
            "tp": config["parallelism"]["tp"], "engine": config["engine"],
            "weight_dtype": c["weight_dtype"], "kv_dtype": c["kv_dtype"]}
    return {"cluster": config["cluster"], "cost_keys": keys}


def kv_spec(config: dict[str, Any]) -> dict[str, Any] | None:
    """The ``kv`` argument of ``simulate`` (``None`` = unlimited)."""
    kv = dict(config["kv"])
    if kv.pop("unlimited"):
        return None
    return {k: v for k, v in kv.items() if v is not None}


def build_requests(config: dict[str, Any], base_dir: Path | None) -> list[Request]:
    """The run's requests, drawn with ``numpy.random.default_rng(seed)``."""
    from sim.workload.build import build_workload

    rng = np.random.default_rng(config["seed"])
    return build_workload(config["workload"], rng, base_dir=base_dir)


def simulate_config(config: dict[str, Any], base_dir: Path | None,
                    requests: list[Request] | None = None) -> SimResult:
    """Simulate one resolved run config and return its result."""
    if requests is None:
        requests = build_requests(config, base_dir)
    cost = build_cost(config)
    slos = {k: v for k, v in config["slos"].items() if v is not None}
    return simulate(requests, policy=config["policy"], cost=cost, kv=kv_spec(config),
                        seed=config["seed"], num_replicas=config["parallelism"]["replicas"],
                        router=config.get("router"), **cluster_args(config),
                        warmup_s=config["metrics"]["warmup_s"],
                        cooldown_s=config["metrics"]["cooldown_s"], slos=slos or None,
                        horizon_s=config["limits"]["horizon_s"],
                        wall_clock_s=config["limits"]["wall_clock_s"],
                        max_model_len=config["limits"]["max_model_len"] or "model")


def execute_run(config: dict[str, Any], base_dir: str | None, run_dir: str) -> dict[str, Any]:
    """Run one config into ``run_dir``; return its summary (or ``{"error": ...}``).

    Files are written atomically and ``summary.json`` last, so a folder without it is an
    unfinished run that a resume will redo.
    """
    folder = Path(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    rid = folder.name
    write_text(folder / "config.yaml", yaml.safe_dump(config, sort_keys=False))
    (folder / "error.txt").unlink(missing_ok=True)
    t0 = time.perf_counter()
    try:
        res = simulate_config(config, Path(base_dir) if base_dir else None)
    except Exception as e:  # noqa: BLE001 - a failed run is recorded, the sweep goes on
        write_text(folder / "error.txt", f"{type(e).__name__}: {e}\n\n{traceback.format_exc()}")
        return {"error": f"{type(e).__name__}: {e}"}
    meta = {"version": __version__, "config_hash": rid, "seed": config["seed"]}
    write_table(folder / "requests", res.requests, meta)
    write_table(folder / "steps", res.steps, meta)
    for name, extra in (("replicas", res.replicas), ("groups", res.groups)):
        if extra is not None:  # routed runs: one row per replica, and per group of a cluster
            write_table(folder / name, extra, meta)
    gaps, counts = res.irregular_itl_runs  # one row per run: (gap seconds, tokens)
    itl = np.column_stack([np.asarray(gaps, dtype=float), np.asarray(counts, dtype=float)])

    def save_itl(path: Path) -> None:
        with path.open("wb") as fh:
            np.save(fh, itl)

    atomic_write(folder / "itl_irregular.npy", save_itl)
    summary = {**res.summary, "run_id": rid, "batchsim_version": __version__,
               "wall_s": round(time.perf_counter() - t0, 3),
               "num_blocks": res.kv.num_blocks if res.kv and not res.kv.unlimited else None}
    write_json(folder / "summary.json", summary)
    return summary
