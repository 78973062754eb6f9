"""Loading, validating, overriding and expanding experiment configs.

Everything is checked before any simulation starts, and every problem becomes one
``ConfigError`` line naming the file and the dotted path (the CLI exits with code 2).
Sweeps expand to a list of ``RunSpec``: the resolved config of each run plus the swept values
that label it in ``summary.csv``.
"""
from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sim.core.errors import InputError
from sim.core.fields import unknown_key, validate_fields
from sim.experiments.schema import SCHEMA, lookup


class ConfigError(InputError):
    """A bad experiment config: ``str()`` is the one-line message shown to the user."""


@dataclass(frozen=True)
class RunSpec:
    """One run of an experiment: its resolved config and the swept values that label it."""

    config: dict[str, Any]
    swept: dict[str, Any]
    label: str


#: Most scalar values a config may hold once aliases are expanded (an alias bomb guard).
MAX_CONFIG_VALUES = 100_000


class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses duplicate keys instead of keeping the last one."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark.line + 1)
            except TypeError:
                raise yaml.constructor.ConstructorError(
                    None, None, "a mapping key must be a plain value",
                    key_node.start_mark) from None
            if first != key_node.start_mark.line + 1:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first on line {first})",
                    key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def _check_shape(data: Any, path: Path) -> None:
    """Refuse non-string keys anywhere and configs too large to be hand-written."""
    budget = MAX_CONFIG_VALUES
    stack: list[tuple[Any, str]] = [(data, "")]
    while stack:
        node, where = stack.pop()
        budget -= 1
        if budget < 0:
            raise ConfigError(f"{path}: {where.rstrip('.') or 'top level'}: more than "
                              f"{MAX_CONFIG_VALUES:,} values once YAML aliases are expanded; "
                              "refusing it")
        if isinstance(node, dict):
            for key, value in node.items():
                if not isinstance(key, str):
                    raise ConfigError(f"{path}: {where}{key!r}: keys must be strings")
                stack.append((value, f"{where}{key}."))
        elif isinstance(node, list):
            stack.extend((v, f"{where}[{i}].") for i, v in enumerate(node))


def load_yaml(path: Path) -> dict[str, Any]:
    """Read an experiment YAML (safe loading only, duplicate keys refused) into a mapping."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read: {e}") from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(e, "problem", None) or "invalid YAML"
        raise ConfigError(f"{path}: invalid YAML{where}: {problem}") from None
    except RecursionError:
        raise ConfigError(f"{path}: invalid YAML: nested too deeply") from None
    except ValueError as e:  # e.g. an integer literal too long to convert
        raise ConfigError(f"{path}: invalid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of keys at the top level")
    _check_shape(data, path)
    return data


def validate(data: dict[str, Any], schema: dict[str, Any] = SCHEMA,
             prefix: str = "") -> dict[str, Any]:
    """Check ``data`` against ``schema`` and return a copy with every default filled in."""
    try:
        return validate_fields(data, schema, prefix)
    except InputError as e:
        raise ConfigError(str(e)) from None


def parse_override(text: str) -> tuple[str, Any]:
    """Split ``dotted.key=value``; the value is parsed as YAML (so ``4`` is a number)."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected dotted.key=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"--set {text!r}: empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def set_dotted(data: dict[str, Any], path: str, value: Any) -> None:
    """Set ``data[a][b][c] = value`` for ``path`` 'a.b.c', creating mappings as needed."""
    parts = path.split(".")
    node = data
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"{'.'.join(parts[:i + 1])}: is not a mapping, cannot set {path}")
        node = child
    node[parts[-1]] = value


def _check_path(path: str) -> None:
    """Reject an override or sweep key that the schema cannot hold."""
    head = path.split(".")[0]
    if head in ("workload", "policy", "router", "cluster", "sweep", "zip"):
        return
    if lookup(path) is None:
        parent = path.rsplit(".", 1)[0] if "." in path else ""
        node = lookup(parent) if parent else SCHEMA
        known = node if isinstance(node, dict) else {}
        raise ConfigError(str(unknown_key(path.rsplit(".", 1)[-1], known, path)))


def _expand(sweep: dict[str, Any] | None, zipped: dict[str, Any] | None,
            source: str) -> list[dict[str, Any]]:
    """The list of swept-value dicts: Cartesian product of ``sweep`` × one zipped group."""
    axes: list[list[dict[str, Any]]] = []
    for key, values in (sweep or {}).items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{source}: sweep.{key}: expected a non-empty list of values")
        _check_path(key)
        axes.append([{key: v} for v in values])
    if zipped:
        lengths = {k: len(v) if isinstance(v, list) else -1 for k, v in zipped.items()}
        if min(lengths.values()) < 1 or len(set(lengths.values())) != 1:
            raise ConfigError(f"{source}: zip: every key needs a list, all of one length "
                              f"(got {lengths})")
        for key in zipped:
            _check_path(key)
        n = next(iter(lengths.values()))
        axes.append([{k: v[i] for k, v in zipped.items()} for i in range(n)])
    combos = []
    for parts in itertools.product(*axes):
        merged: dict[str, Any] = {}
        for p in parts:
            merged.update(p)
        combos.append(merged)
    return combos


def policy_label(spec: Any) -> str:
    """A short label for a policy spec (its ``label`` key, else its name)."""
    if isinstance(spec, dict):
        return str(spec.get("label") or spec.get("name", "?"))
    return str(spec)


def expand_runs(raw: dict[str, Any], overrides: list[str] | None = None,
                source: str = "<config>") -> tuple[dict[str, Any], list[RunSpec]]:
    """Apply overrides, validate, and expand sweeps and ``policies`` into runs."""
    data = copy.deepcopy(raw)
    for text in overrides or []:
        key, value = parse_override(text)
        try:
            _check_path(key)
        except ConfigError as e:
            raise ConfigError(f"--set {e}") from None
        set_dotted(data, key, value)
    try:
        base = validate(data)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None
    if base["policy"] is not None and base["policies"] is not None:
        raise ConfigError(f"{source}: policy: give either 'policy' or 'policies', not both")
    policies = base.pop("policies") or [base["policy"] or {"name": "continuous"}]
    sweep, zipped = base.pop("sweep"), base.pop("zip")
    runs: list[RunSpec] = []
    for spec in policies:
        for combo in _expand(sweep, zipped, source):
            cfg = copy.deepcopy(base)
            cfg["policy"] = copy.deepcopy(spec) if isinstance(spec, dict) else {"name": spec}
            for key, value in combo.items():
                set_dotted(cfg, key, copy.deepcopy(value))
            try:
                cfg = validate({k: v for k, v in cfg.items()})
            except ConfigError as e:
                raise ConfigError(f"{source}: {e}") from None
            cfg.pop("sweep", None)
            cfg.pop("zip", None)
            cfg.pop("policies", None)
            runs.append(RunSpec(cfg, combo, policy_label(cfg["policy"])))
    return base, runs
