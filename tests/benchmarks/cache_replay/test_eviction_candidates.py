"""The adaptive candidates of benchmarks.cache_replay, ``--policies shipped``, and the
held-out traces (windows, the Mooncake synthetic trace, Azure with the enterprise prefix
model)."""

import json

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.cache_replay.__main__ import ORDERS, SHIPPED_PRESET, main, shipped_order
from benchmarks.cache_replay.candidates import AdaptiveSegmentedLRU, LeCaR, ReuseDensity
from benchmarks.cache_replay.prefix_models import enterprise_chains
from benchmarks.cache_replay.simulate import replay_order
from benchmarks.replay.workloads import load_workload
from integrations.vllm_v1.config.presets import preset
from policies import EvictionOrder
from tests.helpers.eviction import assert_misuse_raises_precise_errors

CANDIDATES = {"arc": AdaptiveSegmentedLRU, "lecar": LeCaR,
              "lecar-crlfu": lambda: LeCaR(churn_resistant=True), "density": ReuseDensity}


def release_chain(order, chain):
    for i in range(len(chain) - 1, -1, -1):  # tail first, as vLLM frees
        order.release(chain[i], chain[i - 1] if i else None)


@pytest.mark.parametrize("name", CANDIDATES)
def test_candidates_implement_the_protocol_and_are_runnable_by_name(name):
    order = CANDIDATES[name]()
    assert isinstance(order, EvictionOrder)
    assert type(ORDERS[name]()) is type(order)


@pytest.mark.parametrize("name", CANDIDATES)
def test_candidates_misuse_raises_precise_errors(name):
    order = CANDIDATES[name]()
    assert_misuse_raises_precise_errors(order)


@pytest.mark.parametrize("name", CANDIDATES)
def test_candidates_keep_the_chain_rules(name):
    order = CANDIDATES[name]()
    release_chain(order, ["a", "b", "c"])
    order.release_uncached(1)
    order.release_uncached(2)
    assert [order.evict(), order.evict()] == [2, 1]  # no content first, newest first
    order.discard("a")  # the root's content dropped: b can never hit again
    assert order.evict() == "b"  # orphans before anything that still has its prefix
    assert order.evict() == "c"
    assert len(order) == 0
    order.check_invariants()
    assert order.stats().evictions == 4


ops = st.lists(st.tuples(st.sampled_from(["release", "acquire", "evict", "uncached"]),
                         st.integers(0, 7)), max_size=80)


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(sorted(CANDIDATES)), steps=ops)
def test_candidates_evict_only_what_is_evictable(name, steps):
    order = CANDIDATES[name]()
    evictable: set = set()
    uncached: set = set()  # no content: never a prefix hit
    for op, key in steps:
        if op == "release" and key not in evictable:
            order.release(key, key - 1 if key and key - 1 not in evictable else None)
            evictable.add(key)
            uncached.discard(key)
        elif op == "uncached" and key not in evictable:
            order.release_uncached(key)
            evictable.add(key)
            uncached.add(key)
        elif op == "acquire" and key in evictable and key not in uncached:
            order.acquire(key)
            evictable.discard(key)
        elif op == "evict" and evictable:
            victim = order.evict()
            assert victim in evictable
            evictable.discard(victim)
        assert len(order) == len(evictable)
        assert set(order) == evictable
        order.check_invariants()


def test_arc_grows_probation_when_keys_it_dropped_come_back():
    order = AdaptiveSegmentedLRU()
    assert order.probation_target == 0
    # one-block requests cycling over 15 keys through a 10-block cache: what PROBATION
    # evicted returns soon after, so its target grows (ARC's B1 hits)
    replay_order([(i % 15,) for i in range(200)], 10, order, "arc")
    assert 0 < order.probation_target <= len(order)
    order.check_invariants()


def test_shipped_is_a_fresh_copy_of_the_cache_presets_order():
    first, second = shipped_order(), shipped_order()
    assert first is not second
    shipped = preset(SHIPPED_PRESET).eviction
    assert type(first) is type(shipped)
    fields = [f.name for f in attrs.fields(type(first)) if f.init]
    assert [getattr(first, f) for f in fields] == [getattr(shipped, f) for f in fields]


def test_policies_shipped_measures_the_order_the_preset_ships(tmp_path):
    trace = load_workload("mooncake-conv", max_requests=300)
    chains = [r.block_hashes for r in trace.requests]
    out = tmp_path / "out"
    summary = main(["--trace", "mooncake-conv", "--max-requests", "300", "--cache-blocks", "200",
                    "--policies", "lru,shipped,opt", "--out", str(out)])
    shipped = {r["policy"]: r for r in summary["results"]}["shipped"]
    direct = replay_order(chains, 200, preset(SHIPPED_PRESET).eviction, "direct")
    assert shipped["hit_blocks"] == direct.hit_blocks
    assert set(summary["gap_closed"]) == {"shipped"}
    assert json.loads((out / "summary.json").read_text())["gap_closed"] == summary["gap_closed"]


def test_slice_replays_a_window_of_the_trace(tmp_path):
    summary = main(["--trace", "mooncake-conv", "--slice", "100:250", "--cache-blocks", "100",
                    "--policies", "lru", "--out", str(tmp_path)])
    assert summary["requests"] == 150 and summary["slice"] == "100:250"
    with pytest.raises(SystemExit, match="--slice expects START:STOP"):
        main(["--trace", "mooncake-conv", "--slice", "10", "--out", str(tmp_path)])


def test_the_synthetic_mooncake_trace_is_built_in():
    trace = load_workload("mooncake-synthetic")
    assert len(trace.requests) == 3993 and trace.block_size == 512
    assert len({h for r in trace.requests for h in r.block_hashes}) == 43_924
    assert sum(len(r.block_hashes) for r in trace.requests) == 121_877


def test_enterprise_prefix_model_shares_only_each_tenants_system_prompt():
    trace = load_workload("azure-conv", max_requests=200)
    chains = enterprise_chains(trace)
    assert [len(c) for c in chains] == [32 + -(-r.prompt_tokens // 16) for r in trace.requests]
    roots = {c[:32] for c in chains}
    assert 2 <= len(roots) <= 7  # one system prompt per tenant
    own = [set(c[32:]) for c in chains]
    assert sum(map(len, own)) == len(set().union(*own))  # nothing else is shared
    assert enterprise_chains(trace) == chains  # seeded
    with pytest.raises(SystemExit, match="has no block_hashes"):
        main(["--trace", "azure-conv", "--max-requests", "5", "--out", "/tmp/unused"])
