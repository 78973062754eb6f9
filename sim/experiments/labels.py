"""Policy labels: the names runs are shown under, unique within one experiment.

A policy's ``label:`` is used as written. Without one, the label is the policy's name, and
where several policies of an experiment share that name, the name followed by the parameters
that tell them apart (``chunked_prefill(token_budget=512)``), in the order first written. Two
policies that still read alike (the same parameters, or an automatic label equal to a
written one) are numbered (``continuous #2``); two equal written labels are an error, since
every table, plot and console line keys on the label.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from sim.core.errors import InputError

#: Keys of a policy spec that are not parameters.
NOT_PARAMS = ("name", "label")


def _fmt(value: Any) -> str:
    """A parameter value as short text (YAML flow style for lists and mappings)."""
    if isinstance(value, (dict, list)):
        return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    return str(value)


def swept_value(value: Any) -> Any:
    """A swept value as a table cell: a mapping's ``label`` (a swept ``cluster`` block names
    itself so), other mappings and lists as YAML flow text, scalars as they are."""
    if isinstance(value, dict) and isinstance(value.get("label"), str):
        return value["label"]
    return _fmt(value) if isinstance(value, (dict, list)) else value


def check_swept_labels(grid: Mapping[str, Any] | None, block: str) -> None:
    """Refuse two different values of one swept key (of ``sweep:`` or ``zip:``, ``block``)
    that read alike in every table and plot: mappings with the same ``label`` (two swept
    ``cluster`` blocks called ``x``), whose rows could not be told apart."""
    for key, values in (grid or {}).items():
        seen: dict[str, int] = {}
        for j, value in enumerate(values if isinstance(values, list) else []):
            if not (isinstance(value, dict) and isinstance(value.get("label"), str)):
                continue  # other values are shown as themselves: distinct ones read apart
            cell = value["label"]
            if cell in seen and values[seen[cell]] != value:
                raise InputError(f"label {cell!r} is used by {block}.{key}[{seen[cell]}] too; "
                                 "labels name the rows of every table, so they must differ",
                                 field=f"{block}.{key}[{j}].label")
            seen.setdefault(cell, j)


def _spec(spec: Any) -> dict[str, Any]:
    return spec if isinstance(spec, dict) else {"name": spec}


def policy_labels(specs: list[Any], field: str = "policies") -> list[str]:
    """The label of each policy spec of ``specs`` (``policies:`` entries, in order; ``field``
    names the list in errors, ``"policy"`` the file's one policy)."""
    dicts = [_spec(s) for s in specs]
    written = [d.get("label") for d in dicts]
    seen_written: dict[str, int] = {}
    for i, label in enumerate(written):
        if label is None:
            continue
        where = "policy.label" if field == "policy" else f"{field}[{i}].label"
        if not isinstance(label, str) or not label.strip():
            raise InputError(f"expected a non-empty label (it names the policy's rows in every "
                             f"table and plot), got {label!r}", field=where)
        if str(label) in seen_written:
            raise InputError(f"label {label!r} is used by {field}[{seen_written[str(label)]}] "
                             "too; labels name the rows of every table, so they must differ",
                             field=where)
        seen_written[str(label)] = i
    labels: list[str] = []
    for d, label in zip(dicts, written, strict=True):
        if label is not None:
            labels.append(str(label))
            continue
        name = str(d.get("name", "?"))
        group = [e for e, w in zip(dicts, written, strict=True)
                 if w is None and str(e.get("name", "?")) == name]
        keys = list(dict.fromkeys(k for e in group for k in e if k not in NOT_PARAMS))
        differ = [k for k in keys
                  if len({_fmt(e[k]) if k in e else None for e in group}) > 1 and k in d]
        labels.append(f"{name}({', '.join(f'{k}={_fmt(d[k])}' for k in differ)})" if differ
                      else name)
    taken = set(seen_written)
    out: list[str] = []
    for label, w in zip(labels, written, strict=True):
        if w is None and (label in taken or label in out):
            n = 2
            while f"{label} #{n}" in taken or f"{label} #{n}" in out:
                n += 1
            label = f"{label} #{n}"
        out.append(label)
    return out
