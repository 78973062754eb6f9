"""Routers: one conformance suite over every registered router, then each router's rule.

Every router must return a valid replica index for any loads, be deterministic given the seed,
work with a single replica, and refuse unknown or invalid parameters with a ``RouterError``
naming ``router.<key>``. The rule tests pin who wins on hand-made loads.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routers import RouterError, make_router, registered
from sim.core.errors import InputError
from sim.core.routing import Arrival, ReplicaLoad, prefix_chain

NAMES = sorted(registered())


def loads(*outstanding: int, **kw: list) -> list[ReplicaLoad]:
    """Loads with the given outstanding requests (all waiting) and optional other columns."""
    out = []
    for i, n in enumerate(outstanding):
        extra = {k: v[i] for k, v in kw.items()}
        out.append(ReplicaLoad(index=i, num_waiting=n, **extra))
    return out


def started(spec: dict | str, n: int, seed: int = 0):
    router = make_router(spec)
    router.start(n, np.random.default_rng(seed))
    return router


def arrival(i: int = 0, session: str | None = None, hashes: tuple[int, ...] = ()) -> Arrival:
    return Arrival(id=i, arrival_s=float(i), num_prompt_tokens=100, session=session,
                   block_hashes=hashes)


load_lists = st.lists(st.builds(
    ReplicaLoad, index=st.just(0), num_waiting=st.integers(0, 50), num_running=st.integers(0, 50),
    outstanding_prefill_tokens=st.integers(0, 10**5), num_decoding=st.integers(0, 50),
    kv_used_blocks=st.integers(0, 100), kv_total_blocks=st.sampled_from([0, 100]),
    weight=st.sampled_from([0.5, 1.0, 2.0])), min_size=1, max_size=9).map(
    lambda ls: [ReplicaLoad(**{**{f: getattr(s, f) for f in s.__dataclass_fields__},
                               "index": i}) for i, s in enumerate(ls)])
arrivals = st.lists(st.builds(
    Arrival, id=st.integers(0, 100), arrival_s=st.just(0.0),
    num_prompt_tokens=st.integers(1, 4096), session=st.sampled_from([None, "a", "b"]),
    block_hashes=st.lists(st.integers(0, 5), max_size=4).map(tuple)), min_size=1, max_size=20)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=60, deadline=None)
@given(ls=load_lists, reqs=arrivals, seed=st.integers(0, 2**32 - 1))
def test_every_router_returns_a_valid_replica_deterministically(name, ls, reqs, seed) -> None:
    first = started(name, len(ls), seed)
    again = started(name, len(ls), seed)
    for r in reqs:
        choice = first.route(r, ls)
        assert 0 <= choice < len(ls) and isinstance(choice, int)
        assert again.route(r, ls) == choice


@pytest.mark.parametrize("name", NAMES)
def test_every_router_serves_a_single_replica(name) -> None:
    router = started(name, 1)
    assert [router.route(arrival(i, "s", (1, 2)), loads(5)) for i in range(3)] == [0, 0, 0]


@pytest.mark.parametrize("name", NAMES)
def test_every_router_refuses_unknown_and_invalid_parameters(name) -> None:
    with pytest.raises(RouterError, match=r"router\.bogus: unknown parameter"):
        make_router({"name": name, "bogus": 1})
    with pytest.raises(RouterError, match=r"router\.refresh_s"):
        make_router({"name": name, "refresh_s": -1})
    with pytest.raises(RouterError, match=r"router\.latency_s: expected a number"):
        make_router({"name": name, "latency_s": "fast"})


def test_an_unknown_router_is_an_input_error_with_a_hint() -> None:
    with pytest.raises(InputError, match=r"router\.name: unknown router 'round_robbin' \(did "
                                         r"you mean 'round_robin'\?\); accepted: "):
        make_router({"name": "round_robbin"})


def test_round_robin_takes_replicas_in_turn() -> None:
    router = started("round_robin", 3)
    assert [router.route(arrival(i), loads(9, 0, 0)) for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_random_spreads_uniformly() -> None:
    router = started("random", 4, seed=7)
    picks = np.bincount([router.route(arrival(i), loads(0, 0, 0, 0)) for i in range(4000)])
    assert picks.min() > 900 and picks.max() < 1100


def test_least_outstanding_requests_counts_requests_per_unit_of_capacity() -> None:
    router = started("least_outstanding_requests", 3)
    assert router.route(arrival(), loads(4, 2, 3)) == 1
    assert router.route(arrival(), loads(4, 2, 2)) == 1  # ties: lowest index
    # replica 0 is twice as fast: 4 outstanding there weigh as 2, less than 3 elsewhere
    assert router.route(arrival(), loads(4, 3, 3, weight=[2.0, 1.0, 1.0])) == 0


def test_least_outstanding_tokens_counts_prefill_tokens_and_decodes() -> None:
    router = started("least_outstanding_tokens", 3)
    # work: 4000, 100 + 50 and 0 + 120 tokens, whatever the request counts
    ls = loads(1, 1, 9, outstanding_prefill_tokens=[4000, 100, 0], num_decoding=[0, 50, 120])
    assert router.route(arrival(), ls) == 2
    ls = loads(1, 1, 9, outstanding_prefill_tokens=[4000, 100, 0], num_decoding=[0, 50, 200])
    assert router.route(arrival(), ls) == 1


def test_least_kv_usage_prefers_the_emptiest_cache_then_the_shortest_queue() -> None:
    router = started("least_kv_usage", 3)
    ls = loads(0, 5, 1, kv_used_blocks=[90, 10, 10], kv_total_blocks=[100, 100, 100])
    assert router.route(arrival(), ls) == 2


def test_power_of_two_sends_to_the_lighter_of_the_sampled_pair() -> None:
    router = started("power_of_two", 8, seed=3)
    ls = loads(*range(8))  # replica i has i outstanding
    heavier_than_median = sum(router.route(arrival(i), ls) >= 4 for i in range(2000))
    # P(min of two distinct draws from 8 >= 4) = C(4,2)/C(8,2) = 6/28
    assert abs(heavier_than_median / 2000 - 6 / 28) < 0.03
    assert router.route(arrival(), loads(3, 1)) == 1  # two replicas: always the lighter


def test_session_affinity_is_sticky_until_the_home_is_overloaded() -> None:
    router = started({"name": "session_affinity", "max_load_ratio": 2.0}, 3)
    assert router.route(arrival(0, "conv1"), loads(2, 1, 3)) == 1  # home: the lightest then
    assert router.route(arrival(1, "conv1"), loads(0, 3, 0)) == 1  # 3 <= 2 x 1 + 1: stays home
    assert router.route(arrival(2, "conv1"), loads(0, 6, 0)) == 0  # 6 > 2 x 2 + 1: fallback
    assert router.route(arrival(3, "conv1"), loads(0, 1, 0)) == 1  # the home is kept
    assert router.route(arrival(4, None), loads(3, 1, 0)) == 2  # no session: least loaded


def test_prefix_affinity_follows_the_longest_cached_prefix_within_the_balance() -> None:
    router = started({"name": "prefix_affinity", "balance_abs": 4}, 3)
    chain = prefix_chain("system", 4 * 512)
    assert router.route(arrival(0, hashes=chain), loads(1, 0, 1)) == 1
    other = prefix_chain("other", 2 * 512)
    assert router.route(arrival(1, hashes=other), loads(1, 1, 0)) == 2
    # the first two blocks of ``chain`` were sent to 1: it wins although it is busier
    assert router.route(arrival(2, hashes=chain[:2]), loads(0, 3, 0)) == 1
    # spread 6 - 0 > 4 and 6 > 1.5 x 0: balance first
    assert router.route(arrival(3, hashes=chain), loads(0, 6, 0)) == 0
    # the same chain now lives on 0 and 1 (both full matches): the lighter wins
    assert router.route(arrival(4, hashes=chain), loads(2, 1, 0)) == 1
    assert router.route(arrival(5), loads(2, 1, 0)) == 2  # no hashes: least loaded


def test_prefix_index_forgets_the_least_recently_sent_blocks() -> None:
    router = started({"name": "prefix_affinity", "index_blocks": 3}, 2)
    a, b = prefix_chain("a", 3 * 512), prefix_chain("b", 2 * 512)
    assert router.route(arrival(0, hashes=a), loads(0, 1)) == 0
    assert router.route(arrival(1, hashes=b), loads(0, 1)) == 0  # evicts a's first two blocks
    assert router.index.match(0, a) == 0 and router.index.match(0, b) == 2
    assert router.index.size(0) == 3


def test_weighted_combines_queue_and_prefix_scores() -> None:
    queue_only = started({"name": "weighted", "scorers": {"queue": 1}}, 3)
    assert queue_only.route(arrival(), loads(4, 2, 3)) == 1
    router = started({"name": "weighted", "scorers": {"queue": 1, "prefix": 2}}, 3)
    chain = prefix_chain("sys", 2 * 512)
    assert router.route(arrival(0, hashes=chain), loads(1, 2, 0)) == 2
    # replica 2 holds the chain: 2 x 1 + (1 - 3/4) beats replica 0's 0 + (1 - 0/4)
    assert router.route(arrival(1, hashes=chain), loads(0, 4, 3)) == 2
    with pytest.raises(RouterError, match=r"router\.scorers\.speed: unknown scorer"):
        make_router({"name": "weighted", "scorers": {"speed": 1}})


def test_prefix_chains_share_exactly_their_common_leading_blocks() -> None:
    long, short = prefix_chain("conv7", 5 * 16 + 3, 16), prefix_chain("conv7", 3 * 16, 16)
    assert len(long) == 5 and long[:3] == short
    other = prefix_chain("conv8", 5 * 16, 16)
    assert not set(other) & set(long)
    # stable across processes and Python's hash salt: a pinned value
    assert prefix_chain("x", 512)[0] == prefix_chain("x", 1024)[0] == 504246983626969365
    assert all(0 <= h < 2**63 for h in long)
