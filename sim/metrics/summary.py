"""Per-iteration logging and the summary metrics (names follow ``vllm bench serve``).

The step log appends plain Python numbers to column lists inside the loop (no DataFrame work
on the hot path); tables and the summary are built once at the end. Inter-token latencies are
kept exactly without per-token objects: a token produced one step after its predecessor has an
ITL equal to that step's duration, so each step stores a count of such tokens, and only the
irregular gaps (after a stall or a preemption) are stored individually.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from operator import attrgetter
from typing import Any

import numpy as np
import pandas as pd

from sim.core.errors import InputError
from sim.metrics.kv import kv_summary
from sim.metrics.percentiles import PERCENTILES, pieces_stats, weighted_stats
from sim.metrics.steplog import FLOAT_COLUMNS, STEP_COLUMNS, StepLog
from sim.metrics.stream import StepStream, compact_multiset, step_sums

__all__ = ["FLOAT_COLUMNS", "STEP_COLUMNS", "StepLog", "canonical_irregular", "request_frame",
           "request_table", "summarize"]

REQUEST_COLUMNS = ("id", "arrival_s", "first_scheduled_s", "first_token_s", "finish_s",
                   "ttft_s", "tpot_s", "e2e_s", "max_itl_s", "num_preemptions",
                   "num_prompt_tokens", "num_output_tokens", "num_generated", "status",
                   "reason", "replica", "num_swaps", "num_cached_tokens")

LATENCIES = ("ttft", "tpot", "itl", "e2el")
STATS = ("mean", *(name for name, _ in PERCENTILES))


def canonical_irregular(runs: list[tuple[np.ndarray, ...]]
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(gaps, token times, counts)`` of several logs' irregular runs in one canonical order:
    by token time, then replica, each replica's own order kept. It does not depend on how
    an engine interleaved the replicas' events (one replica: the order as logged)."""
    gaps, at, counts, reps = (np.concatenate(parts) for parts in zip(*runs, strict=True))
    if len(runs) > 1 or (len(reps) and reps.any()):
        order = np.lexsort((reps, at))  # stable: equal keys keep the logged order
        gaps, at, counts = gaps[order], at[order], counts[order]
    return gaps, at, counts


#: The ``Request`` and ``Seq`` fields of the request table's columns, by kind.
_REQUEST_INTS = ("id", "num_prompt_tokens", "num_output_tokens")
_REQUEST_FLOATS = ("arrival_s",)
_SEQ_INTS = ("num_preemptions", "num_generated", "replica", "num_swaps", "num_cached_tokens")
_SEQ_FLOATS = ("first_scheduled_s", "first_token_s", "finish_s", "max_itl_s")
_REQ, _STATUS, _REASON = attrgetter("req"), attrgetter("status"), attrgetter("reason")


def request_table(seqs: list) -> pd.DataFrame:
    """One row per request, in id order, from the engine's final request states (column by
    column: one pass in C a field, not a numpy item assignment a field and request)."""
    n = len(seqs)
    reqs = list(map(_REQ, seqs))
    columns: dict[str, np.ndarray] = {}
    for objects, names, dtype in ((reqs, _REQUEST_INTS, np.int64),
                                  (reqs, _REQUEST_FLOATS, np.float64),
                                  (seqs, _SEQ_INTS, np.int64), (seqs, _SEQ_FLOATS, np.float64)):
        for name in names:
            columns[name] = np.fromiter(map(attrgetter(name), objects), dtype, n)
    return request_frame(columns, list(map(_STATUS, seqs)), list(map(_REASON, seqs)))


def request_frame(columns: dict[str, Any], status: list[str], reason: list[str]
                  ) -> pd.DataFrame:
    """The request table from per-request columns (the ids, times, counts of
    ``REQUEST_COLUMNS`` that are not derived), adding TTFT, TPOT and E2E."""
    data: dict[str, Any] = {k: np.array(v) for k, v in columns.items()}  # its own copies
    done = np.asarray(status, dtype=object) == "finished"
    arrival, first, finish = data["arrival_s"], data["first_token_s"], data["finish_s"]
    data["ttft_s"] = np.where(done, first - arrival, np.nan)
    data["e2e_s"] = np.where(done, finish - arrival, np.nan)
    n_out = data["num_output_tokens"]
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = (finish - first) / (n_out - 1)
    data["tpot_s"] = np.where(done & (n_out > 1), tpot, np.nan)
    data["status"], data["reason"] = status, reason
    # in the table's column order, each column its own block: no second, consolidating
    # copy of a million-row table and no reordering one
    return pd.DataFrame({k: data[k] for k in REQUEST_COLUMNS}, columns=list(REQUEST_COLUMNS),
                        copy=False)


