"""Synthetic multi-turn conversations: the workload where prefix caching pays.

Each conversation is a chain of turns. Turn 1's prompt is the user's first message; turn
``k+1``'s prompt is the whole history so far (turn ``k``'s prompt and its answer) followed by
the new user message. Every turn of a conversation carries ``prefix_id = "conv<c>"`` and
``num_prefix_tokens`` = that history's length, so with ``kv.prefix_caching`` a turn reuses the
blocks its predecessors left cached and computes only the new message.

Spec (``workload: {conversations: {...}}``; token lengths are an int, ``[lo, hi]`` for uniform
integers, or ``{mean: m, sigma: s}`` / ``{median: m, sigma: s}`` for lognormal):

- ``num_conversations`` (required): conversations generated.
- ``rate`` (1.0): conversation starts per second (Poisson).
- ``turns`` ([1, 6]): turns per conversation.
- ``user_tokens`` ({median: 200, sigma: 1.0}): tokens of each new user message.
- ``output_tokens`` ({median: 250, sigma: 0.8}): tokens of each answer.
- ``think_time_s`` (20.0): mean seconds (exponential) between a turn's arrival and the next's.
  Open loop: the next turn's time does not wait for the answer, so under overload a turn can
  arrive before its predecessor finished and then finds less of its history cached.
- ``max_context_tokens`` (8192): a conversation ends before a turn whose prompt plus answer
  would exceed it.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from sim.core.errors import InputError
from sim.core.types import Request
from sim.workload import synthetic

DEFAULTS: dict[str, Any] = {
    "num_conversations": None,
    "rate": 1.0,
    "turns": [1, 6],
    "user_tokens": {"median": 200, "sigma": 1.0},
    "output_tokens": {"median": 250, "sigma": 0.8},
    "think_time_s": 20.0,
    "max_context_tokens": 8192,
}
WHERE = "workload.conversations"


class ConversationError(InputError):
    """An invalid conversations spec; the message starts with the dotted key at fault."""


def _lengths(spec: Any, key: str, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` token counts (>= 1) drawn from one length spec."""
    where = f"{WHERE}.{key}"
    if isinstance(spec, bool):
        raise ConversationError(f"{where}: expected a length, got {spec!r}")
    if isinstance(spec, int):
        if spec < 1:
            raise ConversationError(f"{where}: must be >= 1, got {spec}")
        return synthetic.fixed(spec, size)
    if isinstance(spec, list | tuple) and len(spec) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in spec):
        if spec[1] < spec[0]:
            raise ConversationError(f"{where}: [lo, hi] needs lo <= hi, got {list(spec)}")
        return synthetic.uniform(int(spec[0]), int(spec[1]), size, rng)
    if isinstance(spec, Mapping) and set(spec) in ({"mean", "sigma"}, {"median", "sigma"}):
        try:
            values = synthetic.lognormal(size, rng, sigma=float(spec["sigma"]),
                                         mean=spec.get("mean"), median=spec.get("median"))
        except (TypeError, ValueError) as e:
            raise ConversationError(f"{where}: {e}") from None
        return synthetic.clamp_tokens(values)
    raise ConversationError(f"{where}: expected an int, [lo, hi] or {{mean|median, sigma}}, "
                            f"got {spec!r}")


def _positive(spec: Mapping[str, Any], key: str, integer: bool = False) -> float:
    v = spec[key]
    ok = isinstance(v, int if integer else int | float) and not isinstance(v, bool) and v > 0
    if not ok or not np.isfinite(v):
        kind = "an integer" if integer else "a number"
        raise ConversationError(f"{WHERE}.{key}: expected {kind} > 0, got {v!r}")
    return v


def conversations(spec: Mapping[str, Any], rng: np.random.Generator) -> list[Request]:
    """The requests of ``spec``'s conversations, ids in arrival order (see module docstring)."""
    if not isinstance(spec, Mapping):
        raise ConversationError(f"{WHERE}: must be a mapping, got {type(spec).__name__}")
    unknown = sorted(set(spec) - set(DEFAULTS))
    if unknown:
        raise ConversationError(f"{WHERE}.{unknown[0]}: unknown key; accepted: "
                                f"{', '.join(DEFAULTS)}")
    if spec.get("num_conversations") is None:
        raise ConversationError(f"{WHERE}.num_conversations: required")
    s = {**DEFAULTS, **spec}
    n = int(_positive(s, "num_conversations", integer=True))
    rate = _positive(s, "rate")
    think = _positive(s, "think_time_s")
    max_ctx = int(_positive(s, "max_context_tokens", integer=True))
    starts = synthetic.arrival_times("poisson", rate, rng, num_requests=n)
    turns = _lengths(s["turns"], "turns", n, rng)
    total = int(turns.sum())
    user = _lengths(s["user_tokens"], "user_tokens", total, rng)
    out = _lengths(s["output_tokens"], "output_tokens", total, rng)
    gaps = rng.exponential(think, total)
    rows: list[tuple[float, int, int, str, int]] = []
    k = 0
    for c in range(n):
        t, history = float(starts[c]), 0
        for turn in range(int(turns[c])):
            prompt, answer = history + int(user[k]), int(out[k])
            if turn and prompt + answer > max_ctx:
                break
            rows.append((t, prompt, answer, f"conv{c}", history))
            history = prompt + answer
            t += float(gaps[k])
            k += 1
        k = int(turns[: c + 1].sum())  # draws stay aligned per conversation: same seed, same turns
    rows.sort(key=lambda r: r[0])
    return [Request(id=i, arrival_s=r[0], num_prompt_tokens=r[1], num_output_tokens=r[2],
                    prefix_id=r[3], num_prefix_tokens=r[4]) for i, r in enumerate(rows)]
