"""Keys an experiment sets that none of its runs reads: one error naming the file and the key.

A value accepted but read by nothing (``cost.step_s`` under the roofline cost model,
``kv.num_blocks`` beside ``kv.unlimited: true``, ``kv.reserve_tokens`` without the slab
allocator) was silently ignored. Each block says which of its keys a run does not read
(``unused_cost_keys`` here, ``sim.kv.config.unused_kv_keys`` for ``kv``) and whether that
contradicts what is set beside it; a key unused by every run is then an error (contradictory)
or a one-line note on stderr (harmless). A key that some runs of a sweep read (``reserve_tokens``
beside ``sweep: {kv.allocator: [slab, paged]}``) is fine: the other runs leave it out.
"""
from __future__ import annotations

from typing import Any

from sim.core.fields import Unused, set_off_default
from sim.experiments.intervals import INTERVAL_FIELDS
from sim.experiments.schema import SCHEMA
from sim.kv.config import unused_kv_keys

#: The cost keys each ``cost.kind`` reads (``kind`` itself aside); the other kinds' are unused.
COST_KIND_KEYS: dict[str, tuple[str, ...]] = {
    "roofline": ("weight_dtype", "kv_dtype"),
    "constant": ("step_s",),
    "linear": ("base_s", "per_token_s", "per_seq_s"),
}


def unused_cost_keys(block: dict[str, Any]) -> list[Unused]:
    """The keys of a ``cost`` block set off their default that its ``kind`` does not read."""
    fields = SCHEMA["cost"]
    kind = block.get("kind", fields["kind"].default)
    return [Unused(f"cost.{name}", block[name], f"only cost.kind: {owner} reads it (cost.kind "
                   f"is {kind})")
            for owner, names in COST_KIND_KEYS.items() if owner != kind
            for name in names if set_off_default(block, fields, name)]


def unused_interval_keys(block: dict[str, Any]) -> list[Unused]:
    """``intervals.level`` without draws (``intervals.draws: 0``, no intervals): harmless, a
    note (a sweep of ``intervals.draws`` may have runs with and without intervals)."""
    if block.get("draws", INTERVAL_FIELDS["draws"].default) or not set_off_default(
            block, INTERVAL_FIELDS, "level"):
        return []
    return [Unused("intervals.level", block["level"], "intervals.draws is 0 (no prediction "
                   "intervals)", contradicts=False)]


def unused_keys(config: dict[str, Any]) -> list[Unused]:
    """The keys one run's validated config sets that the run does not read."""
    return (unused_cost_keys(config["cost"]) + unused_kv_keys(config["kv"])
            + unused_interval_keys(config["intervals"]))


def check_unused(configs: list[dict[str, Any]], source: str) -> list[str]:
    """Refuse the first contradictory key (in the first run's order) that no run of
    ``configs`` reads; return the notes of the harmless ones no run reads."""
    if not configs:
        return []
    per_run = [{u.field: u for u in unused_keys(cfg)} for cfg in configs]
    everywhere = [u for field, u in per_run[0].items()
                  if all(field in run for run in per_run[1:])]
    for unused in everywhere:
        if unused.contradicts:
            raise unused.error(source)
    return [unused.note() for unused in everywhere]


__all__ = ["COST_KIND_KEYS", "check_unused", "unused_cost_keys", "unused_interval_keys",
           "unused_keys"]
