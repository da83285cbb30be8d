"""`HeadroomFeedback`: the headroom in force, corrected by prediction errors."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.percentile import percentile
from policies.slo.feedback import MIN_ERRORS, HeadroomFeedback


@settings(max_examples=100, deadline=None)
@given(headroom=st.floats(0.3, 1.2), window=st.integers(0, 40),
       errors=st.lists(st.floats(-2.0, 2.0), max_size=80))
def test_the_headroom_is_the_configured_one_less_the_p90_error_within_bounds(
        headroom, window, errors):
    feedback = HeadroomFeedback(headroom=headroom, window=window, min_headroom=0.25,
                                max_headroom=1.0)
    for count, error in enumerate(errors, 1):
        feedback.learn(error)
        feedback.check_invariants()
        recent = errors[max(count - window, 0):count]
        if window and count >= min(MIN_ERRORS, window):
            assert feedback.value == min(max(headroom - percentile(recent, 90), 0.25), 1.0)
            assert feedback.error_p90 == percentile(recent, 90)
        else:
            assert feedback.value == headroom
            assert feedback.error_p90 == (None if not window or not count
                                          else percentile(recent, 90))


def test_without_a_window_nothing_is_learned():
    feedback = HeadroomFeedback(headroom=0.9)
    for _ in range(50):
        feedback.learn(1.0)
    assert feedback.value == 0.9 and feedback.error_p90 is None


def test_bad_settings_name_the_field():
    with pytest.raises(ValueError, match="headroom"):
        HeadroomFeedback(headroom=0.0)
    with pytest.raises(ValueError, match="window"):
        HeadroomFeedback(headroom=1.0, window=-1)
