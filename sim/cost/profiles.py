"""GPU, model-architecture and engine-overhead profiles: one import for all three kinds.

GPU profiles (``GpuProfile``, ``load_gpu``) are defined here; model specs live in
``sim.cost.model_profile``, engine overheads in ``sim.cost.engine_profile`` and the file
lookup in ``sim.cost.profile_files``, re-exported so callers import every profile name from
this module. Every number in a built-in profile carries a ``source``. Units live in field
names: ``_gb`` gigabytes, ``_tbps`` terabytes/s, ``_gbps`` gigabytes/s (bytes, not bits),
``_us`` microseconds, ``_s`` seconds.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.core.errors import InputError
from sim.cost.engine_profile import EngineProfile, engine_name, load_engine
from sim.cost.model_profile import ModelSpec, load_model
from sim.cost.profile_files import (
    builtin_files,
    list_engines,
    list_gpus,
    list_models,
    profile_file,
    profile_number,
    read_raw,
)
from sim.cost.profile_schema import ProfileError, check_gpu

#: Bytes per element of each supported weight / KV dtype. int4 is weight-only (AWQ/GPTQ style).
DTYPE_BYTES: Mapping[str, float] = {
    "fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5,
}

__all__ = ["DTYPE_BYTES", "Calibration", "EngineProfile", "GpuProfile", "Interconnect",
           "ModelSpec", "ProfileError", "builtin_files", "calibration_note",
           "calibration_notes", "engine_name", "list_engines", "list_gpus", "list_models",
           "load_engine", "load_gpu", "load_model", "profile_file"]


@dataclass(frozen=True)
class Interconnect:
    """GPU-to-GPU link: datasheet bandwidth, the per-direction NCCL bus ceiling, all-reduce α."""

    type: str
    nvlink_gbps: float
    bus_bw_gbps: float
    allreduce_alpha_us: float
    alpha_per_peer_us: float = 0.0


@dataclass(frozen=True)
class Calibration:
    """Efficiency parameters of the roofline (see ``sim.cost.roofline`` for how each is used).

    ``compute_eff(m) = compute_eff_max · m / (m + compute_m_half)`` for a GEMM with ``m`` token
    rows; ``memory_eff`` scales HBM bandwidth; ``kernel_latency_us`` is the fixed floor each
    kernel pays; ``attention_*`` play the same roles for the attention kernel
    (``attention_m_half`` in new tokens per prefill row; memory efficiency and latency default to
    the GEMM ones); ``attention_row_tokens`` is the fixed per-sequence work of a decode kernel,
    in KV tokens; ``comm_eff`` scales the all-reduce bus bandwidth.
    """

    compute_eff_max: float = 0.75
    compute_m_half: float = 64.0
    memory_eff: float = 0.85
    attention_compute_eff: float = 0.5
    attention_m_half: float = 0.0
    attention_memory_eff: float | None = None
    attention_latency_us: float | None = None
    attention_row_tokens: float = 0.0
    kernel_latency_us: float = 4.0
    comm_eff: float = 0.8
    fit: Mapping[str, Any] = field(default_factory=dict)


#: The calibration states a GPU profile can declare (``calibration.status``).
CALIBRATION_STATUSES = ("fitted", "datasheet-only")


def calibration_note(gpu: GpuProfile) -> str:
    """One line saying how far ``gpu``'s numbers are measured: what they were fitted on, or a
    warning that they are datasheet peaks with hand-set efficiencies."""
    if gpu.calibration_status == "fitted":
        return f"{gpu.name}: calibrated (fitted on {gpu.calibration_data or 'measurements'})"
    return (f"WARNING: {gpu.name} is datasheet-only: peaks from the datasheet, hand-set "
            "efficiencies, never fitted to measurements (no known error)")


def calibration_notes(hardware: list[str] | tuple[str, ...]) -> list[str]:
    """``calibration_note`` of each distinct GPU named in ``hardware`` (names or paths; one that
    does not load is left out: the run itself reports that error)."""
    notes = []
    for name in dict.fromkeys(hardware):
        try:
            notes.append(calibration_note(load_gpu(name)))
        except InputError:
            continue
    return notes


@dataclass(frozen=True)
class GpuProfile:
    """One GPU: dense peaks per dtype (TFLOP/s), memory, links, price and calibration."""

    name: str
    description: str
    peak_tflops: Mapping[str, float]
    hbm_gb: float
    hbm_tbps: float
    interconnect: Interconnect
    pcie_gbps: float
    price_per_gpu_hour_usd: float | None
    calibration: Calibration
    sources: Mapping[str, str]
    origin: str = ""
    #: Device memory technology (``HBM3``, ``GDDR6``...); ``""`` when the profile omits it.
    #: ``hbm_gb`` / ``hbm_tbps`` hold the size and bandwidth of whichever memory it is.
    memory_type: str = ""
    #: ``fitted`` (efficiencies fitted to measurements, named by ``calibration_data``) or
    #: ``datasheet-only`` (hand-set efficiencies on datasheet peaks: no measured error).
    calibration_status: str = "datasheet-only"
    calibration_data: str = ""

    def peak_flops(self, dtype: str = "bf16") -> float:
        """Dense FLOP/s of one GPU for ``dtype``; weight-only formats (or a GPU without the
        dtype's tensor cores, e.g. fp8 on A100) compute in bf16, so they get the bf16 peak."""
        tflops = self.peak_tflops.get(dtype) or self.peak_tflops["bf16"]
        return float(tflops) * 1e12

    @property
    def hbm_bytes(self) -> float:
        """Device memory in bytes (decimal GB, as datasheets count)."""
        return self.hbm_gb * 1e9

    @property
    def hbm_bytes_per_s(self) -> float:
        """Datasheet memory bandwidth in bytes/s."""
        return self.hbm_tbps * 1e12


def load_gpu(name_or_path: str | Path) -> GpuProfile:
    """Load a GPU profile by built-in name (``h100-sxm``) or path to a YAML file."""
    data, origin = read_raw("gpus", name_or_path)
    check_gpu(data, origin, set(Calibration.__dataclass_fields__) - {"fit"})
    peaks = data["peak_tflops"]
    ic = data.get("interconnect") or {}
    cal = dict(data.get("calibration") or {})
    fit = cal.pop("fit", {}) or {}
    status = str(cal.pop("status", "fitted" if fit else "datasheet-only"))
    if status not in CALIBRATION_STATUSES:
        raise ProfileError(f"{origin}: calibration.status must be one of "
                           f"{', '.join(CALIBRATION_STATUSES)}, got {status!r}")
    fitted_on = str(cal.pop("fitted_on", fit.get("data", "")))
    known = set(Calibration.__dataclass_fields__) - {"fit"}
    if set(cal) - known:
        raise ProfileError(f"{origin}: unknown calibration keys {sorted(set(cal) - known)}; "
                           f"known: {sorted(known)}")
    return GpuProfile(
        name=str(data.get("name", Path(origin).stem)),
        description=str(data.get("description", "")),
        peak_tflops={k: float(v) for k, v in peaks.items() if v is not None},
        hbm_gb=float(profile_number(data, "hbm_gb", origin)),
        hbm_tbps=float(profile_number(data, "hbm_tbps", origin)),
        interconnect=Interconnect(
            type=str(ic.get("type", "none")),
            nvlink_gbps=float(profile_number(ic, "nvlink_gbps", origin, 0.0)),
            bus_bw_gbps=float(profile_number(ic, "bus_bw_gbps", origin,
                                             data.get("pcie_gbps", 32.0))),
            allreduce_alpha_us=float(profile_number(ic, "allreduce_alpha_us", origin, 10.0)),
            alpha_per_peer_us=float(profile_number(ic, "alpha_per_peer_us", origin, 0.0)),
        ),
        pcie_gbps=float(profile_number(data, "pcie_gbps", origin, 32.0)),
        price_per_gpu_hour_usd=data.get("price_per_gpu_hour_usd"),
        calibration=Calibration(**{k: float(v) for k, v in cal.items() if v is not None},
                                fit=fit),
        sources=dict(data.get("sources") or {}),
        origin=origin,
        memory_type=str(data.get("memory_type") or ""),
        calibration_status=status,
        calibration_data=fitted_on,
    )
