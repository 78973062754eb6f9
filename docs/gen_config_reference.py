"""Generate the configuration reference in docs/configuration.md from the one definition.

Every key of an experiment YAML is declared once, as a ``sim.core.fields.Key`` in
``sim.experiments.schema.SCHEMA`` (whose ``kv`` block is ``sim.kv.config.KV_FIELDS``; the
``cluster`` block's keys are ``sim.cluster.groups`` and ``sim.cluster.kv_links``), and every
policy parameter once, as a dataclass field of its policy class in ``policies/``. This script
renders both as markdown tables and writes them between the marker comments of
docs/configuration.md, so the reference cannot drift from the validator.

Usage, from the repository root::

    python docs/gen_config_reference.py          # rewrite the generated section
    python docs/gen_config_reference.py --check  # exit 1 if it is out of date
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TARGET = REPO / "docs" / "configuration.md"
BEGIN = "<!-- BEGIN GENERATED CONFIG REFERENCE -->"
END = "<!-- END GENERATED CONFIG REFERENCE -->"
COMMAND = "python docs/gen_config_reference.py"

TYPE_NAMES = {bool: "boolean", int: "integer", float: "number", str: "string", dict: "mapping",
              list: "list", type(None): "null"}


def _import_repo() -> None:
    """Make the checkout importable when the script is run by path (``sys.path[0]`` is docs/)."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))


def cell(text: str) -> str:
    """Escape text for one markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def type_name(types: tuple[type, ...]) -> str:
    """The accepted types of a key in words (``integer or null``); int+float read as number."""
    names = [TYPE_NAMES.get(t, t.__name__) for t in types]
    if "integer" in names and "number" in names:
        names.remove("integer")
    return " or ".join(names)


def literal(value: Any) -> str:
    """A value as it would be written in YAML, in code format."""
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`' if value == "" else f"`{value}`"
    return f"`{value!r}`"


def default_text(key: Any) -> str:
    """The default column: ``required`` for required keys, else the default as YAML."""
    return "required" if key.required else literal(key.default)


def bounds_text(key: Any) -> str:
    """Allowed values: the choices, or the numeric bounds (``> 0``, ``≥ 1, ≤ 64``)."""
    if key.choices:
        return " \\| ".join(literal(c) for c in key.choices)
    parts = []
    if key.minimum is not None:
        parts.append(f"{'>' if key.exclusive_min else '≥'} {key.minimum:g}")
    if key.maximum is not None:
        top = key.maximum
        parts.append("≤ 2^63 − 1" if top == 2**63 - 1 else f"≤ {top:g}")
    return ", ".join(parts)


def iter_keys(node: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every leaf ``(dotted path, Key)`` of a schema mapping, in declaration order."""
    for name, child in node.items():
        path = f"{prefix}{name}"
        if isinstance(child, dict):
            yield from iter_keys(child, path + ".")
        else:
            yield path, child


def key_table(rows: list[tuple[str, Any]]) -> list[str]:
    """A markdown table of schema keys."""
    out = ["| key | type | default | unit | meaning | allowed |",
           "|---|---|---|---|---|---|"]
    for path, key in rows:
        out.append(f"| `{path}` | {type_name(key.types)} | {default_text(key)} | "
                   f"{cell(key.unit)} | {cell(key.doc)} | {bounds_text(key)} |")
    return out


def schema_section(schema: dict[str, Any]) -> list[str]:
    """One table for the top-level keys, then one per block (``parallelism``, ``kv``, ...)."""
    top = [(name, key) for name, key in schema.items() if not isinstance(key, dict)]
    lines = ["### Top-level keys", ""] + key_table(top)
    for name, child in schema.items():
        if isinstance(child, dict):
            lines += ["", f"### `{name}`", ""] + key_table(list(iter_keys(child, name + ".")))
    return lines


def annotation_text(annotation: Any) -> str:
    """A policy field's annotation (``int | None``) in the words of the schema tables."""
    words = {"int": "integer", "float": "number", "str": "string", "bool": "boolean",
             "None": "null", "list[int]": "list of integers",
             "Mapping[int, float]": "mapping of priority to seconds"}
    return " or ".join(words.get(part.strip(), part.strip())
                       for part in str(annotation).split("|"))


def policy_section(registered: dict[str, type]) -> list[str]:
    """A table of every registered policy's parameters (the fields of its dataclass)."""
    lines = ["### Policy parameters", "",
             "| policy | parameter | type | default |", "|---|---|---|---|"]
    for name in sorted(registered):
        for f in dataclasses.fields(registered[name]):  # type: ignore[arg-type]
            lines.append(f"| `{name}` | `{f.name}` | {annotation_text(f.type)} | "
                         f"{literal(f.default)} |")
    return lines


def cluster_section() -> list[str]:
    """The keys of the ``cluster`` block, of each group and of a disaggregated ``network``."""
    from sim.cluster.groups import CLUSTER_FIELDS, GROUP_FIELDS
    from sim.cluster.kv_links import NETWORK_FIELDS

    lines = ["### `cluster`", "", "Besides `groups` (a list of groups, below):", ""]
    lines += key_table([(f"cluster.{n}", k) for n, k in CLUSTER_FIELDS.items()])
    lines += ["", "Each group (`cluster.groups[i]`):", ""]
    lines += key_table([(f"cluster.groups[].{n}", k) for n, k in GROUP_FIELDS.items()])
    lines += ["", "`cluster.network` (prefill/decode roles):", ""]
    lines += key_table([(f"cluster.network.{n}", k) for n, k in NETWORK_FIELDS.items()])
    return lines


def render() -> str:
    """The generated section, markers excluded."""
    _import_repo()
    import policies
    from sim.experiments.schema import SCHEMA

    lines = [f"<!-- Generated by `{COMMAND}` from sim.experiments.schema.SCHEMA and the "
             "policy classes; do not edit by hand. -->", ""]
    lines += schema_section(SCHEMA)
    lines += [""] + cluster_section()
    lines += [""] + policy_section(policies.registered())
    return "\n".join(lines) + "\n"


def splice(text: str, generated: str) -> str:
    """``text`` with the part between the markers replaced by ``generated``."""
    start, stop = text.find(BEGIN), text.find(END)
    if start < 0 or stop < start:
        raise ValueError(f"{TARGET}: markers {BEGIN} / {END} not found in order")
    return text[: start + len(BEGIN)] + "\n" + generated + text[stop:]


def current(text: str) -> str:
    """The part of ``text`` between the markers, as ``render`` would return it."""
    start, stop = text.find(BEGIN), text.find(END)
    if start < 0 or stop < start:
        raise ValueError(f"{TARGET}: markers {BEGIN} / {END} not found in order")
    return text[start + len(BEGIN) + 1: stop]


def main(argv: list[str] | None = None) -> int:
    """Rewrite the generated section, or with ``--check`` report whether it is up to date."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    args = parser.parse_args(argv)
    text = TARGET.read_text(encoding="utf-8")
    generated = render()
    if args.check:
        if current(text) != generated:
            print(f"{TARGET.relative_to(REPO)} is out of date; run: {COMMAND}", file=sys.stderr)
            return 1
        return 0
    new = splice(text, generated)
    if new != text:
        TARGET.write_text(new, encoding="utf-8")
        print(f"wrote {TARGET.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
