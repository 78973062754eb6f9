"""The ``kv`` configuration block, defined once: keys, types, defaults, units and meanings.

``KV_FIELDS`` is the single definition. The experiment schema embeds it as its ``kv`` block,
``sim.simulate(kv={...})`` validates its argument against it with the same function and
messages, ``KVConfig``'s defaults are read from it, and the docs' reference table is generated
from it. ``resolve_kv`` turns a user's block into the engine's ``KVConfig``, deriving what the
user left out (block count from HBM, swap bandwidth from PCIe) from the cost model.
"""
from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sim.core.errors import InputError
from sim.core.fields import (
    INT,
    MIN_GBPS,
    NUM,
    OPT,
    STR,
    Key,
    Unused,
    check_value,
    set_off_default,
    validate_fields,
)
from sim.cost.base import KVSizedCost

#: Blocks given to an "unlimited" cache: large enough never to bind, small enough for int64 math.
#: Also the most blocks a cache may have.
UNLIMITED_BLOCKS = 1 << 40
#: Most tokens per block: the engines keep per-block arrays of this length (``2**40`` tokens
#: would be an 8 TiB allocation), and a block longer than the longest request
#: (``MAX_TOKENS``, 10M) is pointless; vLLM's are 16 to 256.
MAX_BLOCK_SIZE = 1 << 16
#: Largest activation reserve (GB per GPU): more than any GPU's memory, well within floats.
MAX_RESERVE_GB = 1e5

ALLOCATORS = ("paged", "slab")
SLAB_RESERVES = ("max_model_len", "prompt_plus_max_output")
PREEMPTIONS = ("recompute", "swap")

#: Every key of the ``kv`` block (YAML ``kv:`` and ``sim.simulate(kv=...)`` alike).
KV_FIELDS: dict[str, Key] = {
    "num_blocks": Key(INT + (OPT,), None, "KV blocks per replica; default: derived from "
                      "HBM, weights and gpu_memory_utilization (an analytic cost model has "
                      "no HBM: unlimited KV when no kv key is set, else required).", minimum=1,
                      maximum=UNLIMITED_BLOCKS),
    "block_size": Key(INT, 16, "Tokens per KV block.", "tokens", 1, maximum=MAX_BLOCK_SIZE),
    "allocator": Key(STR, "paged", "paged (blocks on demand) or slab (reserve "
                     "reserve_tokens per sequence at admission).", choices=ALLOCATORS),
    "reserve_tokens": Key(INT + (OPT,), None, "slab: tokens reserved per sequence "
                          "(e.g. max_model_len).", "tokens", 1),
    "gpu_memory_utilization": Key(NUM, 0.9, "Share of HBM the engine may use.", "", 0, True,
                                  maximum=1.0),
    "activation_reserve_gb": Key(NUM + (OPT,), None, "HBM kept for activations per GPU; "
                                 "default from the cost model.", "GB", 0,
                                 maximum=MAX_RESERVE_GB),
    "unlimited": Key((bool,), False, "Ignore KV capacity entirely (analytic studies)."),
    "slab_reserve": Key(STR, "max_model_len", "slab: reserve reserve_tokens per sequence "
                        "(max_model_len) or its prompt + max_output_tokens.",
                        choices=SLAB_RESERVES),
    "max_output_tokens": Key(INT + (OPT,), None, "slab with prompt_plus_max_output: output "
                             "tokens reserved per sequence.", "tokens", 1),
    "preemption": Key(STR, "recompute", "Out of blocks: drop the KV and recompute it, or "
                      "swap it to host memory over PCIe.", choices=PREEMPTIONS),
    "swap_gbps": Key(NUM + (OPT,), None, "swap: host link bandwidth of a replica; default "
                     "gpu.pcie_gbps × tp.", "GB/s", MIN_GBPS),
    "kv_bytes_per_token": Key(NUM + (OPT,), None, "swap: KV bytes per token of a replica; "
                              "default from the cost model.", "B", 0, True),
    "max_preemptions": Key(INT + (OPT,), 64, "Reject a request preempted more often than this "
                           "(livelock guard; null: unbounded).", "", 0),
    "prefix_caching": Key((bool,), False, "Reuse cached KV blocks of shared prompt prefixes "
                          "(requests' hash_ids or prefix_id / num_prefix_tokens), evicted LRU."),
}


def _default(name: str) -> Any:
    return KV_FIELDS[name].default


