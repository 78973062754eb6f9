"""The Mooncake JSONL trace format: one JSON object per line, prefix identity by block ids.

Each line is ``{"timestamp": ms, "input_length": tokens, "output_length": tokens,
"hash_ids": [id, ...]}`` (the layout of the traces Mooncake published with its paper): the
arrival time in milliseconds, the prompt and output lengths, and one id per 512 prompt tokens
where equal leading ids mean a shared prefix (``sim.core.blocks``). Times are kept as written
(first row not shifted to 0), like the native format's.

Strict, like the CSV formats: a line that is not a JSON object, a missing or unknown field, a
value of the wrong type or out of range, more ids than the prompt has 512-token blocks, or a
time earlier than the previous line's (unless ``sort``) is a ``TraceError`` naming the file,
the 1-based line and the field. Blank lines may only end the file. Gzip-compressed files load
the same (recognised by their magic bytes).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from sim.core.arrays import TraceArrays, tuple_column
from sim.core.blocks import HASH_BLOCK_TOKENS, MAX_HASH_ID
from sim.core.errors import InputError
from sim.workload.limits import MAX_REQUESTS

FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


def is_mooncake(header: str) -> bool:
    """Whether a trace's first line is a JSON object (JSONL) rather than a CSV header."""
    return header.lstrip().startswith("{")


def load_mooncake(path: Path, lines: Any, error: type[InputError], max_tokens: int,
                  max_arrival_s: float, sort: bool) -> TraceArrays:
    """Parse the decoded text ``lines`` of ``path`` (an iterable of str) into ``TraceArrays``.

    ``error`` is the trace loader's error class; ``max_tokens`` and ``max_arrival_s`` its
    bounds, so every format refuses the same values.
    """
    arrival: list[float] = []
    prompt: list[int] = []
    output: list[int] = []
    hash_ids: list[tuple[int, ...]] = []
    blank_at = 0  # the first blank line of a run (fine at the end, not inside)
    last = -np.inf
    unsorted = False
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            blank_at = blank_at or n
            continue
        where = f"{path}: line {n}"
        if blank_at:
            raise error(f"{path}: line {blank_at}: empty line inside the trace")
        if len(arrival) >= MAX_REQUESTS:
            raise error(f"{where}: more than {MAX_REQUESTS:,} requests in one trace")
        row = _object(line, where, error)
        t_ms = _number(row, "timestamp", where, error, 0, max_arrival_s * 1e3, integer=False)
        t = t_ms / 1e3
        p = int(_number(row, "input_length", where, error, 1, max_tokens))
        output.append(int(_number(row, "output_length", where, error, 1, max_tokens)))
        hash_ids.append(_ids(row, p, where, error))
        if t < last:  # after the line's own checks, as the CSV formats rank them
            if not sort:
                raise error(f"{where}: field timestamp: earlier than the previous line's "
                            "(lines must be in time order; set sort: true to sort them)")
            unsorted = True
        last = max(last, t)
        arrival.append(t)
        prompt.append(p)
    if not arrival:
        raise error(f"{path}: no requests (an empty file)")
    trace = TraceArrays(np.array(arrival, dtype=np.float64), np.array(prompt, dtype=np.int64),
                        np.array(output, dtype=np.int64), source=str(path),
                        hash_ids=tuple_column(hash_ids) if any(hash_ids) else None)
    if unsorted:
        trace = trace.take(np.argsort(trace.arrival_s, kind="stable"))
    return trace


def _object(line: str, where: str, error: type[InputError]) -> dict[str, Any]:
    """The line's JSON object with exactly the format's fields."""
    try:
        row = json.loads(line, object_pairs_hook=_no_repeats)
    except (json.JSONDecodeError, RecursionError, _Repeated) as exc:
        msg = (exc.msg if isinstance(exc, json.JSONDecodeError) else
               "nested too deeply" if isinstance(exc, RecursionError) else str(exc))
        raise error(f"{where}: not valid JSON ({msg})") from None
    if not isinstance(row, dict):
        raise error(f"{where}: expected a JSON object, got {type(row).__name__}")
    for name in FIELDS:
        if name not in row:
            raise error(f"{where}: field {name}: missing")
    unknown = sorted(set(row) - set(FIELDS))
    if unknown:
        raise error(f"{where}: field {unknown[0]}: unknown (fields: {', '.join(FIELDS)})")
    return row


class _Repeated(ValueError):
    """A JSON object names one key twice (``json`` would keep the last silently)."""


def _no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Repeated(f"key {key!r} given twice")
        out[key] = value
    return out


def _number(row: dict[str, Any], name: str, where: str, error: type[InputError],
            lo: float, hi: float, integer: bool = True) -> float:
    """``row[name]``: a JSON number (whole when ``integer``) in ``[lo, hi]``."""
    v = row[name]
    kind = "a whole number" if integer else "a number"
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise error(f"{where}: field {name}: must be {kind}, got {json.dumps(v)[:40]}")
    if isinstance(v, float) and (not np.isfinite(v) or (integer and not v.is_integer())):
        raise error(f"{where}: field {name}: must be {kind}, got {v!r}")
    if not lo <= v <= hi:
        raise error(f"{where}: field {name}: must be in [{lo:g}, {hi:g}], got {str(v)[:40]}")
    return float(v)


def _ids(row: dict[str, Any], num_prompt_tokens: int, where: str,
         error: type[InputError]) -> tuple[int, ...]:
    """``row["hash_ids"]``: whole numbers in ``[0, 2**63 - 1]``, one per started 512 tokens."""
    ids = row["hash_ids"]
    if not isinstance(ids, list):
        raise error(f"{where}: field hash_ids: must be a list of whole numbers, got "
                    f"{json.dumps(ids)[:40]}")
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i <= MAX_HASH_ID:
            raise error(f"{where}: field hash_ids: ids must be whole numbers in "
                        f"[0, 2**63 - 1], got {json.dumps(i)[:40]}")
    most = -(-num_prompt_tokens // HASH_BLOCK_TOKENS)
    if len(ids) > most:
        raise error(f"{where}: field hash_ids: {len(ids)} ids for a {num_prompt_tokens}-token "
                    f"prompt: at most one per {HASH_BLOCK_TOKENS} tokens ({most})")
    return tuple(ids)
