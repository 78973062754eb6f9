"""Loading, validating, overriding and expanding experiment configs.

Everything is checked before any simulation starts, and every problem becomes one
``ConfigError`` line naming the file and the dotted path (the CLI exits with code 2).
Sweeps expand to a list of ``RunSpec``: the resolved config of each run plus the swept values
that label it in ``summary.csv``.
"""
from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import os
import stat
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from policies import DEFAULT_POLICY, make_policy
from sim.core.errors import InputError
from sim.core.fields import validate_fields
from sim.experiments.labels import check_swept_labels, policy_labels
from sim.experiments.overrides import (
    ConfigError,
    apply_overrides,
    check_path,
    parse_override,
    set_dotted,
)
from sim.experiments.schema import SCHEMA
from sim.experiments.unused import check_unused
from sim.experiments.yaml_strict import StrictLoader

__all__ = ["ConfigError", "RunSpec", "config_path", "expand_runs", "load_yaml", "parse_override",
           "policy_label", "set_dotted", "validate"]


@dataclass(frozen=True)
class RunSpec:
    """One run of an experiment: its resolved config and the swept values that label it."""

    config: dict[str, Any]
    swept: dict[str, Any]
    label: str


#: Most scalar values a config may hold once aliases are expanded (an alias bomb guard).
MAX_CONFIG_VALUES = 100_000
#: Largest experiment file read (a hand-written config is a few KB; this bounds /dev/zero).
MAX_CONFIG_BYTES = 4 * 1024 * 1024
#: Most runs one experiment may expand to (policies x sweep x zip), checked before expanding.
MAX_RUNS = 10_000
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


def config_path(path: Any) -> Path:
    """An experiment file argument (``str`` or path-like) as a ``Path``; anything else (``None``,
    a mapping) is one ``ConfigError``, not a ``TypeError`` from ``pathlib``."""
    if not isinstance(path, (str, os.PathLike)) or not str(path).strip():
        raise ConfigError(f"config: expected the path of an experiment YAML file, got "
                          f"{path!r}"[:200])
    return Path(path)


def read_config_text(path: Path) -> str:
    """The text of a config file: a regular file (not a FIFO or a device) of at most
    ``MAX_CONFIG_BYTES``, UTF-8."""
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{path}: not a regular file (a folder, FIFO or device); "
                              "expected an experiment YAML file")
        with path.open("rb") as fh:
            data = fh.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror or e}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES // 2**20} MiB; an experiment "
                          "file is a few KB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start})") from None


def _position(text: str, index: int) -> str:
    """``line L, column C`` of a character offset."""
    line = text.count("\n", 0, index) + 1
    return f"line {line}, column {index - (text.rfind(chr(10), 0, index) + 1) + 1}"


