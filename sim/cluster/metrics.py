"""Cluster metrics: how evenly the router spread the load, and a summary per replica.

- ``imbalance_max_mean``: at each routing instant, the most outstanding requests on any
  replica divided by the mean over replicas, averaged over the instants where the mean is
  positive (1.0 is perfect balance; N means one replica holds everything).
- ``imbalance_cv``: the coefficient of variation (std / mean) of the replicas' busy time.
- ``replicas`` table: per replica, requests routed and finished, busy seconds, mean and p99
  TTFT and E2E latency in ms.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from sim.cluster.routed import RoutingLog
from sim.metrics.stream import is_bucketed


def _busy_column(steps: pd.DataFrame) -> str:
    """The busy seconds of a step table's rows: each step's duration, or a bucket's sum of
    them (``metrics.step_table: buckets``, where it read a ``duration_s`` column that bucketed
    tables do not have)."""
    return "duration_s_sum" if is_bucketed(steps) else "duration_s"


def imbalance(log: RoutingLog, steps: pd.DataFrame, num_replicas: int) -> dict[str, float]:
    """The two imbalance metrics of a routed run."""
    out = np.asarray(log.outstanding, dtype=float).reshape(-1, num_replicas)
    mean = out.mean(axis=1) if len(out) else np.empty(0)
    busy_rows = mean > 0
    ratio = (out[busy_rows].max(axis=1) / mean[busy_rows]).mean() if busy_rows.any() else 1.0
    busy = np.zeros(num_replicas)
    if len(steps):
        np.add.at(busy, steps["replica"].to_numpy(), steps[_busy_column(steps)].to_numpy())
    cv = float(busy.std() / busy.mean()) if busy.mean() > 0 else 0.0
    return {"imbalance_max_mean": float(ratio), "imbalance_cv": cv}


def per_replica(requests: pd.DataFrame, steps: pd.DataFrame, num_replicas: int) -> pd.DataFrame:
    """One row per replica: requests, finished, busy seconds, mean/p99 TTFT and E2E (ms)."""
    rows: list[dict[str, Any]] = []
    for k in range(num_replicas):
        mine = requests[requests["replica"] == k]
        done = mine[mine["status"] == "finished"]
        busy = (float(steps.loc[steps["replica"] == k, _busy_column(steps)].sum())
                if len(steps) else 0.0)
        row: dict[str, Any] = {"replica": k, "num_requests": len(mine),
                               "completed": len(done), "busy_s": busy}
        for name, col in (("ttft", "ttft_s"), ("e2el", "e2e_s")):
            values = done[col].dropna().to_numpy()
            row[f"mean_{name}_ms"] = float(values.mean() * 1e3) if values.size else np.nan
            row[f"p99_{name}_ms"] = (float(np.percentile(values, 99) * 1e3) if values.size
                                     else np.nan)
        rows.append(row)
    return pd.DataFrame(rows)
