"""``benchmarks.overhead --churn`` exercises the eviction order: blocks are freed, hit and
evicted at every step, and requests finish and start (the steady benchmark does neither)."""

from benchmarks import overhead


def test_churn_turns_the_batch_over_and_evicts_cached_blocks():
    harness = overhead._churn_harness("cache", running=16, waiting=400)
    order = harness.scheduler.kv_cache_manager.block_pool.free_block_queue.order
    before = order.stats()
    finished = 0
    for _ in range(60):
        finished += len(harness.complete(harness.scheduler.schedule()).finished_request_ids)
        harness.clock.advance(0.01)
    after = order.stats()
    num_blocks = harness.scheduler.kv_cache_manager.block_pool.num_gpu_blocks
    assert finished > 16, "requests finish and waiting ones start during the timed steps"
    assert after.acquires > before.acquires, "prefix hits on cached blocks"
    assert after.evictions > num_blocks, "more blocks taken than exist: cached ones are evicted"


def test_measure_reports_the_churn_scenario():
    row = overhead.measure("cache", running=16, waiting=200, iterations=6, clock="cpu",
                           churn=True)
    assert row["churn"] is True and row["pipeline"] == "cache"
    assert row["stock_median_us"] > 0 and row["pipeline_median_us"] > 0
