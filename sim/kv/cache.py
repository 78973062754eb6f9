"""KV-cache block accounting owned by the engine: a pool of fixed-size blocks.

Policies never allocate; they read a ``KVView`` and the engine grows or frees each sequence's
blocks when it applies a plan. Two layouts share the pool: ``paged`` (blocks on demand, vLLM's
PagedAttention) and ``slab`` (a sequence's first allocation reserves room for its maximum
length at once, as Orca/FasterTransformer reserve per slot: ``max_model_len`` tokens, or the
prompt plus ``max_output_tokens``). With prefix caching, full blocks of a shared prefix stay
cached after use (``sim.kv.prefix_cache``, a trie keyed by ``sim.core.blocks``' identities)
and running sequences hold them shared.

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

from typing import Any

from sim.core.blocks import BlockChain, block_chain
from sim.core.rules import blocks_needed
from sim.core.state import Seq
from sim.core.types import KVView
from sim.kv.config import KVConfig
from sim.kv.prefix_cache import Block, PrefixCache


class BlockPool:
    """Block counts of one replica; per-sequence holdings live on the engine's sequences."""

    __slots__ = ("config", "free", "used", "charged", "peak_used", "cache", "_found", "_held")

    def __init__(self, config: KVConfig) -> None:
        self.config = config
        self.free = config.num_blocks
        self.used = 0
        self.charged = 0
        self.peak_used = 0
        self.cache = PrefixCache() if config.prefix_caching else None
        # Per request id: its chain and the deepest cached block a look found (waiting) or it
        # holds (running); kept here so the engine's sequences carry no cache internals.
        self._found: dict[int, list[Any]] = {}  # [chain, block, hit limit, block.grown]
        self._held: dict[int, tuple[BlockChain, Block]] = {}

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

    def take_for_all(self, seqs: list[Seq], needs: list[int]) -> None:
        """``take_for`` of each of ``seqs`` its ``needs`` (>= 0) more blocks, taken as one
        (a batch run's rows grow together)."""
        total = sum(needs)
        if total:
            self._take(total)
            for seq, need in zip(seqs, needs, strict=True):
                seq.num_blocks += need
            self.charged += total

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
        if self.cache is not None:
            rid = seq.req.id
            self._found.pop(rid, None)
            held = self._held.pop(rid, None)
            if held is not None:  # shared blocks come from the prefix cache
                self.used -= self.cache.unhold(held[1], held[0])
        self.charged -= seq.num_blocks
        seq.num_blocks = seq.num_shared = 0

    def hit_blocks(self, seq: Seq) -> int:
        """Full blocks of ``seq``'s prompt found cached (0 without prefix caching).

        Capped by the request's shared prefix and by its prompt less one token: the last
        prompt token is always computed, since computing it yields the first output token.
        Where the last look ended is kept, so a queue looked at every step costs only the
        blocks cached since.
        """
        cache = self.cache
        if cache is None:
            return 0
        req = seq.req
        found = self._found.get(req.id)
        if found is None:
            chain = block_chain(req, self.config.block_size)
            if chain is None:
                return 0
            limit = min(chain.hit_limit, (req.num_prompt_tokens - 1) // self.config.block_size)
            found = self._found[req.id] = [chain, cache.root, limit, -1]
        node = found[1]
        # the usual case, a look that finds nothing new: the block is live and at the end of
        # the request's reach, or no block was cached below it since the last look
        if node.alive and (node.depth >= found[2] or node.grown == found[3]):
            return node.depth
        node = found[1] = cache.descend(node, found[0], found[2])
        found[3] = node.grown
        return node.depth

    def pin(self, seq: Seq, num_blocks: int) -> None:
        """Make ``seq`` (holding nothing yet) hold the first ``num_blocks`` cached blocks."""
        assert self.cache is not None  # as ``hit_blocks`` found, nothing evicted since
        chain, node, _, _ = self._found.pop(seq.req.id)
        node = self.cache.descend(node, chain, num_blocks)
        if node.depth != num_blocks:
            raise AssertionError(f"request {seq.req.id}: hit of {num_blocks} blocks, "
                                 f"{node.depth} cached")
        self.used += self.cache.hold(node, chain)
        self._held[seq.req.id] = (chain, node)
        seq.num_blocks = seq.num_shared = num_blocks
        self.charged += num_blocks
        if self.used > self.peak_used:
            self.peak_used = self.used

    def register(self, seq: Seq, num_tokens: int) -> None:
        """Add ``seq``'s full blocks within its first ``num_tokens`` to the prefix cache, when
        the next block of its chain is not cached yet.

        A sequence whose next block another request cached first (it extended the chain
        meanwhile, or a shorthand chain runs past this request's shared prefix) keeps its
        blocks private: content past its shared prefix may differ from the cached one. The
        engine registers prompt blocks as they are computed and a finished request's output
        blocks when it leaves (only shorthand chains reach past the prompt).
        """
        cache = self.cache
        if cache is None:
            return
        rid = seq.req.id
        held = self._held.get(rid)
        if held is None:
            chain = block_chain(seq.req, self.config.block_size)
            if chain is None:
                return
            node = cache.root
        else:
            chain, node = held
        full = chain.extends_to(min(num_tokens, seq.num_computed) // self.config.block_size)
        if full > seq.num_shared and cache.can_extend(node, chain):
            self._held[rid] = (chain, cache.grow(node, chain, full))
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
            held = []
            for s in running:
                entry = self._held.get(s.req.id)
                depth = entry[1].depth if entry is not None else 0
                if depth != s.num_shared:
                    raise AssertionError(f"request {s.req.id}: holds {s.num_shared} shared "
                                         f"blocks, the cache says {depth}")
                if entry is not None:
                    held.append(entry[1])
            if len(held) != len(self._held):
                raise AssertionError("prefix blocks held by requests that are not running")
            self.cache.check_held(held)
        elif any(s.num_shared for s in running):
            raise AssertionError("shared blocks without a prefix cache")