def _stats(values: np.ndarray, weights: np.ndarray | None = None) -> dict[str, float]:
    """Mean, median, p90, p99 in milliseconds (weighted when ``weights`` is given)."""
    if weights is not None:
        keep = weights > 0
        if not keep.all():
            values, weights = values[keep], weights[keep]
        del keep
    else:
        values = values[~np.isnan(values)]
    if values.size == 0:
        return dict.fromkeys(STATS, float("nan"))
    if weights is None:
        q = np.percentile(values, [p for _, p in PERCENTILES])
        return {"mean": values.mean() * 1e3,
                **{name: q[i] * 1e3 for i, (name, _) in enumerate(PERCENTILES)}}
    return _in_ms(weighted_stats(values, weights))


def _in_ms(stats: dict[str, float]) -> dict[str, float]:
    """Seconds as milliseconds."""
    return {k: v * 1e3 for k, v in stats.items()}


def itl_sample(steps: pd.DataFrame, irregular: Any, irregular_counts: Any = None
               ) -> tuple[np.ndarray, np.ndarray]:
    """All inter-token latencies as (values, counts): per-step durations plus irregular gaps
    (each ``irregular_counts`` times; once when no counts are given)."""
    gaps = np.asarray(irregular, dtype=float)
    counts = (np.ones(len(gaps), dtype=np.int64) if irregular_counts is None
              else np.asarray(irregular_counts).astype(np.int64))
    vals = np.concatenate([steps["duration_s"].to_numpy(dtype=float), gaps])
    counts = np.concatenate([steps["num_regular_itl"].to_numpy(dtype=np.int64), counts])
    return vals, counts


def check_measurement_window(arrival_s: np.ndarray, warmup_s: float, cooldown_s: float) -> None:
    """Refuse a ``warmup_s`` / ``cooldown_s`` (already checked as numbers by
    ``sim.metrics.fields``) that leaves no request inside the window ``summarize`` measures
    (every metric would be empty)."""
    if len(arrival_s) == 0:
        return
    first, last = float(np.min(arrival_s)), float(np.max(arrival_s))
    inside = (arrival_s >= first + warmup_s) & (arrival_s <= last - cooldown_s)
    if not inside.any():
        raise InputError(f"warmup_s={warmup_s:g} s and cooldown_s={cooldown_s:g} s leave no "
                         f"request to measure: arrivals span {last - first:.6g} s",
                         field="warmup_s" if warmup_s >= cooldown_s else "cooldown_s")


