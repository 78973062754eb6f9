"""Where profiles live and how their raw mappings are read: built-in names, files, HF ids.

Built-in profiles live in ``hardware_profiles/{gpus,models,engines}/<name>.yaml``. Names resolve
from any working directory: first from the source checkout next to this package, then from the
installed package data ``sim._profiles`` (pyproject maps it onto ``hardware_profiles/``).
Unknown names raise :class:`ProfileError` listing the known ones.
"""
from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from sim.core.paths import PROFILE_SUFFIXES, checkout_root, names_a_file
from sim.cost.profile_schema import ProfileError, read_profile_file

#: The config key (and ``build_cost_model`` argument) that names a profile of each kind.
_ARGUMENT = {"gpus": "hardware", "models": "model", "engines": "engine"}

def profile_roots() -> Iterator[Any]:
    """Profile roots in priority order: the source checkout, then installed package data."""
    checkout = checkout_root() / "hardware_profiles"
    if checkout.is_dir():
        yield checkout
    try:
        yield resources.files("sim._profiles")
    except (ModuleNotFoundError, TypeError):
        return


def builtin_files(kind: str) -> dict[str, Any]:
    """Map of built-in profile name → file (Traversable) for one kind; first root wins."""
    found: dict[str, Any] = {}
    for root in profile_roots():
        folder = root.joinpath(kind)
        if not folder.is_dir():
            continue
        for entry in folder.iterdir():
            if entry.name.endswith(".yaml"):
                found.setdefault(entry.name[: -len(".yaml")], entry)
    return found


def canonical_name(name: str) -> str:
    """Canonical spelling of a profile name: lower case, dashes (``H100_SXM`` → ``h100-sxm``)."""
    return name.strip().lower().replace("_", "-")


def profile_file(name_or_path: str | Path) -> Path | None:
    """The file a profile argument names when it is an existing file (``./g.yaml``, a
    ``config.json``); ``None`` for a built-in name or a Hugging Face id."""
    text = str(name_or_path)
    path = Path(text).expanduser()
    if isinstance(name_or_path, Path) or names_a_file(text):
        return path if path.is_file() else None
    return None


def read_raw(kind: str, name_or_path: str | Path) -> tuple[dict[str, Any], str]:
    """Load the raw mapping of a profile by built-in name or file path; return it and its origin."""
    if not isinstance(name_or_path, (str, Path)):
        raise ProfileError(f"expected a built-in {kind[:-1]} name or a profile file path, got "
                           f"{name_or_path!r}"[:200], field=_ARGUMENT[kind])
    text = str(name_or_path)
    path = Path(text).expanduser()
    if isinstance(name_or_path, Path) or names_a_file(text):
        if profile_file(name_or_path) is not None:
            return read_profile_file(path), str(path)
        if kind != "models" or path.suffix in PROFILE_SUFFIXES:
            raise ProfileError(f"{kind[:-1]} profile file not found: {path}",
                               field=_ARGUMENT[kind])
    known = builtin_files(kind)
    key = canonical_name(text)
    if key in known:
        data = yaml.safe_load(known[key].read_text(encoding="utf-8"))
        return data, f"{kind}/{key}.yaml"
    if kind == "models":  # a Hugging Face id such as meta-llama/Meta-Llama-3-70B
        for entry in known.values():
            data = yaml.safe_load(entry.read_text(encoding="utf-8"))
            if str(data.get("hf_id", "")).lower() == text.lower():
                return data, f"{kind}/{entry.name}"
    # up to three: a short name is as close to another GPU as to its own (h100: h200)
    hint = [repr(h) for h in difflib.get_close_matches(key, list(known), n=3)]
    said = ", ".join(hint[:-1]) + f" or {hint[-1]}" if len(hint) > 1 else "".join(hint)
    extra = f" (did you mean {said}?)" if hint else ""
    raise ProfileError(f"unknown {kind[:-1]} {text!r}{extra}; known: "
                       f"{', '.join(sorted(known))}", field=_ARGUMENT[kind])


def list_gpus() -> list[str]:
    """Names of the built-in GPU profiles, sorted."""
    return sorted(builtin_files("gpus"))


def list_models() -> list[str]:
    """Names of the built-in model architecture specs, sorted."""
    return sorted(builtin_files("models"))


def list_engines() -> list[str]:
    """Names of the built-in engine overhead profiles, sorted."""
    return sorted(builtin_files("engines"))


def profile_number(data: Mapping[str, Any], key: str, origin: str, default: Any = ...) -> Any:
    """Fetch a required (or defaulted) number from a profile, with a clear error naming it."""
    if key not in data or data[key] is None:
        if default is ...:
            raise ProfileError(f"{origin}: missing required field {key!r}")
        return default
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProfileError(f"{origin}: field {key!r} must be a number, got {value!r}")
    return value
