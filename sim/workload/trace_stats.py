"""Trace statistics: size, span, arrival rate, burstiness and length percentiles.

Used by ``batchsim trace-stats`` and by anyone checking what a workload looks like before
simulating it.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from sim.core.arrays import TraceArrays
from sim.core.types import Request


def trace_stats(requests: Sequence[Request] | TraceArrays) -> dict[str, float]:
    """Summary of a workload: size, span, rates, burstiness and length percentiles.

    ``mean_rate_per_s`` is ``(count - 1) / span_s`` (one over the mean interarrival gap, the
    quantity ``rate:`` scaling targets); ``peak_per_min`` counts arrivals in 60 s bins from the
    first arrival; ``interarrival_cv`` is std/mean of the gaps (1 for Poisson, >1 bursty).
    Percentiles interpolate linearly.
    """
    tr = requests if isinstance(requests, TraceArrays) else TraceArrays.from_requests(requests)
    n, t = len(tr), tr.arrival_s
    nan = float("nan")
    st: dict[str, float] = {"count": n, "span_s": float(t[-1] - t[0]) if n else nan}
    gaps = np.diff(t)
    st["mean_rate_per_s"] = (n - 1) / st["span_s"] if n > 1 and st["span_s"] > 0 else nan
    st["peak_per_min"] = int(np.bincount(((t - t[0]) // 60).astype(np.int64)).max()) if n else 0
    st["interarrival_cv"] = float(gaps.std() / gaps.mean()) if n > 1 and gaps.mean() > 0 else nan
    for name, v in (("prompt", tr.num_prompt_tokens), ("output", tr.num_output_tokens)):
        if n:
            q = np.percentile(v, [50, 90, 99])
            st |= {f"{name}_mean": float(v.mean()), f"{name}_median": float(q[0]),
                   f"{name}_p90": float(q[1]), f"{name}_p99": float(q[2]),
                   f"{name}_max": int(v.max())}
        else:
            st |= {f"{name}_{k}": nan for k in ("mean", "median", "p90", "p99", "max")}
    return st


def format_trace_stats(stats: Mapping[str, float], title: str | None = None) -> str:
    """Human-readable table of ``trace_stats`` output for ``batchsim trace-stats``."""
    # A rate and a gap spread need two arrivals at different times; a trace of one request (or
    # of requests all at one instant) is valid input, so say why there is no number, not "nan".
    why = ("n/a (one request)" if stats["count"] < 2
           else "n/a (every request arrives at the same time)")
    rate, cv = stats["mean_rate_per_s"], stats["interarrival_cv"]
    lines = [title] if title else []
    lines += [f"requests         {stats['count']:,}",
              f"span             {stats['span_s']:.1f} s",
              f"mean rate        {why if math.isnan(rate) else f'{rate:.3f} req/s'}",
              f"peak per minute  {stats['peak_per_min']:,}",
              f"interarrival cv  {why if math.isnan(cv) else f'{cv:.3f}'}",
              "tokens           mean     median   p90      p99      max"]
    for name in ("prompt", "output"):
        lines.append(f"  {name:<15}" + " ".join(
            f"{stats[f'{name}_{k}']:<8.1f}" for k in ("mean", "median", "p90", "p99"))
            + f" {stats[f'{name}_max']:g}")
    return "\n".join(lines)