def load_yaml(path: Path) -> dict[str, Any]:
    """Read an experiment YAML (safe loading only, duplicate keys refused) into a mapping."""
    text = read_config_text(path)
    try:
        data = yaml.load(text, Loader=StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.reader.ReaderError as e:  # a NUL or other control character
        code = e.character if isinstance(e.character, int) else ord(e.character)
        what = "NUL" if code == 0 else f"#x{code:04x}"
        raise ConfigError(f"{path}: invalid YAML ({_position(text, e.position)}): control "
                          f"character {what} is not allowed") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
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


def _expand(sweep: dict[str, Any] | None, zipped: dict[str, Any] | None,
            source: str) -> list[dict[str, Any]]:
    """The list of swept-value dicts: Cartesian product of ``sweep`` × one zipped group."""
    axes: list[list[dict[str, Any]]] = []
    for key, values in (sweep or {}).items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{source}: sweep.{key}: expected a non-empty list of values")
        _check_swept_path(key, "sweep", source)
        axes.append([{key: v} for v in values])
    if zipped:
        both = sorted(set(zipped) & set(sweep or {}))
        if both:
            raise ConfigError(f"{source}: {both[0]}: varied in both sweep and zip; keep one")
        lengths = {k: len(v) if isinstance(v, list) else -1 for k, v in zipped.items()}
        if min(lengths.values()) < 1 or len(set(lengths.values())) != 1:
            raise ConfigError(f"{source}: zip: every key needs a list, all of one length "
                              f"(got {lengths})")
        for key in zipped:
            _check_swept_path(key, "zip", source)
        n = next(iter(lengths.values()))
        axes.append([{k: v[i] for k, v in zipped.items()} for i in range(n)])
    _check_nested([*(sweep or {}), *(zipped or {})], source)
    combos = []
    for parts in itertools.product(*axes):
        merged: dict[str, Any] = {}
        for p in parts:
            merged.update(p)
        combos.append(merged)
    return combos


#: Top-level keys no sweep can vary: what they hold is expanded into runs before any
#: swept value is set, so a swept one would be ignored.
UNSWEPT = {"policies": "list the policies under policies: (each entry is a run of every "
                       "point), or sweep policy",
           "sweep": "a sweep cannot vary the sweep", "zip": "a sweep cannot vary the zip"}


def _check_swept_path(key: str, block: str, source: str) -> None:
    """``check_path`` of a key of the file's ``sweep:`` or ``zip:``, located there."""
    head = key.split(".")[0]
    if head in UNSWEPT:
        raise ConfigError(f"{source}: {block}.{key}: cannot be varied; {UNSWEPT[head]}")
    try:
        check_path(key)
    except InputError as e:
        raise ConfigError(f"{source}: {block}.{e}") from None


def _check_nested(keys: list[str], source: str) -> None:
    """Refuse two varied keys of which one holds the other (``workload.arrival`` and
    ``workload.arrival.rate``): one would overwrite the other's values in every run."""
    for a in keys:
        for b in keys:
            if b.startswith(a + "."):
                raise ConfigError(f"{source}: sweep: {b} is varied inside {a}, which is "
                                  f"varied too; vary one of them")


def _check_load_key(key: str | None, configs: list[dict[str, Any]], source: str) -> None:
    """``output.load_key`` names a key swept in the file or after its overrides (one that an
    override turned into a single value stays acceptable); any other key is a typo the plots
    would silently ignore."""
    if key is None:
        return
    swept = list(dict.fromkeys(k for cfg in configs for block in ("sweep", "zip")
                               if isinstance(cfg.get(block), dict) for k in cfg[block]))
    if key not in swept:
        raise ConfigError(f"{key!r} is not a swept key; swept: {', '.join(swept) or 'none'}",
                          source=source, field="output.load_key")


def _check_size(num_policies: int, sweep: dict[str, Any] | None,
                zipped: dict[str, Any] | None, source: str) -> None:
    """Refuse more than ``MAX_RUNS`` runs before any is expanded."""
    lengths = [len(v) for v in (sweep or {}).values() if isinstance(v, list)]
    lengths += [max((len(v) for v in (zipped or {}).values() if isinstance(v, list)),
                    default=1)]
    total = num_policies * math.prod(lengths)
    if total > MAX_RUNS:
        raise ConfigError(f"{source}: sweep: {total:,} runs (policies x sweep x zip), more than "
                          f"the limit of {MAX_RUNS:,}; split it into several experiments")


def _check_listed_policy(spec: dict[str, Any], index: int, combo: dict[str, Any],
                         source: str) -> None:
    """Build entry ``index`` of ``policies:`` (with its run's swept values) so that a bad
    parameter names that entry (``policies[1].max_num_seqs``), not a ``policy`` key the file
    does not have; a swept parameter keeps its swept key (``policy.max_num_seqs``)."""
    try:
        make_policy(spec)
    except InputError as e:
        field = e.field or "policy"
        swept = any(field == k or field.startswith(k + ".") for k in combo)
        if not swept and field.split(".")[0] == "policy":
            field = f"policies[{index}]" + field[len("policy"):]
        raise ConfigError(e.problem, source=source, field=field) from None


#: Swept keys that choose a run's policy (not one parameter of it): each run is then
#: labelled by the policy it runs, not by the file's ``policy:``.
POLICY_CHOICE = ("policy", "policy.name")


def _label_chosen(runs: list[RunSpec], chosen: list[dict[str, Any]], key: str,
                  source: str) -> list[RunSpec]:
    """``runs`` labelled by the policies a swept ``key`` chose for them (``chosen``, in run
    order): the labels ``policies:`` entries of those policies would have, unique within the
    experiment, so tables and plots never merge two policies under one label."""
    distinct: list[dict[str, Any]] = []
    for spec in chosen:
        if spec not in distinct:
            distinct.append(spec)
    try:
        labels = policy_labels(distinct, field=f"sweep.{key}")
    except InputError as e:
        raise ConfigError(e.problem, source=source, field=e.field) from None
    return [dataclasses.replace(run, label=labels[distinct.index(spec)])
            for run, spec in zip(runs, chosen, strict=True)]


def policy_label(spec: Any) -> str:
    """A short label for a policy spec (its ``label`` key, else its name)."""
    if isinstance(spec, dict):
        return str(spec.get("label") or spec.get("name", "?"))
    return str(spec)


def expand_runs(raw: dict[str, Any],
                overrides: Iterable[str] | Mapping[str, Any] | None = None,
                source: str = "<config>", *, sweeps: Mapping[str, Any] | None = None,
                notify: Callable[[str], None] | None = None
                ) -> tuple[dict[str, Any], list[RunSpec]]:
    """Apply overrides and sweeps (``sim.experiments.overrides``' rules), validate, and expand
    sweeps and ``policies`` into runs. ``notify`` is told each sweep an override replaced."""
    data = copy.deepcopy(raw)
    for note in apply_overrides(data, overrides, sweeps):
        if notify is not None:
            notify(note)
    try:
        base = validate(data)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None
    if base["policy"] is not None and base["policies"] is not None:
        raise ConfigError(f"{source}: policy: give either 'policy' or 'policies', not both")
    policies = raw_policies = base.pop("policies")
    if policies is not None and not policies:
        raise ConfigError(f"{source}: policies: empty list; give at least one policy (or "
                          "drop the key for the default)")
    policies = policies or [base["policy"] or {"name": DEFAULT_POLICY}]
    try:
        labels = policy_labels(policies, "policies" if raw_policies is not None else "policy")
    except InputError as e:
        raise ConfigError(str(e.within(source))) from None
    sweep, zipped = base.pop("sweep"), base.pop("zip")
    _check_size(len(policies), sweep, zipped, source)
    try:
        check_swept_labels(sweep, "sweep")
        check_swept_labels(zipped, "zip")
    except InputError as e:
        raise ConfigError(str(e.within(source))) from None
    _check_load_key(base["output"]["load_key"], [raw, {"sweep": sweep, "zip": zipped}], source)
    runs: list[RunSpec] = []
    listed = base["policy"] is None and raw_policies is not None
    choosing = [k for k in (*(sweep or {}), *(zipped or {})) if k in POLICY_CHOICE]
    if choosing and listed and len(policies) > 1:
        raise ConfigError(f"{source}: sweep: {choosing[0]} chooses the policy of every run, "
                          "and so does the policies: list; vary one of them")
    chosen: list[dict[str, Any]] = []  # each run's policy as written, when a sweep chooses it
    for i, (spec, label) in enumerate(zip(policies, labels, strict=True)):
        for combo in _expand(sweep, zipped, source):
            cfg = copy.deepcopy(base)
            cfg["policy"] = copy.deepcopy(spec) if isinstance(spec, dict) else {"name": spec}
            for key, value in combo.items():
                try:
                    set_dotted(cfg, key, copy.deepcopy(value))
                except ConfigError as e:
                    raise ConfigError(f"{source}: sweep: {e}") from None
            if isinstance(cfg["policy"], str):  # a swept ``policy: static``, as the file's
                cfg["policy"] = {"name": cfg["policy"]}
            if choosing:
                chosen.append(copy.deepcopy(cfg["policy"]))
            try:
                cfg = validate({k: v for k, v in cfg.items()})
            except ConfigError as e:
                raise ConfigError(f"{source}: {e}") from None
            if listed:
                _check_listed_policy(cfg["policy"], i, combo, source)
            cfg.pop("sweep", None)
            cfg.pop("zip", None)
            cfg.pop("policies", None)
            runs.append(RunSpec(cfg, combo, label))
    if choosing:
        runs = _label_chosen(runs, chosen, choosing[0], source)
    try:
        unused = check_unused([r.config for r in runs], source)
    except InputError as e:
        raise ConfigError(e.problem, source=e.source, field=e.field) from None
    if notify is not None:
        for note in unused:
            notify(note)
    given = (data.get("parallelism") or {}).get("replicas")
    if notify is not None and given is not None and any(r.config.get("cluster") for r in runs):
        notify(f"parallelism.replicas ({given}) is not used by the runs with a cluster block: "
               "its groups set the replicas")
    routed = [r.config for r in runs if r.config.get("router") is not None]
    # one replica still waits out a routing latency: such a router is used
    if notify is not None and routed and all(
            c["parallelism"]["replicas"] == 1 and not c.get("cluster")
            and not (isinstance(c["router"], Mapping) and c["router"].get("latency_s"))
            for c in routed):
        notify("router is not used: every run that sets it has one replica "
               "(parallelism.replicas: 1), so there is nothing to route between")
    return base, runs
