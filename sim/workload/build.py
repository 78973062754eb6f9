"""Build the request list of an experiment from its ``workload:`` YAML block.

Three forms, plus ``conversations:`` (multi-turn sessions), told apart by their keys (full
schema in ``traces/README.md``):

* trace replay — ``trace:`` plus optional ``sort, start_s, duration_s, max_requests,
  rate | time_scale, max_prompt_tokens, max_output_tokens``;
* synthetic — ``arrival:`` plus ``num_requests`` and/or ``duration_s`` and either
  ``prompt_tokens`` + ``output_tokens`` or a joint ``lengths``;
* ``mix:`` — a list of sources. Without a top-level ``arrival`` each item is a full workload
  (its own trace or arrival process) and the streams are superposed in time; with a
  top-level ``arrival`` each item has a ``fraction`` and lengths, and every arrival takes its
  lengths from one item drawn with those probabilities.

Every form accepts ``tenant`` and ``priority`` (stamped on its requests). Bad specs raise
``WorkloadError`` naming the dotted key. Output: requests sorted by arrival, ids ``0..n-1``;
the same spec and seed give the same list (sub-streams come from ``rng.spawn``).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from sim.core.arrays import TraceArrays, tuple_column
from sim.core.blocks import HASH_BLOCK_TOKENS
from sim.core.errors import InputError
from sim.core.fields import check_int, is_real, unknown_key
from sim.core.types import Request
from sim.workload import synthetic
from sim.workload.limits import MAX_CV, MAX_PRIORITY, MAX_RATE, MAX_REQUESTS, MAX_SIGMA, MIN_CV
from sim.workload.traces import (
    MAX_ARRIVAL_S,
    MAX_TOKENS,
    TraceError,
    load_trace_arrays,
)

_COMMON = {"tenant", "priority"}
_TRACE_KEYS = {"trace", "sort", "start_s", "duration_s", "max_requests", "rate", "time_scale",
               "max_prompt_tokens", "max_output_tokens"} | _COMMON
_SYNTH_KEYS = {"arrival", "num_requests", "duration_s", "prompt_tokens", "output_tokens",
               "lengths"} | _COMMON
_MIX_KEYS = {"mix", "arrival", "num_requests", "duration_s", "max_requests"} | _COMMON
_SOURCE_KEYS = {"fraction", "trace", "prompt_tokens", "output_tokens", "lengths"} | _COMMON
_DIST_KEYS = {"fixed": {"value"}, "uniform": {"lo", "hi"}, "lognormal": {"mean", "median", "sigma"},
              "exponential": {"mean"}, "empirical": {"trace"}}



class WorkloadError(InputError):
    """An invalid workload spec; the message starts with the dotted key at fault."""


def build_workload(spec: Mapping[str, Any], rng: np.random.Generator,
                   base_dir: Path | None = None) -> list[Request]:
    """Requests for the ``workload:`` block ``spec`` (paths relative to ``base_dir``)."""
    return build_workload_arrays(spec, rng, base_dir).to_requests()


def build_workload_arrays(spec: Mapping[str, Any], rng: np.random.Generator,
                          base_dir: Path | None = None, where: str = "workload") -> TraceArrays:
    """Columnar form of ``build_workload`` (sorted by arrival), for large or derived workloads."""
    s = _Spec(spec, where, base_dir)
    if "conversations" in spec:
        s.only({"conversations"} | _COMMON)
        from sim.workload.conversations import ConversationError, conversations

        try:
            arr = TraceArrays.from_requests(conversations(spec["conversations"], rng))
        except ConversationError as exc:
            raise WorkloadError(str(exc)) from None
        return _stamp(s, arr.take(np.argsort(arr.arrival_s, kind="stable")))
    if "mix" in spec:
        out = _mix(s, rng)
    elif "trace" in spec:
        out = _trace(s)
    elif "arrival" in spec:
        out = _synthetic(s, rng)
    else:
        raise WorkloadError(f"{where}: needs one of 'trace', 'arrival' or 'mix'")
    return _stamp(s, out)


class _Spec:
    """A mapping plus its dotted path; typed getters raise ``WorkloadError`` with the key."""

    def __init__(self, spec: Any, where: str, base_dir: Path | None) -> None:
        if not isinstance(spec, Mapping):
            raise WorkloadError(f"{where}: must be a mapping, got {type(spec).__name__}")
        self.d, self.where, self.base_dir = spec, where, base_dir

    def key(self, k: str) -> str:
        """Dotted path of key ``k``."""
        return f"{self.where}.{k}"

    def only(self, allowed: set[str]) -> None:
        """Reject keys outside ``allowed``, listing what is accepted."""
        for k in self.d:
            if k not in allowed:  # the one unknown-key message, with its close-match hint
                e = unknown_key(str(k), sorted(allowed), self.key(str(k)))
                raise WorkloadError(e.problem, field=e.field)

    def num(self, k: str, default: Any = None, *, lo: float | None = None, lo_open: bool = False,
            integer: bool = False, required: bool = False, hi: float | None = None) -> Any:
        """A number (int if ``integer``) within optional bounds, or ``default``."""
        v = self.d.get(k)
        if v is None:
            if required:
                raise WorkloadError(f"{self.key(k)}: required")
            return default
        if integer:  # ``sim.core.fields``' one integer rule: 64.0 is refused as everywhere
            try:
                v = check_int(v, self.key(k), bounded=hi is not None)
            except InputError as e:
                raise WorkloadError(e.problem, field=e.field) from None
        elif not (is_real(v) and math.isfinite(v)):  # the same rule: numpy counts
            raise WorkloadError(f"{self.key(k)}: must be a finite number, got {v!r}")
        if lo is not None and (v <= lo if lo_open else v < lo):
            raise WorkloadError(f"{self.key(k)}: must be {'>' if lo_open else '>='} {lo:g}, "
                                f"got {v!r}")
        if hi is not None and v > hi:
            raise WorkloadError(f"{self.key(k)}: must be <= {hi:g}, got {v!r}")
        return int(v) if integer else float(v)

    def tokens(self, k: str, default: Any = None, *, lo: int = 1, required: bool = False
               ) -> Any:
        """A token count in ``[lo, MAX_TOKENS]``."""
        return self.num(k, default, lo=lo, integer=True, required=required, hi=MAX_TOKENS)

    def text(self, k: str, default: str | None = None) -> str | None:
        """A string value, or ``default``."""
        v = self.d.get(k, default)
        if v is not None and not isinstance(v, str):
            raise WorkloadError(f"{self.key(k)}: must be a string, got {v!r}")
        return v

    def sub(self, k: str) -> _Spec:
        """The nested mapping under ``k``."""
        return _Spec(self.d.get(k), self.key(k), self.base_dir)

    def load(self, k: str, **kw: Any) -> TraceArrays:
        """Load the trace named by key ``k``, re-raising trace problems under that key."""
        name = self.text(k)
        if not name:
            raise WorkloadError(f"{self.key(k)}: required (a built-in name or a file path)")
        try:
            return load_trace_arrays(name, self.base_dir, **kw)
        except TraceError as exc:
            raise WorkloadError(f"{self.key(k)}: {exc}") from None


def _trace(s: _Spec) -> TraceArrays:
    """Trace replay: window in the trace's own clock, first N, then time-scale."""
    s.only(_TRACE_KEYS)
    sort = s.d.get("sort", False)
    if not isinstance(sort, bool):
        raise WorkloadError(f"{s.key('sort')}: must be true or false, got {sort!r}")
    tr = s.load("trace", sort=sort)
    start = s.num("start_s", 0.0, lo=0)
    dur = s.num("duration_s", None, lo=0, lo_open=True)
    t = tr.arrival_s - tr.arrival_s[0] - start  # window start becomes time 0
    keep = (t >= 0) & (t < dur if dur is not None else True)
    tr = tr.take(keep).with_arrivals(t[keep])
    n_max = s.num("max_requests", None, lo=1, integer=True)
    if n_max is not None:
        tr = tr.take(slice(0, n_max))
    if len(tr) == 0:
        raise WorkloadError(f"{s.key('start_s')}: the time window selects no requests")
    rate, scale = s.num("rate", None, lo=0, lo_open=True), s.num("time_scale", None, lo=0,
                                                                   lo_open=True)
    if rate is not None and scale is not None:
        raise WorkloadError(f"{s.key('rate')}: give rate or time_scale, not both")
    if rate is not None:
        span = float(tr.arrival_s[-1] - tr.arrival_s[0])
        if len(tr) < 2 or span <= 0:
            raise WorkloadError(f"{s.key('rate')}: needs at least two distinct arrival times")
        scale = ((len(tr) - 1) / span) / rate  # mean rate = (n-1)/span, i.e. 1/mean gap
    if scale is not None:
        with np.errstate(over="ignore"):  # an overflow to inf is refused just below
            tr = tr.with_arrivals(tr.arrival_s * scale)
        if tr.arrival_s[-1] > MAX_ARRIVAL_S:
            raise WorkloadError(f"{s.key('rate' if rate is not None else 'time_scale')}: "
                                f"arrivals reach {tr.arrival_s[-1]:.3g} s, beyond "
                                f"{MAX_ARRIVAL_S:.0e} s")
    prompt = _cap(tr.num_prompt_tokens, s.tokens("max_prompt_tokens"))
    prefix, hids = tr.num_prefix_tokens, tr.hash_ids
    if hids is not None and prompt is not tr.num_prompt_tokens:  # capped: ids past it go too
        most = (-(-prompt // HASH_BLOCK_TOKENS)).tolist()
        hids = tuple_column([h[:k] for h, k in zip(hids.tolist(), most, strict=True)])
    return replace(tr, num_prompt_tokens=prompt,
                   num_output_tokens=_cap(tr.num_output_tokens, s.tokens("max_output_tokens")),
                   num_prefix_tokens=None if prefix is None else np.minimum(prefix, prompt),
                   hash_ids=hids)


def _cap(v: np.ndarray, hi: int | None) -> np.ndarray:
    return v if hi is None else np.minimum(v, hi)


def _arrivals(s: _Spec, rng: np.random.Generator) -> np.ndarray:
    """Arrival times from ``arrival`` + ``num_requests`` / ``duration_s``."""
    a = s.sub("arrival")
    a.only({"process", "rate", "cv"})
    proc = a.text("process", "poisson")
    if proc not in synthetic.ARRIVAL_PROCESSES:
        raise WorkloadError(f"{a.key('process')}: unknown process {proc!r}; choose from "
                            f"{', '.join(synthetic.ARRIVAL_PROCESSES)}")
    rate = a.num("rate", lo=0, lo_open=True, required=True, hi=MAX_RATE)
    cv = a.num("cv", 1.0, lo=MIN_CV, hi=MAX_CV)
    if "cv" in a.d and proc != "gamma":
        raise WorkloadError(f"{a.key('cv')}: only for process: gamma")
    n = s.num("num_requests", None, lo=1, integer=True, hi=MAX_REQUESTS)
    dur = s.num("duration_s", None, lo=0, lo_open=True, hi=MAX_ARRIVAL_S)
    if n is None and dur is None:
        raise WorkloadError(f"{s.key('num_requests')}: give num_requests and/or duration_s")
    if n is None and rate * dur > MAX_REQUESTS:
        raise WorkloadError(f"{s.key('duration_s')}: rate x duration_s = {rate * dur:.3g} "
                            f"requests, more than {MAX_REQUESTS:,}; give num_requests")
    t = synthetic.arrival_times(proc, rate, rng, num_requests=n, duration_s=dur, cv=cv)
    if t.size == 0:
        raise WorkloadError(f"{s.key('duration_s')}: too short for any arrival")
    if t[-1] > MAX_ARRIVAL_S:
        raise WorkloadError(f"{a.key('rate')}: arrivals reach {t[-1]:.3g} s, beyond "
                            f"{MAX_ARRIVAL_S:.0e} s where float time loses step precision")
    return t


def _lengths(s: _Spec, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Prompt and output lengths: joint ``lengths``, or ``prompt_tokens`` + ``output_tokens``."""
    r1, r2 = rng.spawn(2)
    if "lengths" in s.d:
        if "prompt_tokens" in s.d or "output_tokens" in s.d:
            raise WorkloadError(f"{s.key('lengths')}: give lengths or prompt_tokens/"
                                "output_tokens, not both")
        j = s.sub("lengths")
        j.only({"dist", "trace", "max_prompt_tokens", "max_output_tokens"})
        if j.d.get("dist", "empirical") != "empirical":
            raise WorkloadError(f"{j.key('dist')}: joint lengths support only 'empirical'")
        tr = j.load("trace", lengths_only=True)
        p, o = synthetic.empirical_pairs(tr.num_prompt_tokens, tr.num_output_tokens, n, r1)
        return (synthetic.clamp_tokens(p, 1, j.tokens("max_prompt_tokens")),
                synthetic.clamp_tokens(o, 1, j.tokens("max_output_tokens")))
    for k in ("prompt_tokens", "output_tokens"):
        if k not in s.d:
            raise WorkloadError(f"{s.key(k)}: required (or give a joint 'lengths')")
    return _dist(s.sub("prompt_tokens"), n, r1, 0), _dist(s.sub("output_tokens"), n, r2, 1)


def _dist(d: _Spec, n: int, rng: np.random.Generator, column: int) -> np.ndarray:
    """One length distribution; ``column`` picks prompt (0) or output (1) for ``empirical``."""
    kind = d.text("dist")
    if kind not in _DIST_KEYS:
        raise WorkloadError(f"{d.key('dist')}: must be one of {', '.join(_DIST_KEYS)}, "
                            f"got {kind!r}")
    d.only(_DIST_KEYS[kind] | {"dist", "min", "max"})
    lo = d.tokens("min", 1)
    hi = d.tokens("max", None, lo=lo)
    if kind == "fixed":
        v = synthetic.fixed(d.tokens("value", required=True), n)
    elif kind == "uniform":
        a = d.tokens("lo", required=True)
        b = d.tokens("hi", lo=a, required=True)
        v = synthetic.uniform(a, b, n, rng)
    elif kind == "lognormal":
        mean, med = d.num("mean", lo=0, lo_open=True), d.num("median", lo=0, lo_open=True)
        if (mean is None) == (med is None):
            raise WorkloadError(f"{d.key('mean')}: give exactly one of mean or median")
        v = synthetic.lognormal(n, rng, sigma=d.num("sigma", lo=0, required=True,
                                                        hi=MAX_SIGMA),
                                mean=mean, median=med)
    elif kind == "exponential":
        v = synthetic.exponential(d.num("mean", lo=0, lo_open=True, required=True), n, rng)
    else:
        tr = d.load("trace", lengths_only=True)
        v = synthetic.empirical(tr.num_output_tokens if column else tr.num_prompt_tokens, n, rng)
    return synthetic.clamp_tokens(v, lo, hi)


def _synthetic(s: _Spec, rng: np.random.Generator) -> TraceArrays:
    """Arrival process + length distributions, each on its own sub-stream."""
    s.only(_SYNTH_KEYS)
    ra, rl = rng.spawn(2)
    t = _arrivals(s, ra)
    p, o = _lengths(s, t.size, rl)
    return TraceArrays(t, p, o, source="synthetic")


def _mix(s: _Spec, rng: np.random.Generator) -> TraceArrays:
    """Superpose full workloads, or split one arrival stream among sources by fraction."""
    s.only(_MIX_KEYS)
    items = s.d["mix"]
    if not isinstance(items, Sequence) or isinstance(items, str) or not items:
        raise WorkloadError(f"{s.key('mix')}: must be a non-empty list of sources")
    subs = [_Spec(it, f"{s.key('mix')}[{i}]", s.base_dir) for i, it in enumerate(items)]
    rngs = rng.spawn(len(subs) + 2)
    if "arrival" not in s.d:
        for k in ("num_requests",):
            if k in s.d:
                raise WorkloadError(f"{s.key(k)}: only with a top-level arrival")
        parts = []
        for sub, r in zip(subs, rngs, strict=False):
            if "fraction" in sub.d:
                raise WorkloadError(f"{sub.key('fraction')}: fractions need a top-level arrival"
                                    "; without one, give each source its own rate")
            parts.append(build_workload_arrays(sub.d, r, s.base_dir, sub.where))
        out = _concat(parts)
        dur = s.num("duration_s", None, lo=0, lo_open=True)
        if dur is not None:
            out = out.take(out.arrival_s < dur)
    else:
        t = _arrivals(s, rngs[-1])
        fr = []
        for sub in subs:
            sub.only(_SOURCE_KEYS)
            fr.append(sub.num("fraction", lo=0, lo_open=True, required=True))
        if abs(sum(fr) - 1) > 1e-6:
            raise WorkloadError(f"{s.key('mix')}: fractions must sum to 1, got {sum(fr):g}")
        which = rngs[-2].choice(len(subs), size=t.size, p=np.asarray(fr) / sum(fr))
        p, o = np.empty(t.size, np.int64), np.empty(t.size, np.int64)
        parts = []
        for i, (sub, r) in enumerate(zip(subs, rngs, strict=False)):
            mask = which == i
            if "trace" in sub.d:
                if "lengths" in sub.d or "prompt_tokens" in sub.d:
                    raise WorkloadError(f"{sub.key('trace')}: give trace or lengths, not both")
                tr = sub.load("trace", lengths_only=True)
                p[mask], o[mask] = synthetic.empirical_pairs(
                    tr.num_prompt_tokens, tr.num_output_tokens, int(mask.sum()), r)
            else:
                p[mask], o[mask] = _lengths(sub, int(mask.sum()), r)
            parts.append(_stamp(sub, TraceArrays(t[mask], p[mask], o[mask])))
        out = _concat(parts)  # stable merge: equal times keep source order
    n_max = s.num("max_requests", None, lo=1, integer=True)
    return out.take(slice(0, n_max)) if n_max is not None else out


def _concat(parts: list[TraceArrays]) -> TraceArrays:
    """Merge sources into one stream sorted by arrival (ties: earlier source first)."""
    n = [len(p) for p in parts]

    def col(name: str, fill: Any, dtype: Any) -> np.ndarray | None:
        cols = [getattr(p, name) for p in parts]
        if all(c is None for c in cols):
            return None
        return np.concatenate([np.full(k, fill, dtype) if c is None else c.astype(dtype)
                               for c, k in zip(cols, n, strict=True)])

    merged = TraceArrays(np.concatenate([p.arrival_s for p in parts]),
                         np.concatenate([p.num_prompt_tokens for p in parts]),
                         np.concatenate([p.num_output_tokens for p in parts]),
                         col("priority", 0, np.int64), col("tenant", None, object),
                         col("prefix_id", None, object), "mix",
                         col("num_prefix_tokens", 0, np.int64),
                         None if all(p.hash_ids is None for p in parts) else tuple_column(
                             [h for p in parts for h in (p.hash_ids.tolist()
                                                         if p.hash_ids is not None
                                                         else [()] * len(p))]))
    return merged.take(np.argsort(merged.arrival_s, kind="stable"))


def _stamp(s: _Spec, tr: TraceArrays) -> TraceArrays:
    """Fill the spec's ``tenant`` / ``priority`` into requests that do not set their own.

    A trace's own columns and a mix source's labels win over an enclosing spec's labels.
    """
    tenant = s.text("tenant")
    prio = s.num("priority", None, integer=True, lo=-MAX_PRIORITY, hi=MAX_PRIORITY)
    ten, pri = tr.tenant, tr.priority
    if tenant is not None:
        ten = np.full(len(tr), None, object) if ten is None else ten.copy()
        # elementwise ``== None`` over an object array; numpy's stubs refuse a None operand
        ten[np.equal(ten, None)] = tenant  # type: ignore[call-overload]
    if prio is not None and pri is None:
        pri = np.full(len(tr), prio, np.int64)
    return replace(tr, priority=pri, tenant=ten)
