"""ManualClock and the queue-depth admission limit."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies import AdmissionDecision, LoadSnapshot, ManualClock, QueueDepthLimit, RequestView


@given(st.lists(st.floats(min_value=0, max_value=1e6), max_size=50))
def test_manual_clock_is_monotonic(steps):
    clock = ManualClock()
    last = clock.now()
    for dt in steps:
        clock.advance(dt)
        assert clock.now() >= last
        last = clock.now()


def test_manual_clock_refuses_to_go_back():
    clock = ManualClock(5.0)
    with pytest.raises(ValueError, match="negative step"):
        clock.advance(-1)
    with pytest.raises(ValueError, match="cannot go back"):
        clock.set(4.0)
    assert clock.set(6.0) == 6.0


def load(waiting):
    return LoadSnapshot(now=0.0, waiting_requests=waiting, running_requests=0, kv_usage=0.0,
                        token_budget=8192)


@given(max_waiting=st.integers(1, 100), waiting=st.integers(0, 200))
def test_queue_depth_limit_rejects_exactly_when_full(max_waiting, waiting):
    policy = QueueDepthLimit(max_waiting=max_waiting, retry_after_s=2.5)
    decision = policy.admit(RequestView(request_id="r", arrival_s=0.0, prompt_tokens=1),
                            load(waiting))
    assert decision.admitted == (waiting < max_waiting)
    if not decision.admitted:
        assert (decision.reason, decision.retry_after_s) == ("queue_full", 2.5)


def test_a_rejection_needs_a_reason():
    with pytest.raises(ValueError, match="needs a reason"):
        AdmissionDecision.reject("", 1.0)
