"""The scheduling specification: an iteration-level batching policy written as data.

``SchedulingSpec`` says what one scheduler does each step — how a step is composed, how prompts
are admitted, the limits, the watermark, the waiting-queue order and the preemption victim —
and ``policies.scheduler`` is its one reference interpreter. The built-in ``continuous`` and
``chunked_prefill`` policies are presets of it. Each field declares its domain as data
(``Domain`` in the field's metadata): validation, the documentation table and the tests'
random specifications are all derived from it, so a new field or value is validated,
documented and exercised without anyone listing it again. Choices are small integers in the
order of their ``choices`` (``SchedulingSpec.code``), which is how a compiled interpreter sees
them.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sim.core.errors import InputError
from sim.core.fields import not_one_of


@dataclass(frozen=True)
class Domain:
    """The values a specification field accepts.

    ``kind`` is ``"choice"`` (one of ``choices``), ``"int"`` or ``"float"`` (in
    [``minimum``, ``maximum``], the maximum excluded when ``max_exclusive``; ``optional``
    allows ``null``), ``"targets"`` (``null`` or a mapping of integer priority classes to
    seconds > 0) or ``"buckets"`` (``null``, a bucket width > 0, or increasing positive
    upper bounds of prompt-length buckets).
    """

    kind: str
    doc: str
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    max_exclusive: bool = False
    optional: bool = False

    def problem(self, value: Any) -> str:
        """Why ``value`` is outside this domain ('' when it is inside)."""
        if value is None:
            return "" if self.optional or self.kind in ("targets", "buckets") else \
                "must not be null"
        if self.kind == "buckets":
            return "" if bucket_bounds(value) is not None else (
                "expected null, a bucket width > 0 or a list of increasing positive token "
                f"bounds, got {value!r}")
        if self.kind == "choice":
            ok = isinstance(value, str) and value in self.choices
            return "" if ok else not_one_of(value, self.choices)
        if self.kind == "targets":
            if not isinstance(value, Mapping):
                return f"must be a mapping of priority to seconds, got {value!r}"
            for k, v in value.items():
                if (_class_of(k) is None or not _is_real(v) or not math.isfinite(v)
                        or v <= 0):
                    return f"each entry must be integer priority: seconds > 0, got {k!r}: {v!r}"
            return ""
        if self.kind == "int" and not _is_int(value):
            return f"must be {'null or ' if self.optional else ''}an integer, got {value!r}"
        if self.kind == "float" and (not _is_real(value) or not math.isfinite(value)):
            return f"must be a finite number, got {value!r}"
        low = self.minimum is not None and value < self.minimum
        high = self.maximum is not None and (value >= self.maximum if self.max_exclusive
                                             else value > self.maximum)
        return f"must be in {self.describe()}, got {value!r}" if low or high else ""

    def describe(self) -> str:
        """The domain in words, for messages and the documentation table."""
        if self.kind == "choice":
            return " \\| ".join(f"`{c}`" for c in self.choices)
        if self.kind == "targets":
            return "null or {priority: seconds > 0}"
        if self.kind == "buckets":
            return "null, a width > 0 or [increasing bounds]"
        low = "-inf" if self.minimum is None else f"{self.minimum:g}"
        high = "inf" if self.maximum is None else f"{self.maximum:g}"
        text = f"[{low}, {high}{')' if self.max_exclusive or self.maximum is None else ']'}"
        return ("null or " if self.optional else "") + ("integer " if self.kind == "int"
                                                         else "") + text


def _class_of(key: Any) -> int | None:
    """A priority class from a mapping key: an integer, or its decimal text (YAML keys are
    strings); ``None`` when it is neither."""
    if _is_int(key):
        return int(key)
    if isinstance(key, str) and key.strip().lstrip("+-").isdigit():
        return int(key)
    return None


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def bucket_bounds(value: Any) -> tuple[int, ...] | None:
    """A ``"buckets"`` value other than ``null`` as a tuple: ``(width,)`` for a width > 0, the
    bounds for a non-empty list of increasing positive integers; ``None`` when it is
    neither."""
    if _is_int(value):
        return (int(value),) if value > 0 else None
    if not isinstance(value, (list, tuple)) or not value:
        return None
    if not all(_is_int(b) and b > 0 for b in value):
        return None
    if any(a >= b for a, b in itertools.pairwise(value)):
        return None
    return tuple(int(b) for b in value)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def spec_field(default: Any, domain: Domain) -> Any:
    """A specification field with its ``Domain`` (what validation, the documentation table and
    the tests' random specifications read)."""
    return field(default=default, metadata={"domain": domain})


COMPOSITIONS = ("prefill_first", "mixed", "decode_first")
ADMISSIONS = ("whole", "chunked")
ORDERS = ("fcfs", "spf", "priority", "edf")
VICTIMS = ("newest", "priority", "deadline")


@dataclass(frozen=True)
class SchedulingSpec:
    """What an iteration-level scheduler does each step (the fields' domains: ``domains()``).

    Defaults are vLLM v1's scheduler: decode-first steps with chunked prefill.
    """

    composition: str = spec_field("decode_first", Domain(
        "choice", "What one step runs: `prefill_first` (a step that admits prompts runs only "
        "their prefill, decodes wait: vLLM v0), `mixed` (whole prompts join the running "
        "decodes: Orca), `decode_first` (decodes, then running prefill chunks, then new "
        "prompts in what is left of the budget: Sarathi-Serve, vLLM v1).",
        choices=COMPOSITIONS))
    admission: str = spec_field("chunked", Domain(
        "choice", "How a prompt enters: `whole` (all of it in one step; a prompt longer than "
        "`max_num_batched_tokens` is rejected) or `chunked` (pieces of at most `chunk_size`, "
        "sized to the free KV; `decode_first` only).", choices=ADMISSIONS))
    chunk_size: int | None = spec_field(None, Domain(
        "int", "Most prefill tokens one request gets per step (`null`: the budget); "
        "`chunked` admission only.", minimum=1, optional=True))
    max_num_seqs: int = spec_field(256, Domain(
        "int", "Running requests (batch rows); at most `max_num_batched_tokens`, so every "
        "running decode fits in one step.", minimum=1))
    max_num_batched_tokens: int = spec_field(2048, Domain(
        "int", "Tokens per step (the token budget).", minimum=1))
    watermark: float = spec_field(0.01, Domain(
        "float", "Share of KV blocks kept free when admitting new prompts while others run.",
        minimum=0.0, maximum=1.0, max_exclusive=True))
    order: str = spec_field("fcfs", Domain(
        "choice", "Waiting-queue order: `fcfs` (preempted first, then arrival), `spf` "
        "(shortest prompt first), `priority` (higher value first), `edf` (earliest TTFT "
        "deadline: arrival + the target of the request's priority class); ties keep the "
        "`fcfs` order.", choices=ORDERS))
    victim: str = spec_field("newest", Domain(
        "choice", "Who is preempted when KV runs out: `newest` (last admitted), `priority` "
        "(lowest priority value, as vLLM's priority scheduler), `deadline` (latest TTFT "
        "deadline); ties go to the newest.", choices=VICTIMS))
    ttft_target_s: float = spec_field(1.0, Domain(
        "float", "TTFT target of a priority class not in `ttft_targets_s` (`edf`, "
        "`deadline`).", minimum=0.0, maximum=1e9))
    ttft_targets_s: Mapping[int, float] | None = spec_field(None, Domain(
        "targets", "TTFT target in seconds per priority class (a request's `priority` "
        "value), e.g. `{\"0\": 2.0, \"1\": 0.5}` (YAML keys are strings)."))

    def __post_init__(self) -> None:
        bad = self.problem()
        if bad:
            raise InputError(bad[1], field=f"policy.{bad[0]}")
        self._prepare()

    def _prepare(self) -> None:
        """Index the TTFT targets by integer class once (valid specifications only)."""
        targets = {_class_of(k): float(v) for k, v in (self.ttft_targets_s or {}).items()}
        object.__setattr__(self, "_targets", targets)  # derived, not a field

    def problem(self) -> tuple[str, str] | None:
        """The first ``(field, problem)`` of an invalid specification, else ``None``: each
        field against its domain, then the rules that join fields."""
        bad = field_problem(self)
        if bad:
            return bad
        if self.admission == "chunked" and self.composition != "decode_first":
            return "admission", (f"'chunked' needs composition 'decode_first', got "
                                 f"{self.composition!r}")
        if self.chunk_size is not None and self.admission != "chunked":
            return "chunk_size", "applies to 'chunked' admission only; use null"
        # Every composition: a step of decodes alone counts one token per running request,
        # so more rows than the budget could never all decode (vLLM rejects the same).
        if self.max_num_seqs > self.max_num_batched_tokens:
            return "max_num_seqs", (f"{self.max_num_seqs} > max_num_batched_tokens="
                                    f"{self.max_num_batched_tokens}: every running decode "
                                    "must fit in one step's budget; lower max_num_seqs or "
                                    "raise the token budget")
        return None

    def code(self, name: str) -> int:
        """A choice field's value as the small integer a compiled interpreter sees."""
        return domains()[name].choices.index(getattr(self, name))

    def target_s(self, priority: int) -> float:
        """The TTFT target of a request of this priority class."""
        targets: dict[int, float] = self._targets  # type: ignore[attr-defined]
        return targets.get(priority, self.ttft_target_s) if targets else self.ttft_target_s


def field_problem(spec: Any) -> tuple[str, str] | None:
    """The first ``(field, problem)`` of a specification (any dataclass of ``spec_field``s)
    whose value is outside its field's domain, else ``None``."""
    for f in dataclasses.fields(spec):
        why = f.metadata["domain"].problem(getattr(spec, f.name))
        if why:
            return f.name, why
    return None


def domains(spec_type: type = SchedulingSpec) -> dict[str, Domain]:
    """Every field of a specification type (``SchedulingSpec``, or the run-to-completion
    ``sim.core.batching.BatchSpec``) with its domain, in declaration order."""
    return {f.name: f.metadata["domain"] for f in dataclasses.fields(spec_type)}


def spec_table(spec_type: type = SchedulingSpec) -> str:
    """The documentation table of a specification type, generated from the field domains."""
    lines = ["| field | default | values | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(spec_type):
        d: Domain = f.metadata["domain"]
        default = "null" if f.default is None else f"`{f.default}`"
        lines.append(f"| `{f.name}` | {default} | {d.describe()} | {d.doc} |")
    return "\n".join(lines)
