"""KV-cache block accounting owned by the engine: a pool of fixed-size blocks.

Policies never allocate; they read a ``KVView`` and the engine grows or frees each sequence's
blocks when it applies a plan. Two layouts share the pool: ``paged`` (blocks on demand, vLLM's
PagedAttention) and ``slab`` (a sequence's first allocation reserves room for its maximum
length at once, as Orca/FasterTransformer reserve per slot: ``max_model_len`` tokens, or the
prompt plus ``max_output_tokens``). With prefix caching, full blocks of a shared prefix stay
cached after use (``sim.prefix_cache``) and running sequences hold them shared.

Two ledgers, both checked every step in tests:

- physical: ``free + used + cache.evictable == num_blocks``; ``used`` counts private blocks
  and cached blocks some sequence references, ``evictable`` cached blocks nobody holds.
- charged: ``charged`` is the sum of every running sequence's block count, shared blocks
  counted once per holder. Policies see ``num_blocks - charged`` as free: their arithmetic
  (``blocks_needed``, a victim frees its ``num_blocks``) is then exact whatever is shared,
  and the physical pool always has at least that much, since ``used <= charged``. Sharing
  therefore saves compute and keeps more of the cache warm, but admission budgets every running
  sequence its full length (vLLM's scheduler retries allocation against the real pool instead).
"""
from __future__ import annotations

from dataclasses import dataclass

from sim.prefix_cache import PrefixCache
from sim.state import Seq
from sim.types import KVView

#: Blocks given to an "unlimited" cache: large enough never to bind, small enough for int64 math.
UNLIMITED_BLOCKS = 1 << 40

ALLOCATORS = ("paged", "slab")
SLAB_RESERVES = ("max_model_len", "prompt_plus_max_output")
PREEMPTIONS = ("recompute", "swap")


@dataclass(frozen=True)
class KVConfig:
    """Resolved KV-cache configuration of one replica.

    ``swap_s_per_token`` and ``kv_bytes_per_token`` (one replica, all its GPUs) price a swap:
    a sequence of ``c`` computed tokens moves ``c × kv_bytes_per_token`` bytes each way in
    ``c × swap_s_per_token`` seconds. ``max_preemptions`` bounds how often one request may be
    preempted before it is rejected (``None``: unbounded).
    """

    num_blocks: int
    block_size: int = 16
    allocator: str = "paged"
    reserve_tokens: int | None = None
    unlimited: bool = False
    slab_reserve: str = "max_model_len"
    max_output_tokens: int | None = None
    preemption: str = "recompute"
    swap_s_per_token: float | None = None
    kv_bytes_per_token: float | None = None
    max_preemptions: int | None = 64
    prefix_caching: bool = False

    def __post_init__(self) -> None:
        if self.num_blocks < 1 or self.block_size < 1:
            raise ValueError(f"kv: num_blocks and block_size must be >= 1, got "
                             f"{self.num_blocks} and {self.block_size}")
        if self.allocator not in ALLOCATORS:
            raise ValueError(f"kv.allocator: unknown {self.allocator!r}; accepted: {ALLOCATORS}")
        if self.slab_reserve not in SLAB_RESERVES:
            raise ValueError(f"kv.slab_reserve: unknown {self.slab_reserve!r}; accepted: "
                             f"{SLAB_RESERVES}")
        if self.preemption not in PREEMPTIONS:
            raise ValueError(f"kv.preemption: unknown {self.preemption!r}; accepted: "
                             f"{PREEMPTIONS}")
        if self.allocator == "slab":
            if self.slab_reserve == "max_model_len" and not self.reserve_tokens:
                raise ValueError("kv.reserve_tokens: the slab allocator needs the tokens "
                                 "reserved per sequence (e.g. max_model_len)")
            if self.slab_reserve == "prompt_plus_max_output" and not self.max_output_tokens:
                raise ValueError("kv.max_output_tokens: slab_reserve=prompt_plus_max_output "
                                 "needs the output tokens reserved per sequence")
        if self.preemption == "swap" and (self.swap_s_per_token is None
                                          or self.kv_bytes_per_token is None):
            raise ValueError("kv.swap_gbps: swap preemption needs the host link bandwidth and "
                             "kv.kv_bytes_per_token (derived from a roofline cost model)")
        if self.max_preemptions is not None and self.max_preemptions < 0:
            raise ValueError(f"kv.max_preemptions: must be >= 0, got {self.max_preemptions}")

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


