"""Heterogeneous deployments: groups of replicas, each with its own GPU, TP, engine, policy
and KV settings, behind one router.

A ``cluster`` block lists groups::

    cluster:
      groups:
        - {name: h100, replicas: 4, hardware: h100-sxm}
        - {name: a100, replicas: 4, hardware: a100-80gb, tp: 2,
           policy: {name: chunked_prefill, token_budget: 1024}}

A key a group leaves out takes the experiment's value (``model``, ``hardware``, ``engine``,
``parallelism.tp``, ``policy``, ``kv``). Every group's keys are checked by one table
(``GROUP_FIELDS``), with the dotted path of the group in each message. A group's ``weight``
is its replicas' relative capacity for the routers that balance per unit of capacity; left
out, it is measured from the cost model: the tokens per second of a reference decode step
(32 sequences at 1,024 tokens of context), relative to the mean over all replicas.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sim.core.errors import InputError
from sim.core.fields import INT, MAP, NUM, OPT, STR, Key, unknown_key, validate_fields
from sim.cost.base import CostModel

#: A group's role: colocated, or one side of disaggregated serving.
ROLES = ("mixed", "prefill", "decode")
GROUP_FIELDS: dict[str, Any] = {
    "name": Key(STR, None, "Group name, unique in the cluster (the requests table's `group`).",
                required=True),
    "replicas": Key(INT, 1, "Replicas in the group.", minimum=1, maximum=4096),
    "model": Key(STR + (OPT,), None, "Model (default: the experiment's)."),
    "hardware": Key(STR + (OPT,), None, "GPU (default: the experiment's)."),
    "tp": Key(INT + (OPT,), None, "Tensor-parallel degree (default: parallelism.tp).",
              minimum=1, maximum=64),
    "engine": Key(STR + (OPT,), None, "Engine overhead profile (default: the experiment's)."),
    "policy": Key(MAP + STR + (OPT,), None, "Batching policy (default: the experiment's)."),
    "kv": Key(MAP + (OPT,), None, "KV block (default: the experiment's)."),
    "weight": Key(NUM + (OPT,), None, "Relative capacity of one replica (default: measured "
                  "from the cost model).", minimum=0, exclusive_min=True, maximum=1e6),
    "role": Key(STR, "mixed", "mixed (prefill and decode), prefill (prompts only; KV sent on)"
                " or decode (receives KV, decodes); see docs/disaggregation.md.",
                choices=ROLES),
}
#: Keys of the ``cluster`` block besides ``groups`` (a disaggregated cluster's).
CLUSTER_FIELDS: dict[str, Any] = {
    "label": Key(STR + (OPT,), None, "Name of this deployment in tables and plots (what a "
                 "swept cluster block is shown as)."),
    "decode_router": Key(MAP + STR + (OPT,), None, "Router choosing the decode replica of a "
                         "finished prefill (default: round_robin); prefill/decode roles only."),
    "network": Key(MAP + (OPT,), None, "Links KV transfers cross: {gpus_per_node, nvlink_gbps, "
                   "nic_gbps, nvlink_latency_us, nic_latency_us}; prefill/decode roles only."),
}
#: The keys of a group's cost model; each one a group leaves out (or gives as null) takes the
#: experiment's value (``inherit``).
COST_KEYS = ("model", "hardware", "tp", "engine")
#: Most groups a cluster may have.
MAX_GROUPS = 64
#: The reference decode step that measures a replica's capacity: 32 rows at 1,024 tokens.
REFERENCE_ROWS, REFERENCE_CONTEXT = 32, 1024


@dataclass(frozen=True)
class Group:
    """One validated group: its replicas' cost model, policy spec, KV spec and weight."""

    name: str
    replicas: int
    cost: CostModel
    policy: Any
    kv: Any
    weight: float | None
    hardware: str = ""
    role: str = "mixed"
    tp: int = 1  # GPUs per replica (where its KV lives: ``sim.cluster.kv_links``)


