"""Per-iteration logging and the summary metrics (names follow ``vllm bench serve``).

The step log appends plain Python numbers to column lists inside the loop (no DataFrame work
on the hot path); tables and the summary are built once at the end. Inter-token latencies are
kept exactly without per-token objects: a token produced one step after its predecessor has an
ITL equal to that step's duration, so each step stores a count of such tokens, and only the
irregular gaps (after a stall or a preemption) are stored individually.
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from sim.metrics.kv import kv_summary

STEP_COLUMNS = ("replica", "start_s", "duration_s", "num_seqs", "num_prefill_tokens",
                "num_decode_tokens", "num_padding_tokens", "num_padding_rows", "num_waiting",
                "kv_used_blocks", "flops", "bytes", "bound", "num_regular_itl",
                "kv_live_tokens", "kv_cached_blocks", "num_recomputed_tokens", "swap_s",
                "swapped_bytes")

REQUEST_COLUMNS = ("id", "arrival_s", "first_scheduled_s", "first_token_s", "finish_s",
                   "ttft_s", "tpot_s", "e2e_s", "max_itl_s", "num_preemptions",
                   "num_prompt_tokens", "num_output_tokens", "num_generated", "status",
                   "reason", "replica", "num_swaps", "num_cached_tokens")

LATENCIES = ("ttft", "tpot", "itl", "e2el")
STATS = ("mean", "median", "p90", "p99")


#: Step columns stored as C doubles; every other column but ``bound`` is a C int64.
FLOAT_COLUMNS = frozenset({"start_s", "duration_s", "flops", "bytes", "swap_s", "swapped_bytes"})


def _new_columns() -> dict[str, Any]:
    return {c: [] if c == "bound" else array("d" if c in FLOAT_COLUMNS else "q")
            for c in STEP_COLUMNS}


def _put(col: array, values: Any, k: int) -> None:
    """Append ``k`` values (a scalar repeated, or an array) to a typed column without boxing."""
    if isinstance(values, np.ndarray):
        dtype = np.float64 if col.typecode == "d" else np.int64
        col.frombytes(np.ascontiguousarray(values[:k], dtype=dtype).tobytes())
    else:
        col.extend(array(col.typecode, (values,)) * k)


def _numpy(a: array) -> np.ndarray:
    """A typed column as numpy: a view of its buffer (an empty array when it has none)."""
    dtype = np.float64 if a.typecode == "d" else np.int64
    return np.frombuffer(a, dtype=dtype) if a else np.empty(0, dtype=dtype)


@dataclass
class StepLog:
    """Typed column arrays of per-step records plus the irregular inter-token gaps.

    Columns are ``array.array`` (8 bytes a value, not a boxed Python number: a 5M-step run
    stays well under a gigabyte); ``table()`` views them as numpy without copying twice.
    Irregular gaps are run-length encoded: consecutive tokens with the same gap at the same
    time (every running decode after one prefill step, say) share one ``(at, gap, count)`` entry.
    """

    cols: dict[str, Any] = field(default_factory=_new_columns)
    #: Columns that are 0 in every row and so never appended to (a fast path's padding and
    #: swap columns): ``table()`` makes them with ``np.zeros``, whose pages stay unallocated.
    zero_columns: frozenset[str] = frozenset()
    #: The replica of every step, when the log holds one replica's steps only (as zero_columns)
    replica: int = 0
    #: Columns stored row-interleaved instead (one ``extend`` of a tuple per step instead of
    #: one ``append`` per column: a fast path's hot loop); ``table()`` views them strided.
    packed_int_columns: tuple[str, ...] = ()
    packed_float_columns: tuple[str, ...] = ()
    #: The packed rows: ``array``s a run appends to, or numpy rows a compiled run hands over.
    packed_ints: array | np.ndarray = field(default_factory=lambda: array("q"))
    packed_floats: array | np.ndarray = field(default_factory=lambda: array("d"))
    irregular_itl: array = field(default_factory=lambda: array("d"))
    irregular_itl_at: array = field(default_factory=lambda: array("d"))
    irregular_itl_count: array = field(default_factory=lambda: array("q"))
    irregular_itl_replica: array = field(default_factory=lambda: array("q"))

    def add_irregular_itl(self, at_s: float, gap_s: float, count: int = 1,
                          replica: int = 0) -> None:
        """Record ``count`` tokens of ``replica`` whose gap to their predecessor is not one
        step's duration."""
        at, gaps, reps = self.irregular_itl_at, self.irregular_itl, self.irregular_itl_replica
        if at and at[-1] == at_s and gaps[-1] == gap_s and reps[-1] == replica:
            self.irregular_itl_count[-1] += count
        else:
            at.append(at_s)
            gaps.append(gap_s)
            self.irregular_itl_count.append(count)
            reps.append(replica)

    def irregular_runs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(gaps, token times, counts, replicas)`` of the irregular gaps, as numpy."""
        return (_numpy(self.irregular_itl), _numpy(self.irregular_itl_at),
                _numpy(self.irregular_itl_count), _numpy(self.irregular_itl_replica))

    def record(self, replica: int, start: float, duration: float, num_seqs: int,
               num_prefill: int, num_decode: int, num_padding: int, num_padding_rows: int,
               num_waiting: int, kv_used: int, step: Any, regular_itl: int, *,
               kv_live_tokens: int = 0, kv_cached_blocks: int = 0,
               num_recomputed_tokens: int = 0, swap_s: float = 0.0,
               swapped_bytes: float = 0.0) -> None:
        """Append one step (the keyword columns are the KV cache's, see ``sim.metrics.kv``)."""
        c = self.cols
        c["kv_live_tokens"].append(kv_live_tokens)
        c["kv_cached_blocks"].append(kv_cached_blocks)
        c["num_recomputed_tokens"].append(num_recomputed_tokens)
        c["swap_s"].append(swap_s)
        c["swapped_bytes"].append(swapped_bytes)
        c["replica"].append(replica)
        c["start_s"].append(start)
        c["duration_s"].append(duration)
        c["num_seqs"].append(num_seqs)
        c["num_prefill_tokens"].append(num_prefill)
        c["num_decode_tokens"].append(num_decode)
        c["num_padding_tokens"].append(num_padding)
        c["num_padding_rows"].append(num_padding_rows)
        c["num_waiting"].append(num_waiting)
        c["kv_used_blocks"].append(kv_used)
        c["flops"].append(step.flops)
        c["bytes"].append(step.bytes)
        c["bound"].append(step.bound)
        c["num_regular_itl"].append(regular_itl)

    def extend(self, replica: int, starts: np.ndarray, durations: np.ndarray, num_seqs: int,
               num_decode: int, num_padding: int, num_padding_rows: int, num_waiting: int,
               kv_used: np.ndarray, series: Any, regular_itl: int, *,
               kv_live_tokens: np.ndarray | None = None,
               kv_cached_blocks: np.ndarray | None = None) -> None:
        """Append ``len(starts)`` skipped decode steps in one go (no recompute, no swaps)."""
        c, k = self.cols, len(starts)
        for name, value in (
                ("kv_live_tokens", 0 if kv_live_tokens is None else kv_live_tokens),
                ("kv_cached_blocks", 0 if kv_cached_blocks is None else kv_cached_blocks),
                ("num_recomputed_tokens", 0), ("swap_s", 0.0), ("swapped_bytes", 0.0),
                ("replica", replica), ("start_s", starts), ("duration_s", durations),
                ("num_seqs", num_seqs), ("num_prefill_tokens", 0),
                ("num_decode_tokens", num_decode), ("num_padding_tokens", num_padding),
                ("num_padding_rows", num_padding_rows), ("num_waiting", num_waiting),
                ("kv_used_blocks", kv_used), ("flops", series.flops),
                ("bytes", series.bytes), ("num_regular_itl", regular_itl)):
            _put(c[name], value, k)
        c["bound"].extend(series.bound[:k])

    def __len__(self) -> int:
        return len(self.cols["bound"])

    def latest(self, names: tuple[str, ...] = ("start_s", "duration_s", "num_waiting",
                                                "num_seqs")) -> tuple[float, ...] | None:
        """The last step's values of ``names`` (``None`` before the first step), whatever the
        layout. Safe to call from another thread while a run appends (a progress display
        reads it): it only reads the last complete row."""
        n = len(self)
        if not n:
            return None
        out = []
        for name in names:
            for packed_names, packed in ((self.packed_int_columns, self.packed_ints),
                                         (self.packed_float_columns, self.packed_floats)):
                if name in packed_names:
                    width = len(packed_names)
                    rows = len(packed) // width  # complete rows only
                    out.append(float(packed[(rows - 1) * width + packed_names.index(name)])
                               if rows else 0.0)
                    break
            else:
                col = self.cols[name]
                out.append(float(col[min(n, len(col)) - 1]) if len(col) and
                           name not in self.zero_columns else 0.0)
        return tuple(out)

    def table(self) -> pd.DataFrame:
        """The per-iteration table."""
        c = self.cols
        if not len(self):  # keep the dtypes an empty table always had
            return pd.DataFrame({k: [] for k in STEP_COLUMNS}, columns=list(STEP_COLUMNS))
        n = len(self)
        data = {}
        for k, v in c.items():
            dtype = np.float64 if k != "bound" and v.typecode == "d" else np.int64
            if k == "bound":
                data[k] = v
            elif k not in self.zero_columns:
                data[k] = np.frombuffer(v, dtype=dtype)
            elif k == "replica" and self.replica:
                data[k] = np.full(n, self.replica, dtype=np.int64)
            else:
                data[k] = np.zeros(n, dtype=dtype)
        for names, packed, dtype in ((self.packed_int_columns, self.packed_ints, np.int64),
                                     (self.packed_float_columns, self.packed_floats,
                                      np.float64)):
            if names:
                rows = np.frombuffer(packed, dtype=dtype).reshape(n, len(names))
                data.update({name: rows[:, i] for i, name in enumerate(names)})
        # copy=False: the columns stay views of the log's arrays (no second copy of a
        # multi-million-step table); the log is not appended to once its table exists
        return pd.DataFrame(data, columns=list(STEP_COLUMNS), copy=False)


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


def request_table(seqs: list) -> pd.DataFrame:
    """One row per request, in id order, from the engine's final request states."""
    n = len(seqs)
    arr = {c: np.empty(n) for c in ("arrival_s", "first_scheduled_s", "first_token_s",
                                    "finish_s", "max_itl_s")}
    ints = {c: np.empty(n, dtype=np.int64) for c in ("id", "num_preemptions",
                                                     "num_prompt_tokens", "num_output_tokens",
                                                     "num_generated", "replica", "num_swaps",
                                                     "num_cached_tokens")}
    status, reason = [], []
    for i, s in enumerate(seqs):
        r = s.req
        ints["id"][i] = r.id
        arr["arrival_s"][i] = r.arrival_s
        arr["first_scheduled_s"][i] = s.first_scheduled_s
        arr["first_token_s"][i] = s.first_token_s
        arr["finish_s"][i] = s.finish_s
        arr["max_itl_s"][i] = s.max_itl_s
        ints["num_preemptions"][i] = s.num_preemptions
        ints["num_prompt_tokens"][i] = r.num_prompt_tokens
        ints["num_output_tokens"][i] = r.num_output_tokens
        ints["num_generated"][i] = s.num_generated
        ints["replica"][i] = s.replica
        ints["num_swaps"][i] = s.num_swaps
        ints["num_cached_tokens"][i] = s.num_cached_tokens
        status.append(s.status)
        reason.append(s.reason)
    return request_frame({**ints, **arr}, status, reason)


def request_frame(columns: dict[str, Any], status: list[str], reason: list[str]
                  ) -> pd.DataFrame:
    """The request table from per-request columns (the ids, times, counts of
    ``REQUEST_COLUMNS`` that are not derived), adding TTFT, TPOT and E2E."""
    df = pd.DataFrame({**columns, "status": status, "reason": reason})
    done = df["status"].to_numpy() == "finished"
    df["ttft_s"] = np.where(done, df["first_token_s"] - df["arrival_s"], np.nan)
    df["e2e_s"] = np.where(done, df["finish_s"] - df["arrival_s"], np.nan)
    n_out = df["num_output_tokens"].to_numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = (df["finish_s"] - df["first_token_s"]).to_numpy() / (n_out - 1)
    df["tpot_s"] = np.where(done & (n_out > 1), tpot, np.nan)
    return df[list(REQUEST_COLUMNS)]


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
        q = np.percentile(values, [50, 90, 99])
        return {"mean": values.mean() * 1e3, "median": q[0] * 1e3, "p90": q[1] * 1e3,
                "p99": q[2] * 1e3}
    # one multi-million-entry array after another: the caller holds no reference to these.
    # The mean is taken in the given order and the percentiles read values only, so the
    # order of tied values (an unstable sort's, ~3x faster than a stable one) changes nothing.
    out = {"mean": float((values * weights).sum() / weights.sum()) * 1e3}
    order = np.argsort(values, kind="quicksort")
    v = values[order]
    del values
    w = weights[order]
    del weights, order
    cum = np.cumsum(w)  # integer counts stay exact; float weights as given
    total = cum[-1]
    # Inverted-CDF percentile of the weighted sample: identical to expanding the counts.
    for name, p in (("median", 50), ("p90", 90), ("p99", 99)):
        pos = p / 100 * (total - 1)
        lo = int(np.searchsorted(cum, np.floor(pos) + 1))
        hi = int(np.searchsorted(cum, np.ceil(pos) + 1))
        frac = pos - np.floor(pos)
        out[name] = float(v[lo] + (v[hi] - v[lo]) * frac) * 1e3
    return out


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


def summarize(requests: pd.DataFrame, steps: pd.DataFrame, irregular_itl: Any, *,
              peak_flops: float | None, peak_bytes_per_s: float | None,
              slot_capacity: int | None, num_replicas: int, kv_total_blocks: int | None,
              warmup_s: float = 0.0, cooldown_s: float = 0.0,
              slos: dict[str, float] | None = None,
              kv_block_size: int | None = None) -> dict[str, float]:
    """The summary columns (each defined in docs/metrics.md).

    Requests are counted when they arrive inside [first arrival + ``warmup_s``, last arrival −
    ``cooldown_s``]; steps when they start inside the same window, and irregular inter-token
    gaps (``(gaps, token times)``) when their token comes inside it. ``duration`` runs from
    the window's first arrival to its last finish. ``irregular_itl`` is a list of gaps, or
    ``(gaps, token times)``, or ``(gaps, token times, counts)`` (run-length encoded).
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
    if len(steps) and win["status"].isin(["waiting", "running"]).any():
        # Cut short (horizon or wall-clock budget): the run lasted until its last step ended,
        # and that busy time must sit inside the duration.
        last = steps["start_s"].to_numpy(float) + steps["duration_s"].to_numpy(float)
        end = max(end, float(last.max()))
    duration = max(end - (float(win["arrival_s"].min()) if len(win) else 0.0), 0.0)
    st = steps
    if len(steps):
        inside = (steps["start_s"] >= t0) & (steps["start_s"] <= end)
        if not inside.all():  # a copy only when a warm-up or cool-down cuts steps out
            st = steps[inside]
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
    s.update(_latency_stats(done, st, gaps, at, counts, len(steps) > 0, t0, end))
    # each block's per-step temporaries are freed before the next (a 5M-step run's column
    # is 40 MB; all of them at once would double the run's peak memory)
    s.update(_step_metrics(st, win, duration * num_replicas, peak_flops, peak_bytes_per_s,
                           slot_capacity, kv_total_blocks))
    s.update(kv_summary(win, done, st, kv_total_blocks, kv_block_size))
    s["num_steps"] = int(len(st))
    if slos:
        s.update(slo_attainment(done, len(win), slos, per))
    return s


def _latency_stats(done: pd.DataFrame, st: pd.DataFrame, gaps: np.ndarray,
                   at: np.ndarray | None, counts: np.ndarray | None, any_steps: bool,
                   t0: float, end: float) -> dict[str, float]:
    """Mean, median, p90, p99 of TTFT, TPOT, ITL and E2E latency in milliseconds."""
    out = {}
    for metric in LATENCIES:
        if metric == "itl":  # passed on unnamed, so _stats can free each array it is done with
            stats = _stats(*_windowed_itl(st, gaps, at, counts, any_steps, t0, end))
        else:
            stats = _stats(done[f"{metric if metric != 'e2el' else 'e2e'}_s"].to_numpy(float))
        for stat, v in stats.items():
            out[f"{stat}_{metric}_ms"] = float(v)
    return out


def _step_metrics(st: pd.DataFrame, win: pd.DataFrame, span: float, peak_flops: float | None,
                  peak_bytes_per_s: float | None, slot_capacity: int | None,
                  kv_total_blocks: int | None) -> dict[str, float]:
    """Busy fraction, MFU, MBU, slot use, padding, batch size and KV usage of the steps in
    the window; ``span`` is the window's duration × replicas."""
    s: dict[str, float] = {}
    dur = st["duration_s"].to_numpy(float)
    busy = float(dur.sum())
    s["busy_fraction"] = busy / span if span > 0 else float("nan")
    real_tok = (st["num_prefill_tokens"] + st["num_decode_tokens"]).to_numpy(float)
    pad_tok = st["num_padding_tokens"].to_numpy(float)
    all_tok = real_tok + pad_tok
    useful = np.divide(real_tok, all_tok, out=np.zeros_like(real_tok), where=all_tok > 0)
    del real_tok
    flops = float((st["flops"].to_numpy(float) * useful).sum())
    del useful
    s["mfu"] = flops / (span * peak_flops) if peak_flops and span > 0 else float("nan")
    nbytes = float(st["bytes"].to_numpy(float).sum())
    s["mbu"] = nbytes / (span * peak_bytes_per_s) if peak_bytes_per_s and span > 0 \
        else float("nan")
    s["padding_fraction"] = float(pad_tok.sum() / all_tok.sum()) if all_tok.sum() > 0 else 0.0
    del pad_tok, all_tok
    rows = st["num_seqs"].to_numpy(float)
    pad_rows = st["num_padding_rows"].to_numpy(float)
    slots = slot_capacity if slot_capacity else np.maximum(rows + pad_rows, 1)
    del pad_rows
    s["slot_utilization"] = float((dur * rows / slots).sum() / busy) if busy > 0 \
        else float("nan")
    del slots
    s["mean_batch_size"] = float(rows.mean()) if len(rows) else 0.0
    del rows
    s["num_preemptions"] = int(win["num_preemptions"].sum())
    s["max_kv_usage"] = (float(st["kv_used_blocks"].max()) / kv_total_blocks
                         if kv_total_blocks and len(st) else float("nan"))
    s["mean_kv_usage"] = (float((st["kv_used_blocks"].to_numpy(float) * dur).sum() / busy)
                          / kv_total_blocks if kv_total_blocks and busy > 0 else float("nan"))
    return s


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
