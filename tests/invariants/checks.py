"""The scheduler invariants, checked against vLLM's own bookkeeping (blocks, queues, statuses)
and our scheduler's (tracked requests, policy state, contained faults).

`assert_consistent` holds after every step of any run; `assert_drained` once every request
has finished (and every remote load the worker started has been reported).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from integrations.vllm_v1.cache.eviction import PolicyFreeBlockQueue
from integrations.vllm_v1.scheduling.scheduler import PolicySchedulerMixin
from integrations.vllm_v1.vllm_surface.names import RequestStatus

WAITING_STATUSES = frozenset({
    RequestStatus.WAITING, RequestStatus.PREEMPTED,
    RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR, RequestStatus.WAITING_FOR_STREAMING_REQ,
})
"""Statuses of requests in ``waiting`` (they hold no KV blocks)."""


def _managers(scheduler: Any) -> list[Any]:
    return list(scheduler.kv_cache_manager.coordinator.single_type_managers)


def blocks_of(scheduler: Any, request_id: str) -> list[Any]:
    """The KV blocks ``request_id`` holds (read without creating a defaultdict entry)."""
    return [block for manager in _managers(scheduler)
            for block in manager.req_to_blocks.get(request_id, ()) if not block.is_null]


def free_blocks(scheduler: Any) -> int:
    return scheduler.kv_cache_manager.block_pool.get_num_free_blocks()


def usable_blocks(scheduler: Any) -> int:
    """Every block but vLLM's null block."""
    return scheduler.kv_cache_manager.block_pool.num_gpu_blocks - 1


def _assert_queues(scheduler: Any) -> None:
    running, waiting = list(scheduler.running), list(scheduler.waiting)
    holding = list(scheduler.kv_holding_waiting)
    assert len(waiting) == len(scheduler.waiting), "waiting: len() disagrees with iteration"
    assert len(holding) == len(scheduler.kv_holding_waiting), "kv_holding_waiting: len()"
    queued = [r.request_id for r in running + waiting + holding]
    duplicates = [rid for rid, n in Counter(queued).items() if n > 1]
    assert not duplicates, f"requests in two places at once: {duplicates}"
    for request in running + waiting + holding:
        assert scheduler.requests.get(request.request_id) is request, (
            f"{request.request_id} is queued but not in scheduler.requests")
    for request in running:
        assert request.status == RequestStatus.RUNNING, (request.request_id, request.status)
        assert request.num_computed_tokens <= request.num_tokens + request.num_output_placeholders
    for request in waiting:
        assert request.status in WAITING_STATUSES, (request.request_id, request.status)
        assert not blocks_of(scheduler, request.request_id), (
            f"{request.request_id} waits ({request.status.name}) holding KV blocks")
    for request in holding:
        assert not request.is_finished() and request.status != RequestStatus.RUNNING, (
            request.request_id, request.status)
    for request_id in set(scheduler.requests) - set(queued):
        # only a finished request whose blocks wait for the connector stays behind
        assert scheduler.requests[request_id].is_finished(), (
            f"{request_id} is in scheduler.requests but in no queue")


def _assert_blocks(scheduler: Any) -> None:
    pool = scheduler.kv_cache_manager.block_pool
    holders: Counter[int] = Counter()
    for manager in _managers(scheduler):
        for request_id, blocks in manager.req_to_blocks.items():
            if blocks:
                assert request_id in scheduler.requests, (
                    f"freed request {request_id} still holds blocks "
                    f"{[b.block_id for b in blocks]}")
            holders.update(b.block_id for b in blocks if not b.is_null)
    for _, blocks in getattr(scheduler, "deferred_frees", ()):
        holders.update(b.block_id for b in blocks)
    wrong = [(b.block_id, b.ref_cnt, holders[b.block_id]) for b in pool.blocks
             if not b.is_null and b.ref_cnt != holders[b.block_id]]
    assert not wrong, f"(block, ref_cnt, holders) that disagree: {wrong[:8]}"
    free = free_blocks(scheduler)
    assert free == sum(1 for b in pool.blocks if not b.is_null and b.ref_cnt == 0), (
        "the free-block count disagrees with the blocks' reference counts")
    assert math.isclose(scheduler.kv_cache_manager.usage, 1 - free / usable_blocks(scheduler),
                        abs_tol=1e-9)
    queue = pool.free_block_queue
    if isinstance(queue, PolicyFreeBlockQueue):
        queue.check_invariants()


def _assert_ours(scheduler: Any) -> None:
    if not isinstance(scheduler, PolicySchedulerMixin):
        return
    live = {rid for rid, request in scheduler.requests.items() if not request.is_finished()}
    assert set(scheduler._tracked) == live, (
        f"tracked {sorted(scheduler._tracked)} but live {sorted(live)}")
    assert not scheduler.faults.counts, f"a policy raised (contained): {scheduler.faults.counts}"
    for policy in scheduler.pipeline.policies:
        check = getattr(policy, "check_invariants", None)
        if check is not None:
            check()


def assert_consistent(scheduler: Any) -> None:
    """Queues, statuses, block reference counts and policy state agree (any time between steps)."""
    _assert_queues(scheduler)
    _assert_blocks(scheduler)
    _assert_ours(scheduler)


def policy_tracking(scheduler: Any) -> dict[str, int]:
    """Per-request or per-tenant state the pipeline's policies still hold (by stats field)."""
    held: dict[str, int] = {}
    for policy in getattr(getattr(scheduler, "pipeline", None), "policies", ()):
        stats = getattr(policy, "stats", None)
        if stats is None:
            continue
        snapshot = stats()
        name = type(policy).__name__
        for field, count in (("requests_tracked", lambda v: v),
                             ("requests_per_level", sum),
                             ("backlogged", len),
                             ("pending_requests", lambda v: v)):
            value = getattr(snapshot, field, None)
            if value is not None and count(value):
                held[f"{name}.{field}"] = count(value)
    return held


def assert_drained(scheduler: Any) -> None:
    """Nothing is left: every block back in the pool, every request and policy entry gone."""
    assert_consistent(scheduler)
    assert not scheduler.requests, f"requests left: {sorted(scheduler.requests)}"
    assert not scheduler.running and not scheduler.waiting and not scheduler.kv_holding_waiting
    assert free_blocks(scheduler) == usable_blocks(scheduler), (
        f"{usable_blocks(scheduler) - free_blocks(scheduler)} blocks leaked")
    assert scheduler.kv_cache_manager.usage == 0
    for manager in _managers(scheduler):
        assert not any(manager.req_to_blocks.values()), dict(manager.req_to_blocks)
        assert not manager.num_cached_block, manager.num_cached_block
    assert not getattr(scheduler, "deferred_frees", ())
    assert not scheduler.finished_recving_kv_req_ids
    assert not scheduler.failed_recving_kv_req_ids
    assert not scheduler.has_requests()
    if isinstance(scheduler, PolicySchedulerMixin):
        assert not scheduler._tracked and not scheduler.arrivals.rejected
        assert not scheduler.waiting._popped and not scheduler.accounting.charged_on_dispatch
        assert policy_tracking(scheduler) == {}
