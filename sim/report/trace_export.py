"""Export a run's step log (and requests) as a Chrome / Perfetto trace (JSON Trace Event Format).

Open the file at https://ui.perfetto.dev or chrome://tracing. Each replica is a process: a
``steps`` track of complete ("X") events, one per iteration, named prefill / decode / mixed,
with the batch composition in ``args``; counter ("C") tracks of batch size, queue length and KV
blocks (emitted only when the value changes). Requests, when given, are async spans on a
``requests`` process: the request from arrival to finish, with nested ``ttft`` (arrival → first
token) and ``decode`` (first token → finish) spans. With several replicas, every routing
decision is an instant event on a ``router`` process (which request went to which replica and
group, at its arrival). Times are microseconds of simulated time.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.core.errors import InputError
from sim.experiments.results import atomic_write
from sim.metrics.stream import is_bucketed

#: At most this many requests get async spans (the first by arrival).
MAX_REQUESTS = 2000
#: At most this many steps are exported (the first ones); the rest is noted in ``otherData``.
MAX_STEPS = 200_000
COUNTERS = (("num_seqs", "batch size"), ("num_waiting", "queue length"),
            ("kv_used_blocks", "KV blocks"))
REQUESTS_PID = 1_000_000
ROUTER_PID = 999_999


def _us(seconds: float) -> float:
    return round(float(seconds) * 1e6, 3)


def _step_name(prefill: int, decode: int) -> str:
    if prefill and decode:
        return "mixed"
    return "prefill" if prefill else "decode" if decode else "idle"


def step_events(steps: pd.DataFrame) -> list[dict[str, Any]]:
    """Metadata, complete and counter events of a step table."""
    events: list[dict[str, Any]] = []
    for rep in sorted(int(r) for r in steps["replica"].unique()):
        events.append({"name": "process_name", "ph": "M", "pid": rep,
                       "args": {"name": f"replica {rep}"}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": rep,
                       "args": {"sort_index": rep}})
        events.append({"name": "thread_name", "ph": "M", "pid": rep, "tid": 0,
                       "args": {"name": "steps"}})
    cols = {c: steps[c].to_numpy() for c in steps.columns}
    bound = cols.get("bound", np.full(len(steps), "", dtype=object))
    last: dict[tuple[int, str], Any] = {}
    for i in range(len(steps)):
        rep, ts = int(cols["replica"][i]), _us(cols["start_s"][i])
        pre, dec = int(cols["num_prefill_tokens"][i]), int(cols["num_decode_tokens"][i])
        events.append({"name": _step_name(pre, dec), "cat": "step", "ph": "X", "ts": ts,
                       "dur": _us(cols["duration_s"][i]), "pid": rep, "tid": 0,
                       "args": {"num_seqs": int(cols["num_seqs"][i]),
                                "prefill_tokens": pre, "decode_tokens": dec,
                                "padding_tokens": int(cols["num_padding_tokens"][i]),
                                "bound": str(bound[i])}})
        for col, name in COUNTERS:
            if col not in cols:
                continue
            value = int(cols[col][i])
            if last.get((rep, col)) != value:
                last[(rep, col)] = value
                events.append({"name": name, "ph": "C", "ts": ts, "pid": rep,
                               "args": {name: value}})
    return events


def request_events(requests: pd.DataFrame, limit: int = MAX_REQUESTS) -> list[dict[str, Any]]:
    """Async spans (arrival → first token → finish) of the first ``limit`` requests that
    produced a first token."""
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": REQUESTS_PID, "args": {"name": "requests"}},
        {"name": "process_sort_index", "ph": "M", "pid": REQUESTS_PID,
         "args": {"sort_index": REQUESTS_PID}}]
    rows = requests.sort_values("arrival_s", kind="stable")
    rows = rows[rows["first_token_s"].notna()].head(limit)
    for r in rows.itertuples(index=False):
        rid = int(r.id)
        arrive, first = _us(r.arrival_s), _us(r.first_token_s)
        finish = r.finish_s if not math.isnan(r.finish_s) else r.first_token_s
        end = _us(finish)
        base = {"cat": "request", "pid": REQUESTS_PID, "tid": 0, "id": rid}
        args = {"prompt_tokens": int(r.num_prompt_tokens),
                "output_tokens": int(r.num_output_tokens), "status": str(r.status),
                "preemptions": int(r.num_preemptions), "replica": int(r.replica)}
        events += [{**base, "name": f"request {rid}", "ph": "b", "ts": arrive, "args": args},
                   {**base, "name": "ttft", "ph": "b", "ts": arrive},
                   {**base, "name": "ttft", "ph": "e", "ts": first},
                   {**base, "name": "decode", "ph": "b", "ts": first},
                   {**base, "name": "decode", "ph": "e", "ts": end},
                   {**base, "name": f"request {rid}", "ph": "e", "ts": end}]
    return events


def routing_events(requests: pd.DataFrame, limit: int = MAX_REQUESTS) -> list[dict[str, Any]]:
    """One instant event per routing decision of the first ``limit`` arrivals (none when the
    run had a single replica)."""
    if "replica" not in requests or requests["replica"].nunique() < 2:
        return []
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": ROUTER_PID, "args": {"name": "router"}},
        {"name": "process_sort_index", "ph": "M", "pid": ROUTER_PID,
         "args": {"sort_index": -1}}]
    rows = requests.sort_values(["arrival_s", "id"], kind="stable").head(limit)
    groups = rows["group"].tolist() if "group" in rows else [None] * len(rows)
    for rid, at, rep, group in zip(rows["id"].tolist(), rows["arrival_s"].tolist(),
                                   rows["replica"].tolist(), groups, strict=True):
        args: dict[str, Any] = {"request": int(rid), "replica": int(rep)}
        if group is not None:
            args["group"] = str(group)
        events.append({"name": f"route {int(rid)} -> {int(rep)}", "cat": "routing",
                       "ph": "i", "s": "p", "ts": _us(at), "pid": ROUTER_PID, "tid": 0,
                       "args": args})
    return events


#: How every trace this module writes begins, and the marker near its end.
_HEAD, _MARK = b'{"traceEvents":[', b'"otherData":{"source":"batchsim"'


def check_trace_target(path: Path) -> None:
    """Refuse a ``path`` that is a folder, or an existing file that is not a trace this module
    wrote: the export replaces it, and a user's file (or another batchsim file, such as a
    ``summary.csv``) must never be replaced."""
    if path.is_dir():
        raise InputError(f"a folder; give the trace's file name (e.g. {path / 'trace.json'})",
                         field=f"--out {path}")
    if not path.exists():
        return
    try:
        with path.open("rb") as fh:
            head = fh.read(len(_HEAD))
            fh.seek(max(path.stat().st_size - 4096, 0))
            ours = head == _HEAD and _MARK in fh.read()
    except OSError:
        ours = False
    if not ours:
        raise InputError("exists and is not a trace batchsim wrote, so it is not replaced: "
                         "remove it or give another file name", field=f"--out {path}")


def export_chrome_trace(steps: pd.DataFrame, path: Path, requests: pd.DataFrame | None = None,
                        max_requests: int = MAX_REQUESTS, max_steps: int = MAX_STEPS) -> Path:
    """Write ``steps`` (and optionally ``requests``) as a Chrome trace JSON at ``path``
    (atomically); return ``path``."""
    path = Path(path)
    check_trace_target(path)
    if is_bucketed(steps):
        raise InputError("the run's step table is bucketed (metrics.step_table); run it with "
                         "step_table: full to export its steps", source=str(path))
    shown = steps.head(max_steps)
    events = step_events(shown)
    other: dict[str, Any] = {"source": "batchsim", "steps_shown": len(shown),
                             "steps_total": len(steps)}
    if requests is not None:
        events += routing_events(requests, max_requests)
        events += request_events(requests, max_requests)
        other.update(requests_shown=min(int(requests["first_token_s"].notna().sum()),
                                        max_requests), requests_total=len(requests))
    doc = {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}

    def write(p: Path) -> None:
        with p.open("w", encoding="utf-8") as fh:
            json.dump(doc, fh, separators=(",", ":"), allow_nan=False)

    atomic_write(path, write)
    return path