def parse_groups(cluster: Any, *, policy: Any, kv: Any, cost: CostModel | None,
                 cost_keys: Mapping[str, Any] | None, router: Any = None) -> list[Group]:
    """Validate a ``cluster`` block and build each group's cost model (``router``: the
    experiment's router spec or ``Router``, checked against a disaggregated cluster).

    A group's cost model is built from its (or the experiment's) ``model``, ``hardware``,
    ``tp`` and ``engine`` when ``cost_keys`` gives the experiment's values (the YAML path);
    from Python a group may instead carry a ready ``cost`` model, and a group that names no
    model or hardware uses the ``cost`` argument of ``simulate``.
    """
    accepted = sorted({"groups", *CLUSTER_FIELDS})
    if not isinstance(cluster, Mapping):
        raise InputError("expected a mapping with a 'groups' list", field="cluster")
    extra = sorted(str(k) for k in set(cluster) - set(accepted))
    if extra:
        raise unknown_key(extra[0], accepted, f"cluster.{extra[0]}")
    label = cluster.get("label")
    if isinstance(label, str) and not label.strip():  # it names the deployment's rows
        raise InputError("expected a non-empty label (or none)", field="cluster.label")
    groups = cluster.get("groups")
    if not isinstance(groups, list) or not groups or len(groups) > MAX_GROUPS:
        raise InputError(f"expected a list of 1 to {MAX_GROUPS} groups", field="cluster.groups")
    out: list[Group] = []
    for i, raw in enumerate(groups):
        where = f"cluster.groups[{i}]"
        if not isinstance(raw, Mapping):
            raise InputError(f"expected a mapping, got {type(raw).__name__}", field=where)
        given = dict(raw)
        ready = given.pop("cost", None)
        g = validate_fields(given, GROUP_FIELDS, where + ".")
        if not g["name"].strip():  # the requests table's ``group``, the groups table's key
            raise InputError("must be a non-empty name", field=f"{where}.name")
        if any(o.name == g["name"] for o in out):
            raise InputError(f"duplicate group name {g['name']!r}", field=f"{where}.name")
        try:
            group_cost, hardware = _group_cost(g, ready, cost, cost_keys)
        except InputError as e:
            raise InputError(e.problem, field=f"{where}.{e.field or 'hardware'}") from None
        built_tp = getattr(group_cost, "tp", None)
        if g["tp"] is not None and built_tp is not None and int(built_tp) != g["tp"]:
            # a ready cost model's own TP degree: a ``tp`` beside it would count GPUs (and
            # place KV on links) for a replica the cost model does not price
            raise InputError(f"tp={g['tp']} does not match the group's cost model, built for "
                             f"tp={built_tp}", field=f"{where}.tp")
        tp = g["tp"] if g["tp"] is not None else int(built_tp or 1)
        group = Group(g["name"], g["replicas"], group_cost,
                      g["policy"] if g["policy"] is not None else policy,
                      g["kv"] if g["kv"] is not None else kv, g["weight"], hardware,
                      g["role"], tp)
        _check_group(group, where, own_policy=g["policy"] is not None,
                     own_kv=g["kv"] is not None)
        out.append(group)
    total = sum(g.replicas for g in out)
    most = GROUP_FIELDS["replicas"].maximum
    if total > most:  # the bound of parallelism.replicas (and of one group) on the whole fleet
        raise InputError(f"{total} replicas in all; a cluster has at most {most}",
                         field="cluster.groups")
    check_roles(cluster, out, router)
    return out


def _check_group(group: Group, where: str, *, own_policy: bool, own_kv: bool) -> None:
    """Build the group's policy and KV cache once, as its replicas will, so that a bad one is
    an error naming the group (``cluster.groups[1].kv.block_size``) before anything runs. A
    setting the group takes from the experiment keeps its own path, except a KV cache that
    only this group's GPU cannot hold."""
    from policies import make_policy
    from sim.kv.config import resolve_kv

    try:
        make_policy(group.policy)
    except InputError as e:
        if not own_policy:
            raise
        raise InputError(e.problem, field=f"{where}.{e.field or 'policy'}") from None
    try:
        resolve_kv(group.kv, group.cost)
    except InputError as e:
        if not own_kv and e.field not in (None, "kv"):
            raise
        raise InputError(e.problem, field=f"{where}.{e.field or 'kv'}") from None


