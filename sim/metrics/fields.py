"""The metric options, defined once: the ``slos`` and ``metrics`` (window) blocks.

The experiment schema embeds these tables as its ``slos`` and ``metrics`` blocks, and
``check_metric_args`` checks ``sim.simulate``'s ``slos``, ``warmup_s`` and ``cooldown_s``
against the same tables, so a key the YAML refuses (``slos: {foo_ms: 5}``) is refused from
Python with the same words, listing the accepted keys.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sim.core.errors import InputError
from sim.core.fields import NUM, OPT, Key, check_value, validate_fields
from sim.workload.traces import MAX_ARRIVAL_S

#: Per-request latency limits for goodput (keys: ``sim.metrics.summary.SLO_KEYS``).
SLO_FIELDS: dict[str, Key] = {
    "ttft_ms": Key(NUM + (OPT,), None, "Per-request TTFT limit for goodput.", "ms", 0, True),
    "tpot_ms": Key(NUM + (OPT,), None, "Per-request TPOT limit for goodput.", "ms", 0, True),
    "e2el_ms": Key(NUM + (OPT,), None, "Per-request E2E limit for goodput.", "ms", 0, True),
}

#: The measurement window (no longer than the latest arrival time any workload may have).
WINDOW_FIELDS: dict[str, Key] = {
    "warmup_s": Key(NUM, 0.0, "Ignore requests arriving in the first warmup_s.", "s", 0,
                    maximum=MAX_ARRIVAL_S),
    "cooldown_s": Key(NUM, 0.0, "Ignore requests arriving in the last cooldown_s.", "s", 0,
                      maximum=MAX_ARRIVAL_S),
}


def check_metric_args(warmup_s: Any, cooldown_s: Any, slos: Any) -> dict[str, float] | None:
    """Check ``sim.simulate``'s metric arguments; return the SLOs that are set (or ``None``)."""
    check_value(warmup_s, WINDOW_FIELDS["warmup_s"], "warmup_s")
    check_value(cooldown_s, WINDOW_FIELDS["cooldown_s"], "cooldown_s")
    if slos is None:
        return None
    if not isinstance(slos, Mapping):
        raise InputError(f"expected a mapping or None, got {type(slos).__name__}", field="slos")
    block = validate_fields(dict(slos), SLO_FIELDS, "slos.")
    return {k: v for k, v in block.items() if v is not None} or None
