"""Frozen values a router sees: one arriving request, and each replica's load.

A router decides where a request goes from what a production router can know: the request's
prompt length, priority, session and prefix block hashes (never its true output length, which
is engine-only knowledge), and per-replica load signals as a metrics endpoint reports them
(queue lengths, outstanding prefill tokens, decoding requests, KV blocks in use). Signals may
be stale: ``ReplicaLoad.measured_s`` says when they were taken.

Prefix identity is a chain of block hashes, as vLLM hashes KV blocks: hash ``j`` covers
block ``j`` of the prompt and every block before it, so two requests share exactly their
common leading hashes; ``sim.core.blocks`` derives the chain from a request's ``hash_ids``
or its ``prefix_id`` / ``num_prefix_tokens`` shorthand (the rule the replica's prefix cache
uses too).
"""
from __future__ import annotations

from dataclasses import dataclass

from sim.core.blocks import HASH_BLOCK_TOKENS, prefix_chain
from sim.core.load_rules import kv_share, outstanding_requests, outstanding_tokens

__all__ = ["DEFAULT_HASH_BLOCK_TOKENS", "Arrival", "ReplicaLoad", "prefix_chain"]

#: Tokens one prefix hash covers unless the run says otherwise (routed runs: the replica's
#: KV block size, see ``sim.core.blocks``).
DEFAULT_HASH_BLOCK_TOKENS = HASH_BLOCK_TOKENS


@dataclass(frozen=True, slots=True)
class Arrival:
    """What a router may know about one arriving request."""

    id: int
    arrival_s: float
    num_prompt_tokens: int
    priority: int = 0
    #: Sticky key (a conversation or user session); ``None`` when the request has none.
    session: str | None = None
    #: Chained hashes of the prompt's leading blocks, ``hash_block_tokens`` tokens each.
    block_hashes: tuple[int, ...] = ()
    hash_block_tokens: int = DEFAULT_HASH_BLOCK_TOKENS


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    """One replica's load signals, as of ``measured_s``."""

    index: int
    num_waiting: int = 0
    num_running: int = 0
    #: Prompt (or recompute) tokens admitted here and not yet computed, waiting and running.
    outstanding_prefill_tokens: int = 0
    #: Running requests past their prompt: each costs one token of every step.
    num_decoding: int = 0
    kv_used_blocks: int = 0
    #: 0 for an unlimited cache.
    kv_total_blocks: int = 0
    #: Relative serving capacity (1.0 for identical replicas; larger for a faster group).
    weight: float = 1.0
    group: str = ""
    measured_s: float = 0.0

    @property
    def num_outstanding(self) -> int:
        """Requests admitted here and not finished: waiting plus running."""
        return outstanding_requests(self.num_waiting, self.num_running)

    @property
    def outstanding_tokens(self) -> int:
        """Work-based queue length: uncomputed prefill tokens plus one per decoding request
        (a router cannot know how many tokens each decode has left)."""
        return outstanding_tokens(self.outstanding_prefill_tokens, self.num_decoding)

    @property
    def kv_usage(self) -> float:
        """Share of KV blocks in use (0 for an unlimited cache)."""
        return kv_share(self.kv_used_blocks, self.kv_total_blocks)
