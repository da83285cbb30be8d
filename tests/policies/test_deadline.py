"""EDFRanker: least-slack order, time-invariant keys, expiry and lateness."""

import heapq
import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.ordering.deadline import EDFRanker
from policies.protocols import RankingPolicy
from policies.views import RequestView

times = st.floats(min_value=0, max_value=1e5, allow_nan=False)
budgets = st.floats(min_value=1e-3, max_value=1e4, allow_nan=False)
prompt_lengths = st.integers(min_value=0, max_value=20000)
output_lengths = st.integers(min_value=0, max_value=4000)


def view(arrival_s=0.0, deadline_s=None, prompt_tokens=100, computed_tokens=0, output_tokens=0,
         max_output_tokens=64, request_id="r"):
    return RequestView(request_id=request_id, arrival_s=arrival_s, prompt_tokens=prompt_tokens,
                       computed_tokens=computed_tokens, output_tokens=output_tokens,
                       max_output_tokens=max_output_tokens, deadline_s=deadline_s)


@st.composite
def requests(draw):
    arrival = draw(times)
    prompt = draw(prompt_lengths)
    max_output = draw(st.none() | output_lengths)
    return view(
        arrival_s=arrival,
        deadline_s=draw(st.none() | st.builds(lambda b: arrival + b, budgets)),
        prompt_tokens=prompt,
        computed_tokens=draw(st.integers(0, prompt)),
        output_tokens=draw(st.integers(0, max_output if max_output is not None else 500)),
        max_output_tokens=max_output,
    )


def test_is_a_ranking_policy():
    assert isinstance(EDFRanker(), RankingPolicy)


@given(deadlines=st.lists(st.integers(0, 10**8).map(lambda ms: ms / 1000), min_size=1,
                          max_size=40), prompt=prompt_lengths,
       outputs=output_lengths)
def test_pops_deadlines_in_order_for_equal_remaining_work(deadlines, prompt, outputs):
    ranker = EDFRanker()
    heap, seq = [], itertools.count()
    for i, deadline in enumerate(deadlines):
        request = view(deadline_s=deadline, prompt_tokens=prompt, max_output_tokens=outputs,
                       request_id=str(i))
        heapq.heappush(heap, (ranker.rank_key(request), next(seq), request))
    popped = [heapq.heappop(heap)[2].deadline_s for _ in range(len(heap))]
    assert popped == sorted(deadlines)


@given(a=requests(), b=requests(), now=times)
def test_rank_key_orders_like_slack_at_any_time(a, b, now):
    ranker = EDFRanker()
    key_a, key_b = ranker.rank_key(a), ranker.rank_key(b)
    slack_a, slack_b = ranker.effective_priority(a, now), ranker.effective_priority(b, now)
    # Float subtraction of the same ``now`` is monotone: it may merge keys, never swap them.
    if key_a < key_b:
        assert slack_a <= slack_b
    if slack_a < slack_b:
        assert key_a < key_b


@given(request=requests(), now=times)
def test_slack_is_deadline_minus_now_minus_remaining_work(request, now):
    ranker = EDFRanker()
    expected = ranker.deadline_s(request) - now - ranker.estimated_remaining_s(request)
    assert ranker.slack_s(request, now) == pytest.approx(expected, abs=1e-6)
    assert ranker.effective_priority(request, now) == ranker.slack_s(request, now)


@given(request=requests(), t1=times, dt=st.floats(min_value=0, max_value=1e5))
def test_expiry_and_lateness_are_monotone_in_time(request, t1, dt):
    ranker = EDFRanker()
    if ranker.is_expired(request, t1):
        assert ranker.is_expired(request, t1 + dt)
    if ranker.is_late(request, t1):
        assert ranker.is_late(request, t1 + dt)


@given(request=requests(), now=times)
def test_expiry_means_negative_slack_before_the_first_output_token(request, now):
    ranker = EDFRanker()
    expected = (request.deadline_s is not None and request.output_tokens == 0
                and now + ranker.estimated_remaining_s(request) > request.deadline_s)
    # Exact only away from float ties at slack 0.
    if abs(ranker.slack_s(request, now)) > 1e-6:
        assert ranker.is_expired(request, now) == expected
    if ranker.is_expired(request, now):
        assert ranker.is_late(request, now)


def test_a_request_expires_once_it_can_no_longer_finish_in_time():
    ranker = EDFRanker(prefill_s_per_token=0.001, decode_s_per_token=0.01)
    request = view(arrival_s=0.0, deadline_s=2.0, prompt_tokens=500, max_output_tokens=100)
    assert ranker.estimated_remaining_s(request) == pytest.approx(1.5)
    assert not ranker.is_expired(request, 0.49)
    assert ranker.is_expired(request, 0.51)
    assert ranker.slack_s(request, 0.0) == pytest.approx(0.5)


