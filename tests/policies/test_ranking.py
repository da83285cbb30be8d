"""QoSRanker and FCFSOrder: ordering, aging and the anti-starvation bound."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies import FCFSOrder, QoSRanker, RequestView

priorities = st.integers(min_value=-20, max_value=20)
prompt_lengths = st.integers(min_value=1, max_value=20000)
times = st.floats(min_value=0, max_value=1e5, allow_nan=False)


def view(arrival_s=0.0, prompt_tokens=100, priority=0, request_id="r"):
    return RequestView(request_id=request_id, arrival_s=arrival_s, prompt_tokens=prompt_tokens,
                       priority=priority)


@given(a=st.tuples(times, prompt_lengths, priorities), b=st.tuples(times, prompt_lengths,
       priorities), now=times)
def test_rank_key_orders_like_effective_priority_at_any_time(a, b, now):
    ranker = QoSRanker()
    va, vb = view(*a), view(*b)
    key_a, key_b = ranker.rank_key(va), ranker.rank_key(vb)
    if math.isclose(key_a, key_b, rel_tol=1e-12, abs_tol=1e-9):
        return  # an exact tie up to rounding: the two forms may round it either way
    by_key = key_a < key_b
    by_priority = ranker.effective_priority(va, now) < ranker.effective_priority(vb, now)
    assert by_key == by_priority


@given(prompt_a=prompt_lengths, prompt_b=prompt_lengths, priority=priorities, arrival=times)
def test_shorter_prompt_class_never_ranks_behind_a_longer_one(prompt_a, prompt_b, priority,
                                                             arrival):
    ranker = QoSRanker()
    short, long_ = sorted((prompt_a, prompt_b))
    assert ranker.rank_key(view(arrival, short, priority)) <= ranker.rank_key(
        view(arrival, long_, priority))


@given(p_a=priorities, p_b=priorities, prompt=prompt_lengths, arrival=times)
def test_more_urgent_api_priority_ranks_first_at_equal_arrival(p_a, p_b, prompt, arrival):
    ranker = QoSRanker()
    urgent, relaxed = sorted((p_a, p_b))
    assert ranker.rank_key(view(arrival, prompt, urgent)) <= ranker.rank_key(
        view(arrival, prompt, relaxed))


@given(a=st.tuples(times, prompt_lengths, priorities), b=st.tuples(prompt_lengths, priorities),
       extra_s=st.floats(min_value=1e-3, max_value=1e4))
def test_no_request_is_overtaken_by_a_much_later_arrival(a, b, extra_s):
    ranker = QoSRanker()
    bound = ranker.max_overtake_s(-20, 20)
    early = view(*a)
    late = view(a[0] + bound + extra_s, *b)
    assert ranker.rank_key(early) < ranker.rank_key(late)


def test_waiting_raises_urgency_linearly():
    ranker = QoSRanker()
    request = view(arrival_s=10.0, prompt_tokens=5000, priority=3)
    assert ranker.effective_priority(request, 20.0) == pytest.approx(
        ranker.effective_priority(request, 10.0) - 10.0)


def test_length_classes_follow_thresholds():
    ranker = QoSRanker(length_thresholds_tokens=(10, 100), length_penalties_s=(0.0, 1.0, 5.0))
    assert [ranker.length_penalty_s(n) for n in (1, 9, 10, 99, 100, 10**6)] == [
        0.0, 0.0, 1.0, 1.0, 5.0, 5.0]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"length_thresholds_tokens": (100, 10)}, "strictly ascending"),
        ({"length_thresholds_tokens": (0, 10)}, "positive"),
        ({"length_penalties_s": (0.0, 1.0)}, "one entry more"),
        ({"length_penalties_s": (0.0, -1.0, 1.0, 2.0)}, "finite and >= 0"),
        ({"priority_step_s": -1.0}, "priority_step_s"),
    ],
)
def test_invalid_configuration_is_rejected_with_a_precise_message(kwargs, message):
    with pytest.raises(ValueError, match=message):
        QoSRanker(**kwargs)


@given(a=st.tuples(times, prompt_lengths, priorities), b=st.tuples(times, prompt_lengths,
       priorities))
def test_fcfs_never_distinguishes_requests(a, b):
    order = FCFSOrder()
    assert order.rank_key(view(*a)) == order.rank_key(view(*b))
