"""Prefix caching: KV blocks of shared prompt prefixes kept and reused, evicted LRU (vLLM APC).

The cache is a trie of blocks: a block's identity is its whole prefix (``sim.core.blocks``:
block ``m`` of a request is the child, under block ``m - 1``, labelled ``BlockChain.key(m)``),
so two requests share exactly their common leading blocks, whether they name them by
``hash_ids`` or by the ``prefix_id`` shorthand (whose chains are single paths). Each cached
block counts the running sequences holding it; a holder of block ``m`` holds every block
before it, so counts never increase away from the root and the unreferenced (evictable)
blocks form subtrees hanging at the bottom. Eviction frees an unreferenced leaf, so the trie
always stays a set of valid prefixes.

Recency: each block carries the stamp of the last *touch* that reached it. A touch is a
sequence taking its cached hit or releasing its shared blocks; it reaches the blocks it holds
and every cached block further along its own chain (for the shorthand the whole chain, as
the chain is one unit of recency). The evicted leaf is the one with the oldest stamp, the
deepest first among blocks of one touch, so a chain shrinks from its end, as vLLM's free
queue, fed tail-first, evicts.

Pool counts live in ``sim.kv.cache.BlockPool``; this class only says how many blocks change
state. Sequences are tracked by the pool as (chain, deepest block held or found).
"""
from __future__ import annotations

import heapq

from sim.core.blocks import BlockChain


class Block:
    """One cached KV block: its place in the trie, holders and last touch."""

    __slots__ = ("parent", "key", "depth", "refs", "stamp", "children", "alive", "top", "grown")

    def __init__(self, parent: Block | None, key: object, depth: int, refs: int = 0) -> None:
        self.parent = parent
        self.key = key
        self.depth = depth  # blocks from the root to here, this one included (root: 0)
        self.refs = refs
        self.stamp = 0
        self.children: dict[object, Block] = {}
        self.alive = True
        self.grown = 0  # children ever added: a look finding nothing new below skips the walk
        # The root's child this block descends from: ``cached_blocks`` counts per such label.
        self.top: object = key if parent is None or parent.parent is None else parent.top