def unused_kv_keys(block: Mapping[str, Any]) -> list[Unused]:
    """The keys of a ``kv`` block (defaults filled in or not) that its composition never reads:
    every key beside ``unlimited: true`` (it drops them all), a slab key without the slab
    allocator or its reserve, ``swap_gbps`` without swap preemption, and the HBM keys beside an
    explicit ``num_blocks``. The slab and swap keys are harmless (notes: a loop or sweep over
    the allocator or preemption mode keeps them); the others contradict what is set beside
    them (errors)."""
    block = dict(block)

    def get(name: str) -> Any:
        return block.get(name, _default(name))

    given = [name for name in KV_FIELDS if set_off_default(block, KV_FIELDS, name)]
    if get("unlimited"):
        return [Unused(f"kv.{name}", block[name], "kv.unlimited: true ignores KV capacity and "
                       "every other kv key; drop one of them") for name in given
                if name != "unlimited"]
    slab = get("allocator") == "slab"
    reserve = get("slab_reserve")
    read_by = {  # key: (read here?, what reads it, contradictory?)
        "slab_reserve": (slab, "only kv.allocator: slab reads it", False),
        "reserve_tokens": (slab and reserve == "max_model_len", "only kv.allocator: slab with "
                           "kv.slab_reserve: max_model_len reads it", False),
        "max_output_tokens": (slab and reserve == "prompt_plus_max_output", "only kv.allocator: "
                              "slab with kv.slab_reserve: prompt_plus_max_output reads it",
                              False),
        "swap_gbps": (get("preemption") == "swap", "only kv.preemption: swap reads it", False),
        "gpu_memory_utilization": (get("num_blocks") is None, "kv.num_blocks sets the capacity "
                                   "it would derive from HBM; drop one of them", True),
        "activation_reserve_gb": (get("num_blocks") is None, "kv.num_blocks sets the capacity "
                                  "it would derive from HBM; drop one of them", True),
    }
    return [Unused(f"kv.{name}", block[name], read_by[name][1], read_by[name][2])
            for name in given if name in read_by and not read_by[name][0]]


def check_kv_keys(block: Mapping[str, Any]) -> None:
    """Refuse the first contradictory key of ``unused_kv_keys`` and note the others (a
    ``UserWarning``, one line on stderr): ``sim.simulate``'s check of its ``kv`` argument, one
    run's worth of an experiment's (``sim.experiments.unused``; ``kv_spec`` leaves out what a
    run does not read, so a sweep's runs are not noted one by one)."""
    unused = unused_kv_keys(block)
    for key in unused:
        if key.contradicts:
            raise key.error()
    for key in unused:
        warnings.warn(key.note(), UserWarning, stacklevel=4)


@dataclass(frozen=True)
class KVConfig:
    """Resolved KV-cache configuration of one replica (defaults: ``KV_FIELDS``).

    ``swap_s_per_token`` and ``kv_bytes_per_token`` (one replica, all its GPUs) price a swap:
    a sequence of ``c`` computed tokens moves ``c × kv_bytes_per_token`` bytes each way in
    ``c × swap_s_per_token`` seconds. ``max_preemptions`` bounds how often one request may be
    preempted before it is rejected (``None``: unbounded).
    """

    num_blocks: int
    block_size: int = _default("block_size")
    allocator: str = _default("allocator")
    reserve_tokens: int | None = _default("reserve_tokens")
    unlimited: bool = _default("unlimited")
    slab_reserve: str = _default("slab_reserve")
    max_output_tokens: int | None = _default("max_output_tokens")
    preemption: str = _default("preemption")
    swap_s_per_token: float | None = None
    kv_bytes_per_token: float | None = _default("kv_bytes_per_token")
    max_preemptions: int | None = _default("max_preemptions")
    prefix_caching: bool = _default("prefix_caching")

    def __post_init__(self) -> None:
        # a KVConfig built by hand from Python meets the rules of the ``kv`` block
        for name in ("num_blocks", "block_size", "reserve_tokens", "max_output_tokens",
                     "max_preemptions"):
            check_value(getattr(self, name), KV_FIELDS[name], f"kv.{name}")
        if self.allocator not in ALLOCATORS:
            raise InputError(f"unknown {self.allocator!r}; accepted: {ALLOCATORS}",
                             field="kv.allocator")
        if self.slab_reserve not in SLAB_RESERVES:
            raise InputError(f"unknown {self.slab_reserve!r}; accepted: {SLAB_RESERVES}",
                             field="kv.slab_reserve")
        if self.preemption not in PREEMPTIONS:
            raise InputError(f"unknown {self.preemption!r}; accepted: {PREEMPTIONS}",
                             field="kv.preemption")
        if self.allocator == "slab":
            if self.slab_reserve == "max_model_len" and not self.reserve_tokens:
                raise InputError("the slab allocator needs the tokens reserved per sequence "
                                 "(e.g. max_model_len)", field="kv.reserve_tokens")
            if self.slab_reserve == "prompt_plus_max_output" and not self.max_output_tokens:
                raise InputError("slab_reserve=prompt_plus_max_output needs the output tokens "
                                 "reserved per sequence", field="kv.max_output_tokens")
        if self.preemption == "swap" and (self.swap_s_per_token is None
                                          or self.kv_bytes_per_token is None):
            raise InputError("swap preemption needs the host link bandwidth and "
                             "kv.kv_bytes_per_token (derived from a roofline cost model)",
                             field="kv.swap_gbps")

    @property
    def capacity_tokens(self) -> int:
        """Tokens the cache can hold when every block is full."""
        return self.num_blocks * self.block_size

    def reserve_for(self, num_prompt_tokens: int) -> int:
        """Tokens a slab reserves for a sequence with this prompt at admission (0 when paged)."""
        if self.allocator != "slab":
            return 0
        if self.slab_reserve == "prompt_plus_max_output":
            return num_prompt_tokens + int(self.max_output_tokens or 0)
        return int(self.reserve_tokens or 0)


