"""`HeadroomFeedback`: the headroom in force, corrected by prediction errors."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.percentile import percentile
from policies.slo.feedback import MIN_ERRORS, HeadroomFeedback


@settings(max_examples=100, deadline=None)
@given(headroom=st.floats(0.3, 1.2), window=st.integers(0, 40),
       memory_s=st.none() | st.floats(0.5, 20.0),
       heard=st.lists(st.tuples(st.floats(0.0, 3.0), st.floats(-2.0, 2.0), st.booleans()),
                      max_size=80))
def test_the_headroom_is_the_configured_one_less_the_p90_of_the_errors_remembered(
        headroom, window, memory_s, heard):
    """Remembered: the last ``window`` errors, none older than ``memory_s``, with whether
    each was late."""
    feedback = HeadroomFeedback(headroom=headroom, window=window, min_headroom=0.25,
                                max_headroom=1.0, memory_s=memory_s)
    now, history = 0.0, []
    for gap, error, late in heard:
        now += gap
        feedback.learn(error, now, late=late)
        feedback.check_invariants()
        history.append((now, error, late))
        recent = [(e, lt) for t, e, lt in history[max(len(history) - window, 0):]
                  if memory_s is None or t >= now - memory_s] if window else []
        errors = [e for e, _ in recent]
        if window and len(recent) >= min(MIN_ERRORS, window):
            assert feedback.value == min(max(headroom - percentile(errors, 90), 0.25), 1.0)
        else:
            assert feedback.value == headroom
        assert feedback.error_p90 == (percentile(errors, 90) if recent else None)
        assert feedback.late_share == (sum(lt for _, lt in recent) / len(recent)
                                       if recent else None)


def test_a_transient_is_forgotten_and_the_headroom_recovers_without_new_errors():
    """Late first tokens lower the headroom; once they are older than ``memory_s`` it is the
    configured one again, even if nothing was admitted meanwhile (no new errors)."""
    feedback = HeadroomFeedback(headroom=0.9, window=200, min_headroom=0.05, memory_s=6.0)
    for i in range(MIN_ERRORS):
        feedback.learn(2.0, 1.0 + i * 0.01)
    assert feedback.value == 0.05
    feedback.expire(6.5)
    assert feedback.value == 0.05  # still remembered
    feedback.expire(7.5)
    assert feedback.value == 0.9 and feedback.error_p90 is None
    feedback.check_invariants()


def test_without_memory_errors_last_until_the_window_replaces_them():
    feedback = HeadroomFeedback(headroom=0.9, window=MIN_ERRORS, min_headroom=0.05)
    for i in range(MIN_ERRORS):
        feedback.learn(2.0, float(i))
    feedback.expire(1e9)
    assert feedback.value == 0.05


def test_without_a_window_nothing_is_learned():
    feedback = HeadroomFeedback(headroom=0.9)
    for i in range(50):
        feedback.learn(1.0, float(i))
    assert feedback.value == 0.9 and feedback.error_p90 is None


def test_bad_settings_name_the_field():
    with pytest.raises(ValueError, match="headroom"):
        HeadroomFeedback(headroom=0.0)
    with pytest.raises(ValueError, match="window"):
        HeadroomFeedback(headroom=1.0, window=-1)
    with pytest.raises(ValueError, match="memory_s"):
        HeadroomFeedback(headroom=1.0, memory_s=0.0)
