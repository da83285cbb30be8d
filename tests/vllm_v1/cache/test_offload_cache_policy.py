"""`SegmentedLRUCachePolicy` as vLLM's CPU offload tier sees it: the `CachePolicy` contract
(shared with vLLM's own LRU), a stateful oracle, what SegmentedLRU changes, and loading."""

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from vllm.v1.kv_offload.base import ReqContext, make_offload_key
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory
from vllm.v1.kv_offload.cpu.policies.lru import LRUCachePolicy

from integrations.vllm_v1.cache.offload_policy import SegmentedLRUCachePolicy
from integrations.vllm_v1.vllm_surface.names import ChunkStatus
from policies.kv.eviction import Segment

MODULE = "integrations.vllm_v1.cache.offload_policy"
POLICIES = [LRUCachePolicy, SegmentedLRUCachePolicy]
CHUNK_TOKENS = 32


def key(i, group=0):
    return make_offload_key(i.to_bytes(8, "big"), group)


def request(keys, start=0):
    """A ``ReqContext`` in which ``keys`` are consecutive chunks from chunk ``start`` on."""
    context = ReqContext(req_id="r")
    for i, k in enumerate(keys, start + 1):
        context.set_offload_key_position(k, i * CHUNK_TOKENS)
    return context


def stored(policy, *keys):
    """Insert ``keys`` as the manager does: pending (``ref_cnt == -1``), then stored."""
    chunks = {}
    for i, k in enumerate(keys):
        chunks[k] = ChunkStatus(i)
        policy.insert(k, chunks[k])
    for k in keys:
        chunks[k].ref_cnt = 0
        policy.mark_evictable(k)
    return chunks


def load(policy, k):
    """One load of ``k`` from start to end, as the manager does it."""
    chunk = policy.get(k)
    if chunk.ref_cnt == 0:
        policy.mark_non_evictable(k)
    chunk.ref_cnt += 1
    chunk.ref_cnt -= 1
    if chunk.ref_cnt == 0:
        policy.mark_evictable(k)


def evicted_keys(result):
    return None if result is None else [k for k, _ in result]


# -- the CachePolicy contract, for vLLM's LRU and ours ------------------------------------


@pytest.fixture(params=POLICIES, ids=lambda cls: cls.__name__)
def policy(request):
    return request.param(cache_capacity=8)


def test_get_returns_the_inserted_chunk_and_none_when_absent(policy):
    chunks = stored(policy, key(1))
    assert policy.get(key(1)) is chunks[key(1)]
    assert policy.get(key(2)) is None


def test_evicts_the_least_recently_stored_idle_chunk(policy):
    chunks = stored(policy, key(1), key(2))
    assert policy.evict(1, set()) == [(key(1), chunks[key(1)])]
    assert policy.get(key(1)) is None and policy.get(key(2)) is chunks[key(2)]


def test_pending_and_pinned_chunks_are_never_evicted(policy):
    policy.insert(key(1), ChunkStatus(0))  # a store in flight: ref_cnt == -1
    stored(policy, key(2))
    policy.mark_non_evictable(key(2))
    policy.get(key(2)).ref_cnt = 1  # a load in flight
    assert policy.evict(1, set()) is None
    policy.get(key(2)).ref_cnt = 0
    policy.mark_evictable(key(2))
    assert evicted_keys(policy.evict(1, set())) == [key(2)]


def test_protected_chunks_are_skipped(policy):
    stored(policy, key(1), key(2))
    assert evicted_keys(policy.evict(1, {key(1)})) == [key(2)]
    assert policy.evict(1, {key(1)}) is None
    assert policy.get(key(1)) is not None


def test_evict_is_atomic(policy):
    stored(policy, key(1), key(2), key(3))
    assert policy.evict(3, {key(2)}) is None
    assert policy.evict(4, set()) is None
    assert all(policy.get(key(i)) is not None for i in (1, 2, 3))
    assert sorted(evicted_keys(policy.evict(3, set()))) == [key(1), key(2), key(3)]


def test_evicting_nothing_returns_an_empty_list(policy):
    assert policy.evict(0, set()) == []


def test_touch_makes_a_chunk_recent(policy):
    stored(policy, key(1), key(2))
    policy.touch([key(1)], ReqContext(req_id="r"))
    assert evicted_keys(policy.evict(1, set())) == [key(2)]


def test_remove_forgets_a_failed_store(policy):
    policy.insert(key(1), ChunkStatus(0))
    policy.remove(key(1))
    assert policy.get(key(1)) is None
    assert policy.evict(1, set()) is None


