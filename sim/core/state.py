"""Engine-owned mutable state of one request; only the engine touches it.

The "computed tokens catch up" rule (vLLM v1): a step computes ``n`` of the request's
``num_uncomputed`` tokens; when ``num_computed`` reaches prompt + generated, one new token is
sampled. A prefill's last chunk therefore yields the first token, each decode step one more,
and a recompute after preemption re-prefills prompt + generated tokens before sampling again.

KV bookkeeping kept here for the metrics: ``max_held`` (the most tokens whose KV the request
has ever had, computed or found cached) tells recomputed tokens from new ones, and
``num_cached_tokens`` counts prompt tokens it never computed thanks to the prefix cache. A
swapped-out request keeps ``num_computed`` (its KV waits in host memory) but holds no blocks.
"""
from __future__ import annotations

import math

from sim.core.rules import uncomputed_tokens
from sim.core.types import Request, SeqView

#: ``Seq.advance`` result for a token produced one step after the previous one: its
#: inter-token latency is exactly that step's duration, so the step log counts it instead of
#: storing it (keeps memory linear in steps, not tokens).
REGULAR_ITL = -1.0

NAN = math.nan

# ``SeqView`` is a named tuple: built with ``tuple.__new__`` from all its fields in order (the
# derived ``num_uncomputed`` too), which skips ``__new__``'s argument parsing (the engine's
# most frequent allocation).
_new_tuple = tuple.__new__


