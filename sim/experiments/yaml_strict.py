"""The experiment YAML dialect: safe loading that refuses duplicate keys, supports merge keys
and reads YAML 1.2 numbers, shared by the config loader and command-line values."""
from __future__ import annotations

import re
from typing import Any

import yaml

_MERGE_TAG = "tag:yaml.org,2002:merge"


class StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses duplicate keys (flow or block) instead of keeping the
    last one, supports merge keys (``<<: *defaults``; explicit keys override merged ones) and
    reads YAML 1.2 numbers such as ``1e-3`` (YAML 1.1 wants ``1.0e-3``) as floats."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        """The mapping of ``node``, refusing a key that appears twice (with both positions)."""
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark)
            except TypeError:
                raise yaml.constructor.ConstructorError(
                    None, None, "a mapping key must be a plain value",
                    key_node.start_mark) from None
            if first is not key_node.start_mark:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first on line {first.line + 1}, "
                    f"column {first.column + 1})", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


# YAML 1.2 core-schema floats: an exponent needs no dot (1e-3, 2E5); ints keep their resolver.
StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def yaml_value(text: str) -> Any:
    """Parse one YAML value with the experiment loader's rules (``--set`` values)."""
    return yaml.load(text, Loader=StrictLoader)  # noqa: S506 - a SafeLoader subclass


