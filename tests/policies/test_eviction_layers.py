"""The eviction family as layers: each class adds its counters to the one below it, a
layer's counters stay 0 on orders without it, and layers move keys through the public
segment API."""

import attrs
import pytest

from policies import LRU, DuelingSLRU, EvictionOrder, Segment, SegmentedLRU
from policies.kv.eviction import (
    CancellationRetention,
    FrequencyLRU,
    PromptVersioning,
    SetDueling,
    WaitingQueueAwareness,
)

STACK = [LRU, FrequencyLRU, CancellationRetention, PromptVersioning, WaitingQueueAwareness,
         SegmentedLRU, SetDueling, DuelingSLRU]
"""Bottom to top: each class is a layer over the one before it."""


def test_each_layer_extends_the_one_below_and_keeps_its_counters():
    for lower, upper in zip(STACK, STACK[1:], strict=False):
        assert issubclass(upper, lower)
        assert upper.COUNTERS[:len(lower.COUNTERS)] == lower.COUNTERS
    assert set(DuelingSLRU.COUNTERS) == {
        f.name for f in attrs.fields(type(DuelingSLRU().stats()))} - {
        f.name for f in attrs.fields(type(LRU().stats())) if f.name.endswith("_blocks")} - {
        "evictions_by_segment"}


@pytest.mark.parametrize("cls", STACK)
def test_every_layer_is_an_order_that_counts_only_its_own_events(cls):
    order = cls()
    assert isinstance(order, EvictionOrder)
    order.release("a")
    order.release_cancelled("b")
    order.acquire("a")
    order.release("a")  # a reuse: promoted from FrequencyLRU up
    order.evict()
    order.check_invariants()
    stats = order.stats()
    assert (stats.releases, stats.acquires, stats.evictions) == (3, 1, 1)
    assert stats.promotions == (1 if issubclass(cls, FrequencyLRU) else 0)
    assert stats.retained_cancelled == (1 if issubclass(cls, CancellationRetention) else 0)


def test_layers_move_keys_through_the_segment_api():
    order = SegmentedLRU()
    for key in "abc":
        order.release(key)
    assert list(order.keys_in(Segment.PROBATION)) == ["a", "b", "c"]
    order.move("c", Segment.PROBATION, front=True)
    order.move("a", Segment.PROTECTED)
    assert list(order) == ["c", "b", "a"] and order.segment_of("a") is Segment.PROTECTED
    order.expect(["b"])
    order.move("b", Segment.PROBATION)  # wanted by a waiting request: stays in WANTED
    assert order.segment_of("b") is Segment.WANTED
    order.check_invariants()
    order.acquire("c")
    with pytest.raises(KeyError, match="key 'c' is not evictable"):
        order.move("c", Segment.PROBATION)