#: ``sim.simulate``'s default ``kv``: what an experiment YAML without a ``kv:`` block gets.
AUTO = "auto"


def resolve_kv(kv: Mapping[str, Any] | KVConfig | str | None, cost: Any) -> KVConfig:
    """Turn a ``kv`` block (or ``None``: unlimited) into a ``KVConfig`` for ``cost``'s replica.

    ``"auto"`` (the default of ``sim.simulate``) is the default block, as a YAML without ``kv:`` has
    it, when the cost model knows its hardware (capacity from HBM), and unlimited for an analytic
    cost model, which has no memory to derive a capacity from. The block is validated against
    ``KV_FIELDS`` exactly as the YAML's is, and omitted keys take the same defaults. Without
    ``num_blocks`` the capacity comes from the cost model (``kv_capacity_tokens``: HBM × utilization
    − weights − activation reserve), which only a roofline model knows; analytic models then need an
    explicit ``num_blocks``.
    """
    if isinstance(kv, KVConfig):
        return kv
    if isinstance(kv, str) and kv == AUTO:
        kv = {} if isinstance(cost, KVSizedCost) else None
    if kv is None:
        return KVConfig(num_blocks=UNLIMITED_BLOCKS, unlimited=True)
    if not isinstance(kv, Mapping):
        raise InputError(f"expected a mapping, a KVConfig or None, got {type(kv).__name__}",
                         field="kv")
    block = validate_fields(dict(kv), KV_FIELDS, "kv.")
    check_kv_keys(kv)
    if block["unlimited"]:
        return KVConfig(num_blocks=UNLIMITED_BLOCKS, unlimited=True)
    num_blocks = block["num_blocks"]
    if num_blocks is None:
        capacity = cost.kv_capacity_tokens if isinstance(cost, KVSizedCost) else None
        if capacity is None:
            raise InputError("required when the cost model has no hardware profile to derive "
                             "KV capacity from", field="kv.num_blocks")
        extra = {k: block[k] for k in ("gpu_memory_utilization", "activation_reserve_gb")
                 if block[k] is not None}
        num_blocks = int(capacity(**extra)) // block["block_size"]
        if num_blocks < 1:
            raise InputError("no memory left for the KV cache after the weights", field="kv")
    swap_s_per_token, bytes_per_token = swap_rate(block, cost)
    return KVConfig(num_blocks=int(num_blocks), block_size=block["block_size"],
                    allocator=block["allocator"], reserve_tokens=block["reserve_tokens"],
                    slab_reserve=block["slab_reserve"],
                    max_output_tokens=block["max_output_tokens"],
                    preemption=block["preemption"], swap_s_per_token=swap_s_per_token,
                    kv_bytes_per_token=bytes_per_token,
                    max_preemptions=block["max_preemptions"],
                    prefix_caching=block["prefix_caching"])


def replica_kv_bytes_per_token(block: Mapping[str, Any], cost: Any) -> float | None:
    """KV bytes per token of one replica, all its GPUs: ``kv.kv_bytes_per_token``, else the
    cost model's per-GPU figure × TP (``None`` when neither knows: an analytic model)."""
    nbytes = block.get("kv_bytes_per_token")
    per_gpu = getattr(cost, "kv_bytes_per_token", None)
    if nbytes is None and per_gpu is not None:
        nbytes = float(per_gpu) * getattr(cost, "tp", 1)
    return None if nbytes is None else float(nbytes)


def swap_rate(block: Mapping[str, Any], cost: Any) -> tuple[float | None, float | None]:
    """Seconds per token and bytes per token of moving a sequence's KV to or from host memory.

    Bytes per token are the replica's (per-GPU KV bytes × TP); the link is each GPU's PCIe, all
    TP GPUs moving their shard at once (``gpu.pcie_gbps`` × TP). ``kv.swap_gbps`` (the
    replica's total host bandwidth) and ``kv.kv_bytes_per_token`` override; analytic cost
    models know neither, so swapping with them needs both.
    """
    nbytes = replica_kv_bytes_per_token(block, cost)
    tp = getattr(cost, "tp", 1)
    gbps = block.get("swap_gbps")
    gpu = getattr(cost, "gpu", None)
    if gbps is None and gpu is not None:
        gbps = gpu.pcie_gbps * tp
    if nbytes is None or gbps is None:
        if block.get("preemption") == "swap":
            raise InputError("swap preemption with an analytic cost model needs "
                             "kv.swap_gbps and kv.kv_bytes_per_token", field="kv.swap_gbps")
        return None, None
    if gbps <= 0 or nbytes <= 0:
        raise InputError("kv.swap_gbps and kv.kv_bytes_per_token must be > 0", field="kv")
    return float(nbytes) / (float(gbps) * 1e9), float(nbytes)
