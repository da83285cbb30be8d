"""Waiting-queue awareness inside vLLM's scheduler: blocks a waiting prompt will hit stay."""

import pytest

from integrations.vllm_v1 import Pipeline
from integrations.vllm_v1.instruments import EngineShape, SchedulerHarness
from policies.kv.eviction import DuelingSLRU
from tests.helpers.cache import check_pool


def installed_order(harness):
    return harness.scheduler.kv_cache_manager.block_pool.free_block_queue.order


def finish(harness, request_id, prompt):
    harness.add_request(request_id, prompt, 1)
    while harness.has_requests():
        harness.step()


def first_computed_tokens(harness, request_id):
    """Steps (at most 1,000) until ``request_id`` is scheduled; its prefix hit in tokens."""
    for _ in range(1000):
        output = harness.step().scheduler_output
        check_pool(harness.scheduler)
        for new in output.scheduled_new_reqs:
            if new.req_id == request_id:
                return new.num_computed_tokens
    raise AssertionError(f"{request_id} not scheduled in 1,000 steps")


@pytest.mark.parametrize(("keep_waiting", "hit_blocks"), [(True, 5), (False, 1)])
def test_a_waiting_prompts_cached_blocks_outlive_older_ones(keep_waiting, hit_blocks):
    # 15 usable blocks of 16 tokens; one request at a time, so `wanted` waits behind `big`
    shape = EngineShape(num_blocks=16, max_num_seqs=1, max_model_len=512)
    harness = SchedulerHarness.build(Pipeline(eviction=DuelingSLRU(keep_waiting=keep_waiting)),
                                     shape=shape)
    order = installed_order(harness)
    shared = [1000 + i for i in range(80)]  # 5 full blocks
    finish(harness, "first", shared)  # released first: LRU's next victims
    finish(harness, "other", [3000 + i for i in range(80)])  # 5 more, released later
    harness.add_request("big", [5000 + i for i in range(144)], 1)  # needs 4 cached blocks
    harness.add_request("wanted", shared + [7, 8, 9], 1)
    assert order.stats().wanted_blocks == (5 if keep_waiting else 0)
    assert first_computed_tokens(harness, "wanted") == 16 * hit_blocks
    stats = order.stats()
    assert (stats.wanted_hits, stats.wanted_blocks) == ((5, 0) if keep_waiting else (0, 0))


def test_a_preempted_request_waits_again_and_a_finished_one_is_forgotten():
    shape = EngineShape(num_blocks=12, max_num_seqs=2, max_model_len=512)
    harness = SchedulerHarness.build(Pipeline(eviction=DuelingSLRU()), shape=shape)
    order = installed_order(harness)
    harness.add_request("a", [100 + i for i in range(64)], 60)
    harness.add_request("b", [300 + i for i in range(64)], 60)  # both grow until one is preempted
    wanted, preempted = [], 0
    while harness.has_requests():
        output = harness.step().scheduler_output
        check_pool(harness.scheduler)
        wanted.append(order.stats().wanted_blocks)
        preempted += len(output.preempted_req_ids or ())
    assert preempted and any(wanted), "a preempted request's blocks were wanted while it waited"
    assert order.stats().wanted_blocks == 0 and not order._wanted  # all told back


def test_the_cache_preset_ships_it_and_the_replay_can_switch_it_off():
    from benchmarks.replay.pipelines import cache_without_waiting
    from integrations.vllm_v1.config.presets import preset

    assert preset("cache").eviction.keep_waiting
    off = cache_without_waiting()
    assert not off.eviction.keep_waiting and off.eviction.session_pins is not None