class Seq:
    """Progress, KV holding and timestamps of one request."""

    __slots__ = ("req", "num_generated", "num_computed", "num_blocks", "num_preemptions",
                 "first_scheduled_s", "first_token_s", "last_token_s", "finish_s",
                 "max_itl_s", "status", "reason", "replica", "cached_view", "num_shared",
                 "hit_tokens", "swapped", "num_swaps", "max_held", "num_cached_tokens")

    def __init__(self, req: Request, replica: int = 0) -> None:
        self.req = req
        self.replica = replica
        self.num_generated = 0
        self.num_computed = 0
        self.num_blocks = 0
        self.num_preemptions = 0
        self.first_scheduled_s = NAN
        self.first_token_s = NAN
        self.last_token_s = NAN
        self.finish_s = NAN
        self.max_itl_s = 0.0
        self.status = "waiting"
        self.reason = ""
        #: The ``SeqView`` ``view()`` last built, ``None`` once the state has changed since: a
        #: plan is checked against the very view its policy saw (``sim.engine.validate``)
        #: without a call per scheduled request.
        self.cached_view: SeqView | None = None
        self.num_shared = 0  # leading blocks held shared from the prefix cache
        self.hit_tokens = 0  # cached prompt tokens found at the last view, not yet held
        self.swapped = False
        self.num_swaps = 0
        self.max_held = 0
        self.num_cached_tokens = 0

    @property
    def num_uncomputed(self) -> int:
        """Tokens to compute before the next sample."""
        return uncomputed_tokens(self.req.num_prompt_tokens, self.num_generated, self.num_computed)

    @property
    def finished(self) -> bool:
        """True once every output token has been produced."""
        return self.status == "finished"

    def view(self) -> SeqView:
        """The frozen snapshot a policy sees (cached until the state changes)."""
        v = self.cached_view
        if v is None:
            r = self.req
            computed = self.num_computed + self.hit_tokens
            v = self.cached_view = _new_tuple(SeqView, (
                r.id, r.arrival_s, r.num_prompt_tokens, self.num_generated, computed,
                self.num_preemptions, self.num_blocks, r.priority,
                uncomputed_tokens(r.num_prompt_tokens, self.num_generated, computed)))
        return v

    def offer_hit(self, num_tokens: int) -> bool:
        """Show a waiting request's cached prompt tokens to the next plan (not held yet);
        True when that changes its view."""
        if num_tokens != self.hit_tokens:
            self.hit_tokens = num_tokens
            self.cached_view = None
            return True
        return False

    def take_hit(self) -> None:
        """The offered cached tokens are now held: they count as computed."""
        n = self.hit_tokens
        self.num_cached_tokens += max(0, self.num_computed + n - self.max_held)
        self.num_computed += n
        self.hit_tokens = 0
        if self.num_computed > self.max_held:
            self.max_held = self.num_computed
        self.cached_view = None

    def num_recomputed(self, n: int) -> int:
        """Of the next ``n`` tokens to compute, those whose KV the request had held before."""
        return max(0, min(self.num_computed + n, self.max_held) - self.num_computed)

    def schedule(self, now: float) -> None:
        """Mark the request as running (first time: record when it was first scheduled)."""
        if self.first_scheduled_s != self.first_scheduled_s:  # NaN: never scheduled before
            self.first_scheduled_s = now
        self.status = "running"
        self.cached_view = None

    def advance(self, n: int, start: float, end: float) -> float | None:
        """Commit ``n`` computed tokens at ``end``; return the new token's ITL if one was sampled.

        Returns ``None`` when no token was sampled or it was the first one, ``REGULAR_ITL`` when
        the previous token came at ``start`` (ITL == step duration), else the gap in seconds.
        """
        self.cached_view = None
        computed = self.num_computed + n
        self.num_computed = computed
        if computed > self.max_held:
            self.max_held = computed
        req, generated = self.req, self.num_generated
        if computed < req.num_prompt_tokens + generated:
            return None
        generated += 1
        self.num_generated = generated
        last = self.last_token_s
        self.last_token_s = end
        if generated >= req.num_output_tokens:
            self.status = "finished"
            self.finish_s = end
        if generated == 1:
            self.first_token_s = end
            return None
        gap = end - last
        if gap > self.max_itl_s:
            self.max_itl_s = gap
        return REGULAR_ITL if last == start else gap

    def skip(self, k: int, end: float, worst_itl: float) -> None:
        """Commit ``k`` regular decode steps at once (event skipping), the last ending at ``end``.

        Every one of these tokens came one step after the previous, so the largest of them is
        the longest of the skipped steps.
        """
        self.cached_view = None
        self.num_computed += k
        self.num_generated += k
        if self.num_computed > self.max_held:
            self.max_held = self.num_computed
        self.last_token_s = end
        if worst_itl > self.max_itl_s:
            self.max_itl_s = worst_itl
        if self.num_generated >= self.req.num_output_tokens:
            self.status = "finished"
            self.finish_s = end

    def preempt(self) -> None:
        """Drop the KV (recompute): everything computed must be computed again."""
        self.num_computed = 0
        self.num_blocks = 0
        self.num_preemptions += 1
        self.status = "waiting"
        self.cached_view = None

    def swap_out(self) -> None:
        """Move the KV to host memory: computed tokens are kept, GPU blocks are not."""
        self.num_blocks = 0
        self.num_preemptions += 1
        self.num_swaps += 1
        self.swapped = True
        self.status = "waiting"
        self.cached_view = None

    def reject(self, now: float, reason: str) -> None:
        """The request will never be served; record why."""
        self.num_blocks = 0
        self.num_computed = 0
        self.hit_tokens = 0
        self.swapped = False
        self.status = "rejected"
        self.reason = reason
        self.finish_s = now
        self.cached_view = None

    def check(self, block_size: int) -> None:
        """Assert this running request's counters are consistent."""
        r = self.req
        if not (0 <= self.num_computed <= r.num_prompt_tokens + self.num_generated):
            raise AssertionError(f"request {r.id}: computed {self.num_computed} out of range")
        if self.num_generated > r.num_output_tokens:
            raise AssertionError(f"request {r.id}: generated more tokens than its output")
        if self.num_blocks * block_size < self.num_computed:
            raise AssertionError(f"request {r.id}: runs without its KV ({self.num_blocks} "
                                 f"blocks for {self.num_computed} tokens)")
