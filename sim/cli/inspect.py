"""What ``batchsim profiles --hardware X`` (and ``--model X``) prints: a profile's specs.

A GPU: dense peak TFLOP/s per dtype, memory size, type and bandwidth, interconnect, price and
its calibration status (fitted to measurements, with the held-out error, or datasheet-only).
A model: the architecture numbers the cost model counts with.
"""
from __future__ import annotations

from typing import Any

from sim.cost.profiles import GpuProfile, ModelSpec


def calibration_status(gpu: GpuProfile) -> str:
    """A status the profile's fit states in words, else ``fitted <date> to <data> (held-out
    error)`` for a fitted profile, else ``datasheet-only`` (efficiencies are initial values,
    not fitted to measurements)."""
    fit: Any = gpu.calibration.fit or {}
    if isinstance(fit, dict) and fit.get("status"):
        return str(fit["status"])
    if gpu.calibration_status != "fitted":
        return "datasheet-only (efficiencies are initial values, not fitted to measurements)"
    parts = ["fitted"]
    if isinstance(fit, dict) and fit.get("date"):
        parts.append(str(fit["date"]))
    data = gpu.calibration_data or (fit.get("data") if isinstance(fit, dict) else "")
    if data:
        parts.append(f"to {str(data).split(' (')[0]}")
    text = " ".join(parts)
    mdape = fit.get("heldout_mdape_pct") if isinstance(fit, dict) else None
    if isinstance(mdape, dict) and "overall" in mdape:
        text += f" (held-out median abs. error {mdape['overall']:g}%)"
    return text


def describe_gpu(gpu: GpuProfile) -> str:
    """The specs of one GPU profile, one fact a line."""
    ic, cal = gpu.interconnect, gpu.calibration
    peaks = ", ".join(f"{k} {v:g}" for k, v in gpu.peak_tflops.items())
    memory = f"{gpu.hbm_gb:g} GB {gpu.memory_type or '(memory type not given)'}"
    link = (f"{ic.type}, NVLink {ic.nvlink_gbps:g} GB/s" if ic.nvlink_gbps
            else f"{ic.type}, no NVLink")
    price = (f"${gpu.price_per_gpu_hour_usd:g} per GPU-hour"
             if gpu.price_per_gpu_hour_usd is not None else "n/a (no list price)")
    rows = [
        ("profile", gpu.origin or gpu.name),
        ("peak TFLOP/s", f"{peaks} (dense)"),
        ("memory", f"{memory}, {gpu.hbm_tbps:g} TB/s"),
        ("interconnect", f"{link}; all-reduce bus {ic.bus_bw_gbps:g} GB/s, "
                         f"latency {ic.allreduce_alpha_us:g} us"),
        ("PCIe", f"{gpu.pcie_gbps:g} GB/s one way"),
        ("price", price),
        ("efficiencies", f"compute up to {cal.compute_eff_max:g}, memory {cal.memory_eff:g}, "
                         f"kernel floor {cal.kernel_latency_us:g} us"),
        ("calibration", calibration_status(gpu)),
    ]
    head = f"{gpu.name}: {gpu.description}" if gpu.description else gpu.name
    return "\n".join([head, *(f"  {k:<13} {v}" for k, v in rows)])


def describe_model(spec: ModelSpec) -> str:
    """The architecture of one model spec, as the cost model counts it."""
    fields = {k: getattr(spec, k) for k in spec.__dataclass_fields__
              if k != "name" and not k.startswith("_")}
    width = max(len(k) for k in fields)
    return "\n".join([spec.name, *(f"  {k:<{width}} {v}" for k, v in fields.items()
                                   if v not in (None, "", {}))])
