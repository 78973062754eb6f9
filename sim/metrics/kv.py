"""Summary metrics of the KV cache: how well memory is used, and what preemption costs.

Computed from sums over the per-step columns the engine logs (``kv_used_blocks``,
``kv_live_tokens``, ``kv_cached_blocks``, ``num_recomputed_tokens``, ``swap_s``,
``swapped_bytes``; the sums are ``sim.metrics.stream.step_sums``) and the
per-request ``num_preemptions``, ``num_swaps``, ``num_cached_tokens``. Definitions (one line
each, also in docs/metrics.md):

- ``mean_kv_live_fraction``: time-weighted tokens stored / token slots held (blocks in use ×
  block size) — how much of the memory a layout holds stores KV.
- ``kv_internal_fragmentation``: time-weighted token slots held but empty / all token slots
  of the cache — the share of the whole KV cache a layout wastes inside its allocations.
- ``num_swaps``, ``swapped_bytes``: swap-outs, and bytes moved over PCIe both ways.
- ``preemption_time_lost_s``: step time spent on swap transfers plus, for recompute, each
  step's compute time × (recomputed tokens / tokens of the step).
- ``max_num_preemptions``: the most times one request was preempted.
- ``prefix_hit_rate``: prompt tokens found in the prefix cache / prompt tokens, over completed
  requests.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

NAN = float("nan")


def _col(df: pd.DataFrame, name: str) -> np.ndarray:
    """A column as floats, zeros when an older table lacks it."""
    return df[name].to_numpy(float) if name in df else np.zeros(len(df))


def kv_summary(win: pd.DataFrame, done: pd.DataFrame, sums: dict[str, float], num_steps: int,
               total_blocks: int | None, block_size: int | None) -> dict[str, float]:
    """KV metrics over the requests in the window (``win``, ``done``) and its steps (their
    ``sim.metrics.stream.step_sums``)."""
    out: dict[str, float] = {
        "num_swaps": int(_col(win, "num_swaps").sum()),
        "swapped_bytes": float(sums["swapped_bytes"]),
        # swap transfer time plus each step's compute time × its share of recomputed tokens
        "preemption_time_lost_s": float(sums["swap_s"] + sums["recompute_s"]),
        "max_num_preemptions": int(_col(win, "num_preemptions").max()) if len(win) else 0,
    }
    prompt = _col(done, "num_prompt_tokens").sum()
    out["prefix_hit_rate"] = float(_col(done, "num_cached_tokens").sum() / prompt) \
        if prompt > 0 else NAN
    if block_size and num_steps:
        held = sums["held_token_s"]
        out["mean_kv_live_fraction"] = sums["live_token_s"] / held if held > 0 else NAN
        busy = sums["busy_s"]
        out["kv_internal_fragmentation"] = (
            sums["empty_token_s"] / (busy * total_blocks * block_size)
            if total_blocks and busy > 0 else NAN)
    else:
        out["mean_kv_live_fraction"] = out["kv_internal_fragmentation"] = NAN
    return out
