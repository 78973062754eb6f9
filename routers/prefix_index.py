"""A router's own picture of which prefixes each replica has cached (approximate, LRU).

Production cache-aware routers (SGLang's router, llm-d's approximate prefix scorer) do not
query every replica's KV cache per request: they remember which prompt blocks they sent where
and assume those are still cached, forgetting the least recently sent ones once a replica's
share exceeds what its cache could hold. ``PrefixIndex`` is that memory, one LRU set of block
hashes per replica: ``match`` counts the leading hashes of a request the replica is believed to
hold, ``record`` notes that the replica now holds the request's chain.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class PrefixIndex:
    """Per-replica LRU sets of block hashes, each bounded to ``capacity`` hashes."""

    def __init__(self, num_replicas: int, capacity: int) -> None:
        self.capacity = capacity
        self._held: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(num_replicas)]

    def match(self, replica: int, hashes: Sequence[int]) -> int:
        """Leading hashes of ``hashes`` the replica is believed to hold."""
        held = self._held[replica]
        n = 0
        for h in hashes:
            if h not in held:
                break
            n += 1
        return n

    def record(self, replica: int, hashes: Sequence[int]) -> None:
        """The replica now holds ``hashes``: mark them most recently used, evict the oldest."""
        held = self._held[replica]
        for h in hashes:
            held[h] = None
            held.move_to_end(h)
        while len(held) > self.capacity:
            held.popitem(last=False)

    def size(self, replica: int) -> int:
        """Hashes currently remembered for ``replica``."""
        return len(self._held[replica])
