"""Checks on vLLM's block pool under a `PolicyFreeBlockQueue`."""


def check_pool(scheduler):
    """Every free block is in the queue exactly once and the count is exact."""
    pool = scheduler.kv_cache_manager.block_pool
    queue = pool.free_block_queue
    queue.check_invariants()
    free = [b for b in pool.blocks if b.ref_cnt == 0 and not b.is_null]
    assert queue.num_free_blocks == len(free) == pool.get_num_free_blocks()
    assert {b.block_id for b in queue.get_all_free_blocks()} == {b.block_id for b in free}
