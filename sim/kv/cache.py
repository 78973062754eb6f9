"""KV-cache block accounting owned by the engine: a pool of fixed-size blocks.

Policies never allocate; they read a ``KVView`` and the engine grows or frees each sequence's
blocks when it applies a plan. Two layouts share the pool: ``paged`` (blocks on demand, vLLM's
PagedAttention) and ``slab`` (a sequence's first allocation reserves room for its maximum
length at once, as Orca/FasterTransformer reserve per slot: ``max_model_len`` tokens, or the
prompt plus ``max_output_tokens``). With prefix caching, full blocks of a shared prefix stay
cached after use (``sim.kv.prefix_cache``) and running sequences hold them shared.

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

from sim.core.rules import blocks_needed
from sim.core.state import Seq
from sim.core.types import KVView
from sim.kv.config import KVConfig
from sim.kv.prefix_cache import PrefixCache


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
        need = blocks_needed(num_tokens, cfg.reserve_for(seq.req.num_prompt_tokens),
                             seq.num_blocks, cfg.block_size)
        if need:
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
        if seq.num_shared:  # shared blocks come from the prefix cache, under the prefix id
            assert self.cache is not None and seq.req.prefix_id is not None
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
        assert self.cache is not None and seq.req.prefix_id is not None  # as ``hit_blocks`` found
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