def test_a_running_request_with_negative_slack_is_late_not_expired():
    ranker = EDFRanker(prefill_s_per_token=0.0, decode_s_per_token=0.1)
    running = view(deadline_s=1.0, prompt_tokens=10, computed_tokens=10, output_tokens=5,
                   max_output_tokens=15)
    assert ranker.estimated_remaining_s(running) == pytest.approx(1.0)
    assert ranker.is_late(running, 0.5)
    assert not ranker.is_expired(running, 0.5)
    assert not ranker.is_late(running, 0.0)


@given(request=requests(), now=times)
def test_requests_without_a_deadline_never_expire_nor_run_late(request, now):
    ranker = EDFRanker()
    no_deadline = view(arrival_s=request.arrival_s, prompt_tokens=request.prompt_tokens,
                       max_output_tokens=request.max_output_tokens)
    assert not ranker.is_expired(no_deadline, now + 1e6)
    assert not ranker.is_late(no_deadline, now + 1e6)


def test_requests_without_a_deadline_are_ordered_as_due_after_the_default():
    ranker = EDFRanker(default_deadline_s=10.0)
    free = view(arrival_s=5.0)
    assert ranker.deadline_s(free) == 15.0
    due_sooner = view(arrival_s=5.0, deadline_s=14.0)
    due_later = view(arrival_s=5.0, deadline_s=16.0)
    assert ranker.rank_key(due_sooner) < ranker.rank_key(free) < ranker.rank_key(due_later)


@given(request=requests())
def test_remaining_work_shrinks_as_the_request_progresses(request):
    ranker = EDFRanker()
    remaining = ranker.estimated_remaining_s(request)
    assert remaining >= 0
    prefilled = view(prompt_tokens=request.prompt_tokens, computed_tokens=request.prompt_tokens,
                     output_tokens=request.output_tokens,
                     max_output_tokens=request.max_output_tokens)
    one_more = view(prompt_tokens=request.prompt_tokens, computed_tokens=request.prompt_tokens,
                    output_tokens=request.output_tokens + 1,
                    max_output_tokens=request.max_output_tokens)
    assert ranker.estimated_remaining_s(one_more) <= ranker.estimated_remaining_s(prefilled)
    assert ranker.estimated_remaining_s(prefilled) <= remaining


def test_remaining_work_uses_the_default_and_the_cap_on_output_length():
    ranker = EDFRanker(prefill_s_per_token=0.0, decode_s_per_token=1.0, default_output_tokens=7,
                       max_estimated_output_tokens=100)
    assert ranker.estimated_remaining_s(view(max_output_tokens=None)) == 7.0
    assert ranker.estimated_remaining_s(view(max_output_tokens=None, output_tokens=3)) == 4.0
    assert ranker.estimated_remaining_s(view(max_output_tokens=8000)) == 100.0
    assert ranker.estimated_remaining_s(view(max_output_tokens=None, output_tokens=9)) == 0.0


def test_longer_remaining_work_ranks_first_at_equal_deadline():
    ranker = EDFRanker()
    short = view(deadline_s=10.0, max_output_tokens=10)
    long_ = view(deadline_s=10.0, max_output_tokens=200)
    assert ranker.rank_key(long_) < ranker.rank_key(short)


@given(requests=st.lists(requests(), min_size=1, max_size=30), now=times)
def test_service_key_puts_every_late_request_after_every_on_time_one(requests, now):
    ranker = EDFRanker()
    ordered = sorted(requests, key=lambda r: ranker.service_key(r, now))
    lateness = [ranker.is_late(r, now) for r in ordered]
    assert lateness == sorted(lateness)
    for group in (False, True):
        keys = [ranker.rank_key(r) for r, late in zip(ordered, lateness, strict=True)
                if late == group]
        assert keys == sorted(keys)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prefill_s_per_token": -1e-5}, "prefill_s_per_token must be finite and >= 0"),
        ({"decode_s_per_token": float("inf")}, "decode_s_per_token must be finite and >= 0"),
        ({"default_output_tokens": -1}, "default_output_tokens must be an integer >= 0"),
        ({"max_estimated_output_tokens": 1.5}, "max_estimated_output_tokens must be an integer"),
        ({"default_deadline_s": 0.0}, "default_deadline_s must be finite and > 0"),
    ],
)
def test_invalid_configuration_is_rejected_with_a_precise_message(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EDFRanker(**kwargs)
