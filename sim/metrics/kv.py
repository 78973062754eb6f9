"""Summary metrics of the KV cache: how well memory is used, and what preemption costs.

Computed from the per-step columns the engine logs (``kv_used_blocks``, ``kv_live_tokens``,
``kv_cached_blocks``, ``num_recomputed_tokens``, ``swap_s``, ``swapped_bytes``) and the
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


def _time_lost(steps: pd.DataFrame, dur: np.ndarray) -> float:
    """``preemption_time_lost_s``: swap transfer time plus each step's compute time × the
    share of its tokens that were recomputed."""
    swap_s = _col(steps, "swap_s")
    tokens = (_col(steps, "num_prefill_tokens") + _col(steps, "num_decode_tokens")
              + _col(steps, "num_padding_tokens"))
    recomputed = _col(steps, "num_recomputed_tokens")
    share = np.divide(recomputed, tokens, out=np.zeros_like(tokens), where=tokens > 0)
    del tokens, recomputed
    return float(swap_s.sum() + ((dur - swap_s) * share).sum())


def kv_summary(win: pd.DataFrame, done: pd.DataFrame, steps: pd.DataFrame,
               total_blocks: int | None, block_size: int | None) -> dict[str, float]:
    """KV metrics over the requests in the window (``win``, ``done``) and its steps."""
    dur = _col(steps, "duration_s")
    out: dict[str, float] = {
        "num_swaps": int(_col(win, "num_swaps").sum()),
        "swapped_bytes": float(_col(steps, "swapped_bytes").sum()),
        "preemption_time_lost_s": _time_lost(steps, dur),
        "max_num_preemptions": int(_col(win, "num_preemptions").max()) if len(win) else 0,
    }
    prompt = _col(done, "num_prompt_tokens").sum()
    out["prefix_hit_rate"] = float(_col(done, "num_cached_tokens").sum() / prompt) \
        if prompt > 0 else NAN
    if block_size and len(steps):
        live = _col(steps, "kv_live_tokens")
        slots = _col(steps, "kv_used_blocks") * block_size
        held = float((dur * slots).sum())
        out["mean_kv_live_fraction"] = float((dur * live).sum()) / held if held > 0 else NAN
        busy = float(dur.sum())
        slots -= live  # empty token slots, in place: one 5M-step column less held at once
        out["kv_internal_fragmentation"] = (
            float((dur * slots).sum()) / (busy * total_blocks * block_size)
            if total_blocks and busy > 0 else NAN)
    else:
        out["mean_kv_live_fraction"] = out["kv_internal_fragmentation"] = NAN
    return out
