"""benchmarks.cache_replay: vLLM prefix semantics, Belady, and the command's output."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.cache_replay.__main__ import main
from benchmarks.cache_replay.simulate import replay_opt, replay_order
from policies import LRU, SegmentedLRU
from policies.kv.eviction import DuelingSLRU, SessionPins

CHAINS = [(1, 2), (3,), (1, 2)]


def test_a_block_hits_only_behind_a_hit_prefix():
    # Block 2 is cached but its parent 1 is not: no hit (vLLM's prefix semantics).
    order = LRU()
    result = replay_order([(1, 2), (3, 4), (5, 2)], 2, order, "lru")
    assert result.hit_blocks == 0
    result = replay_order([(1, 2), (1, 2, 3)], 3, LRU(), "lru")
    assert (result.hit_blocks, result.prompt_blocks, result.hit_rate) == (2, 5, 0.4)


def test_lru_evicts_the_one_shot_request_tail_first_and_opt_bypasses_it():
    assert replay_order(CHAINS, 2, LRU(), "lru").hit_blocks == 1  # 3 evicted 2, kept 1
    assert replay_opt(CHAINS, 2).hit_blocks == 2  # 3 is never used again: not kept


def test_session_turns_reach_an_order_with_session_pins():
    # Two sessions take turns through a 4-block cache; a one-shot request comes between.
    chains = [(1, 2), (3, 4), (9,), (1, 2, 5), (3, 4, 6)]
    turns = [("a", 0.0), ("b", 1.0), (None, 1.5), ("a", 2.0), ("b", 3.0)]
    order = DuelingSLRU(session_pins=SessionPins(max_pinned_fraction=1.0, judged=False))
    pinned = replay_order(chains, 4, order, "dueling-pins", turns=turns)
    stats = order.stats()
    assert stats.pins > 0 and stats.pin_hits > 0  # the sessions' turns were pinned and hit
    assert pinned.hit_blocks > replay_order(chains, 4, DuelingSLRU(), "dueling").hit_blocks
    with pytest.raises(ValueError, match="turns must have one entry per chain: 1 for 5"):
        replay_order(chains, 4, order, "x", turns=turns[:1])


def test_a_waiting_queue_keeps_the_blocks_the_next_requests_hit():
    # A 4-block cache; (1, 2) comes back after two one-shots and (3, 4), which evicts two.
    chains = [(1, 2), (5,), (6,), (3, 4), (1, 2)]
    assert replay_order(chains, 4, SegmentedLRU(), "slru").hit_blocks == 0  # 2, 1 went first
    order = SegmentedLRU()
    queued = replay_order(chains, 4, order, "slru", waiting=2)  # (1, 2) waits behind (3, 4)
    assert queued.hit_blocks == order.stats().wanted_hits == 2
    assert order.stats().wanted_blocks == 0  # every request told back once it was served
    off = SegmentedLRU(keep_waiting=False)
    assert replay_order(chains, 4, off, "x", waiting=2).hit_blocks == 0
    assert replay_order(chains, 4, LRU(), "lru", waiting=2).hit_blocks == 0  # no hints: vLLM's
    with pytest.raises(ValueError, match="waiting must be >= 0, got -1"):
        replay_order(chains, 4, LRU(), "lru", waiting=-1)


def test_rejects_an_empty_cache():
    with pytest.raises(ValueError, match="cache_blocks must be >= 1, got 0"):
        replay_order(CHAINS, 0, LRU(), "lru")


prefix_chains = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=6), min_size=1,
                         max_size=25).map(
    lambda chains: [tuple(tuple(c[: i + 1]) for i in range(len(c))) for c in chains])
"""Chains whose keys name whole prefixes, as vLLM's block hashes do."""


@settings(max_examples=100, deadline=None)
@given(chains=prefix_chains, cache_blocks=st.integers(1, 10))
def test_hits_never_exceed_an_infinite_cache(chains, cache_blocks):
    seen: set = set()
    bound = 0
    for chain in chains:  # an infinite cache hits each chain's longest seen prefix
        hit = 0
        while hit < len(chain) and chain[hit] in seen:
            hit += 1
        bound += hit
        seen.update(chain)
    for result in (replay_order(chains, cache_blocks, LRU(), "lru"),
                   replay_order(chains, cache_blocks, SegmentedLRU(), "slru"),
                   replay_opt(chains, cache_blocks)):
        assert 0 <= result.hit_blocks <= bound
        assert result.prompt_blocks == sum(map(len, chains))


def test_command_writes_the_summary_and_the_plot(tmp_path):
    trace = tmp_path / "trace.jsonl"
    lines = [{"name": "tiny", "block_size": 16}]
    for i in range(40):
        lines.append({"arrival_s": i, "prompt_tokens": 64, "output_tokens": 1,
                      "block_hashes": [i % 3, 100 + i % 3, 200 + i % 5, 1000 + i]})
    trace.write_text("\n".join(json.dumps(line) for line in lines))
    out = tmp_path / "out"
    main(["--trace", str(trace), "--cache-blocks", "4", "8", "--policies", "lru,slru,opt",
          "--out", str(out)])
    summary = json.loads((out / "summary.json").read_text())
    rows = {(r["policy"], r["cache_blocks"]): r["hit_rate"] for r in summary["results"]}
    assert set(rows) == {(p, n) for p in ("lru", "slru", "opt") for n in (4, 8)}
    assert all(0.0 <= rate <= 1.0 for rate in rows.values())
    assert rows[("opt", 8)] >= rows[("lru", 8)]
    assert (out / "hit_rate.png").stat().st_size > 0
