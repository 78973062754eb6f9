"""Checks on what ``sim.simulate`` is given, done before anything runs.

A NaN arrival time or a zero-token request would otherwise hang or corrupt a run, so
``request_columns`` validates every request, vectorised with numpy so a million requests cost
milliseconds: ``arrival_s`` finite, >= 0 and at most ``MAX_ARRIVAL_S``; ``num_prompt_tokens``
and ``num_output_tokens`` integers (Python or numpy, not bool) in ``[1, MAX_TOKENS]`` (the
bounds of a trace file); ids unique. A bad request raises ``InputError``
naming it and the field (``requests[3].arrival_s: must be a finite number >= 0, got nan``).

``LIMIT_FIELDS`` is the one definition of the run limits: the experiment schema embeds it as
its ``limits`` block and ``check_run_limits`` checks ``sim.simulate``'s keyword arguments
against it, so both accept and refuse the same values with the same words.
"""
from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import Any

import numpy as np

from sim.core.arrays import TraceArrays
from sim.core.blocks import check_hash_ids
from sim.core.errors import InputError
from sim.core.fields import INT, NUM, OPT, Key, check_value, is_int_type, is_real, is_real_type
from sim.core.types import Request
from sim.workload.traces import MAX_ARRIVAL_S, MAX_TOKENS  # the trace files' bounds

_TOKEN_FIELDS = ("num_prompt_tokens", "num_output_tokens")
_ARRIVAL_PROBLEM = "must be a finite number >= 0"
_TOKEN_PROBLEM = "must be an integer >= 1"


def request_columns(requests: Sequence[Request] | TraceArrays) -> dict[str, np.ndarray]:
    """Ids, arrival times and lengths of valid ``requests`` as numpy arrays, in input order.

    Ids are ``int64`` unless some id is not an integer (an object array then; only the general
    engine takes such ids).
    Raises ``InputError`` for the first bad request (by position), naming it and the field.
    Columnar input (``TraceArrays``) has the row numbers as ids.
    """
    if isinstance(requests, TraceArrays):
        return _columns_from_arrays(requests)
    if not isinstance(requests, Sequence) or isinstance(requests, str | bytes):
        raise InputError(f"expected a sequence of Request or a TraceArrays, got "
                         f"{type(requests).__name__}", field="requests")
    wrong = {t for t in set(map(type, requests)) if not issubclass(t, Request)}
    if wrong:
        i = next(i for i, r in enumerate(requests) if type(r) in wrong)
        raise InputError(f"expected a Request, got {type(requests[i]).__name__}",
                         field=f"requests[{i}]")
    return _columns_from_requests(requests)


#: The run limits: YAML ``limits:`` and ``sim.simulate``'s keyword arguments of the same names.
LIMIT_FIELDS: dict[str, Key] = {
    # > 0: a run stopped at 0 s simulates nothing, and would report an empty summary as a
    # result
    "horizon_s": Key(NUM + (OPT,), None, "Stop simulated time here (partial results are "
                     "marked).", "s", 0, exclusive_min=True),
    "wall_clock_s": Key(NUM + (OPT,), None, "Stop a run after this much real time "
                        "(partial results are marked).", "s", 0, exclusive_min=True),
    "max_model_len": Key(INT + (OPT,), None, "Longest prompt + output a request may "
                         "reach; default the model's max_position_embeddings (vLLM's "
                         "rule); longer requests are rejected at arrival.", "tokens", 1),
}


#: The YAML's ``seed`` and ``parallelism.replicas``, ``sim.simulate``'s ``seed`` and
#: ``num_replicas``.
SEED = Key(INT, 0, "Seed of every random draw (workload generation, resampling).",
           minimum=0, maximum=2**63 - 1)
REPLICAS = Key(INT, 1, "Model replicas, behind `router` (default: round robin).", minimum=1,
               maximum=4096)


def check_run_limits(horizon_s: Any, wall_clock_s: Any, max_model_len: Any = None) -> None:
    """Check ``sim.simulate``'s run limits against ``LIMIT_FIELDS`` (the YAML's rules)."""
    for name, value in (("horizon_s", horizon_s), ("wall_clock_s", wall_clock_s),
                        ("max_model_len", max_model_len)):
        check_value(value, LIMIT_FIELDS[name], name)


