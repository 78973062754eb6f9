"""Queue orderings, kept apart from packing so every policy can use any of them (SGLang's split).

An ordering sorts the waiting queue; packing then walks it in that order. Preempted requests
keep their place at the front under FCFS (the engine lists them first), as vLLM does.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from sim.core.types import SeqView

ORDERINGS: dict[str, Callable[[Sequence[SeqView]], list[SeqView]]] = {
    # First come, first served: the engine's order (preempted first, then by arrival).
    "fcfs": lambda q: list(q),
    # Shortest prompt first: fewer tokens to prefill first (ties keep arrival order).
    "spf": lambda q: sorted(q, key=lambda s: s.num_uncomputed),
    # Higher priority value first; ties keep the engine's order.
    "priority": lambda q: sorted(q, key=lambda s: -s.priority),
}


def order_queue(queue: Sequence[SeqView], ordering: str) -> list[SeqView]:
    """Return ``queue`` sorted by the named ordering (stable)."""
    if ordering == "fcfs" or len(queue) < 2:
        return list(queue)
    return ORDERINGS[ordering](queue)
