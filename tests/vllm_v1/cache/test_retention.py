"""Cancellation-aware retention and cache versioning: the policy, then inside vLLM's scheduler."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from integrations.vllm_v1 import Pipeline
from integrations.vllm_v1.instruments import EngineShape, SchedulerHarness
from integrations.vllm_v1.vllm_surface.names import RequestStatus
from policies import LRU, Segment, SegmentedLRU
from policies.kv.eviction import RetentionHints
from policies.kv.prompt_versions import PromptVersions
from tests.helpers.cache import check_pool
from tests.helpers.drain import drain


def release_chain(order, chain, cancelled=False):
    """Release a request's chain tail first, as vLLM frees it."""
    for i in range(len(chain) - 1, -1, -1):
        parent = chain[i - 1] if i else None
        if cancelled:
            order.release_cancelled(chain[i], parent)
        else:
            order.release(chain[i], parent)


@pytest.mark.parametrize("cls", [LRU, SegmentedLRU])
def test_implements_the_retention_hints(cls):
    assert isinstance(cls(), RetentionHints)


def test_a_cancelled_requests_blocks_are_retained():
    order = SegmentedLRU()
    for i in range(100):  # a cache of some size (PROTECTED holds at most 98 % of it)
        order.release(i)
    release_chain(order, ["sys", "code"], cancelled=True)
    release_chain(order, ["x", "y"])
    assert order.segment_of("sys") is order.segment_of("code") is Segment.PROTECTED
    assert order.segment_of("x") is Segment.PROBATION
    assert order.stats().retained_cancelled == 2
    evicted = [order.evict() for _ in range(102)]  # every one-shot block goes first
    assert evicted[-2:] == ["y", "x"] and list(order) == ["code", "sys"]
    off = SegmentedLRU(retain_cancelled=False)
    release_chain(off, ["sys", "code"], cancelled=True)
    assert off.segment_of("sys") is Segment.PROBATION and off.stats().retained_cancelled == 0


def test_plain_lru_treats_a_cancelled_release_as_a_release():
    order, plain = LRU(), LRU()
    release_chain(order, ["a", "b"], cancelled=True)
    release_chain(plain, ["a", "b"])
    assert list(order) == list(plain) == ["b", "a"]
    assert order.observe_prompt("t", "a", "2") == 0


def test_demote_chain_moves_a_protected_chain_to_the_front_leaves_first():
    order = SegmentedLRU()
    for _ in range(2):  # used twice: protected
        for key in ("v1", "v1a", "v1b"):
            if key in order:
                order.acquire(key)
        release_chain(order, ["v1", "v1a", "v1b"])
    release_chain(order, ["other"])
    assert order.segment_of("v1") is Segment.PROTECTED
    assert order.demote_chain("v1") == 3
    assert list(order)[:3] == ["v1b", "v1a", "v1"]
    assert order.uses("v1") == 0 and order.stats().demoted_stale == 3
    assert order.evict() == "v1b"
    assert order.demote_chain("unknown") == 0
    order.check_invariants()


def test_a_demoted_referenced_block_is_released_as_a_first_use():
    order = SegmentedLRU()
    release_chain(order, ["r"])
    order.acquire("r")
    order.demote_chain("r")  # still referenced
    order.release("r")
    assert order.segment_of("r") is Segment.PROBATION and order.uses("r") == 0


def test_an_explicit_new_version_makes_the_old_roots_stale_once():
    versions = PromptVersions()
    assert versions.observe("acme", "v1-root", "1") == ()
    assert versions.observe("acme", "chat-root", None) == ()
    assert versions.observe("acme", "v2-root", "2") == ("v1-root",)
    assert versions.observe("acme", "v2-root", "2") == ()
    assert versions.observe("acme", "v1-root", "1") == ()  # a late v1 request: no flapping
    assert versions.observe("globex", "g-root", "9") == ()  # other tenants are separate


def test_implicit_detection_needs_a_shared_root_and_a_window_without_it():
    versions = PromptVersions(stale_after_requests=3, min_uses=2)
    seen = [versions.observe("t", root) for root in ["old", "old", "one-off", "new", "new",
                                                     "new", "new"]]
    assert seen == [(), (), (), (), (), ("old",), ()]  # "one-off" (1 use) is only forgotten
    assert versions.tracked_roots("t") == ("new",)


