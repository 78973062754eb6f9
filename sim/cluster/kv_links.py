"""Where KV transfers flow: GPUs placed on nodes, one NVLink port and one NIC per GPU.

The ``network`` key of a disaggregated ``cluster`` block (``NETWORK_FIELDS``). Replicas take
``tp`` consecutive GPUs each, in the order the groups are listed, packed onto nodes of
``gpus_per_node`` GPUs (a replica never straddles two nodes: it starts on the next node
instead). Each GPU has a full-duplex NVLink port (to the node's NVSwitch) and a full-duplex
NIC, each direction a link of ``sim.cluster.network``: within a node a flow crosses the
sender's NVLink out and the receiver's NVLink in; across nodes the sender's NIC out and the
receiver's NIC in (the switch fabric between NICs is not a bottleneck: a non-blocking fat
tree).

A replica's KV is split over its GPUs by attention heads. A transfer from a TP=a replica to a
TP=b replica moves the same bytes whatever a and b; GPU i of the sender holds the head range
[i/a, (i+1)/a) and GPU j of the receiver needs [j/b, (j+1)/b), so one flow goes from i to j
for every overlapping pair, carrying the overlap's share of the bytes (a + b - gcd(a, b)
flows; TP=a to TP=a is a flows, GPU i to GPU i). Heads replicated because the model has
fewer KV heads than GPUs are counted once: the bytes are the replica's, split evenly.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sim.cluster.network import LinkSpec
from sim.core.fields import INT, MIN_GBPS, NUM, OPT, Key, validate_fields

NETWORK_FIELDS: dict[str, Any] = {
    "gpus_per_node": Key(INT, 8, "GPUs per node (an NVSwitch domain).", minimum=1,
                         maximum=1024),
    "nvlink_gbps": Key(NUM + (OPT,), None, "NVLink bandwidth per GPU and direction, GB/s "
                       "(default: half the GPU profile's bidirectional NVLink figure).",
                       minimum=MIN_GBPS, maximum=1e5),
    "nic_gbps": Key(NUM, 50.0, "NIC bandwidth per GPU and direction, GB/s (50 = 400 Gb/s "
                    "InfiniBand NDR).", minimum=MIN_GBPS, maximum=1e5),
    "nvlink_latency_us": Key(NUM, 2.0, "Latency of an NVLink hop, microseconds.", minimum=0,
                             maximum=1e6),
    "nic_latency_us": Key(NUM, 5.0, "Latency of a NIC hop (RDMA), microseconds.", minimum=0,
                          maximum=1e6),
}


@dataclass(frozen=True)
class Topology:
    """The links of a deployment and the first GPU of each replica."""

    links: dict[str, LinkSpec]
    first_gpu: tuple[int, ...]
    tp: tuple[int, ...]
    gpus_per_node: int

    def flows(self, src: int, dst: int, nbytes: float) -> list[tuple[tuple[str, ...], float]]:
        """The flows (path, bytes) of moving ``nbytes`` of KV from replica ``src`` to ``dst``."""
        a, b = self.tp[src], self.tp[dst]
        span = math.lcm(a, b)
        out = []
        for i in range(a):
            lo_i, hi_i = i * span // a, (i + 1) * span // a
            for j in range(b):
                lo = max(lo_i, j * span // b)
                hi = min(hi_i, (j + 1) * span // b)
                if hi > lo:
                    out.append((self.path(self.first_gpu[src] + i, self.first_gpu[dst] + j),
                                nbytes * (hi - lo) / span))
        return out

    def path(self, src_gpu: int, dst_gpu: int) -> tuple[str, ...]:
        """The links from one GPU to another (none to itself)."""
        if src_gpu == dst_gpu:
            return ()
        kind = "nvlink" if src_gpu // self.gpus_per_node == dst_gpu // self.gpus_per_node \
            else "nic"
        return (f"gpu{src_gpu}.{kind}.out", f"gpu{dst_gpu}.{kind}.in")


def build_topology(spec: Any, tp: Sequence[int], nvlink_default_gbps: float | None,
                   where: str = "cluster.network") -> Topology:
    """Validate a ``network`` block and place replicas of the given TP degrees."""
    net = validate_fields(dict(spec or {}), NETWORK_FIELDS, where + ".")
    per_node = net["gpus_per_node"]
    first, gpu = [], 0
    for k, n in enumerate(tp):
        if n > per_node:
            from sim.core.errors import InputError

            raise InputError(f"replica {k} has tp={n}, more GPUs than a node's "
                             f"{per_node}", field=f"{where}.gpus_per_node")
        if gpu // per_node != (gpu + n - 1) // per_node:
            gpu = (gpu // per_node + 1) * per_node  # start on the next node
        first.append(gpu)
        gpu += n
    nvlink = net["nvlink_gbps"] if net["nvlink_gbps"] is not None else nvlink_default_gbps
    if nvlink is None or nvlink <= 0:
        nvlink = net["nic_gbps"]  # no NVLink on this GPU: peers talk over the NIC's speed
    links: dict[str, LinkSpec] = {}
    for g in range(gpu):
        for d in ("out", "in"):
            name = f"gpu{g}.nvlink.{d}"
            links[name] = LinkSpec(name, nvlink * 1e9, net["nvlink_latency_us"] * 1e-6 / 2)
            name = f"gpu{g}.nic.{d}"
            links[name] = LinkSpec(name, net["nic_gbps"] * 1e9, net["nic_latency_us"] * 1e-6 / 2)
    return Topology(links, tuple(first), tuple(tp), per_node)