def summarize(requests: pd.DataFrame, steps: pd.DataFrame, irregular_itl: Any, *,
              peak_flops: float | None, peak_bytes_per_s: float | None,
              slot_capacity: int | Mapping[int, int | None] | None, num_replicas: int,
              kv_total_blocks: int | None,
              warmup_s: float = 0.0, cooldown_s: float = 0.0,
              slos: dict[str, float] | None = None,
              kv_block_size: int | None = None,
              stream: StepStream | None = None) -> dict[str, float]:
    """The summary columns (each defined in docs/metrics.md).

    Requests are counted when they arrive inside [first arrival + ``warmup_s``, last arrival −
    ``cooldown_s``]; steps when they start inside the same window, and irregular inter-token
    gaps (``(gaps, token times)``) when their token comes inside it. ``duration`` runs from
    the window's first arrival to its last finish. ``irregular_itl`` is a list of gaps, or
    ``(gaps, token times)``, or ``(gaps, token times, counts)`` (run-length encoded).
    With a ``stream`` (a bucketed step table) the step metrics come from its exact sums over
    every step, and ``steps`` (the buckets) is not read. ``slot_capacity`` is the policy's
    batch rows, or (a full step table only) each replica's, by replica number: a fleet whose
    policies differ, where each step's rows count against its own replica's slots.
    """
    counts = None
    if isinstance(irregular_itl, tuple):
        gaps, at = (np.asarray(x, dtype=float) for x in irregular_itl[:2])
        if len(irregular_itl) > 2:
            counts = np.asarray(irregular_itl[2], dtype=np.int64)
    else:
        gaps = np.asarray(irregular_itl, dtype=float)
        at = None
    if len(requests):
        t0 = requests["arrival_s"].min() + warmup_s
        t1 = requests["arrival_s"].max() - cooldown_s
        win = requests[(requests["arrival_s"] >= t0) & (requests["arrival_s"] <= t1)]
    else:
        win, t0 = requests, 0.0
    done = win[win["status"] == "finished"]
    end = float(done["finish_s"].max()) if len(done) else t0
    any_steps = stream.num_rows > 0 if stream is not None else len(steps) > 0
    if any_steps and win["status"].isin(["waiting", "running"]).any():
        # Cut short (horizon or wall-clock budget): the run lasted until its last step ended,
        # and that busy time must sit inside the duration.
        if stream is not None:
            end = max(end, stream.max_end_s)
        else:
            last = steps["start_s"].to_numpy(float) + steps["duration_s"].to_numpy(float)
            end = max(end, float(last.max()))
    duration = max(end - (float(win["arrival_s"].min()) if len(win) else 0.0), 0.0)
    if stream is not None:
        stream.close(end)
        sums, num_steps, kv_max = stream.sums() or _no_sums(kv_block_size), \
            stream.num_window, stream.max_kv_used
        g, w = _windowed_gaps(gaps, at, counts, any_steps, t0, end)

        def itl() -> dict[str, float]:
            # the stream lets go of its sample, kept as sorted pieces: never merged whole
            pieces = stream.itl_pieces(release=True)
            keep = w > 0
            pieces.append(compact_multiset(g[keep], w[keep]))
            return _in_ms(pieces_stats(pieces))
    else:
        st = steps
        if len(steps):
            inside = (steps["start_s"] >= t0) & (steps["start_s"] <= end)
            if not inside.all():  # a copy only when a warm-up or cool-down cuts steps out
                st = steps[inside]
        num_steps = len(st)
        kv_max = float(st["kv_used_blocks"].max()) if num_steps else math.nan
        def itl() -> dict[str, float]:
            return _stats(*_windowed_itl(st, gaps, at, counts, any_steps, t0, end))

        latency = _latency_stats(done, itl)  # before the step sums' temporaries exist
        # one pass over the columns; its per-step temporaries are freed as it goes (a
        # 5M-step run's column is 40 MB)
        sums = step_sums({k: st[k].to_numpy() for k in SUM_INPUTS},
                         _step_slots(slot_capacity, st), kv_block_size)
        del st
    out_tokens = float(done["num_output_tokens"].sum())
    in_tokens = float(done["num_prompt_tokens"].sum())
    per = duration if duration > 0 else float("nan")
    s: dict[str, float] = {
        "completed": int(len(done)),
        "num_rejected": int((win["status"] == "rejected").sum()),
        "num_unfinished": int(win["status"].isin(["waiting", "running"]).sum()),
        "duration": duration,
        "request_throughput": len(done) / per,
        "output_throughput": out_tokens / per,
        "total_token_throughput": (out_tokens + in_tokens) / per,
    }
    s.update(latency if stream is None else _latency_stats(done, itl))
    s.update(_step_metrics(sums, num_steps, kv_max, win, duration * num_replicas, peak_flops,
                           peak_bytes_per_s, kv_total_blocks))
    s.update(kv_summary(win, done, sums, num_steps, kv_total_blocks, kv_block_size))
    s["num_steps"] = int(num_steps)
    if slos:
        s.update(slo_attainment(done, len(win), slos, per))
    return s


#: The step columns ``step_sums`` reads.
SUM_INPUTS = ("duration_s", "num_prefill_tokens", "num_decode_tokens", "num_padding_tokens",
              "flops", "bytes", "num_seqs", "num_padding_rows", "kv_used_blocks", "swap_s",
              "swapped_bytes", "num_recomputed_tokens", "kv_live_tokens")


def _step_slots(slot_capacity: int | Mapping[int, int | None] | None, steps: pd.DataFrame
                ) -> int | np.ndarray | None:
    """``slot_capacity`` as ``step_sums`` takes it: given per replica, each step's own
    replica's batch rows (0 where unbounded)."""
    if not isinstance(slot_capacity, Mapping):
        return slot_capacity
    by_replica = np.zeros(max(slot_capacity, default=-1) + 1)
    for replica, rows in slot_capacity.items():
        by_replica[replica] = rows or 0
    return by_replica[steps["replica"].to_numpy(np.int64)] if len(steps) else np.zeros(0)


