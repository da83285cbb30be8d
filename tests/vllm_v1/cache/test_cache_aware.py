"""CacheAwareRanker inside vLLM's real scheduler: cached prompts start first, the fallback
keeps arrival order under a large queue, and the view carries the cached tokens."""

from integrations.vllm_v1 import Pipeline
from integrations.vllm_v1.instruments import EngineShape, SchedulerHarness
from policies import QoSRanker
from policies.kv.cache_aware import CacheAwareRanker

SHAPE = EngineShape(num_blocks=128, max_num_seqs=1, max_num_batched_tokens=512,
                    max_model_len=2048)
PREFIX = [3 + i % 50 for i in range(160)]  # 10 blocks of 16 tokens


def first_scheduled_order(pipeline, arrivals):
    """Warm the cache with PREFIX, keep the engine busy, queue ``arrivals``; first-schedule order.

    ``arrivals`` are ``(request id, warm?)``: a warm request repeats PREFIX (and hits the
    cache), a cold one has a prompt of the same length no one has sent.
    """
    harness = SchedulerHarness.build(pipeline, shape=SHAPE)
    harness.add_request("warmup", PREFIX, 1)
    while harness.has_requests():
        harness.step()
    harness.add_request("busy", [9000 + i for i in range(32)], 20)
    harness.step()  # "busy" takes the only seat
    for index, (request_id, warm) in enumerate(arrivals):
        harness.clock.advance(0.1)
        prompt = PREFIX + [1] if warm else [20_000 + 500 * index + i for i in range(161)]
        harness.add_request(request_id, prompt, 2)
    order = []
    while harness.has_requests():
        harness.clock.advance(0.01)
        for new in harness.step().scheduler_output.scheduled_new_reqs:
            order.append(new.req_id)
    return order


def test_a_cache_hitting_request_is_served_before_an_earlier_cold_one():
    arrivals = [("cold", False), ("warm", True)]
    assert first_scheduled_order(Pipeline(), arrivals) == ["cold", "warm"]  # stock FCFS
    assert first_scheduled_order(Pipeline(ranking=CacheAwareRanker()), arrivals) == [
        "warm", "cold"]


def test_the_head_start_composes_with_a_qos_base_and_keeps_priority():
    pipeline = Pipeline(ranking=CacheAwareRanker(base=QoSRanker(), bonus_s=1.0))
    arrivals = [("cold", False), ("warm", True)]
    assert first_scheduled_order(pipeline, arrivals) == ["warm", "cold"]


def test_under_a_large_queue_the_fallback_keeps_arrival_order():
    pipeline = Pipeline(ranking=CacheAwareRanker(max_waiting_requests=2))
    arrivals = [("cold0", False), ("cold1", False), ("cold2", False), ("warm", True)]
    assert first_scheduled_order(pipeline, arrivals) == ["cold0", "cold1", "cold2", "warm"]
    light = Pipeline(ranking=CacheAwareRanker(max_waiting_requests=3))
    assert first_scheduled_order(light, arrivals)[0] == "warm"


def test_the_view_carries_the_cached_tokens_found_on_admission():
    harness = SchedulerHarness.build(Pipeline(ranking=CacheAwareRanker()), shape=SHAPE)
    harness.add_request("warmup", PREFIX, 1)
    while harness.has_requests():
        harness.step()
    harness.add_request("again", PREFIX, 1)
    request = harness.scheduler.requests["again"]
    assert harness.scheduler._view(request).cached_tokens == 144  # 9 full blocks; the last
    # token's block is recomputed, as vLLM's own lookup does
    assert harness.step().scheduler_output.num_scheduled_tokens["again"] == 160 - 144
