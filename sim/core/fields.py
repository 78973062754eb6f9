"""Typed configuration keys and the one validator for them, shared by YAML and Python.

A configuration block (``kv``, the experiment schema, ...) is a mapping of names to ``Key``:
accepted types, default, unit, bounds and a one-line meaning. ``validate_fields`` checks a
user's mapping against it and fills in the defaults; every problem is one ``InputError`` naming
the dotted path. The YAML loader and the Python API call the same function, so they accept the
same values, reject the same mistakes with the same words, and share one set of defaults.

The number tests (``is_real``, ``is_integer`` and their type forms) are the one definition of
"a number" for every input check, and ``MAX_INT`` bounds every integer key: past it the
compiled kernel's int64 arithmetic would overflow.
"""
from __future__ import annotations

import copy
import difflib
import math
import numbers
from dataclasses import dataclass
from typing import Any

from sim.core.errors import InputError


@dataclass(frozen=True)
class Key:
    """One config key: accepted types, default, unit and a one-line meaning."""

    types: tuple[type, ...]
    default: Any
    doc: str
    unit: str = ""
    minimum: float | None = None
    exclusive_min: bool = False
    maximum: float | None = None
    choices: tuple[Any, ...] | None = None
    required: bool = False


NUM = (int, float)
STR = (str,)
INT = (int,)
MAP = (dict,)
OPT = type(None)

#: Largest magnitude of any integer key without a tighter ``maximum`` (2**53: exact as a float
#: too). The compiled kernel holds counts in int64 and adds and multiplies them (blocks ×
#: block size, tokens + tokens), so an integer near 2**63 would overflow there.
MAX_INT = 2**53
#: Slowest bandwidth any link key accepts, GB/s (1 MB/s): below it moving one request's KV
#: could take longer than the 1e9 s of simulated time within which float times stay precise.
MIN_GBPS = 1e-3


def is_int_type(t: type) -> bool:
    """An integer type (Python or numpy), bools excluded (YAML's ``true`` is no number)."""
    return issubclass(t, numbers.Integral) and not issubclass(t, bool)


def is_real_type(t: type) -> bool:
    """A real-number type (Python or numpy ints and floats), bools excluded."""
    return issubclass(t, numbers.Real) and not issubclass(t, bool)


def is_integer(value: Any) -> bool:
    """An integer (Python or numpy), bools excluded."""
    return is_int_type(type(value))


def is_real(value: Any) -> bool:
    """A real number (Python or numpy), bools excluded."""
    return is_real_type(type(value))


#: Types named in a config's words where Python's differ.
_TYPE_WORDS = {dict: "mapping", type(None): "null"}


def yaml_kind(value: Any) -> str:
    """What a value is, in a config's words (``null`` for ``None``, else its type's name)."""
    return "null" if value is None else type(value).__name__


def _type_ok(value: Any, key: Key) -> bool:
    """``value`` has one of ``key``'s types (numpy scalars count as int/float, bools only as
    bool: YAML's ``true`` is no number)."""
    if isinstance(value, bool):
        return bool in key.types
    if int in key.types and is_integer(value):
        return True
    if float in key.types and is_real(value):
        return True
    return isinstance(value, key.types)


def check_value(value: Any, key: Key, path: str) -> Any:
    """Validate one leaf value; return it normalised (numpy scalars as Python numbers)."""
    if not _type_ok(value, key):
        want = " or ".join(sorted({_TYPE_WORDS.get(t, t.__name__) for t in key.types}))
        got = "null" if value is None else f"{type(value).__name__} {value!r}"
        raise InputError(f"expected {want}, got {got}", field=path)
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, int)):
        value = int(value)
    elif isinstance(value, numbers.Real) and not isinstance(value, (bool, int, float)):
        value = float(value)
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(f"must be finite, got {value!r}", field=path)
    if key.choices and value not in key.choices:
        raise InputError(not_one_of(value, key.choices), field=path)
    if key.minimum is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
        bad = value <= key.minimum if key.exclusive_min else value < key.minimum
        if bad:
            rel = ">" if key.exclusive_min else ">="
            raise InputError(f"must be {rel} {key.minimum}, got {value!r}", field=path)
    if key.maximum is not None and isinstance(value, (int, float)) and value > key.maximum:
        raise InputError(f"must be <= {key.maximum:g}, got {value!r}", field=path)
    if isinstance(value, int) and not isinstance(value, bool) and key.maximum is None:
        check_int_range(value, path)
    return value


