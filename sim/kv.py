"""KV-cache block accounting owned by the engine: a pool of fixed-size blocks.

Policies never allocate; they read a ``KVView`` and the engine grows or frees each sequence's
blocks when it applies a plan. Two layouts share the pool: ``paged`` (blocks on demand, vLLM's
PagedAttention) and ``slab`` (a sequence's first allocation reserves room for
``reserve_tokens`` at once, as Orca/FasterTransformer reserve the maximum length per slot).
"""
from __future__ import annotations

from dataclasses import dataclass

from sim.types import KVView

#: Blocks given to an "unlimited" cache: large enough never to bind, small enough for int64 math.
UNLIMITED_BLOCKS = 1 << 40

ALLOCATORS = ("paged", "slab")


@dataclass(frozen=True)
class KVConfig:
    """Resolved KV-cache configuration of one replica."""

    num_blocks: int
    block_size: int = 16
    allocator: str = "paged"
    reserve_tokens: int | None = None
    unlimited: bool = False

    def __post_init__(self) -> None:
        if self.num_blocks < 1 or self.block_size < 1:
            raise ValueError(f"kv: num_blocks and block_size must be >= 1, got "
                             f"{self.num_blocks} and {self.block_size}")
        if self.allocator not in ALLOCATORS:
            raise ValueError(f"kv.allocator: unknown {self.allocator!r}; accepted: {ALLOCATORS}")
        if self.allocator == "slab" and not self.reserve_tokens:
            raise ValueError("kv.reserve_tokens: the slab allocator needs the tokens reserved "
                             "per sequence (e.g. max_model_len)")

    @property
    def capacity_tokens(self) -> int:
        """Tokens the cache can hold when every block is full."""
        return self.num_blocks * self.block_size


class BlockPool:
    """Free-block counter of one replica; per-sequence holdings live on the engine's sequences.

    Blocks are interchangeable, so only counts matter for capacity; ``used`` is tracked
    separately from ``free`` so that conservation (free + used == total) can be asserted.
    """

    __slots__ = ("config", "free", "used", "peak_used")

    def __init__(self, config: KVConfig) -> None:
        self.config = config
        self.free = config.num_blocks
        self.used = 0
        self.peak_used = 0

    def allocate(self, num_blocks: int) -> None:
        """Take ``num_blocks`` from the pool; the caller has checked they are free."""
        if num_blocks > self.free:
            raise AssertionError(f"KV over capacity: need {num_blocks}, free {self.free}")
        self.free -= num_blocks
        self.used += num_blocks
        if self.used > self.peak_used:
            self.peak_used = self.used

    def release(self, num_blocks: int) -> None:
        """Return ``num_blocks`` to the pool."""
        self.free += num_blocks
        self.used -= num_blocks

    def view(self) -> KVView:
        """The frozen view a policy sees."""
        cfg = self.config
        reserve = cfg.reserve_tokens if cfg.allocator == "slab" else None
        return KVView(cfg.num_blocks, self.free, cfg.block_size, reserve)

    def check(self) -> None:
        """Assert conservation: every block is either free or used."""
        if self.free + self.used != self.config.num_blocks or self.free < 0:
            raise AssertionError(f"KV blocks not conserved: free {self.free} + used {self.used}"
                                 f" != total {self.config.num_blocks}")