def test_a_root_another_tenant_still_uses_is_never_stale():
    versions = PromptVersions()
    versions.observe("a", "shared", "1")
    versions.observe("b", "shared", None)
    assert versions.observe("a", "a-v2", "2") == ()


@given(st.lists(st.tuples(st.sampled_from("ab"), st.integers(0, 6),
                          st.sampled_from([None, "1", "2", "3"])), max_size=80))
def test_stale_roots_are_reported_at_most_once_per_use(requests):
    versions = PromptVersions(stale_after_requests=5, min_uses=2, max_roots_per_tenant=4)
    used_since_report: dict = {}
    for tenant, root, version in requests:
        for stale in versions.observe(tenant, root, version):
            assert used_since_report.get(stale, 0) > 0  # reported only after being used again
            used_since_report[stale] = 0
        used_since_report[root] = used_since_report.get(root, 0) + 1
        assert all(len(versions.tracked_roots(t)) <= 4 for t in "ab")


def test_segmented_lru_demotes_what_its_prompt_versions_report():
    order = SegmentedLRU(prompt_versions=PromptVersions())
    release_chain(order, ["v1", "v1a"])
    assert order.observe_prompt("acme", "v1", "1") == 0
    assert order.observe_prompt("acme", "v2", "2") == 2
    assert SegmentedLRU().observe_prompt("acme", "v2", "2") == 0  # versioning off by default


# -- through the real scheduler -------------------------------------------------------------

SHAPE = EngineShape(num_blocks=40, max_num_seqs=4, max_num_batched_tokens=512,
                    max_model_len=1024)


def prompt(seed, blocks=10):
    return [seed * 1000 + i % 50 for i in range(16 * blocks)]


def hit_after_cancel_and_churn(order):
    """Cancel a request mid-decode, churn the cache with one-shot prompts, retry: tokens hit."""
    harness = SchedulerHarness.build(Pipeline(eviction=order), shape=SHAPE)
    harness.add_request("completion", prompt(1), 50)
    for _ in range(3):
        harness.step()
    harness.scheduler.finish_requests("completion", RequestStatus.FINISHED_ABORTED)
    check_pool(harness.scheduler)
    for i in range(4):  # 4 x 10 one-shot blocks through a 39-block cache
        harness.add_request(f"oneshot{i}", prompt(10 + i), 1)
        drain(harness, check=check_pool)
    harness.add_request("retry", prompt(1) + [1], 1)
    scheduled = harness.step().scheduler_output.num_scheduled_tokens["retry"]
    drain(harness, check=check_pool)
    return 161 - scheduled, harness.scheduler.kv_cache_manager.block_pool.free_block_queue.order


def test_a_cancelled_requests_prefix_survives_churn_and_the_retry_hits():
    hit, order = hit_after_cancel_and_churn(SegmentedLRU())
    assert hit == 160 and order.stats().retained_cancelled >= 10
    missed, _ = hit_after_cancel_and_churn(SegmentedLRU(retain_cancelled=False))
    assert missed == 0  # as junk in PROBATION, the cancelled prefix is evicted first


def test_a_new_prompt_version_demotes_the_old_prompts_blocks():
    order = SegmentedLRU(prompt_versions=PromptVersions())
    harness = SchedulerHarness.build(Pipeline(eviction=order), shape=SHAPE)
    for i in range(2):  # v1 used twice: its blocks are promoted to PROTECTED
        harness.add_request(f"v1-{i}", prompt(1) + [7 + i], 1,
                            extra_args={"tenant": "acme", "prompt_version": "v1"})
        drain(harness, check=check_pool)
    queue = harness.scheduler.kv_cache_manager.block_pool.free_block_queue
    engine_order = queue.order
    assert engine_order.stats().protected_blocks == 10
    harness.add_request("v2-0", prompt(2) + [7], 1,
                        extra_args={"tenant": "acme", "prompt_version": "v2"})
    assert engine_order.stats().demoted_stale == 10
    assert engine_order.stats().protected_blocks == 0
    drain(harness, check=check_pool)
    check_pool(harness.scheduler)
