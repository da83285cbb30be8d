"""MLFQ: skip-join, demotion by service, promotion on preemption, against an oracle."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from policies.ordering.levels import MLFQ, MLFQStats
from policies.protocols import LifecycleObserver
from policies.views import RequestView


def view(request_id="r", prompt_tokens=100):
    return RequestView(request_id=request_id, arrival_s=0.0, prompt_tokens=prompt_tokens)


def oracle_level(quanta, skip_join, prompt, service, preemptions):
    """The documented formula, written as plain loops."""
    start = len(quanta) - 1
    if not skip_join:
        start = 0
    else:
        for i, quantum in enumerate(quanta):
            if prompt <= quantum:
                start = i
                break
    by_usage, bound = len(quanta) - 1, 0
    for i, quantum in enumerate(quanta):
        bound += quantum
        if service < bound:
            by_usage = i
            break
    return max(0, max(start, by_usage) - preemptions)


def test_implements_the_lifecycle_protocol():
    assert isinstance(MLFQ(), LifecycleObserver)


@pytest.mark.parametrize(
    ("quanta", "message"),
    [
        ((), "quanta_tokens must not be empty"),
        ((0, 10), "quanta_tokens must be positive"),
        ((-5, 10), "quanta_tokens must be positive"),
        ((10, 10), "quanta_tokens must be strictly increasing"),
        ((100, 10, math.inf), "quanta_tokens must be strictly increasing"),
        ((10, math.inf, math.inf), "quanta_tokens must be strictly increasing"),
        ((math.inf, 10), "quanta_tokens must be strictly increasing"),
        ((10, math.nan), "quanta_tokens must not contain NaN"),
    ],
)
def test_invalid_quanta_are_rejected_with_a_precise_message(quanta, message):
    with pytest.raises(ValueError, match=message):
        MLFQ(quanta_tokens=quanta)


def test_valid_quanta_may_end_finite_or_infinite():
    assert MLFQ(quanta_tokens=[1, 2.5]).quanta_tokens == (1, 2.5)
    assert MLFQ().quanta_tokens == (128, 512, 2048, math.inf)
    assert MLFQ().num_levels == 4


@pytest.mark.parametrize(
    ("prompt", "level"),
    [(0, 0), (1, 0), (128, 0), (129, 1), (512, 1), (513, 2), (2048, 2), (2049, 3), (10**9, 3)],
)
def test_skip_join_starts_at_the_first_quantum_that_holds_the_prompt(prompt, level):
    policy = MLFQ()
    policy.on_admitted(view(prompt_tokens=prompt), 0.0)
    assert policy.level(view(prompt_tokens=prompt)) == level
    assert MLFQ(skip_join=False).level(view(prompt_tokens=prompt)) == 0


@given(quanta=st.lists(st.integers(1, 10**4), min_size=1, max_size=6, unique=True).map(sorted),
       prompt=st.integers(0, 10**5), data=st.data())
def test_skip_join_places_by_prompt_length(quanta, prompt, data):
    if data.draw(st.booleans()):  # prompts at and next to a quantum's edge
        prompt = data.draw(st.sampled_from(quanta)) + data.draw(st.sampled_from([-1, 0, 1]))
    policy = MLFQ(quanta_tokens=quanta)
    level = policy.level(view(prompt_tokens=prompt))
    if level < len(quanta) - 1 or prompt <= quanta[-1]:
        assert prompt <= quanta[level]  # the quantum holds the whole prompt...
    assert level == 0 or prompt > quanta[level - 1]  # ...and no more urgent one does


def test_demotion_follows_cumulative_quanta():
    policy = MLFQ()
    request = view(prompt_tokens=10)
    levels = []
    for service in (127, 1, 511, 1, 2047, 1, 10**6):
        policy.on_scheduled(request, service, 0.0)
        levels.append(policy.level(request))
    # cumulative bounds 128, 640, 2688: service 127, 128, 639, 640, 2687, 2688, ...
    assert levels == [0, 1, 1, 2, 2, 3, 3]
    assert policy.stats().demotions == 3


def test_a_finite_last_quantum_keeps_requests_at_the_last_level():
    policy = MLFQ(quanta_tokens=(4, 8))
    request = view(prompt_tokens=100)
    assert policy.level(request) == 1
    policy.on_scheduled(request, 1000, 0.0)
    assert policy.level(request) == 1


def test_preemption_promotes_by_one_level_and_is_banked_at_level_zero():
    policy = MLFQ()
    request = view(prompt_tokens=3000)
    policy.on_admitted(request, 0.0)
    assert policy.level(request) == 3
    policy.on_preempted(request)
    assert policy.level(request) == 2
    for _ in range(3):
        policy.on_preempted(request)
    assert policy.level(request) == 0
    policy.on_scheduled(request, 3000, 0.0)  # usage says 3, minus 4 preemptions
    assert policy.level(request) == 0
    assert policy.stats() == MLFQStats(requests_per_level=(1, 0, 0, 0), demotions=0,
                                       promotions=3)


events = st.lists(st.one_of(st.integers(0, 3000), st.just("preempt")), max_size=40)


@given(prompt=st.integers(0, 5000), events=events)
def test_levels_only_worsen_with_service_and_only_improve_by_preemption(prompt, events):
    policy = MLFQ()
    request = view(prompt_tokens=prompt)
    policy.on_admitted(request, 0.0)
    level = policy.level(request)
    for event in events:
        if event == "preempt":
            policy.on_preempted(request)
            assert policy.level(request) == max(0, level - 1)
        else:
            policy.on_scheduled(request, event, 0.0)
            assert policy.level(request) >= level
        level = policy.level(request)


def test_finishing_forgets_the_request():
    policy = MLFQ()
    request = view(prompt_tokens=300)
    policy.on_admitted(request, 0.0)
    policy.on_scheduled(request, 10**4, 0.0)
    assert policy.stats().requests_per_level == (0, 0, 0, 1)
    policy.on_finished(request, 1.0)
    policy.on_finished(view("never-seen"), 1.0)
    assert policy.stats().requests_per_level == (0, 0, 0, 0)
    assert policy.level(request) == 1  # untracked again: back to its start level
    policy.check_invariants()


def test_negative_service_is_rejected():
    with pytest.raises(ValueError, match="tokens must be >= 0, got -1"):
        MLFQ().on_scheduled(view(), -1, 0.0)


class MLFQMachine(RuleBasedStateMachine):
    """A real MLFQ beside a model that keeps only (prompt, service, preemptions)."""

    requests = Bundle("requests")

    def __init__(self):
        super().__init__()
        self.policy = None
        self.model = {}  # request id -> [prompt, service, preemptions]
        self.counter = 0
        self.level_changes = [0, 0]  # demotions, promotions

    @rule(quanta=st.lists(st.integers(1, 600), min_size=1, max_size=5, unique=True).map(sorted),
          infinite_last=st.booleans(), skip_join=st.booleans())
    def configure(self, quanta, infinite_last, skip_join):
        if self.policy is None:
            self.quanta = (*quanta, math.inf) if infinite_last else tuple(quanta)
            self.skip_join = skip_join
            self.policy = MLFQ(quanta_tokens=self.quanta, skip_join=skip_join)

    def level(self, request_id):
        return oracle_level(self.quanta, self.skip_join, *self.model[request_id])

    @rule(target=requests, prompt=st.integers(0, 3000))
    def admit(self, prompt):
        if self.policy is None:
            self.configure([128, 512, 2048], True, True)
        self.counter += 1
        request_id = f"q{self.counter}"
        self.model[request_id] = [prompt, 0, 0]
        self.policy.on_admitted(view(request_id, prompt), 0.0)
        return request_id

    def change(self, request_id, index, amount):
        before = self.level(request_id)
        self.model[request_id][index] += amount
        after = self.level(request_id)
        self.level_changes[0] += max(0, after - before)
        self.level_changes[1] += max(0, before - after)

    @rule(request_id=requests, tokens=st.integers(0, 1500))
    def schedule(self, request_id, tokens):
        if request_id in self.model:
            self.policy.on_scheduled(view(request_id, self.model[request_id][0]), tokens, 0.0)
            self.change(request_id, 1, tokens)

    @rule(request_id=requests)
    def preempt(self, request_id):
        if request_id in self.model:
            self.policy.on_preempted(view(request_id, self.model[request_id][0]))
            self.change(request_id, 2, 1)

    @rule(request_id=requests)
    def finish(self, request_id):
        if request_id in self.model:
            self.policy.on_finished(view(request_id, self.model.pop(request_id)[0]), 0.0)

    @invariant()
    def agrees_with_the_model(self):
        if self.policy is None:
            return
        self.policy.check_invariants()
        per_level = [0] * len(self.quanta)
        for request_id, (prompt, _, _) in self.model.items():
            level = self.level(request_id)
            assert self.policy.level(view(request_id, prompt)) == level
            per_level[level] += 1
        stats = self.policy.stats()
        assert stats.requests_per_level == tuple(per_level)
        assert [stats.demotions, stats.promotions] == self.level_changes


MLFQMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
test_mlfq_machine = MLFQMachine.TestCase