def model_len_limit(cost: Any, max_model_len: int | None | str) -> int | None:
    """The context limit of a replica with ``cost``: ``max_model_len``, or for ``"model"``
    the model's ``max_position_embeddings`` when the cost model has one (``None``: none)."""
    if max_model_len == "model":
        return getattr(getattr(cost, "model", None), "max_position_embeddings", None)
    return max_model_len  # type: ignore[return-value]


def check_run_args(seed: Any, num_replicas: Any) -> None:
    """Check ``sim.simulate``'s ``seed`` and ``num_replicas`` by the YAML keys' rules."""
    check_value(seed, SEED, "seed")
    check_value(num_replicas, REPLICAS, "num_replicas")


def _show(value: Any) -> str:
    """How a bad value reads in a message (numpy scalars as their Python value)."""
    if isinstance(value, np.generic):
        value = value.item()
    return repr(value) if not isinstance(value, float) else str(value)


def _fail(where: int, ids: Any, field: str, problem: str, value: Any) -> InputError:
    """The error for ``requests[where].field`` (its id added when it is not the position; the
    value unless the problem already shows it)."""
    rid = ids[where] if ids is not None else where
    note = "" if isinstance(rid, (int, np.integer)) and int(rid) == where else f" (id {rid!r})"
    got = "" if ", got " in problem else f", got {_show(value)}"
    return InputError(f"{problem}{got}{note}", field=f"requests[{where}].{field}")


def _columns_from_requests(requests: Sequence[Request]) -> dict[str, np.ndarray]:
    """Validate a list of ``Request`` and return its columns."""
    n = len(requests)
    ids = list(map(attrgetter("id"), requests))
    cols: dict[str, np.ndarray] = {}
    arrivals = list(map(attrgetter("arrival_s"), requests))
    bad = {t for t in set(map(type, arrivals)) if not is_real_type(t)}
    if bad:
        i = next(i for i, v in enumerate(arrivals) if type(v) in bad)
        raise _fail(i, ids, "arrival_s", _ARRIVAL_PROBLEM, arrivals[i])
    cols["arrival_s"] = _check_arrivals(np.fromiter(arrivals, np.float64, n), arrivals, ids)
    for name in _TOKEN_FIELDS:
        values = list(map(attrgetter(name), requests))
        bad = {t for t in set(map(type, values)) if not is_int_type(t)}
        if bad:
            i = next(i for i, v in enumerate(values) if type(v) in bad)
            raise _fail(i, ids, name, _TOKEN_PROBLEM, values[i])
        try:
            col = np.fromiter(values, np.int64, n)
        except OverflowError:
            i = next(i for i, v in enumerate(values) if not -2**63 <= v < 2**63)
            raise _fail(i, ids, name, _TOKEN_PROBLEM + " and < 2**63", values[i]) from None
        _check_tokens(col, name, values, ids)
        cols[name] = col
    # ids, priorities and prefix lengths are int64 columns of every table: a string id or
    # one past int64 failed when the requests table was built, after the whole run
    id_col = _int_column(ids, ids, "id", "must be an integer within int64")
    _check_unique(id_col)
    _check_extras({name: list(map(attrgetter(name), requests)) for name in _EXTRA_FIELDS},
                  ids)
    _check_hash_ids(list(map(attrgetter("hash_ids"), requests)),
                    list(map(attrgetter("num_prefix_tokens"), requests)), cols, ids)
    return {"id": id_col, **cols}


#: The optional fields of a request beyond its lengths, checked alike for ``Request`` lists and
#: ``TraceArrays`` columns (``_check_extras``): int64 priorities, prefix lengths >= 0 (a shared
#: prefix longer than the prompt reuses at most the prompt: the engine's rule), text labels.
_EXTRA_FIELDS = ("priority", "num_prefix_tokens", "tenant", "prefix_id")
_PRIORITY_PROBLEM = "must be an integer within int64"
_PREFIX_PROBLEM = "must be an integer >= 0"
_LABEL_PROBLEM = "must be a string or None"