def check_roles(cluster: Mapping[str, Any], groups: list[Group], router: Any = None) -> None:
    """Roles are all ``mixed``, or prefill and decode groups (both present, nothing mixed);
    ``decode_router`` and ``network`` belong to the latter, whose routers (``router``, the
    experiment's, and ``decode_router``) take no routing latency."""
    extra = {k: v for k, v in validate_fields(
        {k: v for k, v in cluster.items() if k != "groups"}, CLUSTER_FIELDS,
        "cluster.").items() if v is not None and k != "label"}
    roles = {g.role for g in groups}
    if roles == {"mixed"}:
        if extra:
            raise InputError("needs groups with role prefill and decode",
                             field=f"cluster.{sorted(extra)[0]}")
        return
    for role in ("prefill", "decode"):
        if role not in roles:
            raise InputError(f"a disaggregated cluster needs a group with role {role}; "
                             f"mixed groups cannot be combined with prefill/decode ones",
                             field="cluster.groups")
    if "mixed" in roles:
        k = next(i for i, g in enumerate(groups) if g.role == "mixed")
        raise InputError("mixed groups cannot be combined with prefill/decode ones",
                         field=f"cluster.groups[{k}].role")
    check_no_latency(router, decode_router(cluster))
    check_same_model(groups)
    from sim.cluster.kv_links import build_topology

    # the placement rule itself (a replica within one node), prefill groups' replicas first
    build_topology(cluster.get("network"), [g.tp for role in ("prefill", "decode")
                                            for g in groups if g.role == role
                                            for _ in range(g.replicas)], None)


def decode_router(cluster: Mapping[str, Any]) -> Any:
    """The ``decode_router`` of a disaggregated ``cluster`` block (round robin by default);
    a bad one is an error at ``cluster.decode_router``."""
    from routers import make_router

    spec = cluster.get("decode_router")
    try:
        return make_router(spec if spec is not None else "round_robin")
    except InputError as e:  # name the key it came from
        raise InputError(e.problem, field=f"cluster.decode_{e.field or 'router'}") from None


def check_no_latency(router: Any, decode: Any) -> None:
    """Refuse a routing latency on either router of a disaggregated cluster before anything
    runs (the driver does not model requests in transit to a prefill or decode replica; the
    run itself used to fail on it, after the preflight, naming ``router.latency_s`` for both).
    ``router``: the experiment's spec or ``Router`` (``None``: round robin); ``decode``: the
    built decode router."""
    from routers import make_router

    main = make_router(router) if router is not None else None
    for built, where in ((main, "router"), (decode, "cluster.decode_router")):
        if built is not None and built.latency_s > 0:
            raise InputError("routing latency is not modelled with disaggregation yet",
                             field=f"{where}.latency_s")


def check_same_model(groups: Sequence[Group]) -> None:
    """Every prefill and decode group serves one model: a prefill replica's KV cache is
    decoded elsewhere, which only the same model's weights can do (another model's KV has
    other layers and heads; such a cluster ran, sending one model's bytes to the other).
    Cost models without a model (analytic ones) are not compared."""
    first = next((g for g in groups if getattr(g.cost, "model", None) is not None), None)
    if first is None:
        return
    ref = first.cost.model  # type: ignore[attr-defined]
    for k, g in enumerate(groups):
        model = getattr(g.cost, "model", None)
        if model is not None and model != ref:
            raise InputError(f"group {g.name!r} serves {_model_name(model)} but group "
                             f"{first.name!r} serves {_model_name(ref)}: a disaggregated "
                             "cluster's prefill and decode groups must serve the same model "
                             "(the decode side reads the prefill side's KV cache)",
                             field=f"cluster.groups[{k}].model")


def _model_name(model: Any) -> str:
    """How a model reads in a message: its name, else its repr."""
    return repr(getattr(model, "name", model))


def is_disaggregated(groups: Sequence[Group]) -> bool:
    """True when the groups split prefill and decode (``check_roles`` has passed)."""
    return any(g.role != "mixed" for g in groups)


