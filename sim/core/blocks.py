"""Prefix identity of a request's KV blocks: the one rule the prefix cache and routers share.

Two requests may share a KV block only if every token up to the end of that block is the same
in both (attention makes a block's KV depend on all before it), so a block's identity is its
whole prefix — vLLM hashes each block together with its predecessor's hash for that reason.
A request states that identity in one of two ways:

- ``hash_ids`` (a trace's native column, Mooncake's field): one id per ``HASH_BLOCK_TOKENS``
  (512) prompt tokens; two requests share exactly the tokens of their common *leading* ids
  (equal ids after a difference mean nothing). Ids may stop before the prompt does (its tail
  then has no identity) but never run past it.
- the ``prefix_id`` / ``num_prefix_tokens`` shorthand: ``prefix_id`` names one token chain (a
  system prompt, a conversation's history). A request may reuse up to ``num_prefix_tokens`` of
  it, and whatever it computes continues that chain: the first request to reach a block of the
  chain writes it (later turns of a conversation then find their history, outputs included).

The engine's blocks hold ``block_size`` tokens (16 by default), the ids' blocks 512. Block
``m`` (tokens ``[m*block_size, (m+1)*block_size)``) has an identity when those tokens lie in
the prompt and within the ids; it is then named by its position and the ids up to the one
covering its last token — ``BlockChain.key(m)`` is the ids that block adds to its
predecessor's (usually none, or one at each 512-token boundary). A block size that does not
divide 512 works the same way. The replica's prefix cache is a trie over these keys; routers
see the same chain as 63-bit hashes (``block_hashes``), so a router's match and the replica's
cache hit count the same blocks.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from sim.core.types import Request

#: Tokens one ``hash_ids`` entry covers (Mooncake's traces: 512).
HASH_BLOCK_TOKENS = 512
#: Ids are stored as int64 and hashed as 8 bytes: the range a trace may use.
MAX_HASH_ID = 2**63 - 1
_MASK64 = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class BlockChain:
    """The identities of one request's leading blocks of ``block_size`` tokens.

    ``hit_limit``: blocks the request may find cached. ``extend_limit``: blocks it may add
    to the cache (``None``: unbounded, the shorthand's chain continues with everything the
    request computes).
    """

    block_size: int
    hit_limit: int
    extend_limit: int | None
    prefix_id: str | None = None
    hash_ids: tuple[int, ...] = ()

    def key(self, m: int) -> object:
        """What block ``m`` adds to its predecessor's identity (a trie edge label)."""
        if self.prefix_id is not None:
            return self.prefix_id if m == 0 else ()
        bs, hb = self.block_size, HASH_BLOCK_TOKENS
        first = (m * bs - 1) // hb + 1 if m else 0  # first id not covered by blocks < m
        return self.hash_ids[first:((m + 1) * bs - 1) // hb + 1]

    def extends_to(self, m: int) -> int:
        """``m`` capped by ``extend_limit``."""
        return m if self.extend_limit is None else min(m, self.extend_limit)


def block_chain(req: Request, block_size: int) -> BlockChain | None:
    """``req``'s chain of ``block_size``-token blocks, ``None`` when it has no prefix identity.

    ``hash_ids`` win over the shorthand (validation refuses a request with both).
    """
    if req.hash_ids:
        n = min(len(req.hash_ids) * HASH_BLOCK_TOKENS, req.num_prompt_tokens) // block_size
        return BlockChain(block_size, n, n, hash_ids=req.hash_ids)
    if req.prefix_id is not None:
        return BlockChain(block_size, req.num_prefix_tokens // block_size, None,
                          prefix_id=req.prefix_id)
    return None


def block_hashes(req: Request, block_size: int) -> tuple[int, ...]:
    """63-bit hashes of ``req``'s identified blocks (up to ``hit_limit``), each covering its
    block and all before it: two requests share exactly their common leading hashes.

    The shorthand's are ``prefix_chain``'s; ``hash_ids`` chains hash each id once (blake2b
    over the previous id hash) and derive each block's hash from the id hash covering its end
    and its position (splitmix64), so hashing costs one blake2b per 512 tokens.
    """
    chain = block_chain(req, block_size)
    if chain is None or not chain.hit_limit:
        return ()
    if chain.prefix_id is not None:
        return prefix_chain(chain.prefix_id, chain.hit_limit * block_size, block_size)
    covered: list[int] = []
    previous = b""
    for i in req.hash_ids[:((chain.hit_limit * block_size) - 1) // HASH_BLOCK_TOKENS + 1]:
        previous = hashlib.blake2b(previous + int(i).to_bytes(8, "big"), digest_size=8).digest()
        covered.append(int.from_bytes(previous, "big"))
    return tuple(_mix(covered[((m + 1) * block_size - 1) // HASH_BLOCK_TOKENS] ^ m) >> 1
                 for m in range(chain.hit_limit))


def _mix(x: int) -> int:
    """splitmix64's finaliser: a bijection of 64-bit integers that spreads every input bit."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def prefix_chain(prefix_id: str, num_prefix_tokens: int,
                 block_tokens: int = HASH_BLOCK_TOKENS) -> tuple[int, ...]:
    """Chained hashes of the full ``block_tokens``-token blocks of a named shared prefix.

    Requests with the same ``prefix_id`` share ``min`` of their chain lengths leading hashes;
    a partial last block is not hashed (vLLM caches full blocks only). Stable across
    processes (blake2b, not Python's salted ``hash``).
    """
    out: list[int] = []
    previous = b""
    for j in range(num_prefix_tokens // block_tokens):
        digest = hashlib.blake2b(previous + f"{prefix_id}\x00{j}".encode(),
                                 digest_size=8).digest()
        out.append(int.from_bytes(digest, "big") >> 1)  # non-negative int64
        previous = digest
    return tuple(out)


def check_hash_ids(hash_ids: object, num_prompt_tokens: int) -> str:
    """Why ``hash_ids`` cannot belong to a prompt of ``num_prompt_tokens`` ('' if it can):
    a tuple of integers in ``[0, MAX_HASH_ID]``, at most one per started 512 tokens."""
    if not isinstance(hash_ids, tuple):
        return f"must be a tuple of integers, got {type(hash_ids).__name__}"
    for i in hash_ids:
        if isinstance(i, bool | np.bool_) or not isinstance(i, int | np.integer):
            return f"must hold integers, got {i!r}"
        if not 0 <= i <= MAX_HASH_ID:
            return f"ids must be in [0, 2**63 - 1], got {i}"
    most = -(-num_prompt_tokens // HASH_BLOCK_TOKENS)
    if len(hash_ids) > most:
        return (f"{len(hash_ids)} ids for a {num_prompt_tokens}-token prompt: at most "
                f"{most} (one per {HASH_BLOCK_TOKENS} tokens)")
    return ""
