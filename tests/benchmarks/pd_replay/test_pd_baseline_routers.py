"""The replay's baseline routers: each one's defining behaviour, as its docs describe it."""

import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.pd_replay.routers import KVOverlapRouter, PowerOfTwoRouter, PrefixAffinityRouter
from policies.pd.router import InstanceLoad, RouteReason, chain_keys

PREFILL = ("p0", "p1", "p2", "p3")
DECODE = ("d0", "d1", "d2", "d3")
BLOCK = 512


def idle() -> dict[str, InstanceLoad]:
    return {n: InstanceLoad() for n in PREFILL + DECODE}


queues_st = st.lists(st.integers(0, 50), min_size=4, max_size=4)


@given(queues_st, st.integers(0, 2**32))
def test_pow2_picks_the_shorter_queue_of_its_two_draws(queues, seed):
    loads = {**idle(), **{n: InstanceLoad(ongoing_requests=q) for n, q in zip(DECODE, queues, strict=True)}}
    router = PowerOfTwoRouter(prefill=(), decode=DECODE, rng=random.Random(seed))
    draws = random.Random(seed).sample(list(DECODE), 2)  # the router draws the same pair
    chosen = router.route("r", 100, (), loads).decode
    assert chosen in draws
    assert loads[chosen].ongoing_requests == min(loads[n].ongoing_requests for n in draws)
    if len(set(queues)) == 4:  # the longest queue loses every pair it is drawn in
        assert chosen != DECODE[queues.index(max(queues))]


def test_pow2_sends_the_shortest_queue_about_half_the_requests_of_four():
    loads = {**idle(), **{n: InstanceLoad(ongoing_requests=q)
                          for n, q in zip(DECODE, (3, 0, 5, 7), strict=True)}}
    router = PowerOfTwoRouter(prefill=PREFILL, decode=DECODE, rng=random.Random(1))
    counts = Counter(router.route(f"r{i}", 100, (), loads).decode for i in range(4000))
    # d1 wins every pair it is in: 3 of the 6 pairs; d3 wins none
    assert 0.46 < counts["d1"] / 4000 < 0.54 and counts["d3"] == 0
    router.check_invariants()
    assert router.stats().routed == 4000


def test_prefix_affinity_follows_the_prefix_while_queues_are_balanced():
    router = PrefixAffinityRouter(prefill=PREFILL, decode=DECODE, block_size_tokens=BLOCK,
                                  rng=random.Random(0))
    loads = idle()
    keys = chain_keys([1, 2, 3, 4])
    first = router.route("a", 4 * BLOCK + 10, keys, loads)
    # a longer turn of the same conversation, with the home instances a little busier
    busier = {**loads, first.decode: InstanceLoad(ongoing_requests=9),
              first.prefill: InstanceLoad(ongoing_requests=9)}
    second = router.route("b", 6 * BLOCK, chain_keys([1, 2, 3, 4, 5, 6]), busier)
    assert (second.decode, second.prefill) == (first.decode, first.prefill)
    assert second.decode_reason is RouteReason.AFFINITY and second.decode_cached_blocks == 4
    router.check_invariants()


def test_prefix_affinity_falls_back_to_pow2_past_the_imbalance_threshold():
    router = PrefixAffinityRouter(prefill=(), decode=("d0", "d1"), block_size_tokens=BLOCK,
                                  rng=random.Random(0))
    keys = chain_keys([1, 2, 3])
    home = router.route("a", 3 * BLOCK, keys, {"d0": InstanceLoad(), "d1": InstanceLoad()}).decode
    other = "d1" if home == "d0" else "d0"
    just_balanced = {home: InstanceLoad(ongoing_requests=9), other: InstanceLoad()}
    assert router.route("b", 3 * BLOCK, keys, just_balanced).decode == home
    imbalanced = {home: InstanceLoad(ongoing_requests=10), other: InstanceLoad()}
    moved = router.route("c", 3 * BLOCK, keys, imbalanced)
    assert moved.decode == other and moved.decode_reason is RouteReason.LEAST_LOADED


def test_prefix_affinity_sends_a_weak_match_to_the_smallest_tree():
    router = PrefixAffinityRouter(prefill=(), decode=("d0", "d1", "d2"), block_size_tokens=BLOCK,
                                  rng=random.Random(0))
    loads = {n: InstanceLoad() for n in ("d0", "d1", "d2")}
    homes = [router.route(f"h{i}", 20 * BLOCK, chain_keys([i] * 20), loads).decode
             for i in range(2)]
    assert len(set(homes)) == 2  # each went to an instance that had nothing yet
    empty = ({"d0", "d1", "d2"} - set(homes)).pop()
    # 1 block of 20 matches an existing tree (5 % < 10 %): the empty tree wins instead
    weak = router.route("w", 20 * BLOCK, chain_keys([0] + [9] * 19), loads)
    assert weak.decode == empty and weak.decode_reason is RouteReason.LEAST_LOADED