def test_clear_drops_every_chunk(policy):
    stored(policy, key(1), key(2))
    policy.mark_non_evictable(key(2))
    policy.clear()
    assert policy.get(key(1)) is None and policy.get(key(2)) is None
    assert policy.evict(1, set()) is None


# -- what SegmentedLRU changes -------------------------------------------------------------


def test_a_loaded_chunk_outlives_chunks_never_reused():
    slru, lru = SegmentedLRUCachePolicy(cache_capacity=8), LRUCachePolicy(cache_capacity=8)
    for policy in (slru, lru):
        stored(policy, key(1), key(2), key(3))
        load(policy, key(1))
    assert slru.order.segment_of(key(1)) is Segment.PROTECTED
    assert evicted_keys(slru.evict(2, set())) == [key(2), key(3)]
    assert evicted_keys(lru.evict(2, set())) == [key(1), key(2)]  # pins do not refresh LRU


def test_a_load_and_its_reuse_report_count_one_use():
    policy = SegmentedLRUCachePolicy(cache_capacity=8)
    context = request([key(1), key(2)])
    stored(policy, key(1), key(2))
    load(policy, key(1))
    policy.on_request_finished([[key(1), key(2)]], {key(2)}, {key(1)}, context)
    assert policy.order.uses(key(1)) == 2
    assert policy.order.uses(key(2)) == 1  # inserted only: not a use
    policy.on_request_finished([[key(1)]], set(), {key(1)}, request([key(1)]))
    assert policy.order.uses(key(1)) == 3  # a second request's reuse counts
    policy.check_invariants()


def test_a_protected_idle_chunk_is_held_out_as_a_reuse():
    policy = SegmentedLRUCachePolicy(cache_capacity=8)
    stored(policy, key(1), key(2))
    assert evicted_keys(policy.evict(1, {key(1)})) == [key(2)]
    assert policy.order.uses(key(1)) == 2
    policy.on_request_finished([[key(1)]], set(), {key(1)}, request([key(1)]))
    assert policy.order.uses(key(1)) == 2  # the report matches the hold-out
    policy.check_invariants()


def test_the_chain_is_learned_from_positions_and_orphans_go_next():
    policy = SegmentedLRUCachePolicy(cache_capacity=8)
    chain = [key(1), key(2), key(3)]
    policy.on_store_miss(chain, request(chain))
    stored(policy, key(9), *chain)  # key(9): an older chunk of another request
    load(policy, key(9))  # reused: protected
    assert evicted_keys(policy.evict(1, set())) == [key(1)]
    assert policy.order.segment_of(key(2)) is Segment.ORPHAN
    assert policy.order.segment_of(key(3)) is Segment.PROBATION  # its parent is still cached
    policy.check_invariants()


def test_a_gap_in_the_positions_is_not_a_link():
    policy = SegmentedLRUCachePolicy(cache_capacity=8)
    context = ReqContext(req_id="r")
    for i, end in ((1, 32), (2, 64), (3, 128)):
        context.set_offload_key_position(key(i), end)
    policy.on_store_miss([key(1), key(2), key(3)], context)
    stored(policy, key(1), key(2), key(3))
    policy.evict(2, set())
    assert policy.order.segment_of(key(3)) is Segment.PROBATION


def test_evicted_content_that_returns_is_promoted():
    policy = SegmentedLRUCachePolicy(cache_capacity=8)
    stored(policy, key(1), key(2))
    load(policy, key(1))
    policy.evict(2, set())
    stored(policy, key(1))
    assert policy.order.segment_of(key(1)) is Segment.PROTECTED  # the ghost list


# -- a stateful oracle ---------------------------------------------------------------------

CAPACITY = 4
KEYS = [key(i) for i in range(8)]