def check_flags(**flags: Any) -> None:
    """Each keyword argument is a bool: an API flag given as ``"no"`` (true, being non-empty)
    or ``1`` is an ``InputError`` naming it, not a silent yes."""
    for name, flag in flags.items():
        if not isinstance(flag, bool):
            raise InputError(f"expected true or false, got {flag!r}", field=name)


def check_int(value: Any, path: str, *, bounded: bool = False) -> int:
    """The value of an integer key as an ``int``: an integer (Python or numpy), within
    ``MAX_INT`` unless the key has a tighter bound of its own (``bounded``: the caller checks
    it, as ``check_value`` does a ``maximum``); a float is refused even when whole (``64.0``),
    a bool always. The one integer rule of every key: config blocks (``check_value``), plugin
    parameters and workload keys, from YAML and from Python alike."""
    if not is_integer(value):
        got = "null" if value is None else f"{type(value).__name__} {value!r}"
        raise InputError(f"expected int, got {got}", field=path)
    if not bounded:
        check_int_range(int(value), path)
    return int(value)


def check_int_range(value: int, path: str) -> None:
    """Refuse an integer of magnitude above ``MAX_INT`` (see there), naming ``path``."""
    if abs(value) > MAX_INT:
        raise InputError(f"must be at most 2**53 = {MAX_INT:,} in magnitude, got {value:.3g}",
                         field=path)


def not_one_of(value: Any, choices: Any) -> str:
    """The problem of a value outside ``choices``: every accepted one, and the closest to a
    misspelt name (``'fifoo' is not one of fcfs, spf, priority (did you mean 'fcfs'?)``)."""
    names = [str(c) for c in choices]
    hint = difflib.get_close_matches(str(value), names, n=1) if isinstance(value, str) else []
    extra = f" (did you mean {hint[0]!r}?)" if hint else ""
    return f"{value!r} is not one of {', '.join(names)}{extra}"


def unknown_key(key: str, known: Any, path: str) -> InputError:
    """The error for an unknown key at ``path``: the closest known name and every accepted one."""
    hint = difflib.get_close_matches(key, list(known), n=1)
    extra = f" (did you mean {hint[0]!r}?)" if hint else ""
    return InputError(f"unknown key{extra}; accepted: {', '.join(known)}", field=path)


@dataclass(frozen=True)
class Unused:
    """A key set off its default that the composition it sits in never reads (``kv.num_blocks``
    beside ``kv.unlimited: true``), where it was silently ignored. ``contradicts``: whoever set
    it clearly expected an effect, so it is an error; else (a key a sweep's other runs may
    read, ``kv.reserve_tokens`` under the paged allocator) a one-line note that it is unused."""

    field: str
    value: Any
    why: str
    contradicts: bool = True

    def error(self, source: str | None = None) -> InputError:
        """The ``InputError`` of a contradictory key, naming it (and ``source``)."""
        return InputError(f"{self.value!r} has no effect: {self.why}", source=source,
                          field=self.field)

    def note(self) -> str:
        """The one-line note of a harmless but unused key."""
        return f"{self.field} ({self.value!r}) is not used: {self.why}"


def set_off_default(block: Any, fields: dict[str, Any], name: str) -> bool:
    """``block`` (a user's mapping, defaults filled in or not) gives key ``name`` a value other
    than its default: only such a key can have been meant to change something."""
    return isinstance(block, dict) and name in block and block[name] != fields[name].default


def validate_fields(data: Any, fields: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Check mapping ``data`` against ``fields`` (nested mappings of ``Key``) and return a copy
    with every default filled in. ``prefix`` is the dotted path of ``data`` (``"kv."``)."""
    if not isinstance(data, dict):
        where = prefix.rstrip(".") or None
        raise InputError(f"expected a mapping, got {yaml_kind(data)}", field=where)
    out: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if not isinstance(key, str) or key not in fields:
            raise unknown_key(str(key), fields, path)
        node = fields[key]
        if isinstance(node, dict):
            if not isinstance(value, dict):
                raise InputError(f"expected a mapping, got {yaml_kind(value)}", field=path)
            out[key] = validate_fields(value, node, path + ".")
        else:
            out[key] = check_value(value, node, path)
    for key, node in fields.items():
        if key in out:
            continue
        if isinstance(node, dict):
            out[key] = validate_fields({}, node, f"{prefix}{key}.")
        elif node.required:
            raise InputError("required key missing", field=f"{prefix}{key}")
        else:
            out[key] = copy.deepcopy(node.default)
    return out