def _check_extras(columns: dict[str, Any], ids: Any) -> None:
    """Raise for the first bad value of each optional field given (a list of values, or a
    ``TraceArrays`` column: numpy integer and string columns are checked whole, others value
    by value by the same rules)."""
    for name in ("priority", "num_prefix_tokens"):
        col = columns.get(name)
        if col is None:
            continue
        problem = _PRIORITY_PROBLEM if name == "priority" else _PREFIX_PROBLEM
        ints = _int_values(col, ids, name, problem)
        if name == "num_prefix_tokens" and (ints < 0).any():
            i = int(np.argmax(ints < 0))
            raise _fail(i, ids, name, problem, int(ints[i]))
    for name in ("tenant", "prefix_id"):  # labels: text or none
        col = columns.get(name)
        if col is None or (isinstance(col, np.ndarray) and col.dtype.kind == "U"):
            continue
        values = col  # an object column iterates its objects as a list does (no copy)
        if not set(map(type, values)) <= {str, type(None)}:
            i = next(i for i, v in enumerate(values) if not isinstance(v, (str, type(None))))
            raise _fail(i, ids, name, _LABEL_PROBLEM, values[i])


def _int_values(col: Any, ids: Any, field: str, problem: str) -> np.ndarray:
    """``col`` (a list, or a numpy column checked whole when its dtype is an integer one) as
    int64 values by ``_int_column``'s rule: integers (numpy's count; bools and floats, whole
    or not, do not) within int64."""
    if not isinstance(col, np.ndarray):
        return _int_column(col, ids, field, problem)
    if col.dtype.kind == "i":
        return col.astype(np.int64, copy=False)
    if col.dtype.kind == "u" and (not col.size or int(col.max()) < 2**63):
        return col.astype(np.int64, copy=False)
    return _int_column(col.tolist(), ids, field, problem)


def _int_column(values: list[Any], ids: Any, field: str, problem: str) -> np.ndarray:
    """``values`` as an int64 column; the first that is no integer (numpy's count, bools do
    not) or is past int64 is the error ``requests[i].<field>: <problem>``."""
    bad = {t for t in set(map(type, values)) if not is_int_type(t)}
    if bad:
        i = next(i for i, v in enumerate(values) if type(v) in bad)
        raise _fail(i, ids, field, problem, values[i])
    try:
        return np.fromiter(values, np.int64, len(values))
    except OverflowError:
        i = next(i for i, v in enumerate(values) if not -2**63 <= v < 2**63)
        raise _fail(i, ids, field, problem, values[i]) from None


def _columns_from_arrays(trace: TraceArrays) -> dict[str, np.ndarray]:
    """Validate columnar requests (ids are the row numbers) and return their columns."""
    arrival = np.asarray(trace.arrival_s)
    if arrival.ndim != 1:
        raise InputError(f"must be a 1-D array, got shape {arrival.shape}", field="arrival_s")
    n = arrival.shape[0]
    if arrival.dtype.kind not in "iuf":
        if arrival.dtype.kind == "O":
            values = arrival.tolist()
            bad = [i for i, v in enumerate(values) if not is_real(v)]
            if bad:
                raise _fail(bad[0], None, "arrival_s", _ARRIVAL_PROBLEM, values[bad[0]])
        else:
            raise _fail(0, None, "arrival_s", _ARRIVAL_PROBLEM, arrival[0]) if n else InputError(
                f"must be numbers, got dtype {arrival.dtype}", field="arrival_s")
    arrival = _check_arrivals(arrival.astype(np.float64, copy=False), arrival, None)
    cols = {"id": np.arange(n, dtype=np.int64), "arrival_s": arrival}
    for name in _TOKEN_FIELDS:
        col = np.asarray(getattr(trace, name))
        if col.shape != (n,):
            raise InputError(f"must have one value per request ({n}), got shape {col.shape}",
                             field=name)
        if col.dtype.kind not in "iu":
            if col.dtype.kind != "O":
                raise _fail(0, None, name, _TOKEN_PROBLEM, col[0]) if n else InputError(
                    f"must be integers, got dtype {col.dtype}", field=name)
            values = col.tolist()
            bad = [i for i, v in enumerate(values) if not is_int_type(type(v))]
            if bad:
                raise _fail(bad[0], None, name, _TOKEN_PROBLEM, values[bad[0]])
            col = np.fromiter(values, np.int64, n)
        elif col.dtype.kind == "u" and n and int(col.max()) >= 2**63:
            i = int(np.argmax(col >= 2**63))
            raise _fail(i, None, name, _TOKEN_PROBLEM + " and < 2**63", col[i])
        col = col.astype(np.int64, copy=False)
        _check_tokens(col, name, col, None)
        cols[name] = col
    extras = {}
    for name in _EXTRA_FIELDS:  # the Request path's checks, one column at a time
        col = getattr(trace, name)
        if col is None:
            continue
        if not isinstance(col, np.ndarray):  # a list; labels as objects: [5, 'a'] would
            # become the strings '5', 'a'
            col = np.asarray(col, dtype=object if name in ("tenant", "prefix_id") else None)
        if col.shape != (n,):
            raise InputError(f"must have one value per request ({n}), got shape {col.shape}",
                             field=name)
        extras[name] = col
    _check_extras(extras, None)
    if trace.hash_ids is not None:
        hids = np.asarray(trace.hash_ids, dtype=object)
        if hids.shape != (n,):
            raise InputError(f"must have one tuple per request ({n}), got shape {hids.shape}",
                             field="hash_ids")
        prefix = trace.num_prefix_tokens
        _check_hash_ids(hids.tolist(), [0] * n if prefix is None else prefix.tolist(), cols,
                        None)
    return cols