def test_kv_overlap_prefill_pool_minimises_queued_plus_uncached_blocks():
    router = KVOverlapRouter(prefill=("p0", "p1"), decode=("d0",), block_size_tokens=BLOCK,
                             kv_capacity_blocks=1000, rng=random.Random(0))
    keys = chain_keys([1, 2, 3, 4])
    loads = {"p0": InstanceLoad(), "p1": InstanceLoad(queued_prefill_tokens=1),
             "d0": InstanceLoad()}
    assert router.route("a", 4 * BLOCK + 50, keys, loads).prefill == "p0"
    # p0 holds 4 blocks (2,048 tokens): worth up to 2,048 queued tokens there
    close = {**loads, "p0": InstanceLoad(queued_prefill_tokens=2000)}
    assert router.route("b", 4 * BLOCK + 50, keys, close).prefill == "p0"
    far = {**loads, "p0": InstanceLoad(queued_prefill_tokens=2100)}
    assert router.route("c", 4 * BLOCK + 50, keys, far).prefill == "p1"
    router.check_invariants()


@given(st.lists(st.floats(0, 1), min_size=4, max_size=4), st.integers(0, 3))
def test_kv_overlap_decode_pool_takes_the_fewest_active_blocks_ignoring_prefixes(usage, home):
    router = KVOverlapRouter(prefill=PREFILL, decode=DECODE, block_size_tokens=BLOCK,
                             kv_capacity_blocks=1000, rng=random.Random(0))
    keys = chain_keys([7, 8, 9])
    router.index.insert([DECODE[home]], keys)
    loads = {**idle(), **{n: InstanceLoad(kv_usage=u) for n, u in zip(DECODE, usage, strict=True)}}
    decision = router.route("r", 3 * BLOCK, keys, loads)
    assert loads[decision.decode].kv_usage == min(usage)


def test_kv_overlap_aggregated_adds_both_terms():
    router = KVOverlapRouter(prefill=(), decode=("w0", "w1"), block_size_tokens=BLOCK,
                             kv_capacity_blocks=100, rng=random.Random(0))
    keys = chain_keys([1, 2, 3, 4, 5, 6])
    router.index.insert(["w0"], keys)
    # w0: 0 prefill blocks + 50 active; w1: 6 prefill blocks + 45, then + 43 active
    loads = {"w0": InstanceLoad(kv_usage=0.5), "w1": InstanceLoad(kv_usage=0.45)}
    assert router.route("a", 6 * BLOCK, keys, loads).decode == "w0"
    loads = {"w0": InstanceLoad(kv_usage=0.5), "w1": InstanceLoad(kv_usage=0.43)}
    assert router.route("b", 6 * BLOCK, keys, loads).decode == "w1"


@pytest.mark.parametrize("cls", [PowerOfTwoRouter, PrefixAffinityRouter, KVOverlapRouter])
def test_baselines_skip_down_instances_and_report_unavailable(cls):
    extra = {} if cls is PowerOfTwoRouter else {"block_size_tokens": BLOCK}
    if cls is KVOverlapRouter:
        extra["kv_capacity_blocks"] = 100
    router = cls(prefill=PREFILL, decode=DECODE, **extra)
    for name in ("d0", "d1", "p2"):
        router.mark_down(name)
    decisions = [router.route(f"r{i}", 1000, chain_keys([i, i + 1]), idle()) for i in range(30)]
    assert {d.decode for d in decisions} <= {"d2", "d3"}
    assert "p2" not in {d.prefill for d in decisions}
    for name in DECODE:
        router.mark_down(name)
    assert router.route("x", 1000, (), idle()).decode_reason is RouteReason.UNAVAILABLE
    router.check_invariants()


def test_baselines_reject_bad_config_and_missing_loads():
    with pytest.raises(ValueError, match="imbalanced_threshold must be an integer >= 1"):
        PrefixAffinityRouter(prefill=(), decode=DECODE, block_size_tokens=BLOCK,
                             imbalanced_threshold=0)
    with pytest.raises(ValueError, match=r"match_rate_threshold must be in \[0, 1\]"):
        PrefixAffinityRouter(prefill=(), decode=DECODE, block_size_tokens=BLOCK,
                             match_rate_threshold=2.0)
    with pytest.raises(ValueError, match="kv_capacity_blocks must be an integer >= 1"):
        KVOverlapRouter(prefill=(), decode=DECODE, block_size_tokens=BLOCK, kv_capacity_blocks=0)
    with pytest.raises(KeyError, match="loads has no entry for healthy instance"):
        PowerOfTwoRouter(prefill=(), decode=DECODE).route("r", 10, (), {})
