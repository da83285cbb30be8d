"""`Ordering` without vLLM: queue keys, the running order and slot preemption's queue moves."""

import math

import pytest

from integrations.vllm_v1 import Pipeline
from integrations.vllm_v1.scheduling.faults import PolicyFaults
from integrations.vllm_v1.scheduling.ordering import Ordering, sort_number, stock_priority_key
from integrations.vllm_v1.scheduling.queue import PolicyRequestQueue
from policies import MLFQ, WFQ, EDFRanker, QoSRanker
from tests.vllm_v1.scheduling.seam_fakes import FakeRequest, admit, view_of


class BrokenLevels:
    """A level policy whose level is not a number."""

    def level(self, request):
        return None

    def on_scheduled(self, request, tokens, now):
        pass

    def on_preempted(self, request):
        pass


def ordering(pipeline=None, own_queue_order=True):
    pipeline = pipeline or Pipeline(ranking=QoSRanker())
    return Ordering(pipeline=pipeline, tracked={}, faults=PolicyFaults(pipeline.policies),
                    own_queue_order=own_queue_order)


def test_the_queue_key_is_level_then_rank_key():
    plain = ordering()
    admit(plain.tracked, FakeRequest(request_id="a"), rank_key=3.5)
    assert plain.queue_key(FakeRequest(request_id="a")) == (0, 3.5)
    levels = MLFQ()
    leveled = ordering(Pipeline(ranking=QoSRanker(), levels=levels))
    long = admit(leveled.tracked, FakeRequest(request_id="b", num_prompt_tokens=100_000),
                 rank_key=1.0)
    assert leveled.queue_key(long) == (levels.level(leveled.tracked["b"].admitted), 1.0)


def test_an_invalid_level_is_contained_as_level_zero():
    levels = BrokenLevels()
    broken = ordering(Pipeline(ranking=QoSRanker(), levels=levels))
    request = admit(broken.tracked, FakeRequest(request_id="a"), rank_key=2.0)
    assert broken.queue_key(request) == (0, 2.0)
    assert broken.faults.counts == {("BrokenLevels", "levels"): 1}


def test_a_requeue_key_replaces_the_computed_one():
    plain = ordering()
    request = admit(plain.tracked, FakeRequest(request_id="a"), rank_key=3.0)
    plain.requeue(request, (2, -1.0))
    assert plain.queue_key(request) == (2, -1.0)


def test_sort_number_refuses_what_a_queue_cannot_sort():
    assert sort_number(3, "level") == 3
    for bad in (None, True, "1", math.nan):
        with pytest.raises(TypeError, match="rank key must be a number"):
            sort_number(bad, "rank key")


def test_the_stock_key_is_vllms_priority_order():
    request = FakeRequest(request_id="x", priority=2, arrival_time=5.0)
    assert stock_priority_key(request) == (2, 5.0, "x")


def test_static_keys_sort_by_rank_and_keep_ties_in_place():
    plain = ordering()
    assert plain.static_service_keys
    running = [admit(plain.tracked, FakeRequest(request_id=name), rank_key=key)
               for name, key in (("c", 3.0), ("a", 1.0), ("b1", 2.0), ("b2", 2.0))]
    plain.sort_running(running, view_of(plain.tracked), now=0.0)
    assert [r.request_id for r in running] == ["a", "b1", "b2", "c"]


def test_fairness_serves_the_tenant_with_less_service_first():
    fairness = WFQ(weights={"x": 1, "y": 1})
    fair = ordering(Pipeline(ranking=QoSRanker(), fairness=fairness))
    assert not fair.static_service_keys
    served = admit(fair.tracked, FakeRequest(request_id="x1"), rank_key=0.0, tenant="x")
    starved = admit(fair.tracked, FakeRequest(request_id="y1"), rank_key=9.0, tenant="y")
    fairness.on_backlogged("x")
    fairness.on_backlogged("y")
    fairness.charge("x", input_tokens=1000)
    running = [served, starved]
    fair.sort_running(running, view_of(fair.tracked), now=0.0)
    assert running == [starved, served]


def test_late_requests_are_served_after_the_ones_on_time():
    edf = ordering(Pipeline(ranking=EDFRanker()))
    late = admit(edf.tracked, FakeRequest(request_id="late"), rank_key=0.0, deadline_s=1.0)
    on_time = admit(edf.tracked, FakeRequest(request_id="fresh"), rank_key=5.0,
                    deadline_s=1000.0)
    running = [late, on_time]
    edf.sort_running(running, view_of(edf.tracked), now=100.0)
    assert running == [on_time, late]


def queue_of(order, *specs):
    queue = PolicyRequestQueue(order.queue_key)
    requests = [admit(order.tracked, FakeRequest(request_id=name), rank_key=key)
                for name, key in specs]
    for request in requests:
        queue.add_request(request)
    return queue, requests


def test_a_preemption_puts_the_beneficiary_first_and_the_victim_right_behind():
    order = ordering()
    queue, (first, second, beneficiary) = queue_of(order, ("w1", 1.0), ("w2", 2.0), ("b", 3.0))
    victim = admit(order.tracked, FakeRequest(request_id="v"), rank_key=0.5)
    assert order.queue_preemption_pair(queue, victim, beneficiary)
    queue.prepend_request(victim)  # as vLLM's _preempt_request re-queues it
    assert [queue.pop_request() for _ in range(4)] == [beneficiary, victim, first, second]


def test_without_the_order_to_change_only_a_head_beneficiary_is_served():
    order = ordering(own_queue_order=False)
    queue, (head, beneficiary) = queue_of(order, ("w1", 1.0), ("b", 3.0))
    victim = admit(order.tracked, FakeRequest(request_id="v"), rank_key=0.5)
    assert not order.queue_preemption_pair(queue, victim, beneficiary)
    assert order.tracked["b"].requeue_key is None and order.tracked["v"].requeue_key is None
    assert order.queue_preemption_pair(queue, victim, head)
    assert order.tracked["v"].requeue_key is None  # the queue keeps its own order