class BlockPool:
    """Block counts of one replica; per-sequence holdings live on the engine's sequences."""

    __slots__ = ("config", "free", "used", "charged", "peak_used", "cache")

    def __init__(self, config: KVConfig) -> None:
        self.config = config
        self.free = config.num_blocks
        self.used = 0
        self.charged = 0
        self.peak_used = 0
        self.cache = PrefixCache() if config.prefix_caching else None

    @property
    def cached(self) -> int:
        """Cached blocks no running sequence holds (reusable, evicted on demand)."""
        return self.cache.evictable if self.cache is not None else 0

    @property
    def view_free(self) -> int:
        """Free blocks as policies count them: total minus every running sequence's blocks."""
        return self.config.num_blocks - self.charged

    # -- per-sequence operations --------------------------------------------------------------
    def grow(self, seq: Seq, num_tokens: int) -> None:
        """Give ``seq`` the blocks to hold ``num_tokens`` (at least its slab reservation)."""
        cfg = self.config
        target = max(num_tokens, cfg.reserve_for(seq.req.num_prompt_tokens))
        need = -(-target // cfg.block_size) - seq.num_blocks
        if need > 0:
            self._take(need)
            seq.num_blocks += need
            self.charged += need

    def take_for(self, seq: Seq, need: int) -> None:
        """Give ``seq`` ``need`` more blocks (``grow`` once the target is known; ``need > 0``)."""
        self._take(need)
        seq.num_blocks += need
        self.charged += need

    def _take(self, num_blocks: int) -> None:
        if num_blocks > self.free and self.cache is not None:
            self.free += self.cache.evict(num_blocks - self.free)
        if num_blocks > self.free:
            raise AssertionError(f"KV over capacity: need {num_blocks}, free {self.free}")
        self.free -= num_blocks
        self.used += num_blocks
        if self.used > self.peak_used:
            self.peak_used = self.used

    def release(self, seq: Seq) -> None:
        """Return ``seq``'s blocks: private ones to the free list, shared ones to the cache."""
        private = seq.num_blocks - seq.num_shared
        self.free += private
        self.used -= private
        if seq.num_shared:
            self.used -= self.cache.release(seq.req.prefix_id, seq.num_shared)
        self.charged -= seq.num_blocks
        seq.num_blocks = seq.num_shared = 0

    def hit_blocks(self, seq: Seq) -> int:
        """Full blocks of ``seq``'s prompt found cached (0 without prefix caching).

        Capped by the request's shared prefix and by its prompt less one token: the last
        prompt token is always computed, since computing it yields the first output token.
        """
        req = seq.req
        if self.cache is None or req.prefix_id is None or not req.num_prefix_tokens:
            return 0
        bs = self.config.block_size
        return min(self.cache.length(req.prefix_id), req.num_prefix_tokens // bs,
                   (req.num_prompt_tokens - 1) // bs)

    def pin(self, seq: Seq, num_blocks: int) -> None:
        """Make ``seq`` (holding nothing yet) hold the first ``num_blocks`` cached blocks."""
        self.used += self.cache.acquire(seq.req.prefix_id, num_blocks)
        seq.num_blocks = seq.num_shared = num_blocks
        self.charged += num_blocks
        if self.used > self.peak_used:
            self.peak_used = self.used

    def register(self, seq: Seq, num_tokens: int) -> None:
        """Add ``seq``'s full blocks within its first ``num_tokens`` to its prefix chain, when it
        holds all of the chain.

        A sequence that holds less than the whole cached chain (another request extended it
        meanwhile, or its shared prefix ends earlier) keeps its blocks private: content past
        its shared prefix may differ from the chain's. The engine registers prompt blocks as
        they are computed and a finished request's output blocks when it leaves.
        """
        pid = seq.req.prefix_id
        if self.cache is None or pid is None:
            return
        full = min(num_tokens, seq.num_computed) // self.config.block_size
        if full > seq.num_shared and seq.num_shared == self.cache.length(pid):
            self.cache.extend(pid, full)
            seq.num_shared = full

    # -- views and checks ---------------------------------------------------------------------
    def view(self) -> KVView:
        """The frozen view a policy sees."""
        cfg = self.config
        slab = cfg.allocator == "slab"
        fixed = cfg.reserve_tokens if slab and cfg.slab_reserve == "max_model_len" else None
        per_seq = (cfg.max_output_tokens if slab and cfg.slab_reserve == "prompt_plus_max_output"
                   else None)
        return KVView(cfg.num_blocks, self.view_free, cfg.block_size, fixed, per_seq,
                      self.cached)

    def check(self, running: list[Seq] | None = None) -> None:
        """Assert conservation (free + used + cached = total) and, given the running
        sequences, that their holdings add up to ``used`` and ``charged``."""
        total = self.config.num_blocks
        if self.free < 0 or self.free + self.used + self.cached != total:
            raise AssertionError(f"KV blocks not conserved: free {self.free} + used {self.used}"
                                 f" + cached {self.cached} != total {total}")
        if not self.used <= self.charged <= total:
            raise AssertionError(f"KV charged {self.charged} outside [used {self.used}, "
                                 f"total {total}]")
        if running is None:
            return
        charged = sum(s.num_blocks for s in running)
        private = sum(s.num_blocks - s.num_shared for s in running)
        referenced = self.cache.referenced if self.cache is not None else 0
        if charged != self.charged or private + referenced != self.used:
            raise AssertionError(f"KV leak: running sequences hold {charged} blocks "
                                 f"({private} private), pool says charged {self.charged}, "
                                 f"used {self.used} ({referenced} shared)")
        if self.cache is not None:
            holders: dict[str, list[int]] = {}
            for s in running:
                if s.req.prefix_id is not None:
                    holders.setdefault(s.req.prefix_id, []).append(s.num_shared)
            self.cache.check(holders)
        elif any(s.num_shared for s in running):
            raise AssertionError("shared blocks without a prefix cache")
