"""Prefix caching: KV blocks of shared prompt prefixes kept and reused, evicted LRU (vLLM APC).

A ``prefix_id`` names a token chain (a system prompt, a conversation's history). Every request
carrying that id starts with ``num_prefix_tokens`` tokens of the chain, so the full blocks of
the chain computed by one request can be reused by the next: it starts with those tokens
already computed and holds the blocks shared, reference-counted. vLLM finds the same blocks by
hashing each block's tokens; a per-chain count of cached blocks is the same thing for a
simulator that never sees token contents.

Counts only: a chain is a list of per-block reference counts. Each holder references blocks
``0..s-1`` of its chain, so the counts never increase along the chain and the unreferenced
(evictable) blocks are always a tail. Eviction takes tail blocks of the least recently used
chain first (recency: the last time a chain was hit or released), so a chain shrinks from its
end and stays a valid prefix — as vLLM's free queue, fed tail-first, evicts.

Pool counts live in ``sim.kv.cache.BlockPool``; this class only says how many blocks change state.
"""
from __future__ import annotations

from collections import OrderedDict


class PrefixCache:
    """Reference counts of cached prefix blocks per chain, with LRU eviction of unused tails."""

    __slots__ = ("_chains", "_lru", "evictable", "referenced")

    def __init__(self) -> None:
        self._chains: dict[str, list[int]] = {}
        # Chains with at least one unreferenced block, least recently used first.
        self._lru: OrderedDict[str, None] = OrderedDict()
        self.evictable = 0  # cached blocks no sequence references: free-able on demand
        self.referenced = 0  # cached blocks some running sequence holds

    def length(self, prefix_id: str) -> int:
        """Blocks of ``prefix_id``'s chain currently cached (a prefix of the chain)."""
        chain = self._chains.get(prefix_id)
        return len(chain) if chain else 0

    def cached_blocks(self) -> dict[str, int]:
        """Blocks cached now per ``prefix_id`` (chains holding at least one block)."""
        return {pid: len(chain) for pid, chain in self._chains.items() if chain}

    def _touch(self, prefix_id: str, chain: list[int]) -> None:
        """Mark a chain as just used; keep it in the LRU only while it has a free tail."""
        if chain and chain[-1] == 0:
            self._lru[prefix_id] = None
            self._lru.move_to_end(prefix_id)
        else:
            self._lru.pop(prefix_id, None)

    def acquire(self, prefix_id: str, num_blocks: int) -> int:
        """Reference the first ``num_blocks`` cached blocks; return how many were unreferenced."""
        chain = self._chains[prefix_id]
        if num_blocks > len(chain):
            raise AssertionError(f"prefix {prefix_id!r}: hit of {num_blocks} blocks, "
                                 f"{len(chain)} cached")
        revived = 0
        for j in range(num_blocks):
            if chain[j] == 0:
                revived += 1
            chain[j] += 1
        self.evictable -= revived
        self.referenced += revived
        self._touch(prefix_id, chain)
        return revived

    def release(self, prefix_id: str, num_blocks: int) -> int:
        """Drop one reference to the first ``num_blocks``; return how many became unreferenced."""
        chain = self._chains[prefix_id]
        dropped = 0
        for j in range(num_blocks):
            chain[j] -= 1
            if chain[j] == 0:
                dropped += 1
        self.evictable += dropped
        self.referenced -= dropped
        self._touch(prefix_id, chain)
        return dropped

    def extend(self, prefix_id: str, num_blocks: int) -> int:
        """Grow the chain to ``num_blocks``, the new blocks held by the one sequence extending it.

        The caller holds the whole current chain (it references every cached block), so its
        freshly computed blocks become the chain's continuation with one reference each.
        """
        chain = self._chains.setdefault(prefix_id, [])
        added = num_blocks - len(chain)
        if added > 0:
            chain.extend([1] * added)
            self.referenced += added
        return max(added, 0)

    def evict(self, num_blocks: int) -> int:
        """Free up to ``num_blocks`` unreferenced blocks, LRU chain first, tail first."""
        evicted = 0
        while evicted < num_blocks and self._lru:
            prefix_id = next(iter(self._lru))
            chain = self._chains[prefix_id]
            while evicted < num_blocks and chain and chain[-1] == 0:
                chain.pop()
                evicted += 1
            if not chain or chain[-1] != 0:
                del self._lru[prefix_id]
            if not chain:
                del self._chains[prefix_id]
        self.evictable -= evicted
        return evicted

    def check(self, holders: dict[str, list[int]]) -> None:
        """Assert the counts match ``holders``: prefix id -> each holder's shared blocks."""
        evictable = referenced = 0
        for pid, chain in self._chains.items():
            held = holders.get(pid, [])
            want = [sum(1 for s in held if s > j) for j in range(len(chain))]
            if chain != want:
                raise AssertionError(f"prefix {pid!r}: reference counts {chain} != holders {want}")
            if any(s > len(chain) for s in held):
                raise AssertionError(f"prefix {pid!r}: a holder outgrew the cached chain")
            free = sum(1 for r in chain if r == 0)
            evictable += free
            referenced += len(chain) - free
            if (free > 0) != (pid in self._lru):
                raise AssertionError(f"prefix {pid!r}: LRU membership out of date")
        for pid, held in holders.items():
            if pid not in self._chains and any(held):
                raise AssertionError(f"prefix {pid!r}: held but not cached")
        if (evictable, referenced) != (self.evictable, self.referenced):
            raise AssertionError(f"prefix cache counts ({self.evictable}, {self.referenced}) "
                                 f"!= recount ({evictable}, {referenced})")
