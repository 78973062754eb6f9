"""Running a disaggregated cluster: replicas by role, the driver, and the result's tables.

The replicas of prefill groups come first, then those of decode groups, each in the order the
groups are listed (``replica`` numbers them so; GPUs are placed in the same order:
``sim.cluster.kv_links``). The requests table has one row per request, joined across its two
replicas: ``first_token_s`` and TTFT from the prefill replica, ``finish_s`` from the decode
replica, ``replica`` and ``group`` where it finished (the decode replica, or the prefill one
for a request of one output token or one rejected), plus the disaggregation columns
(``DISAGG_COLUMNS``). The first inter-token gap of a request spans its KV transfer and its
wait for the decode replica, so TPOT and ITL include them, as a client sees them.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from policies import make_policy
from routers import Router
from sim.cluster.disagg import DisaggDriver
from sim.cluster.groups import Group, replica_weights
from sim.cluster.handoff import GeneralSide, TransferLog
from sim.cluster.kv_links import build_topology
from sim.core.errors import InputError
from sim.core.state import Seq
from sim.core.types import Request
from sim.engine.coverage import fast_path_blocker
from sim.engine.inputs import model_len_limit
from sim.engine.replica import Replica
from sim.kv.config import replica_kv_bytes_per_token, resolve_kv
from sim.metrics.live import LiveLogs
from sim.metrics.summary import StepLog, request_table

#: ``simulate``'s ``monitor``: handed the run's step logs and its arrival times.
Monitor = Callable[[Sequence[StepLog], np.ndarray], None]

#: Columns a disaggregated run adds to the requests table (seconds, bytes, replica numbers).
DISAGG_COLUMNS = ("prefill_replica", "decode_replica", "kv_wait_s", "kv_transfer_s",
                  "kv_transfer_bytes", "kv_landed_s", "decode_start_s")


def build_replicas(groups: list[Group], log: StepLog, options: dict[str, Any],
                   num_requests: int) -> tuple[list[Any], list[Group], list[str]]:
    """Every replica (prefill groups' first) as a hand-off side, its group, and per group
    why it runs on the general engine ('' on the compiled interpreter: ``engine_blocker``)."""
    replicas: list[Any] = []
    owner: list[Group] = []
    reasons: list[str] = []
    for role in ("prefill", "decode"):
        for g in (g for g in groups if g.role == role):
            kv = resolve_kv(g.kv, g.cost)
            limit = model_len_limit(g.cost, options["max_model_len"])
            why = engine_blocker(make_policy(g.policy), kv, g.cost, options, num_requests,
                                 g.replicas)
            reasons.append(why)
            for _ in range(g.replicas):
                policy = make_policy(g.policy)
                if not why:
                    from sim.engine.compiled_handoff import HandoffCompiled
                    replicas.append(HandoffCompiled(len(replicas), policy, g.cost, kv,
                                                    max_model_len=limit,
                                                    hold=role == "prefill"))
                else:
                    rep = Replica(len(replicas), (), policy, g.cost, kv, log, {},
                                  checks=options["checks"], horizon_s=options["horizon_s"],
                                  skip=options["event_skipping"],
                                  deadline=options["deadline"], max_model_len=limit)
                    replicas.append(GeneralSide(rep, hold=role == "prefill"))
                owner.append(g)
    return replicas, owner, reasons


def engine_blocker(policy: Any, kv: Any, cost: Any, options: dict[str, Any],
                   num_requests: int, num_replicas: int) -> str:
    """Why a group's replicas run on the general engine ('' when the compiled interpreter
    covers them): the engine's allow-list (``sim.engine.coverage``), a horizon or a
    wall-clock budget, ``fast_path``, or too few requests to repay loading it."""
    from sim.engine.simulate import size_blocker

    choice = options.get("fast_path", True)
    if not choice:
        return "fast_path=False"
    if options["horizon_s"] is not None or options["deadline"] is not None:
        return "a horizon or wall-clock budget"
    return (fast_path_blocker(policy, kv, cost, checks=options["checks"],
                              event_skipping=options["event_skipping"], driven=True)
            or size_blocker(num_requests, num_replicas, choice))


def run_disagg(reqs: list[Request], groups: list[Group], router: Router, decode_router: Router,
               network: Any, rngs: tuple[np.random.Generator, np.random.Generator],
               log: StepLog, options: dict[str, Any], monitor: Monitor | None = None
               ) -> tuple[pd.DataFrame, list[Any], list[Group], DisaggDriver, list[StepLog]]:
    """Serve ``reqs`` (arrival order) on the groups; return the joined requests table, the
    replicas (hand-off sides), their groups, the driver (routing logs, links, each group's
    engine blocker) and the step logs (the general replicas' shared one first, then one per
    compiled replica). ``monitor`` (``simulate``'s) is handed those logs as ``LiveLogs``,
    which count every replica's steps and the requests done as the run goes."""
    replicas, owner, reasons = build_replicas(groups, log, options, len(reqs))
    n_p = sum(g.replicas for g in groups if g.role == "prefill")
    per_token = []
    for g in owner[:n_p]:
        nbytes = replica_kv_bytes_per_token(g.kv if isinstance(g.kv, Mapping) else {}, g.cost)
        if nbytes is None:  # named by the group's index, as every other group key is
            k = next(i for i, o in enumerate(groups) if o is g)
            raise InputError("a KV transfer needs the KV bytes per token: set "
                             "kv.kv_bytes_per_token with an analytic cost model",
                             field=f"cluster.groups[{k}].kv.kv_bytes_per_token")
        per_token.append(float(nbytes))
    nvlink = [getattr(getattr(g.cost, "gpu", None), "interconnect", None) for g in owner]
    bidir = [ic.nvlink_gbps for ic in nvlink if ic is not None and ic.nvlink_gbps > 0]
    topology = build_topology(network, [g.tp for g in owner],
                              min(bidir) / 2 if bidir else None)
    weights = replica_weights(owner)
    driver = DisaggDriver(replicas[:n_p], replicas[n_p:], router, decode_router, topology,
                          per_token, min(r.kv.block_size for r in replicas),
                          (weights[:n_p], weights[n_p:]))
    compiled = [side for side in replicas if not isinstance(side, GeneralSide)]
    logs = [log, *(StepLog() for _ in compiled)]  # a compiled replica's, filled at its end
    if monitor is not None:
        monitor(live_logs(logs, replicas, driver),
                np.fromiter((r.arrival_s for r in reqs), float, len(reqs)))
    moved = driver.run(reqs, rngs)
    pre: dict[int, Seq] = {}
    dec: dict[int, Seq] = {}
    by_id = {r.id: r for r in reqs}
    filled = iter(logs[1:])
    for k, side in enumerate(replicas):
        seqs = pre if k < n_p else dec
        if isinstance(side, GeneralSide):
            seqs.update(side.rep.seqs)
            continue
        seqs.update(compiled_seqs(side, driver.admitted if side.holds else by_id, next(filled)))
    driver.reasons = reasons
    return joined_table(reqs, pre, dec, moved), replicas, owner, driver, logs


def live_logs(logs: list[StepLog], replicas: Sequence[Any], driver: DisaggDriver) -> LiveLogs:
    """``logs`` with the run's own progress counts: the requests done (``DisaggDriver.
    num_done``), the steps in the general replicas' log and in each compiled replica's buffer
    (its log fills at its end), and the furthest replica clock."""
    compiled = [side.rep for side in replicas if not isinstance(side, GeneralSide)]
    general = [side.rep for side in replicas if isinstance(side, GeneralSide)]

    def steps() -> int:
        return len(logs[0]) + sum(rep.num_steps for rep in compiled)

    def reached_s() -> float:
        return max([0.0, *(rep.now for rep in compiled), *(rep.clock for rep in general)])

    return LiveLogs(logs, driver.num_done, steps, reached_s)


def compiled_seqs(side: Any, handed: Mapping[int, Request], log: StepLog) -> dict[int, Seq]:
    """The final request states of a compiled replica (``Seq`` values, as the general
    engine's; ``handed``: the requests it was handed, by id), its steps handed to ``log``."""
    from sim.engine.compiled_run import hand_over

    out = hand_over(side.rep, log, side.index)
    seqs = {}
    first_sched = out.first_scheduled_s.tolist()
    first_tok, finish = out.first_token_s.tolist(), out.finish_s.tolist()
    itl = out.max_itl_s.tolist()
    npre, gen = out.num_preemptions.tolist(), out.num_generated.tolist()
    for j, rid in enumerate(side.ids):
        seq = Seq(handed[rid], side.index)
        seq.first_scheduled_s, seq.first_token_s = first_sched[j], first_tok[j]
        seq.finish_s, seq.max_itl_s = finish[j], itl[j]
        seq.num_preemptions, seq.num_generated = npre[j], gen[j]
        seq.status, seq.reason = out.status[j], out.reason[j]
        seqs[rid] = seq
    return seqs





def joined_table(reqs: Sequence[Request], pre: dict[int, Seq], dec: dict[int, Seq],
                 moved: TransferLog) -> pd.DataFrame:
    """One row per request in id order, joined across its prefill and decode replicas."""
    final: list[Seq] = []
    decode_start = np.full(len(reqs), np.nan)
    for k, req in enumerate(reqs):
        first = pre[req.id]
        second = dec.get(req.id)
        if moved.reject_reason[k]:
            first.reject(float(moved.prefill_done_s[k]), moved.reject_reason[k])
        elif second is None and moved.decode_replica[k] >= 0:  # a run cut short: never sent
            first.status, first.finish_s = "waiting", np.nan
        if second is None:
            final.append(first)
            continue
        decode_start[k] = second.first_scheduled_s
        second.first_scheduled_s = first.first_scheduled_s
        second.num_preemptions += first.num_preemptions
        second.num_cached_tokens = first.num_cached_tokens
        final.append(second)
    order = sorted(range(len(reqs)), key=lambda k: reqs[k].id)
    table = request_table([final[k] for k in order])
    done = moved.prefill_done_s[order]
    extra = {
        "prefill_replica": moved.prefill_replica[order],
        "decode_replica": moved.decode_replica[order],
        "kv_wait_s": moved.kv_start_s[order] - done,
        "kv_transfer_s": moved.kv_landed_s[order] - done,
        "kv_transfer_bytes": moved.kv_bytes[order],
        "kv_landed_s": moved.kv_landed_s[order],
        "decode_start_s": decode_start[order],
    }
    # the prefill side ran every request as one of a single output token
    table["num_output_tokens"] = np.array([reqs[k].num_output_tokens for k in order],
                                          dtype=np.int64)
    for name in DISAGG_COLUMNS:
        table[name] = extra[name]
    return table


def per_gpu(summary: dict[str, Any], num_gpus: int) -> dict[str, Any]:
    """A cluster's GPU count and its rates per GPU (goodput when SLOs are set): what
    deployments of different sizes or splits are compared by."""
    out: dict[str, Any] = {"num_gpus": num_gpus}
    for key in ("request_goodput", "output_throughput", "request_throughput"):
        if key in summary and summary[key] == summary[key]:
            out[f"{key}_per_gpu"] = float(summary[key]) / num_gpus
    return out


def disagg_summary(table: pd.DataFrame, driver: DisaggDriver, duration_s: float
                   ) -> dict[str, Any]:
    """The disaggregation entries of the summary: transfers, back-pressure (``kv_wait``),
    decode queueing, time to decode start, link utilization (docs/metrics.md)."""
    moved = table[table["decode_replica"] >= 0]
    sent = moved[np.isfinite(moved["kv_transfer_s"].to_numpy(float))]

    def stat(values: pd.Series, how: str) -> float:
        v = values.to_numpy(float)
        v = v[np.isfinite(v)]
        if not v.size:
            return float("nan")
        return float((v.mean() if how == "mean" else np.percentile(v, 99)) * 1e3)

    out: dict[str, Any] = {
        "num_kv_transfers": int(len(sent)),
        "kv_transfer_bytes": float(sent["kv_transfer_bytes"].sum()),
        "mean_kv_transfer_ms": stat(sent["kv_transfer_s"], "mean"),
        "p99_kv_transfer_ms": stat(sent["kv_transfer_s"], "p99"),
        "mean_kv_wait_ms": stat(sent["kv_wait_s"], "mean"),
        "p99_kv_wait_ms": stat(sent["kv_wait_s"], "p99"),
        "mean_prefill_queue_ms": stat(table["first_scheduled_s"] - table["arrival_s"], "mean"),
        "mean_decode_queue_ms": stat(moved["decode_start_s"] - moved["kv_landed_s"], "mean"),
        "mean_time_to_decode_start_ms": stat(moved["decode_start_s"] - moved["arrival_s"],
                                             "mean"),
        "p99_time_to_decode_start_ms": stat(moved["decode_start_s"] - moved["arrival_s"],
                                            "p99"),
    }
    usage = driver.net.usage
    busy = [u.busy_s for u in usage.values() if u.bytes > 0]
    out["max_link_utilization"] = (max(busy) / duration_s if busy and duration_s > 0 else 0.0)
    out["mean_link_utilization"] = (float(np.mean(busy)) / duration_s
                                    if busy and duration_s > 0 else 0.0)
    return out


def link_table(driver: DisaggDriver, duration_s: float) -> pd.DataFrame:
    """One row per link that carried bytes: bytes, busy seconds and utilization."""
    rows = [{"link": name, "bytes": u.bytes, "busy_s": u.busy_s,
             "utilization": u.busy_s / duration_s if duration_s > 0 else 0.0}
            for name, u in driver.net.usage.items() if u.bytes > 0]
    return pd.DataFrame(rows, columns=["link", "bytes", "busy_s", "utilization"])