def _group_cost(g: dict[str, Any], ready: Any, cost: CostModel | None,
                cost_keys: Mapping[str, Any] | None) -> tuple[CostModel, str]:
    """The cost model of one group, and the name of its GPU ('' when unnamed).

    From Python (``cost_keys`` is ``None``) a group that sets some of ``COST_KEYS`` takes the
    others from the ``cost`` argument when it is a roofline (``python_cost_keys``), as a YAML
    group takes the experiment's; a ready ``cost`` of the group's own is used as it is, so
    the keys that would build another one are refused beside it rather than ignored."""
    if ready is not None:
        if not callable(getattr(ready, "step", None)):
            raise InputError("expected a cost model (with a step method)", field="cost")
        _check_ready(g, ready)
        return ready, str(g["hardware"] or "")
    if cost_keys is None and not any(g[k] is not None for k in COST_KEYS):
        if cost is None:
            raise InputError("no cost model: give model/hardware or a cost", field="hardware")
        return cost, ""
    from sim.cost.roofline import build_cost_model

    keys = inherit(g, cost_keys if cost_keys is not None else python_cost_keys(cost, g))
    if "model" not in keys or "hardware" not in keys:
        raise InputError("needs a model and a hardware profile (or a cost model of its own)",
                         field="model" if "model" not in keys else "hardware")
    return build_cost_model(**keys), _gpu_name(keys["hardware"])


def _check_ready(g: Mapping[str, Any], ready: Any) -> None:
    """A group's ready cost model prices its replicas; ``model`` and ``engine`` beside it
    would be ignored, and a ``hardware`` other than its GPU would only mislabel the group."""
    for key in ("model", "engine"):
        if g[key] is not None:
            raise InputError(f"{g[key]!r} is not used: the group's own cost model sets its "
                             f"{key}; drop one of them", field=key)
    gpu = getattr(ready, "gpu", None)
    if g["hardware"] is None or gpu is None:  # an analytic cost model: ``hardware`` names it
        return
    from sim.cost.profiles import load_gpu

    try:  # by the profile it names (a built-in name or a file), not by its spelling
        same = load_gpu(g["hardware"]) == gpu
    except InputError:
        same = False
    if not same:
        raise InputError(f"{g['hardware']!r} does not match the group's cost model, built for "
                         f"{_gpu_name(gpu)!r}", field="hardware")


def python_cost_keys(cost: Any, group: Mapping[str, Any]) -> dict[str, Any]:
    """The cost keys a Python group that sets some of them takes from ``simulate``'s ``cost``:
    a roofline's model, GPU, TP, engine and dtypes (none from an analytic cost model, or from
    a roofline built with parameter overrides, which another GPU or TP would not keep)."""
    from sim.cost.roofline import CostParams, RooflineCost

    if not isinstance(cost, RooflineCost):
        return {}
    if cost.params != CostParams.of(cost.gpu, cost.engine, cost.tp):
        own = next(k for k in COST_KEYS if group.get(k) is not None)
        raise InputError(f"simulate's cost argument has parameter overrides, which this group "
                         f"cannot take over with its own {own}: give the group a cost model "
                         "of its own", field=own)
    return {"model": cost.model, "hardware": cost.gpu, "tp": cost.tp, "engine": cost.engine,
            "weight_dtype": cost.weight_dtype, "kv_dtype": cost.kv_dtype}


def _gpu_name(hardware: Any) -> str:
    """A GPU's name: a profile's ``name``, a name or path as given, '' for none."""
    if hardware is None:
        return ""
    return str(getattr(hardware, "name", hardware))


def inherit(group: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """A group's cost keys: ``defaults`` (the experiment's values) with each of ``COST_KEYS``
    that ``group`` gives in its place."""
    keys = dict(defaults)
    for k in COST_KEYS:
        if group.get(k) is not None:
            keys[k] = group[k]
    return keys


def replica_weights(owner: Sequence[Group]) -> list[float]:
    """Each replica's capacity weight (``owner``: each replica's group): its group's
    ``weight``, or else measured over all the replicas (``capacity_weights``)."""
    measured = capacity_weights([g.cost for g in owner])
    return [g.weight if g.weight is not None else w for g, w in zip(owner, measured,
                                                                      strict=True)]


def capacity_weights(costs: Sequence[CostModel]) -> list[float]:
    """Each replica's reference decode throughput relative to the mean over ``costs``."""
    rates = []
    for cost in costs:
        from sim.core.types import BatchShape

        shape = BatchShape.of([1] * REFERENCE_ROWS, [REFERENCE_CONTEXT] * REFERENCE_ROWS)
        seconds = cost.step(shape).seconds
        rates.append(REFERENCE_ROWS / seconds if seconds > 0 else 1.0)
    mean = sum(rates) / len(rates)
    return [r / mean for r in rates]
