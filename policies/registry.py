"""The policy registry and base class: one method, ``schedule(view) -> Plan``.

Policies are small dataclasses registered by name; ``make_policy`` builds one from a YAML-style
mapping and turns an unknown name or parameter into a ``PolicyError`` that lists what is
accepted. A policy orders and packs; it never mutates requests, allocates KV, advances time or
records metrics — the engine does all that and validates every plan against the limits a policy
declares (``max_num_seqs``, ``max_num_batched_tokens``).
"""
from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from sim.core.errors import InputError
from sim.core.fields import not_one_of
from sim.core.plugins import typed

if TYPE_CHECKING:  # annotations only: importing sim here would be circular
    from sim.core.types import Plan, View


#: The policy a run gets when it names none: a YAML without ``policy:`` / ``policies:``,
#: ``sim.simulate(policy=None)`` and a cluster group that leaves it out.
DEFAULT_POLICY = "continuous"


class PolicyError(InputError):
    """A policy name or parameter is unknown or invalid."""


class Policy:
    """Base class of every batching policy.

    Subclasses are dataclasses whose fields are their parameters (each with a default and a
    docstring line in the class docstring). ``slot_capacity`` is the number of batch rows the
    policy can fill, used for the ``slot_utilization`` metric.
    """

    name: ClassVar[str] = "policy"
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None

    def schedule(self, view: View) -> Plan:
        """Decide what the next step computes."""
        raise NotImplementedError

    @property
    def slot_capacity(self) -> int | None:
        """Rows a full batch has (``None`` when unbounded)."""
        return self.max_num_seqs

    def _require(self, ok: bool, field: str, problem: str) -> None:
        """Raise a ``PolicyError`` at ``policy.<field>`` unless ``ok``."""
        if not ok:
            raise PolicyError(problem, field=f"policy.{field}")


_REGISTRY: dict[str, type[Policy]] = {}


def register(name: str) -> Callable[[type[Policy]], type[Policy]]:
    """Class decorator adding a policy under ``name``."""

    def deco(cls: type[Policy]) -> type[Policy]:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise PolicyError(f"policy name {name!r} registered twice")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def registered() -> dict[str, type[Policy]]:
    """All registered policies by name (a copy)."""
    return dict(_REGISTRY)


def policy_params(cls: type[Policy]) -> dict[str, Any]:
    """Parameter names of a policy class with their defaults."""
    # every policy class is a dataclass, though the base class is not
    return {f.name: f.default for f in dataclasses.fields(cls)}  # type: ignore[arg-type]


def make_policy(spec: str | Mapping[str, Any] | Policy) -> Policy:
    """Build a policy from ``"name"`` or ``{"name": ..., **params}`` (or pass one through)."""
    if isinstance(spec, Policy):
        return spec
    if isinstance(spec, str):
        spec = {"name": spec}
    if not isinstance(spec, Mapping) or "name" not in spec:
        raise PolicyError("expected a mapping with a 'name' key, e.g. "
                          "{name: continuous, max_num_seqs: 64}", field="policy")
    params = dict(spec)
    name = params.pop("name")
    label = params.pop("label", None)  # a display name for reports, not a parameter
    if label is not None and not isinstance(label, str):
        raise PolicyError(f"must be a string, got {type(label).__name__}", field="policy.label")
    if not isinstance(name, str):
        raise PolicyError(f"must be a string, got {type(name).__name__}", field="policy.name")
    cls = _REGISTRY.get(name)
    if cls is None:
        hint = difflib.get_close_matches(str(name), _REGISTRY, n=1)
        extra = f" (did you mean {hint[0]!r}?)" if hint else ""
        raise PolicyError(f"unknown policy {name!r}{extra}; accepted: "
                          f"{', '.join(sorted(_REGISTRY))}", field="policy.name")
    accepted = policy_params(cls)
    for key in params:
        if not isinstance(key, str) or key not in accepted:
            hint = difflib.get_close_matches(str(key), accepted, n=1)
            extra = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise PolicyError(f"unknown parameter of {name!r}{extra}; accepted: "
                              f"{', '.join(accepted)}", field=f"policy.{key}")
    for key, value in params.items():
        params[key] = _typed(key, value, accepted[key])
    return cls(**params)


def _typed(key: str, value: Any, default: Any) -> Any:
    """Check ``value`` against the type of the parameter's default (``None`` defaults accept
    anything the policy's own validation allows): ``sim.core.plugins.typed``'s rule."""
    return typed(PolicyError, f"policy.{key}", value, default)


def check_choice(policy: Policy, field: str, value: Any, choices: Any) -> None:
    """Validate that parameter ``field`` is one of ``choices`` (``sim.core.fields``' words)."""
    policy._require(isinstance(value, str) and value in choices, field,
                    not_one_of(value, choices))


def check_positive(policy: Policy, **values: float | None) -> None:
    """Validate that each named parameter is ``None`` or > 0."""
    for key, value in values.items():
        policy._require(value is None or value > 0, key, f"must be > 0, got {value!r}")


