"""`PrefixWarmer`: hot-prefix learning, the quiet-engine gate, re-warm spacing, restore."""

from hypothesis import given
from hypothesis import strategies as st

from policies import LoadSnapshot
from policies.kv.cache_warming import PrefixWarmer

BLOCK = 4


def keys(tokens):
    """Block keys with prefix semantics: the key of block i is the tuple of tokens up to it."""
    return [tuple(tokens[:(i + 1) * BLOCK]) for i in range(len(tokens) // BLOCK)]


def quiet(now, waiting=0, kv_usage=0.1):
    return LoadSnapshot(now=now, waiting_requests=waiting, running_requests=0,
                        kv_usage=kv_usage, token_budget=256)


def observe(warmer, tokens, now):
    warmer.observe(keys(tokens), tokens, BLOCK, now)


SYSTEM = list(range(100, 112))  # three blocks shared by a tenant's requests


def test_a_prefix_becomes_hot_after_min_requests_and_only_the_deepest_is_named():
    warmer = PrefixWarmer(min_requests=2)
    observe(warmer, SYSTEM + [1, 2, 3, 4], now=0.0)
    assert warmer.hot(0.0) == []
    observe(warmer, SYSTEM + [5, 6, 7, 8], now=1.0)
    (prefix,) = warmer.hot(1.0)
    assert prefix.tokens == tuple(SYSTEM), "the shared blocks, not each request's own"
    assert 1.9 < prefix.score <= 2.0


def test_counts_decay_with_the_half_life():
    warmer = PrefixWarmer(min_requests=2, half_life_s=10.0)
    observe(warmer, SYSTEM, now=0.0)
    observe(warmer, SYSTEM, now=0.0)
    assert warmer.hot(4.0)
    assert warmer.hot(6.0) == [], "2 requests decay below 1.5 after 0.415 half-lives"


def test_warms_only_when_quiet_uncached_and_not_recently():
    warmer = PrefixWarmer(min_requests=2, max_kv_usage=0.5, rewarm_interval_s=60.0)
    for t in (0.0, 1.0):
        observe(warmer, SYSTEM + [t], now=t)
    assert warmer.next_to_warm(quiet(2.0, waiting=1), lambda p: False) == []
    assert warmer.next_to_warm(quiet(2.0, kv_usage=0.6), lambda p: False) == []
    assert warmer.next_to_warm(quiet(2.0), lambda p: True) == [], "already cached"
    (prefix,) = warmer.next_to_warm(quiet(2.0), lambda p: False)
    assert prefix.tokens == tuple(SYSTEM)
    assert warmer.next_to_warm(quiet(30.0), lambda p: False) == [], "warmed 28 s ago"
    assert warmer.next_to_warm(quiet(62.5), lambda p: False) == [prefix.__class__(
        key=prefix.key, tokens=prefix.tokens, score=warmer.hot(62.5)[0].score)]
    assert warmer.stats(62.5).warmed == 2


def test_snapshot_restores_the_hot_set_in_a_fresh_warmer():
    warmer = PrefixWarmer(min_requests=2)
    for t in (0.0, 1.0, 2.0):
        observe(warmer, SYSTEM + [t], now=t)
    records = warmer.snapshot(2.0)
    fresh = PrefixWarmer(min_requests=2)
    fresh.restore(records, keys, BLOCK, now=500.0)
    assert [p.tokens for p in fresh.hot(500.0)] == [tuple(SYSTEM)]
    assert fresh.hot(500.0)[0].score == records[0]["score"]


@given(st.lists(st.lists(st.integers(0, 3), min_size=BLOCK, max_size=6 * BLOCK),
                max_size=60))
def test_memory_stays_bounded_and_hot_prefixes_are_prompt_prefixes(prompts):
    warmer = PrefixWarmer(min_requests=2, max_tracked_blocks=8)
    for t, tokens in enumerate(prompts):
        observe(warmer, tokens, now=float(t))
        assert warmer.stats(float(t)).tracked_blocks <= 16
    for prefix in warmer.hot(float(len(prompts))):
        assert len(prefix.tokens) % BLOCK == 0
        assert any(list(prefix.tokens) == p[:len(prefix.tokens)] for p in prompts)


def test_restart_replay_counts_only_real_requests_and_warming_helps_shared_prefixes():
    from benchmarks.cache_replay.restart import replay_restart

    shared = [("sys", 0), ("sys", 1), ("sys", 2)]
    chains = [shared + [("own", i)] for i in range(40)]
    arrivals = [float(i) for i in range(40)]
    result = replay_restart(chains, arrivals, 8, restart_index=20, window=10)
    assert result.warm_prefixes == 1 and result.warm_blocks == 3
    assert result.cold_hit_rate == 27 / 40, "9 of 10 requests hit the 3 shared blocks"
    assert result.warmed_hit_rate == 30 / 40, "all 10 hit once warmed"
    unique = [[("u", i, j) for j in range(4)] for i in range(40)]
    result = replay_restart(unique, arrivals, 8, restart_index=20, window=10)
    assert result.warm_prefixes == 0
    assert result.cold_hit_rate == result.warmed_hit_rate == 0.0
