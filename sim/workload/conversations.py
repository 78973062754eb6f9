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
- ``max_context_tokens`` (8192): a conversation ends before a later turn whose prompt plus
  answer would exceed it. Its first turn is always kept, as drawn (every conversation has at
  least one turn; a first turn is one request's prompt and answer, which the deployment's
  ``limits.max_model_len`` bounds).

Hard caps, checked before anything is drawn: at most ``MAX_TURNS`` turns per conversation and
at most ``MAX_REQUESTS`` turns in all (``num_conversations`` × the most turns the ``turns``
spec can give), the bound every workload form has.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from sim.core.errors import InputError
from sim.core.fields import is_integer, is_real, unknown_key
from sim.core.types import Request
from sim.workload import synthetic
from sim.workload.limits import MAX_RATE, MAX_REQUESTS, MAX_SIGMA
from sim.workload.traces import MAX_ARRIVAL_S, MAX_TOKENS

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
#: Most turns one conversation may have (a lognormal ``turns`` is clamped to it).
MAX_TURNS = 1000


class ConversationError(InputError):
    """An invalid conversations spec; the message starts with the dotted key at fault."""


def _most(spec: Any, key: str, hi: int) -> int:
    """The largest value length spec ``spec`` can draw (checked to lie in ``[1, hi]``)."""
    where = f"{WHERE}.{key}"
    if isinstance(spec, bool):
        raise ConversationError(f"{where}: expected a length, got {spec!r}")
    if is_integer(spec):  # ``sim.core.fields``' integer rule: numpy counts, 64.0 does not
        if not 1 <= spec <= hi:
            raise ConversationError(f"{where}: must be in [1, {hi:,}], got {spec}")
        return int(spec)
    if isinstance(spec, list | tuple) and len(spec) == 2 and all(is_integer(v) for v in spec):
        if not 1 <= spec[0] <= spec[1] <= hi:
            raise ConversationError(f"{where}: [lo, hi] needs 1 <= lo <= hi <= {hi:,}, got "
                                    f"{list(spec)}")
        return int(spec[1])
    if isinstance(spec, Mapping) and set(spec) in ({"mean", "sigma"}, {"median", "sigma"}):
        for name, value in spec.items():
            ok = is_real(value)
            low, top = (0, MAX_SIGMA) if name == "sigma" else (0, hi)
            # sigma may be 0 (every draw the median); a mean or median must be > 0
            if not ok or not (low <= value if name == "sigma" else low < value) or value > top:
                span = f"[0, {top:g}]" if name == "sigma" else f"(0, {top:,}]"
                raise ConversationError(f"{where}.{name}: must be a number in {span}, "
                                        f"got {value!r}")
        return hi  # clamped to it
    raise ConversationError(f"{where}: expected an int, [lo, hi] or {{mean|median, sigma}}, "
                            f"got {spec!r}")


def _lengths(spec: Any, key: str, size: int, rng: np.random.Generator,
             hi: int = MAX_TOKENS) -> np.ndarray:
    """``size`` counts in ``[1, hi]`` drawn from one length spec (checked by ``_most``)."""
    _most(spec, key, hi)
    if is_integer(spec):
        return synthetic.fixed(int(spec), size)
    if isinstance(spec, list | tuple):
        return synthetic.uniform(int(spec[0]), int(spec[1]), size, rng)
    values = synthetic.lognormal(size, rng, sigma=float(spec["sigma"]),
                                 mean=spec.get("mean"), median=spec.get("median"))
    return synthetic.clamp_tokens(values, 1, hi)


def _positive(spec: Mapping[str, Any], key: str, hi: float, integer: bool = False) -> float:
    """``spec[key]``: a number (an integer if ``integer``) in ``(0, hi]``."""
    v = spec[key]
    ok = is_integer(v) if integer else is_real(v)  # ``sim.core.fields``' rules
    if not ok or not 0 < v <= hi:
        kind = "an integer" if integer else "a number"
        raise ConversationError(f"{WHERE}.{key}: expected {kind} in (0, {hi:,.0f}], got {v!r}")
    return v


def conversations(spec: Mapping[str, Any], rng: np.random.Generator) -> list[Request]:
    """The requests of ``spec``'s conversations, ids in arrival order (see module docstring)."""
    if not isinstance(spec, Mapping):
        raise ConversationError(f"{WHERE}: must be a mapping, got {type(spec).__name__}")
    unknown = sorted(set(spec) - set(DEFAULTS))
    if unknown:
        e = unknown_key(str(unknown[0]), DEFAULTS, f"{WHERE}.{unknown[0]}")
        raise ConversationError(e.problem, field=e.field)
    if spec.get("num_conversations") is None:
        raise ConversationError(f"{WHERE}.num_conversations: required")
    s = {**DEFAULTS, **spec}
    n = int(_positive(s, "num_conversations", MAX_REQUESTS, integer=True))
    rate = _positive(s, "rate", MAX_RATE)
    think = _positive(s, "think_time_s", MAX_ARRIVAL_S)
    max_ctx = int(_positive(s, "max_context_tokens", MAX_TOKENS, integer=True))
    for key in ("user_tokens", "output_tokens"):
        _most(s[key], key, MAX_TOKENS)
    most = n * _most(s["turns"], "turns", MAX_TURNS)
    if most > MAX_REQUESTS:  # before any allocation: the draws below are this long
        raise ConversationError(f"{WHERE}.num_conversations: {n:,} conversations of up to "
                                f"{most // n:,} turns may reach {most:,} requests, more than "
                                f"{MAX_REQUESTS:,}")
    starts = synthetic.arrival_times("poisson", rate, rng, num_requests=n)
    turns = _lengths(s["turns"], "turns", n, rng, MAX_TURNS)
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
            if turn and prompt + answer > max_ctx:  # the first turn always runs (docstring)
                break
            rows.append((t, prompt, answer, f"conv{c}", history))
            history = prompt + answer
            t += float(gaps[k])
            k += 1
        k = int(turns[: c + 1].sum())  # draws stay aligned per conversation: same seed, same turns
    rows.sort(key=lambda r: r[0])
    if rows and rows[-1][0] > MAX_ARRIVAL_S:
        raise ConversationError(f"{WHERE}.rate: turns arrive until {rows[-1][0]:.3g} s, beyond "
                                f"{MAX_ARRIVAL_S:.0e} s where float time loses step precision")
    return [Request(id=i, arrival_s=r[0], num_prompt_tokens=r[1], num_output_tokens=r[2],
                    prefix_id=r[3], num_prefix_tokens=r[4]) for i, r in enumerate(rows)]