class OffloadTier(RuleBasedStateMachine):
    """The manager's calls on a tier of ``CAPACITY`` chunks; the oracle is a dict of ref_cnts."""

    policy_cls = SegmentedLRUCachePolicy

    def __init__(self):
        super().__init__()
        self.policy = self.policy_cls(cache_capacity=CAPACITY)
        self.chunks = {}  # key -> the ChunkStatus handed to the policy
        self.next_id = 0

    def idle(self, protected=frozenset()):
        return [k for k, c in self.chunks.items() if c.ref_cnt == 0 and k not in protected]

    @rule(k=st.sampled_from(KEYS), protected=st.sets(st.sampled_from(KEYS), max_size=3))
    def store(self, k, protected):
        if k in self.chunks:
            return
        protected = protected | {k}
        if len(self.chunks) == CAPACITY:
            can = len(self.idle(protected)) >= 1
            result = self.policy.evict(1, protected)
            assert (result is not None) == can
            if result is None:
                return
            (victim, chunk), = result
            assert victim not in protected and self.chunks.pop(victim) is chunk
            assert chunk.ref_cnt == 0
        self.chunks[k] = ChunkStatus(self.next_id)
        self.next_id += 1
        self.policy.insert(k, self.chunks[k])

    @rule(data=st.data())
    def finish_store(self, data):
        pending = [k for k, c in self.chunks.items() if c.ref_cnt == -1]
        if pending:
            k = data.draw(st.sampled_from(pending))
            if data.draw(st.booleans()):
                self.chunks[k].ref_cnt = 0
                self.policy.mark_evictable(k)
            else:
                self.policy.remove(k)
                del self.chunks[k]

    @rule(data=st.data())
    def start_load(self, data):
        ready = [k for k, c in self.chunks.items() if c.ref_cnt >= 0]
        if ready:
            k = data.draw(st.sampled_from(ready))
            if self.chunks[k].ref_cnt == 0:
                self.policy.mark_non_evictable(k)
            self.chunks[k].ref_cnt += 1

    @rule(data=st.data())
    def finish_load(self, data):
        pinned = [k for k, c in self.chunks.items() if c.ref_cnt > 0]
        if pinned:
            k = data.draw(st.sampled_from(pinned))
            self.chunks[k].ref_cnt -= 1
            if self.chunks[k].ref_cnt == 0:
                self.policy.mark_evictable(k)

    @rule(n=st.integers(0, CAPACITY + 1), protected=st.sets(st.sampled_from(KEYS), max_size=3))
    def evict(self, n, protected):
        can = len(self.idle(protected)) >= n
        result = self.policy.evict(n, set(protected))
        assert (result is not None) == can
        for victim, chunk in result or ():
            assert victim not in protected and chunk.ref_cnt == 0
            assert self.chunks.pop(victim) is chunk
        assert result is None or len({k for k, _ in result}) == n

    @rule(keys=st.lists(st.sampled_from(KEYS), unique=True, max_size=4), data=st.data())
    def finish_request(self, keys, data):
        reused = {k for k in keys if k in self.chunks and self.chunks[k].ref_cnt >= 0}
        reused = data.draw(st.sets(st.sampled_from(sorted(reused)))) if reused else set()
        self.policy.on_store_miss([k for k in keys if k not in self.chunks], request(keys))
        self.policy.on_request_finished([keys], set(keys) - reused, reused, request(keys))

    @precondition(lambda self: self.chunks)
    @rule()
    def clear(self):
        self.policy.clear()
        self.chunks.clear()

    @invariant()
    def no_chunk_is_lost(self):
        assert len(self.chunks) <= CAPACITY
        for k in KEYS:
            assert self.policy.get(k) is self.chunks.get(k)
        if hasattr(self.policy, "check_invariants"):
            self.policy.check_invariants()


class OffloadTierLRU(OffloadTier):
    policy_cls = LRUCachePolicy


TestOffloadTier = OffloadTier.TestCase
TestOffloadTier.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestOffloadTierLRU = OffloadTierLRU.TestCase
TestOffloadTierLRU.settings = settings(max_examples=30, stateful_step_count=40, deadline=None)


# -- loading it the way vLLM does ----------------------------------------------------------


def test_vllm_loads_the_policy_by_name_and_module_path():
    cls = CachePolicyFactory.get_cache_policy_cls("SegmentedLRUCachePolicy", MODULE)
    assert cls is SegmentedLRUCachePolicy


def test_vllms_cpu_manager_stores_loads_and_evicts_through_it():
    manager = CPUOffloadingManager(num_chunks=2, cache_policy="SegmentedLRUCachePolicy",
                                   cache_policy_module_path=MODULE)
    first, second, third = [key(1)], [key(2)], [key(3)]
    for keys in (first, second):
        context = request(keys)
        assert manager.prepare_store(keys, context).keys_to_store == keys
        manager.complete_store(keys, context)
        manager.on_request_finished(context)
    context = request(first)
    manager.prepare_load(first, context)
    manager.complete_load(first, context)
    manager.on_request_finished(context)
    output = manager.prepare_store(third, request(third))
    assert output.evicted_keys == second  # LRU would evict `first`, the older store
    manager._policy.check_invariants()
