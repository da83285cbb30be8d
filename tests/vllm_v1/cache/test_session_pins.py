"""Session pins inside vLLM's scheduler: a finished turn's blocks are pinned for the next."""

from integrations.vllm_v1 import Pipeline
from integrations.vllm_v1.instruments import EngineShape, SchedulerHarness
from policies.kv.eviction import DuelingSLRU, Segment, SessionPins
from tests.helpers.cache import check_pool


def run(harness, request_id, prompt, session_id):
    harness.add_request(request_id, prompt, 2, session_id=session_id)
    while harness.has_requests():
        harness.step()
        check_pool(harness.scheduler)


def test_a_sessions_turn_is_pinned_and_its_next_turn_hits_the_pins():
    """A turn's blocks are pinned in their place; when a one-shot request needs the room, LRU
    would evict them (the oldest): the pins hold them instead, and the next turn hits them."""
    shape = EngineShape(num_blocks=64, max_num_seqs=4, max_model_len=1024)
    order = DuelingSLRU(session_pins=SessionPins(max_pinned_fraction=1.0, judged=False))
    harness = SchedulerHarness.build(Pipeline(eviction=order), shape=shape)
    prompt = [5 + i % 50 for i in range(160)]  # 10 full blocks
    run(harness, "turn-1", prompt, "agent-1")
    queue = harness.scheduler.kv_cache_manager.block_pool.free_block_queue
    turn_blocks = [k for k in queue.order if queue.order.segment_of(k) is not Segment.UNCACHED]
    assert queue.order.stats().pins == 10 and all(map(queue.order.pinned, turn_blocks))
    run(harness, "filler", [100 + i % 50 for i in range(320)], None)  # 20 blocks, aged after
    run(harness, "pressure", [200 + i % 50 for i in range(640)], None)  # needs cached blocks
    stats = queue.order.stats()
    assert stats.pinned_blocks == 10 and dict(stats.evictions_by_segment)["probation"] > 0
    run(harness, "turn-2", prompt + [7] * 40, "agent-1")  # the next turn extends the context
    assert queue.order.stats().pin_hits == 10  # all held by their pins: the new tokens after


def test_without_a_session_id_nothing_is_pinned():
    shape = EngineShape(num_blocks=64, max_num_seqs=4, max_model_len=1024)
    order = DuelingSLRU(session_pins=SessionPins())
    harness = SchedulerHarness.build(Pipeline(eviction=order), shape=shape)
    run(harness, "one-shot", [5 + i % 50 for i in range(160)], None)
    assert harness.scheduler.kv_cache_manager.block_pool.free_block_queue.order.stats().pins == 0


def test_judged_pins_start_off_and_turn_on_where_sessions_loop_through_the_cache():
    """The shipped default: no pin until the shadow LRU that pins out-hits the plain one. Ten
    sessions taking turns through a cache too small for all of them is LRU's loop failure
    (each turn's context is evicted just before it returns): pins turn on and are hit."""
    shape = EngineShape(num_blocks=64, max_num_seqs=4, max_model_len=1024)
    harness = SchedulerHarness.build(Pipeline(eviction=DuelingSLRU(session_pins=SessionPins())),
                                     shape=shape)
    order = harness.scheduler.kv_cache_manager.block_pool.free_block_queue.order
    for turn in range(6):
        for session in range(10):  # 8 blocks of context, one more each turn
            prompt = [session + 1] * 16 + [5 + i % 50 for i in range(16 * (7 + turn))]
            run(harness, f"s{session}-t{turn}", prompt, f"agent-{session}")
            harness.clock.advance(1.0)
        if turn == 0:
            assert order.stats().pins == 0  # no evidence yet: LRU
    stats, duel = order.stats(), order.duel_stats()
    assert duel["lru_shadow_hits"] == 0 < duel["pinned_shadow_hits"]  # the loop, and pins
    assert duel["pins_on"] == 1
    assert stats.pins > 0 and stats.pin_hits > 0
    order.check_invariants()