def _check_arrivals(arrival: np.ndarray, values: Any, ids: Any) -> np.ndarray:
    """Raise for the first arrival time that is not finite or is negative."""
    with np.errstate(invalid="ignore"):
        bad = ~(np.isfinite(arrival) & (arrival >= 0))
    if bad.any():
        i = int(np.argmax(bad))
        raise _fail(i, ids, "arrival_s", _ARRIVAL_PROBLEM, values[i])
    late = arrival > MAX_ARRIVAL_S
    if late.any():  # a trace file refuses these too: float time loses step precision there
        i = int(np.argmax(late))
        raise _fail(i, ids, "arrival_s", f"must be at most {MAX_ARRIVAL_S:g} s", values[i])
    return arrival


def _check_tokens(col: np.ndarray, name: str, values: Any, ids: Any) -> None:
    """Raise for the first token count below 1."""
    bad = col < 1
    if bad.any():
        i = int(np.argmax(bad))
        raise _fail(i, ids, name, _TOKEN_PROBLEM, values[i])
    huge = col > MAX_TOKENS
    if huge.any():  # as in a trace file: such a count is a data error, not a workload
        i = int(np.argmax(huge))
        raise _fail(i, ids, name, f"must be at most {MAX_TOKENS:,}", values[i])


def _check_hash_ids(hash_ids: list[Any], num_prefix_tokens: list[Any],
                    cols: dict[str, np.ndarray], ids: Any) -> None:
    """Raise for the first request whose ``hash_ids`` are malformed, run past its prompt, or
    come with a ``num_prefix_tokens`` shorthand too (one prefix identity per request)."""
    prompt = cols["num_prompt_tokens"]
    for i, h in enumerate(hash_ids):
        if type(h) is tuple and not h:
            continue
        problem = check_hash_ids(h, int(prompt[i]))
        if problem:
            raise _fail(i, ids, "hash_ids", problem, h if len(repr(h)) < 60 else "...")
        if num_prefix_tokens[i]:
            raise _fail(i, ids, "hash_ids", "a request names its prefix by hash_ids or by "
                        "num_prefix_tokens, not both", h if len(repr(h)) < 60 else "...")


def _check_unique(ids: np.ndarray) -> None:
    """Raise for the first id (by position) that repeats an earlier one."""
    if len(ids) < 2:
        return
    order = np.argsort(ids, kind="stable")
    dup = ids[order[1:]] == ids[order[:-1]]
    if dup.any():
        later = order[1:][dup]
        i = int(later.min())
        first = int(np.flatnonzero(ids == ids[i])[0])
        raise InputError(f"request ids must be unique: {int(ids[i])} repeats requests[{first}]",
                         field=f"requests[{i}].id")
