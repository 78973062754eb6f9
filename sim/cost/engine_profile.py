"""An engine's CPU-side step overheads (``EngineProfile``): per step, row, layer and TP degree.

Loaded by name (``vllm-v0``, ``vllm-v1``, ``trtllm``, ``sglang``, ``ideal``) or YAML path; a
profile that is only ``alias_of: OTHER`` loads OTHER.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.core.errors import InputError
from sim.cost.profile_files import profile_number, read_raw
from sim.cost.profile_schema import ProfileError, check_engine


@dataclass(frozen=True)
class EngineProfile:
    """CPU-side cost an engine adds to each step, and its collectives' framework latency.

    Every TP degree pays ``per_step_s + per_seq_s · rows + per_layer_launch_s · layers``; at
    TP > 1 the step also pays ``tp_per_step_s + tp_per_rank_s · (tp − 2) + tp_per_seq_s · rows``
    (worker RPC, synchronisation, input broadcast) and each all-reduce takes at least its
    framework-level floor ``allreduce_floor_us`` (the host's dispatch and synchronisation of a
    collective called from the framework; a mapping by GPU profile name with a ``default``, or
    one number), never less than the GPU's kernel-level time. ``calibration`` says what
    the numbers were fitted on (``status``: ``fitted``, ``derived`` or ``by-definition``)."""

    name: str
    per_step_s: float = 0.0
    per_seq_s: float = 0.0
    per_layer_launch_s: float = 0.0
    description: str = ""
    sources: Mapping[str, str] = field(default_factory=dict)
    tp_per_step_s: float = 0.0
    tp_per_rank_s: float = 0.0
    tp_per_seq_s: float = 0.0
    allreduce_floor_us: Mapping[str, float] = field(default_factory=dict)
    calibration: Mapping[str, Any] = field(default_factory=dict)

    def overhead_terms(self, tp: int) -> tuple[float, float, float]:
        """``(per step s, per sequence s, per layer s)`` at TP degree ``tp``."""
        if tp <= 1:
            return self.per_step_s, self.per_seq_s, self.per_layer_launch_s
        return (self.per_step_s + self.tp_per_step_s + self.tp_per_rank_s * (tp - 2),
                self.per_seq_s + self.tp_per_seq_s, self.per_layer_launch_s)

    def allreduce_floor_s(self, gpu: str, tp: int) -> float:
        """The least time one all-reduce of ``tp`` GPUs named ``gpu`` takes (s); 0 at TP 1."""
        if tp <= 1:
            return 0.0
        floor = self.allreduce_floor_us
        return float(floor.get(gpu, floor.get("default", 0.0))) * 1e-6


_ENGINE_NUMBERS = ("per_step_s", "per_seq_s", "per_layer_launch_s", "tp_per_step_s",
                   "tp_per_rank_s", "tp_per_seq_s")


def _floor_map(data: Mapping[str, Any], origin: str) -> dict[str, float]:
    """``allreduce_floor_us`` of an engine profile as ``{gpu or "default": µs}``."""
    raw = data.get("allreduce_floor_us")
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raw = {"default": raw}
    return {str(k): float(profile_number(raw, k, f"{origin}: allreduce_floor_us")) for k in raw}


def engine_name(name_or_path: str | Path) -> str:
    """The profile name ``name_or_path`` loads (an alias gives its target), or the text itself
    when it does not load."""
    try:
        return load_engine(name_or_path).name
    except InputError:
        return str(name_or_path)


def load_engine(name_or_path: str | Path = "ideal") -> EngineProfile:
    """Load an engine profile by name (``vllm-v0``, ``vllm-v1``, ``trtllm``, ``sglang``,
    ``ideal``) or YAML path. A profile that is only ``alias_of: OTHER`` (``vllm`` names
    ``vllm-v0``, so configs written before the engine generations keep running) loads OTHER."""
    data, origin = read_raw("engines", name_or_path)
    for _ in range(4):  # an alias names a profile; a short chain at most, never a loop
        check_engine(data, origin)
        target = data.get("alias_of")
        if target is None:
            break
        extra = sorted(set(data) - {"alias_of", "name", "description", "sources"})
        if extra:  # an alias cannot also change numbers: they would be silently ignored
            raise ProfileError(f"an alias profile holds only alias_of (and name, description,"
                               f" sources); also given: {', '.join(extra)}", source=origin,
                               field="alias_of")
        data, origin = read_raw("engines", str(target))
    else:
        raise ProfileError(f"{origin}: alias_of chain too long (a loop?)")
    numbers = {k: float(profile_number(data, k, origin, 0.0)) for k in _ENGINE_NUMBERS}
    return EngineProfile(
        name=str(data.get("name", Path(origin).stem)),
        description=str(data.get("description", "")),
        sources=dict(data.get("sources") or {}),
        calibration=dict(data.get("calibration") or {}),
        allreduce_floor_us=_floor_map(data, origin),
        **numbers,
    )
