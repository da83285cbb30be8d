"""The swapped free-block queue inside the real vLLM scheduler: exact bookkeeping, no leaks."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from integrations.vllm_v1 import Pipeline
from integrations.vllm_v1.cache.eviction import PolicyFreeBlockQueue
from integrations.vllm_v1.instruments import EngineShape, SchedulerHarness
from policies import LRU, SegmentedLRU
from tests.helpers.cache import check_pool
from tests.helpers.workloads import replay_workload, workloads

WORKLOADS = workloads(max_output_tokens=40, max_requests=14)


SHAPES = st.builds(lambda blocks, budget: EngineShape(num_blocks=blocks, max_num_seqs=8,
                                                      max_num_batched_tokens=budget,
                                                      max_model_len=1024),
                   st.sampled_from([20, 40, 512]), st.sampled_from([64, 256]))


def test_the_pipeline_installs_its_order_as_the_free_block_queue():
    order = SegmentedLRU()
    harness = SchedulerHarness.build(Pipeline(eviction=order), shape=EngineShape(num_blocks=64))
    queue = harness.scheduler.kv_cache_manager.block_pool.free_block_queue
    assert isinstance(queue, PolicyFreeBlockQueue)
    assert queue.num_free_blocks == 63  # all but vLLM's null block
    assert isinstance(queue.order, SegmentedLRU)  # the engine's own (unpickled) copy
    check_pool(harness.scheduler)


def test_a_pipeline_without_eviction_keeps_vllms_queue():
    harness = SchedulerHarness.build(Pipeline(), shape=EngineShape(num_blocks=64))
    queue = harness.scheduler.kv_cache_manager.block_pool.free_block_queue
    assert not isinstance(queue, PolicyFreeBlockQueue)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload=WORKLOADS, shape=SHAPES)
def test_lru_order_schedules_exactly_like_stock_vllm(workload, shape):
    """vLLM's LRU through our queue: same hits, preemptions and finishes, step by step."""
    stock = replay_workload(SchedulerHarness.build(None, shape=shape), workload)
    ours = replay_workload(SchedulerHarness.build(Pipeline(eviction=LRU()), shape=shape), workload,
               check=check_pool)
    assert ours == stock


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload=WORKLOADS, shape=SHAPES)
def test_segmented_lru_keeps_every_pool_invariant_and_leaks_nothing(workload, shape):
    harness = SchedulerHarness.build(Pipeline(eviction=SegmentedLRU()), shape=shape)
    replay_workload(harness, workload, check=check_pool)
    pool = harness.scheduler.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == shape.num_blocks - 1  # everything came back
    assert not harness.scheduler.requests


def test_prefix_hits_are_served_from_the_queue():
    shape = EngineShape(num_blocks=64, max_num_seqs=4, max_model_len=1024)
    harness = SchedulerHarness.build(Pipeline(eviction=SegmentedLRU()), shape=shape)
    prompt = [5 + i % 50 for i in range(160)]  # 10 full blocks
    harness.add_request("first", prompt, 2)
    while harness.has_requests():
        harness.step()
    harness.add_request("second", prompt, 2)
    scheduled = harness.step().scheduler_output.num_scheduled_tokens["second"]
    assert scheduled == 160 - 144  # 9 blocks hit; vLLM recomputes the block of the last token
    queue = harness.scheduler.kv_cache_manager.block_pool.free_block_queue
    assert queue.order.stats().acquires == 9
    check_pool(harness.scheduler)


def test_a_preempted_requests_blocks_are_shielded():
    shape = EngineShape(num_blocks=24, max_num_seqs=4, max_num_batched_tokens=256,
                        max_model_len=1024)
    harness = SchedulerHarness.build(Pipeline(eviction=SegmentedLRU()), shape=shape)
    for i in range(3):  # three 100-token prompts growing by 120 tokens cannot all fit 23 blocks
        harness.add_request(f"r{i}", [1000 * i + t % 50 for t in range(100)], 120)
    preempted = 0
    while harness.has_requests():
        preempted += len(harness.step().scheduler_output.preempted_req_ids or ())
        check_pool(harness.scheduler)
    queue = harness.scheduler.kv_cache_manager.block_pool.free_block_queue
    assert preempted > 0
    assert queue.order.stats().shielded > 0


def test_popping_an_empty_queue_raises_like_vllm():
    queue = PolicyFreeBlockQueue([], SegmentedLRU())
    with pytest.raises(ValueError, match="No free blocks available"):
        queue.popleft()
