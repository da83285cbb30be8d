"""`FrontendGate`: the rate it learns, and its guarantees (an idle stage admits, no refusal
without a measured rate, monotone in the requests ahead) as properties."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.admission.frontend_gate import REASON, FrontendGate


def sequential(gate, service_s, count, start=0.0):
    """``count`` requests served back to back, each ``service_s`` in the stage."""
    now = start
    for _ in range(count):
        gate.enter(now)
        now += service_s
        gate.leave(now)
    return now


# A history: (gap before the event, enter or leave), replayed on a gate.
EVENTS = st.lists(st.tuples(st.floats(0, 2), st.booleans()), max_size=60)


def replay(events, **fields):
    gate = FrontendGate(**fields)
    now = 0.0
    for gap, enter in events:
        now += gap
        if enter or gate.in_stage == 0:
            gate.enter(now)
        else:
            gate.leave(now)
        gate.check_invariants()
    return gate, now


@pytest.mark.parametrize("service_s", [0.001, 0.02, 0.5])
def test_a_sequential_stage_is_learned_at_its_service_rate(service_s):
    gate = FrontendGate()
    now = sequential(gate, service_s, 20)
    assert gate.rate_per_s(now) == pytest.approx(1 / service_s)
    assert gate.wait_s(4, now) == pytest.approx(4 * service_s)


def test_a_stage_busy_without_completions_slows_its_rate():
    gate = FrontendGate()
    now = sequential(gate, 0.01, 20)
    gate.enter(now)
    assert gate.rate_per_s(now + 0.19) == pytest.approx(19 / 0.38)  # 0.19 s busy, none done


def test_idle_time_does_not_count_and_old_completions_are_forgotten_in_busy_time():
    gate = FrontendGate(window_s=1.0)
    now = sequential(gate, 0.01, 20)
    assert gate.rate_per_s(now + 600.0) == pytest.approx(100), "idle: the rate holds"
    assert not gate.decide(1000, 0.5, now + 600.0).admitted, (
        "a burst after a quiet spell meets the rate measured before it")
    now = sequential(gate, 0.1, 20, start=now + 600.0)  # 2 busy s at a tenth of the rate
    assert gate.rate_per_s(now) == pytest.approx(10), "the fast completions left the window"


def test_a_refusal_names_the_reason_and_waits_the_predicted_time():
    gate = FrontendGate()
    now = sequential(gate, 0.1, 10)
    decision = gate.decide(3, 0.25, now)
    assert (decision.admitted, decision.reason) == (False, REASON)
    assert decision.retry_after_s == pytest.approx(0.3)
    assert gate.decide(2, 0.25, now).admitted
    stats = gate.stats()
    assert (stats.admitted, stats.rejected, stats.completions) == (1, 1, 10)
    assert stats.last_wait_s == pytest.approx(0.2)


def test_only_served_requests_are_completions():
    gate = FrontendGate()
    for i in range(20):
        gate.enter(i * 0.1)
        gate.leave(i * 0.1 + 0.05, served=False)
    assert gate.rate_per_s(2.0) is None


@pytest.mark.parametrize(("call", "message"), [
    (lambda g: g.leave(0.0), "leave() without a request in the stage"),
    (lambda g: (g.enter(1.0), g.enter(0.5)), "now must not go backwards: 0.5 < 1.0"),
    (lambda g: g.decide(1, 0.0, 0.0), "ttft_s must be > 0, got 0.0"),
    (lambda g: g.wait_s(-1, 0.0), "ahead must be >= 0, got -1"),
])
def test_misuse_is_refused_with_a_message(call, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call(FrontendGate())


@pytest.mark.parametrize(("field", "value", "message"), [
    ("window_s", 0.0, "window_s must be finite and > 0, got 0.0"),
    ("min_completions", 1, "min_completions must be an integer >= 2, got 1"),
    ("max_samples", 1, "max_samples must be an integer >= 2, got 1"),
])
def test_bad_fields_are_named(field, value, message):
    with pytest.raises(ValueError, match=message):
        FrontendGate(**{field: value})


@given(EVENTS, st.floats(1e-3, 100))
def test_an_idle_stage_admits(events, ttft_s):
    gate, now = replay(events)
    assert gate.decide(0, ttft_s, now).admitted


@given(EVENTS, st.integers(0, 10_000), st.floats(1e-3, 100))
def test_no_refusal_without_a_measured_rate(events, ahead, ttft_s):
    gate, now = replay(events, min_completions=40)
    if gate.rate_per_s(now) is None:
        assert gate.decide(ahead, ttft_s, now).admitted


@given(EVENTS, st.integers(0, 500), st.integers(0, 500), st.floats(1e-3, 10),
       st.floats(1e-3, 10))
def test_monotone_in_the_requests_ahead_and_the_target(events, k1, k2, t1, t2):
    gate, now = replay(events, min_completions=2)
    (few, many), (short, long) = sorted((k1, k2)), sorted((t1, t2))
    if gate.decide(many, short, now).admitted:
        assert gate.decide(few, short, now).admitted
        assert gate.decide(many, long, now).admitted


@given(EVENTS, st.integers(1, 500), st.floats(1e-3, 10))
def test_a_refusal_waits_at_least_the_target_and_exactly_the_prediction(events, ahead, ttft_s):
    gate, now = replay(events, min_completions=2)
    decision = gate.decide(ahead, ttft_s, now)
    wait = gate.wait_s(ahead, now)
    assert decision.admitted == (wait <= ttft_s)
    if not decision.admitted:
        assert decision.retry_after_s == wait > ttft_s
        assert math.isfinite(wait)