def _no_sums(block_size: int | None) -> dict[str, float]:
    """``step_sums`` of no steps."""
    empty = {k: np.zeros(0) for k in SUM_INPUTS}
    return step_sums(empty, None, block_size)


def _latency_stats(done: pd.DataFrame, itl: Callable[[], dict[str, float]]
                   ) -> dict[str, float]:
    """Mean, median, p90, p99 of TTFT, TPOT, ITL and E2E latency in milliseconds (``itl``
    computes the ITL's, when they are due: its sample is built only then)."""
    out = {}
    for metric in LATENCIES:
        if metric == "itl":
            stats = itl()
        else:
            stats = _stats(done[f"{metric if metric != 'e2el' else 'e2e'}_s"].to_numpy(float))
        for stat, v in stats.items():
            out[f"{stat}_{metric}_ms"] = float(v)
    return out


def _step_metrics(sums: dict[str, float], num_steps: int, kv_max: float, win: pd.DataFrame,
                  span: float, peak_flops: float | None, peak_bytes_per_s: float | None,
                  kv_total_blocks: int | None) -> dict[str, float]:
    """Busy fraction, MFU, MBU, slot use, padding, batch size and KV usage of the steps in
    the window (from their ``step_sums``); ``span`` is the window's duration × replicas."""
    s: dict[str, float] = {}
    busy = sums["busy_s"]
    s["busy_fraction"] = busy / span if span > 0 else float("nan")
    s["mfu"] = (sums["useful_flops"] / (span * peak_flops) if peak_flops and span > 0
                else float("nan"))
    s["mbu"] = sums["bytes"] / (span * peak_bytes_per_s) if peak_bytes_per_s and span > 0 \
        else float("nan")
    s["padding_fraction"] = (float(sums["padding_tokens"] / sums["tokens"])
                             if sums["tokens"] > 0 else 0.0)
    s["slot_utilization"] = float(sums["slot_s"] / busy) if busy > 0 else float("nan")
    s["mean_batch_size"] = float(sums["rows"] / num_steps) if num_steps else 0.0
    s["num_preemptions"] = int(win["num_preemptions"].sum())
    s["max_kv_usage"] = (kv_max / kv_total_blocks if kv_total_blocks and num_steps
                         else float("nan"))
    s["mean_kv_usage"] = (float(sums["kv_block_s"] / busy) / kv_total_blocks
                          if kv_total_blocks and busy > 0 else float("nan"))
    return s


def _windowed_gaps(gaps: np.ndarray, at: np.ndarray | None, counts: np.ndarray | None,
                   any_steps: bool, t0: float, end: float) -> tuple[np.ndarray, np.ndarray]:
    """The irregular gaps whose token came inside the window, with their counts."""
    w = np.ones(len(gaps), dtype=np.int64) if counts is None else counts.astype(np.int64)
    if at is None or not any_steps:
        return gaps, w
    keep = (at > t0) & (at <= end)
    return gaps[keep], w[keep]


def _windowed_itl(st: pd.DataFrame, gaps: np.ndarray, at: np.ndarray | None,
                  counts: np.ndarray | None, any_steps: bool, t0: float, end: float
                  ) -> tuple[np.ndarray, np.ndarray]:
    """The ITL sample of the measurement window: irregular gaps whose token came inside it."""
    if at is None or not any_steps:
        return itl_sample(st, gaps, counts)
    keep = (at > t0) & (at <= end)
    return itl_sample(st, gaps[keep], None if counts is None else counts[keep])


SLO_KEYS = {"ttft_ms": "ttft_s", "tpot_ms": "tpot_s", "e2el_ms": "e2e_s"}


def slo_attainment(done: pd.DataFrame, num_requests: int, slos: dict[str, float],
                   duration: float) -> dict[str, float]:
    """Share of requests meeting every per-request SLO, and goodput (DistServe's definition)."""
    ok = np.ones(len(done), dtype=bool)
    for key, limit_ms in slos.items():
        col = SLO_KEYS[key]
        vals = done[col].to_numpy(float)
        # A single-token request has no TPOT; it cannot violate a TPOT SLO.
        ok &= np.where(np.isnan(vals), True, vals * 1e3 <= limit_ms)
    good = int(ok.sum())
    return {"slo_attainment": good / num_requests if num_requests else float("nan"),
            "request_goodput": good / duration}
