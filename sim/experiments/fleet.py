"""The GPUs a run's deployment occupies, per GPU type, and what they cost per output token.

Without a ``cluster`` block a run occupies ``parallelism.tp × parallelism.replicas`` GPUs of
its ``hardware``. With one, each group occupies ``replicas × tp`` GPUs of its own hardware (a
key a group leaves out takes the experiment's value: ``sim.cluster.groups.inherit`` and
``GROUP_FIELDS``' defaults, the rules the cluster is built by), so a heterogeneous or
disaggregated deployment is counted and priced GPU by GPU.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sim.cluster.groups import GROUP_FIELDS, inherit
from sim.core.fields import validate_fields
from sim.experiments.runner import group_defaults


def fleet(config: Mapping[str, Any]) -> dict[str, int]:
    """GPUs per hardware name (in the order the groups list them) of one run's config."""
    par = config["parallelism"]
    cluster = config.get("cluster")
    if not cluster:
        return {config["hardware"]: int(par["tp"]) * int(par["replicas"])}
    defaults = group_defaults(dict(config))
    out: dict[str, int] = {}
    for i, raw in enumerate(cluster["groups"]):
        g = validate_fields(dict(raw), GROUP_FIELDS, f"cluster.groups[{i}].")
        keys = inherit(g, defaults)
        hardware = keys["hardware"]
        out[hardware] = out.get(hardware, 0) + int(keys["tp"]) * int(g["replicas"])
    return out


def fleet_label(gpus: Mapping[str, int]) -> str:
    """The hardware column of a fleet: one name, or ``4×h100-sxm+4×a100-80gb`` when mixed."""
    if len(gpus) == 1:
        return next(iter(gpus))
    return "+".join(f"{n}×{hw}" for hw, n in gpus.items())


def cost_per_mtok(config: Mapping[str, Any], output_throughput: float,
                  base_dir: str | None = None) -> float | None:
    """USD per million output tokens: the fleet's list price per hour / output tokens per hour
    (``None`` when a GPU of the fleet has no list price or nothing was produced)."""
    from sim.core.paths import resolve_from
    from sim.cost.profiles import load_gpu

    if not output_throughput > 0:
        return None
    usd_per_hour = 0.0
    for hardware, gpus in fleet(config).items():
        try:
            price = load_gpu(resolve_from(hardware, Path(base_dir) if base_dir else None)
                             ).price_per_gpu_hour_usd
        except (ValueError, OSError):
            return None
        if price is None:
            return None
        usd_per_hour += price * gpus
    return usd_per_hour / (output_throughput * 3600) * 1e6
