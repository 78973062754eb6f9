"""The formulas of one replica's load signals, written once.

A replica's outstanding requests, outstanding tokens and KV share in use are read by the
``ReplicaLoad`` a router sees (``sim.core.routing``), by the balance rules over the load
arrays (``sim.core.load_arrays.measure``), by the routing logs the imbalance metrics come
from, and by the compiled routing loop (``sim.engine.compiled_route``), which compiles these
very functions with numba. They are plain functions of numbers (``outstanding_requests`` is
elementwise on integer arrays too) and depend on no other module of ``sim``, so the values
module and the arrays module can both call them.
"""
from __future__ import annotations

from typing import TypeVar

import numpy as np

#: An integer, or an integer numpy array (one count per replica).
Count = TypeVar("Count", int, np.ndarray)


def outstanding_requests(waiting: Count, running: Count) -> Count:
    """Requests admitted to a replica and not finished: waiting (buffered arrivals included)
    plus running."""
    return waiting + running


def outstanding_tokens(prefill: int, decoding: int) -> int:
    """Work-based queue length: uncomputed prefill tokens plus one per decoding request (a
    router cannot know how many tokens each decode has left)."""
    return prefill + decoding


def kv_share(used: int, kv_total: int) -> float:
    """Share of the KV blocks in use (0 for an unlimited cache, ``kv_total`` 0)."""
    return used / kv_total if kv_total else 0.0
