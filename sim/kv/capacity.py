"""KV-cache capacity of a deployment from first principles (``batchsim profiles --model ...``).

Per GPU: HBM × ``gpu_memory_utilization`` − the GPU's share of the weights − an activation
reserve is left for KV. One token's KV on one GPU takes 2 (K and V) × layers × KV heads on
that GPU × head_dim × dtype bytes (KV heads split over TP, replicated when GPUs outnumber
them). Every GPU of a replica holds its heads' share of the same tokens, so the replica's
token capacity is the per-GPU figure; it is cut into blocks of ``block_size`` tokens. The
arithmetic lives in ``RooflineCost.kv_capacity_tokens``, the one place ``sim.simulate`` also
uses, so what this prints is what a run gets.
"""
from __future__ import annotations

from dataclasses import dataclass

from sim.core.fields import check_value
from sim.core.rules import blocks_for
from sim.kv.config import KV_FIELDS

#: Context lengths at which ``describe_capacity`` shows how many sequences fit at once.
CONTEXTS = (1024, 4096, 8192)
#: Activation reserve per GPU when none is given: ``RooflineCost.kv_capacity_tokens``'s default.
ACTIVATION_RESERVE_GB = 1.0


@dataclass(frozen=True)
class KVCapacity:
    """The KV budget of one replica."""

    model: str
    hardware: str
    tp: int
    block_size: int
    gpu_memory_utilization: float
    hbm_bytes_per_gpu: float
    weight_bytes_per_gpu: float
    activation_reserve_bytes: float
    kv_bytes_per_token_per_gpu: float
    num_blocks: int
    #: Device memory technology (``HBM3``, ``GDDR6``...; ``""`` when the profile omits it).
    memory_type: str = ""

    @property
    def kv_bytes_per_token(self) -> float:
        """One token's KV over the whole replica (all TP GPUs)."""
        return self.kv_bytes_per_token_per_gpu * self.tp

    @property
    def max_tokens(self) -> int:
        """Tokens the cache holds when every block is full."""
        return self.num_blocks * self.block_size

    def max_seqs(self, context_len: int) -> int:
        """Sequences of ``context_len`` tokens that fit at once (paged: whole blocks each)."""
        return self.num_blocks // blocks_for(context_len, self.block_size)


#: The ``kv`` block's defaults (``KV_FIELDS``), which the capacity reports share.
BLOCK_SIZE: int = KV_FIELDS["block_size"].default
GPU_MEMORY_UTILIZATION: float = KV_FIELDS["gpu_memory_utilization"].default


def kv_capacity(model: str, hardware: str, tp: int = 1, block_size: int = BLOCK_SIZE,
                gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
                activation_reserve_gb: float = ACTIVATION_RESERVE_GB,
                kv_dtype: str = "bf16", weight_dtype: str = "bf16") -> KVCapacity:
    """The KV capacity of ``model`` on ``tp`` × ``hardware`` (built-in names or paths)."""
    from sim.cost.roofline import build_cost_model

    # the kv block's rules (``batchsim profiles --block-size 0`` is refused like kv.block_size: 0)
    for name, value in (("block_size", block_size),
                        ("gpu_memory_utilization", gpu_memory_utilization),
                        ("activation_reserve_gb", activation_reserve_gb)):
        check_value(value, KV_FIELDS[name], name)
    cost = build_cost_model(model=model, hardware=hardware, tp=tp, kv_dtype=kv_dtype,
                            weight_dtype=weight_dtype)
    tokens = cost.kv_capacity_tokens(gpu_memory_utilization=gpu_memory_utilization,
                                     activation_reserve_gb=activation_reserve_gb)
    return KVCapacity(cost.model.name, cost.gpu.name, tp, block_size, gpu_memory_utilization,
                      cost.gpu.hbm_bytes, cost.weight_bytes_per_gpu,
                      activation_reserve_gb * 1e9, cost.kv_bytes_per_token,
                      tokens // block_size, cost.gpu.memory_type)


def describe_capacity(model: str, hardware: str, tp: int = 1, block_size: int = BLOCK_SIZE,
                      gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION) -> str:
    """A short text report of ``kv_capacity`` (what ``batchsim profiles`` prints)."""
    c = kv_capacity(model, hardware, tp, block_size, gpu_memory_utilization)
    memory = f" {c.memory_type}" if c.memory_type else ""
    gb = 1e9
    kv_gb = c.max_tokens * c.kv_bytes_per_token_per_gpu / gb
    lines = [
        f"{c.model} on {tp} x {c.hardware} (gpu_memory_utilization {gpu_memory_utilization:g})",
        f"memory per GPU          {c.hbm_bytes_per_gpu / gb:8.2f} GB{memory} "
        f"(usable {c.hbm_bytes_per_gpu * gpu_memory_utilization / gb:.2f} GB)",
        f"weights per GPU         {c.weight_bytes_per_gpu / gb:8.2f} GB",
        f"activation reserve      {c.activation_reserve_bytes / gb:8.2f} GB per GPU",
        f"KV cache per GPU        {kv_gb:8.2f} GB",
        f"KV bytes per token      {c.kv_bytes_per_token_per_gpu / 1e3:8.1f} kB per GPU, "
        f"{c.kv_bytes_per_token / 1e3:.1f} kB per replica",
        f"KV blocks               {c.num_blocks:8,} of {block_size} tokens",
        f"max tokens              {c.max_tokens:8,}",
        "max concurrent sequences at context " + ", ".join(
            f"{n // 1024}k: {c.max_seqs(n):,}" for n in CONTEXTS),
    ]
    return "\n".join(lines)
