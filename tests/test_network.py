"""KV-transfer links (``sim.cluster.network``): exact transfer times and fair sharing."""
from __future__ import annotations

import pytest
import simpy

from sim.cluster.network import LinkSpec, Network
from sim.core.errors import InputError

GB = 1e9


def times(env: simpy.Environment, net: Network, transfers: list[tuple[float, tuple, float]]
          ) -> list[float]:
    """Landing time of each (start time, path, bytes) transfer."""
    out: list[float] = [0.0] * len(transfers)

    def one(i: int, at: float, path: tuple, nbytes: float):
        yield env.timeout(at)
        out[i] = yield net.transfer(path, nbytes)

    for i, (at, path, nbytes) in enumerate(transfers):
        env.process(one(i, at, path, nbytes))
    env.run(until=1e6)
    return out


def network(**links: tuple[float, float]) -> tuple[simpy.Environment, Network]:
    env = simpy.Environment()
    specs = {name: LinkSpec(name, bw, lat) for name, (bw, lat) in links.items()}
    return env, Network(env, specs)


def test_one_transfer_takes_latency_plus_bytes_over_bandwidth() -> None:
    env, net = network(nic=(50 * GB, 5e-6))
    (end,) = times(env, net, [(1.0, ("nic",), 2 * GB)])
    assert end == pytest.approx(1.0 + 5e-6 + 2 / 50, rel=1e-12)
    assert net.usage["nic"].bytes == pytest.approx(2 * GB)
    assert net.usage["nic"].busy_s == pytest.approx(2 / 50)


def test_two_concurrent_transfers_on_one_link_each_take_twice_as_long() -> None:
    env, net = network(nic=(50 * GB, 0.0))
    a, b = times(env, net, [(0.0, ("nic",), GB), (0.0, ("nic",), GB)])
    assert a == b == pytest.approx(2 * GB / (50 * GB), rel=1e-12)


def test_a_late_flow_shares_only_while_both_flow() -> None:
    # A: 1 GB alone for 10 ms (0.1 GB moved at 10 GB/s), then shared at 5 GB/s with B.
    env, net = network(link=(10 * GB, 0.0))
    a, b = times(env, net, [(0.0, ("link",), GB), (0.01, ("link",), 0.2 * GB)])
    # B: 0.2 GB at 5 GB/s -> lands at 0.05; A has 0.9 - 0.2 = 0.7 GB left, alone: 0.07 s more
    assert b == pytest.approx(0.05, rel=1e-9)
    assert a == pytest.approx(0.05 + 0.07, rel=1e-9)


def test_max_min_fairness_across_two_links() -> None:
    # f1 crosses a (10) and b (4); f2 only a. b bottlenecks f1 at 4, f2 takes a's other 6.
    env, net = network(a=(10 * GB, 0.0), b=(4 * GB, 0.0))
    f1, f2 = times(env, net, [(0.0, ("a", "b"), 4 * GB), (0.0, ("a",), 6 * GB)])
    assert f1 == pytest.approx(1.0, rel=1e-9) and f2 == pytest.approx(1.0, rel=1e-9)


def test_bad_links_and_paths_are_input_errors() -> None:
    with pytest.raises(InputError, match=r"links\.nic\.bandwidth: must be a finite number > 0"):
        LinkSpec("nic", 0.0)
    env, net = network(nic=(GB, 0.0))
    with pytest.raises(InputError, match=r"unknown link 'nvlink'"):
        net.transfer(("nvlink",), 10)
