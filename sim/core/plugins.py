"""A registry of named plugins built from YAML-style mappings (routers), and the one
parameter-type rule that policies and routers share (``typed``).

A plugin kind (``"router"``) is a family of small dataclasses registered by name; ``make``
builds one from ``"name"`` or ``{"name": ..., **params}`` and turns an unknown name, an unknown
parameter or a mistyped value into an ``InputError`` whose field is the dotted key
(``router.name``, ``router.refresh_s``) and which lists what is accepted, with a close-match
hint. Parameter types are taken from the dataclass defaults, so a plugin states each parameter
once, as a field with its default.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from sim.core.errors import InputError
from sim.core.fields import check_int, is_integer, is_real

T = TypeVar("T")


class PluginError(InputError):
    """A plugin name or parameter is unknown or has the wrong type."""


class Registry(Generic[T]):
    """Named dataclasses of one plugin ``kind``; ``make`` builds and checks them."""

    def __init__(self, kind: str, error: type[InputError] = PluginError) -> None:
        self.kind = kind
        self.error = error
        self._classes: dict[str, type[T]] = {}

    def register(self, name: str) -> Callable[[type[T]], type[T]]:
        """Class decorator adding a dataclass under ``name`` (sets its ``name`` attribute)."""

        def deco(cls: type[T]) -> type[T]:
            if name in self._classes and self._classes[name] is not cls:
                raise self.error(f"{self.kind} name {name!r} registered twice")
            cls.name = name  # type: ignore[attr-defined]
            self._classes[name] = cls
            return cls

        return deco

    def registered(self) -> dict[str, type[T]]:
        """Every registered class by name (a copy)."""
        return dict(self._classes)

    def params(self, name: str) -> dict[str, Any]:
        """Parameter names of the plugin ``name`` with their defaults."""
        cls = self._classes[name]
        return {f.name: _default(f) for f in dataclasses.fields(cls)  # type: ignore[arg-type]
                if f.init}

    def make(self, spec: str | Mapping[str, Any]) -> T:
        """Build a plugin from ``"name"`` or ``{"name": ..., **params}``."""
        kind = self.kind
        if isinstance(spec, str):
            spec = {"name": spec}
        if not isinstance(spec, Mapping) or "name" not in spec:
            raise self.error(f"expected a mapping with a 'name' key, e.g. {{name: "
                             f"{next(iter(sorted(self._classes)), 'x')}}}", field=kind)
        params = dict(spec)
        name = params.pop("name")
        if not isinstance(name, str) or name not in self._classes:
            hint = difflib.get_close_matches(str(name), self._classes, n=1)
            extra = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise self.error(f"unknown {kind} {name!r}{extra}; accepted: "
                             f"{', '.join(sorted(self._classes))}", field=f"{kind}.name")
        accepted = self.params(name)
        for key in params:
            if not isinstance(key, str) or key not in accepted:
                hint = difflib.get_close_matches(str(key), accepted, n=1)
                extra = f" (did you mean {hint[0]!r}?)" if hint else ""
                raise self.error(f"unknown parameter of {name!r}{extra}; accepted: "
                                 f"{', '.join(accepted) or 'none'}", field=f"{kind}.{key}")
            params[key] = typed(self.error, f"{kind}.{key}", params[key], accepted[key])
        return self._classes[name](**params)


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def typed(error: type[InputError], field: str, value: Any, default: Any) -> Any:
    """``value`` checked against the type of the parameter's ``default`` (``None`` defaults and
    mappings are left to the plugin's own validation); an integer parameter takes integers
    only, as every integer key does (``sim.core.fields.check_int``)."""
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise error(f"expected true/false, got {value!r}", field=field)
    elif isinstance(default, int):
        try:  # ``sim.core.fields``' one integer rule: no whole floats, the kernel's range
            return check_int(value, field)
        except InputError as e:
            raise error(e.problem, field=field) from None
    elif isinstance(default, float):
        if not is_real(value):  # ``sim.core.fields``' one rule: numpy numbers count, bools not
            raise error(f"expected a number, got {value!r}", field=field)
        value = int(value) if is_integer(value) else float(value)  # as given: 0 stays 0
        if isinstance(value, float) and not math.isfinite(value):
            raise error(f"must be finite, got {value!r}", field=field)
    elif isinstance(default, str) and not isinstance(value, str):
        raise error(f"expected a string, got {value!r}", field=field)
    return value
