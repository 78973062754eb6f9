"""The scalar scheduling rules, written once: KV blocks, the admission test, the victim choice.

Each rule is a plain function of integers and floats (no objects, no ``None``: an absent slab
reservation is 0 tokens, an absent limit a huge number), so the same source serves three
callers: the Python reference interpreter of the scheduling specification
(``policies.scheduler``), the general engine (``KVView.blocks_needed``, plan validation, KV
growth) and the compiled kernel, which compiles these very functions with ``numba.njit``
instead of restating them. Changing a rule here changes it everywhere.

Vocabulary: a sequence that has computed ``num_computed_tokens`` and holds ``num_blocks``
blocks of ``block_size`` tokens; a slab allocator reserves at least ``floor_tokens`` on the
first allocation. The run-to-completion rules at the end (when a batch goes, which prompt
bucket a request joins, the room a preempted member needs to rejoin) serve
``policies.batch_run`` and the compiled interpreter's batches alike.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import numpy as np

#: An integer, or an integer numpy array (``blocks_for`` is elementwise on arrays too).
Tokens = TypeVar("Tokens", int, np.ndarray)

#: Total blocks at or above which a cache counts as unlimited (``sim.kv.config.UNLIMITED_BLOCKS``).
UNLIMITED_BLOCKS = 1 << 40

#: A policy's limit on a step's sequences or tokens when it sets none (``within_limit``).
NO_LIMIT = 1 << 62

#: Victim rules (``SchedulingSpec.victim``) as the small integers the kernel sees.
VICTIM_NEWEST, VICTIM_PRIORITY, VICTIM_DEADLINE = 0, 1, 2


def uncomputed_tokens(num_prompt_tokens: int, num_generated: int,
                      num_computed_tokens: int) -> int:
    """Tokens a sequence must still compute before its next token can be sampled: its prompt
    and generated tokens less those computed (1 for a decode)."""
    return num_prompt_tokens + num_generated - num_computed_tokens


def tokens_allowed(num_tokens: int, num_uncomputed: int) -> bool:
    """Whether a plan may give a request ``num_tokens`` this step: at least one, and no more
    than the ``num_uncomputed`` it has left."""
    return 1 <= num_tokens <= num_uncomputed


def as_limit(limit: int | None) -> int:
    """A policy's limit (``max_num_seqs``, ``max_num_batched_tokens``) as the rules take it:
    ``NO_LIMIT`` for none (read in Python, not compiled)."""
    return NO_LIMIT if limit is None else limit


def within_limit(count: int, limit: int) -> bool:
    """Whether ``count`` (a step's sequences or tokens) keeps to a policy's ``limit``
    (``NO_LIMIT`` when it has none)."""
    return count <= limit


def blocks_fit(num_blocks: int, free_blocks: int, freed_blocks: int) -> bool:
    """Whether ``num_blocks`` more blocks fit in the free ones and those the step's
    preemptions free."""
    return num_blocks <= free_blocks + freed_blocks


def blocks_for(num_tokens: Tokens, block_size: int) -> Tokens:
    """Blocks that hold ``num_tokens`` tokens (exact integer ceiling; elementwise on arrays)."""
    return -(-num_tokens // block_size)


def target_tokens(num_tokens: int, floor_tokens: int) -> int:
    """Tokens a sequence's blocks must cover: what it computes, at least its slab floor."""
    return num_tokens if num_tokens >= floor_tokens else floor_tokens


def blocks_needed(num_tokens: int, floor_tokens: int, num_blocks: int, block_size: int) -> int:
    """Extra blocks a sequence holding ``num_blocks`` needs to hold ``num_tokens`` computed
    tokens (at least ``floor_tokens``: its slab reservation, 0 when paged)."""
    target = num_tokens if num_tokens >= floor_tokens else floor_tokens
    need = -(-target // block_size) - num_blocks
    return need if need > 0 else 0


def slab_floor(num_prompt_tokens: int, reserve_tokens: int, reserve_output_tokens: int) -> int:
    """The slab reservation of a sequence in tokens: prompt + ``reserve_output_tokens`` when
    that is set (>= 0), else ``reserve_tokens`` (0: paged, no reservation)."""
    if reserve_output_tokens >= 0:
        return num_prompt_tokens + reserve_output_tokens
    return reserve_tokens


def watermark_blocks(watermark: float, total_blocks: int) -> int:
    """Blocks kept free at admission: ``watermark`` × total (0 for an unlimited cache)."""
    return int(watermark * total_blocks) if total_blocks < UNLIMITED_BLOCKS else 0


def admits(seats: int, tokens: int, budget_tokens: int, free_blocks: int, blocks: int,
           mark_blocks: int) -> bool:
    """The whole-prompt admission test: a free sequence slot, the tokens within the step's
    budget, and the blocks leaving at least the watermark free."""
    return seats >= 1 and tokens <= budget_tokens and free_blocks - blocks >= mark_blocks


def max_fitting_tokens(num_computed_tokens: int, num_blocks: int, floor_tokens: int,
                       block_size: int, free_blocks: int, cap: int) -> int:
    """The most new tokens (at most ``cap``) whose KV fits in ``free_blocks`` (0 if none).

    Chunked admission sizes a chunk by what the cache can hold rather than skipping the
    request; for a slab the first allocation must also cover the whole reservation.
    """
    if cap < 1 or free_blocks < 0:
        return 0
    room = (num_blocks + free_blocks) * block_size - num_computed_tokens
    n = cap if cap <= room else room
    if n < 1 or blocks_needed(num_computed_tokens + n, floor_tokens, num_blocks,
                              block_size) > free_blocks:
        return 0
    return n


def outranks(victim: int, priority: int, deadline_s: float, best_priority: int,
             best_deadline_s: float) -> bool:
    """Whether an older candidate is a better preemption victim than the best one so far.

    Candidates are scanned from the newest to the oldest, so ties go to the newest:
    ``VICTIM_NEWEST`` never prefers an older one; ``VICTIM_PRIORITY`` prefers the lower
    priority value (the less important request, as vLLM's priority scheduler does);
    ``VICTIM_DEADLINE`` the later TTFT deadline.
    """
    if victim == VICTIM_PRIORITY:
        return priority < best_priority
    if victim == VICTIM_DEADLINE:
        return deadline_s > best_deadline_s
    return False


def batch_due_s(oldest_arrival_s: float, wait_s: float) -> float:
    """When a partial run-to-completion batch goes: its oldest request's arrival plus the
    batch's ``wait_s`` (``inf``: never by time, only full)."""
    return oldest_arrival_s + wait_s


def batch_ready(count: int, batch_size: int, more_arrivals: bool, now_s: float,
                due_s: float) -> bool:
    """Whether a group of ``count`` waiting requests goes as a batch now: it is full, no more
    requests will arrive (waiting cannot fill it), or its ``batch_due_s`` has come."""
    return count >= batch_size or not more_arrivals or now_s >= due_s


def prompt_bucket(num_tokens: int, width: int, bounds: Sequence[int] | np.ndarray) -> int:
    """The prompt-length bucket of a request that would prefill ``num_tokens`` now: with a
    ``width`` > 0, buckets of 1..w, w+1..2w, ... tokens; else the first of the increasing upper
    ``bounds`` that holds it (``len(bounds)``: the last bucket, everything longer), as
    ``bisect_left`` finds it."""
    if width > 0:
        return (num_tokens - 1) // width
    k = 0
    while k < len(bounds) and bounds[k] < num_tokens:
        k += 1
    return k


def rejoin_free_blocks(free_blocks: int, num_running: int) -> int:
    """The blocks preempted members of a batch may take to rejoin it: the free ones less one
    of headroom per running member, so the next decode step does not evict them at once."""
    return free_blocks - num_running
