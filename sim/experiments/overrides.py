"""Command-line and API overrides of an experiment: ``--set``, ``--sweep`` and their rules.

One set of rules, applied in order to the raw YAML mapping before validation, whoever calls:

- ``KEY=VALUE`` sets a dotted key. When ``KEY`` (or a key below it) is swept in ``sweep:`` or
  ``zip:``, that sweep is dropped, so the one value given is what runs, and a note says so: a
  user who writes ``--set workload.rate=6`` wants rate 6, not the YAML's rates.
- ``sweep.KEY=[...]`` (or ``zip.KEY=[...]``) sets the sweep of one dotted key; ``null``
  removes it. ``sweep=null`` (``zip=null``) removes the whole block.
- ``sweeps`` (``--sweep KEY=[...]``, ``run_experiment(sweeps={KEY: [...]})``) is the same as
  ``sweep.KEY=[...]``.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from sim.core.errors import InputError
from sim.core.fields import Key, unknown_key
from sim.experiments.schema import SCHEMA, lookup
from sim.experiments.yaml_strict import yaml_value

#: The blocks whose entries are swept dotted keys.
SWEEP_BLOCKS = ("sweep", "zip")
#: Blocks that may be written as a name alone, short for ``{name: ...}``.
NAMED_BLOCKS = ("policy", "router", "cluster.decode_router")


class ConfigError(InputError):
    """A bad experiment config or override: ``str()`` is the one-line message shown."""


def set_dotted(data: dict[str, Any], path: str, value: Any) -> None:
    """Set ``data[a][b][c] = value`` for ``path`` 'a.b.c', creating mappings as needed. A block
    written as its name alone (``policy: static``, ``router: random``) is the mapping
    ``{name: ...}`` it stands for, so a key below it can be set (``policy.batch_size``)."""
    parts = path.split(".")
    node = data
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif isinstance(child, str) and ".".join(parts[:i + 1]) in NAMED_BLOCKS:
            child = node[part] = {"name": child}
        if not isinstance(child, dict):
            raise ConfigError(f"{'.'.join(parts[:i + 1])}: is not a mapping, cannot set {path}")
        node = child
    node[parts[-1]] = value


def check_path(path: str) -> None:
    """Reject an override or sweep key that the schema cannot hold."""
    parts = path.split(".")
    if not all(parts):
        raise ConfigError(f"{path}: empty key name (two dots in a row, or a dot at an end)")
    indexed = next((p for p in parts if "[" in p), None)
    if indexed is not None:
        whole = ".".join(parts[:parts.index(indexed)] + [indexed.split("[")[0]])
        raise ConfigError(f"{path}: a list entry cannot be set on its own ({indexed}); set the "
                          f"whole list, e.g. --set '{whole}=[...]'")
    head = parts[0]
    if head in ("workload", "policy", "router", "cluster", "sweep", "zip"):
        return  # validated by their own modules once set
    if lookup(path) is None:
        for i in range(1, len(parts)):  # a key below a single value: say which value
            if isinstance(lookup(".".join(parts[:i])), Key):
                leaf = ".".join(parts[:i])
                raise ConfigError(f"{path}: {leaf} is a single value, not a block of keys; set "
                                  f"it whole, e.g. --set '{leaf}=...'")
        for i in range(1, len(parts) + 1):  # the first key the schema does not have
            if lookup(".".join(parts[:i])) is None:
                node = lookup(".".join(parts[:i - 1])) if i > 1 else SCHEMA
                known = node if isinstance(node, dict) else {}
                raise ConfigError(str(unknown_key(parts[i - 1], known,
                                                  ".".join(parts[:i]))))


def parse_value(raw: str, flag: str = "--set", key: str = "") -> Any:
    """A command-line value parsed as the experiment YAML parses it (so ``4`` is a number,
    ``1e-3`` a float and ``[1, 2]`` a list); other text that is no YAML value stays text, but
    a value written as a YAML list or mapping (``[...``, ``{...``) must parse as one."""
    if not raw.strip():
        return ""
    try:
        return yaml_value(raw)
    except (yaml.YAMLError, ValueError, RecursionError) as e:
        if raw.lstrip()[:1] in ("[", "{"):
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ConfigError(f"{flag} {key}={raw}: not a valid YAML "
                              f"{'list' if raw.lstrip()[0] == '[' else 'mapping'} ({why})"
                              ) from None
        return raw


def parse_override(text: str, flag: str = "--set") -> tuple[str, Any]:
    """Split ``dotted.key=value``; the value is parsed as YAML."""
    if "=" not in text:
        raise ConfigError(f"{flag} {text!r}: expected dotted.key=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"{flag} {text!r}: empty key")
    return key, parse_value(raw, flag, key)


def parse_sweep(text: str) -> tuple[str, list[Any]]:
    """``--sweep KEY=[a, b]`` (or ``KEY=a,b``) as ``(KEY, [a, b])``."""
    key, raw = text.split("=", 1) if "=" in text else (text, "")
    raw = raw.strip()
    values = parse_value(raw if raw.startswith("[") else f"[{raw}]", "--sweep", key.strip())
    if not key.strip() or not isinstance(values, list) or not values:
        raise ConfigError(f"--sweep {text!r}: expected dotted.key=[value, ...] "
                            "(or dotted.key=a,b,c)")
    return key.strip(), values


def _show(value: Any) -> str:
    """A value as YAML flow text, for notes."""
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix(
        "\n...").strip()


def _block(data: dict[str, Any], name: str, create: bool = False) -> dict[str, Any] | None:
    """``data[name]`` when it is a mapping (made when ``create``), else ``None``."""
    node = data.get(name)
    if node is None and create:
        node = data[name] = {}
    if node is not None and not isinstance(node, dict):
        raise ConfigError(f"{name}: expected a mapping of dotted.key: [values], cannot "
                            f"set an entry of it")
    return node


def _drop_empty(data: dict[str, Any], name: str) -> None:
    if data.get(name) == {}:
        data.pop(name)


def apply_override(data: dict[str, Any], key: str, value: Any, text: str,
                   notes: list[str]) -> None:
    """Apply one ``key=value`` to the raw config ``data`` by the module's rules.

    ``text`` is how the user wrote it (for messages); notes about replaced sweeps are appended
    to ``notes``.
    """
    head, _, rest = key.partition(".")
    if head in SWEEP_BLOCKS and not rest:  # the whole block
        if value is None:
            data.pop(head, None)
        else:
            data[head] = value
        return
    if head in SWEEP_BLOCKS:  # one swept key: sweep.workload.rate=[...]
        try:
            check_path(rest)
        except ConfigError as e:
            raise ConfigError(f"{text}: {e}") from None
        if value is None:
            block = _block(data, head)
            if block is not None:
                block.pop(rest, None)
                _drop_empty(data, head)
            return
        other = _block(data, SWEEP_BLOCKS[1 - SWEEP_BLOCKS.index(head)])
        if other is not None and rest in other:
            raise ConfigError(f"{text}: {rest} is already varied in "
                                f"{SWEEP_BLOCKS[1 - SWEEP_BLOCKS.index(head)]}; "
                                f"set it there or remove it first")
        block = _block(data, head, create=True)
        assert block is not None
        block[rest] = value
        return
    try:
        check_path(key)
    except ConfigError as e:
        raise ConfigError(f"--set {e}") from None
    for name in SWEEP_BLOCKS:
        block = _block(data, name)
        for swept in list(block or {}):
            if key.startswith(swept + "."):
                raise ConfigError(f"{text}: {swept} is swept; set the sweep instead "
                                    f"(--set '{name}.{swept}=[...]')")
            if swept == key or swept.startswith(key + "."):
                values = block.pop(swept)  # type: ignore[union-attr]
                notes.append(f"{text} replaces the sweep of {swept} ({name}: {_show(values)})")
        _drop_empty(data, name)
    try:
        set_dotted(data, key, value)
    except ConfigError as e:
        raise ConfigError(f"{text}: {e}") from None


def apply_overrides(data: dict[str, Any],
                    overrides: Iterable[str] | Mapping[str, Any] | None,
                    sweeps: Mapping[str, Any] | None = None) -> list[str]:
    """Apply ``overrides`` (``--set`` strings, or a mapping of dotted key → value) and then
    ``sweeps`` (dotted key → list of values, or ``None`` to remove that sweep) to ``data`` in
    place; return the notes to show the user."""
    notes: list[str] = []
    if isinstance(overrides, Mapping):
        items = [(str(k), v, f"--set {k}={_show(v)}") for k, v in overrides.items()]
    else:
        texts = ([] if overrides is None else list(overrides)
                 if isinstance(overrides, Iterable) else [overrides])
        if isinstance(overrides, str) or any(not isinstance(t, str) for t in texts):
            what = (f"the string {overrides!r}" if isinstance(overrides, str)
                    else repr(overrides)[:200])
            raise ConfigError(f"overrides: expected a list of 'dotted.key=value' strings (or a "
                              f"mapping of dotted key to value), got {what}")
        items = [(*parse_override(t), f"--set {t}") for t in texts]
    if sweeps is not None and not isinstance(sweeps, Mapping):
        raise ConfigError("sweeps: expected a mapping of dotted.key: [values]")
    for key, values in (sweeps or {}).items():
        if values is not None and (not isinstance(values, list) or not values):
            raise ConfigError(f"--sweep {key}: expected a non-empty list of values, got "
                                f"{_show(values)}")
        items.append((f"sweep.{key}", values, f"--sweep {key}={_show(values)}"))
    for key, value, text in items:
        apply_override(data, key, value, text, notes)
    return notes
