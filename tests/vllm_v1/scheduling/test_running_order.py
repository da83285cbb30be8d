"""The incremental running order (rank keys fixed on admission) equals the full sort's."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from integrations.vllm_v1 import Pipeline
from integrations.vllm_v1.instruments import EngineShape, SchedulerHarness
from policies import CacheAwareRanker, QoSRanker

REQUESTS = 12


@pytest.fixture(scope="module")
def scheduler():
    """A scheduler whose requests have rank keys with ties (priorities repeat, arrivals too)."""
    harness = SchedulerHarness.build(Pipeline(ranking=CacheAwareRanker(base=QoSRanker())),
                                     shape=EngineShape(num_blocks=256, max_num_seqs=REQUESTS))
    for i in range(REQUESTS):
        harness.add_request(f"r{i}", [7 + i] * 20, 4, priority=i % 3, arrival_s=float(i // 4))
    assert harness.scheduler.ordering.static_service_keys
    return harness.scheduler


# A step of vLLM's on the running list: drop the request at an index (it finished or was
# preempted), append a request not running (it started or resumed), or swap two (a reorder).
steps = st.lists(st.tuples(st.sampled_from(["drop", "append", "swap"]), st.integers(0, 99),
                           st.integers(0, 99)), max_size=30)


@settings(max_examples=150, deadline=None)
@given(start=st.permutations(range(REQUESTS)), steps=steps, sort_every=st.integers(1, 3))
def test_incremental_order_equals_the_full_sort(scheduler, start, steps, sort_every):
    requests = [scheduler.requests[f"r{i}"] for i in range(REQUESTS)]
    scheduler.running = [requests[i] for i in start[: REQUESTS // 2]]
    for n, (what, a, b) in enumerate(steps):
        running = scheduler.running
        idle = [r for r in requests if r not in running]
        if what == "drop" and running:
            running.pop(a % len(running))
        elif what == "append" and idle:
            running.append(idle[a % len(idle)])
        elif what == "swap" and running:
            i, j = a % len(running), b % len(running)
            running[i], running[j] = running[j], running[i]
        if n % sort_every == 0:
            ordering = scheduler.ordering
            expected = sorted(running, key=ordering.service_key(scheduler._view, 0.0))  # full sort
            ordering.sort_running(scheduler.running, scheduler._view, 0.0)
            assert scheduler.running == expected