class PrefixCache:
    """A trie of cached blocks with reference counts and LRU eviction of unreferenced leaves."""

    __slots__ = ("root", "_free", "_clock", "_order", "_per_top", "evictable", "referenced")

    def __init__(self) -> None:
        self.root = Block(None, None, 0)
        # Unreferenced leaves (stamp, -depth, order, block); stale entries are skipped.
        self._free: list[tuple[int, int, int, Block]] = []
        self._clock = 0
        self._order = 0
        self._per_top: dict[object, int] = {}
        self.evictable = 0  # cached blocks no sequence references: free-able on demand
        self.referenced = 0  # cached blocks some running sequence holds

    # -- lookups ------------------------------------------------------------------------------
    def descend(self, node: Block, chain: BlockChain, limit: int) -> Block:
        """The deepest cached block along ``chain`` from ``node`` (alive), at most ``limit``
        blocks deep. A block evicted since it was found is replaced by its nearest live
        ancestor first (ancestors outlive descendants)."""
        while not node.alive:
            assert node.parent is not None
            node = node.parent
        while node.depth > limit:
            assert node.parent is not None
            node = node.parent
        while node.depth < limit:
            child = node.children.get(chain.key(node.depth))
            if child is None:
                break
            node = child
        return node

    def cached_blocks(self) -> dict[str, int]:
        """Blocks cached now per first block: ``prefix_id`` for shorthand chains, ``#<id>``
        for ``hash_ids`` chains (the ids of their first block)."""
        return {_label(top): n for top, n in self._per_top.items() if n}

    # -- reference counts ---------------------------------------------------------------------
    def hold(self, node: Block, chain: BlockChain) -> int:
        """Reference ``node`` and its ancestors; return how many were unreferenced."""
        self._clock += 1
        stamp, revived, b = self._clock, 0, node
        while b.parent is not None:
            if b.refs == 0:
                revived += 1
            b.refs += 1
            b.stamp = stamp
            b = b.parent
        self.evictable -= revived
        self.referenced += revived
        self._touch_along(node, chain, stamp)
        return revived

    def unhold(self, node: Block, chain: BlockChain) -> int:
        """Drop one reference to ``node`` and its ancestors; return how many became free."""
        self._clock += 1
        stamp, dropped, b = self._clock, 0, node
        while b.parent is not None:
            b.refs -= 1
            if b.refs == 0:
                dropped += 1
            b.stamp = stamp
            b = b.parent
        self.evictable += dropped
        self.referenced -= dropped
        self._touch_along(node, chain, stamp)
        return dropped

    def _touch_along(self, node: Block, chain: BlockChain, stamp: int) -> None:
        """Stamp the cached blocks past ``node`` on ``chain``; queue the last if a free leaf."""
        limit = chain.extend_limit
        while limit is None or node.depth < limit:
            child = node.children.get(chain.key(node.depth))
            if child is None:
                break
            child.stamp = stamp
            node = child
        if node.refs == 0 and not node.children and node.parent is not None:
            self._queue(node)

    def can_extend(self, node: Block, chain: BlockChain) -> bool:
        """Whether the block after ``node`` on ``chain`` is not cached (so its computer may
        add it): a block another request cached first stays theirs, and the late one's copy
        stays private (vLLM, too, keeps one cached block per hash)."""
        return chain.key(node.depth) not in node.children

    def grow(self, node: Block, chain: BlockChain, depth: int) -> Block:
        """Cache the blocks after ``node`` on ``chain`` up to ``depth``, held by the one
        sequence that computed them (it holds ``node``); return the deepest."""
        per_top = self._per_top
        while node.depth < depth:
            child = Block(node, chain.key(node.depth), node.depth + 1, refs=1)
            node.children[child.key] = child
            node.grown += 1
            per_top[child.top] = per_top.get(child.top, 0) + 1
            self.referenced += 1
            node = child
        return node

    def evict(self, num_blocks: int) -> int:
        """Free up to ``num_blocks`` unreferenced blocks, least recently touched leaf first."""
        evicted, free, per_top = 0, self._free, self._per_top
        while evicted < num_blocks and free:
            stamp, _, _, b = heapq.heappop(free)
            if not b.alive or b.refs or b.children or b.stamp != stamp:
                continue  # stale: touched, held or grown since it was queued
            parent = b.parent
            assert parent is not None
            del parent.children[b.key]
            b.alive = False
            per_top[b.top] -= 1
            evicted += 1
            if parent.refs == 0 and not parent.children and parent.parent is not None:
                self._queue(parent)
        self.evictable -= evicted
        return evicted

    def _queue(self, b: Block) -> None:
        self._order += 1
        heapq.heappush(self._free, (b.stamp, -b.depth, self._order, b))
        if len(self._free) > 4 * self.evictable + 256:  # mostly stale entries: drop them
            live = {id(e[3]): e for e in self._free
                    if e[3].alive and not e[3].refs and not e[3].children and e[3].stamp == e[0]}
            self._free = sorted(live.values())

    # -- by prefix id: the shorthand's chains driven directly (tests, small tools) -----------
    @staticmethod
    def _chain(prefix_id: str) -> BlockChain:
        return BlockChain(1, 0, None, prefix_id=prefix_id)

    def _at(self, prefix_id: str, num_blocks: int) -> Block:
        node = self.descend(self.root, self._chain(prefix_id), num_blocks)
        if node.depth != num_blocks:
            raise AssertionError(f"prefix {prefix_id!r}: {num_blocks} blocks asked, "
                                 f"{node.depth} cached")
        return node

    def length(self, prefix_id: str) -> int:
        """Blocks of ``prefix_id``'s chain currently cached."""
        return self.descend(self.root, self._chain(prefix_id), 1 << 62).depth

    def acquire(self, prefix_id: str, num_blocks: int) -> int:
        """``hold`` the first ``num_blocks`` blocks of ``prefix_id``'s chain."""
        return self.hold(self._at(prefix_id, num_blocks), self._chain(prefix_id))

    def release(self, prefix_id: str, num_blocks: int) -> int:
        """``unhold`` the first ``num_blocks`` blocks of ``prefix_id``'s chain."""
        return self.unhold(self._at(prefix_id, num_blocks), self._chain(prefix_id))

    def extend(self, prefix_id: str, num_blocks: int) -> int:
        """``grow`` ``prefix_id``'s chain to ``num_blocks``; return how many were added."""
        chain = self._chain(prefix_id)
        node = self.descend(self.root, chain, 1 << 62)
        return self.grow(node, chain, num_blocks).depth - node.depth if num_blocks > node.depth \
            else 0

    def check(self, holders: dict[str, list[int]]) -> None:
        """``check_held`` with holders given as prefix id -> each holder's shared blocks."""
        self.check_held([self._at(pid, n) for pid, held in holders.items() for n in held if n])

    # -- checks -------------------------------------------------------------------------------
    def check_held(self, held: list[Block]) -> None:
        """Assert the counts match ``held`` (each running holder's deepest shared block) and
        that every unreferenced leaf is queued for eviction."""
        want: dict[int, int] = {}
        for node in held:
            if not node.alive:
                raise AssertionError("a sequence holds an evicted prefix block")
            b: Block | None = node
            while b is not None and b.parent is not None:
                want[id(b)] = want.get(id(b), 0) + 1
                b = b.parent
        queued = {id(e[3]) for e in self._free if e[3].stamp == e[0]}
        evictable = referenced = 0
        stack = list(self.root.children.values())
        while stack:
            b = stack.pop()
            if b.refs != want.get(id(b), 0):
                raise AssertionError(f"prefix block at depth {b.depth}: {b.refs} references, "
                                     f"{want.get(id(b), 0)} holders")
            if b.refs:
                referenced += 1
            else:
                evictable += 1
                if not b.children and id(b) not in queued:
                    raise AssertionError(f"free prefix leaf at depth {b.depth} not queued")
            stack.extend(b.children.values())
        if (evictable, referenced) != (self.evictable, self.referenced):
            raise AssertionError(f"prefix cache counts ({self.evictable}, {self.referenced}) "
                                 f"!= recount ({evictable}, {referenced})")


def _label(top: object) -> str:
    """A first block's name: its ``prefix_id``, or ``#`` and its ids joined by ``-``."""
    if isinstance(top, str):
        return top
    assert isinstance(top, tuple)
    return "#" + "-".join(map(str, top))
