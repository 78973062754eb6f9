"""``TraceArrays``: requests in columnar form (one numpy array per field).

Trace loaders produce it, workload builders transform it and ``simulate`` accepts it directly,
so a million-request run never builds a million ``Request`` objects. It lives in the core so
the engine can take columnar requests without importing the trace parser.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np

from sim.core.bulk import paused_gc
from sim.core.types import Request


@dataclass(frozen=True)
class TraceArrays:
    """A trace in columnar form: one numpy array per field, rows sorted by ``arrival_s``.

    ``priority``, ``tenant``, ``prefix_id`` and ``hash_ids`` are ``None`` when the trace has
    no such column (every request then takes the ``Request`` default); ``hash_ids`` is an
    object array of int tuples.
    """

    arrival_s: np.ndarray
    num_prompt_tokens: np.ndarray
    num_output_tokens: np.ndarray
    priority: np.ndarray | None = None
    tenant: np.ndarray | None = None
    prefix_id: np.ndarray | None = None
    source: str = "<memory>"
    num_prefix_tokens: np.ndarray | None = None
    hash_ids: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.arrival_s.shape[0])

    def take(self, index: np.ndarray | slice) -> TraceArrays:
        """Rows selected by a slice, boolean mask or integer index array (order as given)."""
        def pick(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else a[index]
        return TraceArrays(self.arrival_s[index], self.num_prompt_tokens[index],
                           self.num_output_tokens[index], pick(self.priority),
                           pick(self.tenant), pick(self.prefix_id), self.source,
                           pick(self.num_prefix_tokens), pick(self.hash_ids))

    def with_arrivals(self, arrival_s: np.ndarray) -> TraceArrays:
        """The same rows with new arrival times (used by time slicing and scaling)."""
        return replace(self, arrival_s=np.asarray(arrival_s, dtype=np.float64))

    def to_requests(self, first_id: int = 0) -> list[Request]:
        """``Request`` objects with ids ``first_id, first_id+1, ...`` in row order."""
        n = len(self)
        arr = self.arrival_s.tolist()
        prm = self.num_prompt_tokens.tolist()
        out = self.num_output_tokens.tolist()
        pri = self.priority.tolist() if self.priority is not None else [0] * n
        ten = self.tenant.tolist() if self.tenant is not None else [None] * n
        pre = self.prefix_id.tolist() if self.prefix_id is not None else [None] * n
        ids = range(first_id, first_id + n)
        with paused_gc():
            if self.num_prefix_tokens is None and self.hash_ids is None:
                return list(map(Request, ids, arr, prm, out, pri, ten, pre))
            npx = (self.num_prefix_tokens.tolist() if self.num_prefix_tokens is not None
                   else [0] * n)
            hid = self.hash_ids.tolist() if self.hash_ids is not None else [()] * n
            return list(map(Request, ids, arr, prm, out, pri, ten, pre, npx, hid))

    @staticmethod
    def from_requests(requests: Iterable[Request]) -> TraceArrays:
        """Columnar form of a request list (optional columns kept only if any is set)."""
        reqs = list(requests)
        pri = np.array([r.priority for r in reqs], dtype=np.int64)
        ten = np.array([r.tenant for r in reqs], dtype=object)
        pre = np.array([r.prefix_id for r in reqs], dtype=object)
        npx = np.array([r.num_prefix_tokens for r in reqs], dtype=np.int64)
        hid = tuple_column([r.hash_ids for r in reqs])
        return TraceArrays(
            np.array([r.arrival_s for r in reqs], dtype=np.float64),
            np.array([r.num_prompt_tokens for r in reqs], dtype=np.int64),
            np.array([r.num_output_tokens for r in reqs], dtype=np.int64),
            pri if pri.any() else None,
            ten if any(t is not None for t in ten) else None,
            pre if any(p is not None for p in pre) else None,
            num_prefix_tokens=npx if npx.any() else None,
            hash_ids=hid if any(r.hash_ids for r in reqs) else None,
        )


def tuple_column(values: list[tuple[int, ...]]) -> np.ndarray:
    """A 1-D object array of tuples (``np.array`` would make equal-length tuples a 2-D array)."""
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out
