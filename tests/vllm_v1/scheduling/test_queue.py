"""PolicyRequestQueue: no request lost or duplicated, fairness picks tenants, keys order heaps."""

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from integrations.vllm_v1.scheduling.queue import PolicyRequestQueue
from integrations.vllm_v1.vllm_surface.names import Request, SamplingParams
from policies import WFQ


def make_request(request_id: str) -> Request:
    return Request(request_id=request_id, prompt_token_ids=[1, 2, 3],
                   sampling_params=SamplingParams(max_tokens=1), pooling_params=None,
                   arrival_time=0.0)


class QueueMachine(RuleBasedStateMachine):
    """The queue against a multiset oracle, with per-request keys and two tenants under WFQ."""

    def __init__(self):
        super().__init__()
        self.keys: dict[str, float] = {}
        self.tenants: dict[str, str] = {}
        self.wfq = WFQ(weights={"a": 2.0})
        self.started: set[str] = set()  # popped to be scheduled, not to be skipped
        self.queue = PolicyRequestQueue(lambda r: self.keys[r.request_id],
                                        lambda r: self.tenants[r.request_id], self.wfq,
                                        on_dispatched=self.charge_if_started)
        self.model: dict[str, Request] = {}
        self.counter = 0

    @rule(key=st.integers(0, 3), tenant=st.sampled_from(["a", "b"]), front=st.booleans())
    def add(self, key, tenant, front):
        request_id = f"r{self.counter}"
        self.counter += 1
        self.keys[request_id], self.tenants[request_id] = float(key), tenant
        request = make_request(request_id)
        (self.queue.prepend_request if front else self.queue.add_request)(request)
        self.model[request_id] = request

    @precondition(lambda self: self.model)
    @rule()
    def pop(self):
        peeked = self.queue.peek_request()
        popped = self.queue.pop_request()
        assert popped is peeked
        tenant = self.tenants[popped.request_id]
        same_tenant = [r for r in self.model.values() if self.tenants[r.request_id] == tenant]
        assert self.keys[popped.request_id] == min(self.keys[r.request_id] for r in same_tenant)
        del self.model[popped.request_id]
        self.started.add(popped.request_id)
        self.queue.settle()  # the step ends

    def charge_if_started(self, tenant, request):
        if request.request_id in self.started:
            self.wfq.charge(tenant, input_tokens=10)

    @precondition(lambda self: self.model)
    @rule()
    def skip(self):
        """vLLM pops a request it cannot start yet and prepends it back: no service, no idling."""
        before = self.wfq.stats()
        skipped = self.queue.pop_request()
        self.queue.prepend_request(skipped)
        self.queue.settle()
        after = self.wfq.stats()
        assert after.counters == before.counters and after.backlogged == before.backlogged
        assert self.queue.peek_request() is skipped

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def remove(self, data):
        request_id = data.draw(st.sampled_from(sorted(self.model)))
        self.queue.remove_requests([self.model.pop(request_id)])

    @invariant()
    def same_contents(self):
        assert len(self.queue) == len(self.model)
        assert sorted(r.request_id for r in self.queue) == sorted(self.model)
        backlogged = {self.tenants[i] for i in self.model}
        assert self.wfq.stats().backlogged == frozenset(backlogged)

    @invariant()
    def head_is_a_prefix_of_iteration(self):
        order = list(self.queue)
        for count in (0, 1, 3, len(order) + 1):
            assert self.queue.head(count) == order[:count]


TestQueueMachine = QueueMachine.TestCase
TestQueueMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


@given(st.lists(st.integers(0, 5), min_size=1, max_size=30))
def test_without_fairness_pops_by_key_then_insertion(keys):
    queue = PolicyRequestQueue(lambda r: keys[int(r.request_id)])
    for i in range(len(keys)):
        queue.add_request(make_request(str(i)))
    popped = [int(queue.pop_request().request_id) for _ in keys]
    assert popped == sorted(range(len(keys)), key=lambda i: (keys[i], i))
