"""`TighterArrivals`: the prefill later arrivals of tighter classes put ahead of a request."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.slo.arrivals import TighterArrivals

TARGETS = {"chat": 0.5, "rag": 2.0}


def test_a_loose_request_expects_the_tight_class_to_keep_arriving_ahead_of_it():
    arrivals = TighterArrivals(ttft_s=TARGETS, memory_s=2.0)
    for k in range(20):  # 10 chat requests a second, 200 tokens each: 2,000 tokens/s
        arrivals.observe("chat", 200, k * 0.1)
    now = 1.95
    assert arrivals.rate("chat", now) == pytest.approx(2000)
    # A rag request arriving now is served after chat arriving within 1.5 s: 3,000 tokens.
    assert arrivals.work_ahead(now + 2.0, now) == pytest.approx(3000)
    # A chat request arriving now is served before every later chat request.
    assert arrivals.work_ahead(now + 0.5, now) == pytest.approx(0, abs=1e-6)
    # rag admissions never rank ahead of a request already here.
    arrivals.observe("rag", 1500, now)
    assert arrivals.work_ahead(now + 2.0, now) == pytest.approx(3000)
    arrivals.check_invariants()


def test_admissions_older_than_the_memory_are_forgotten():
    arrivals = TighterArrivals(ttft_s=TARGETS, memory_s=2.0)
    arrivals.observe("chat", 400, 0.0)
    assert arrivals.rate("chat", 1.0) == pytest.approx(200)
    assert arrivals.rate("chat", 2.5) == 0 and arrivals.work_ahead(4.5, 2.5) == 0
    arrivals.observe("chat", 100, 3.0)  # the old entry leaves the window
    assert arrivals.rate("chat", 3.0) == pytest.approx(50)
    arrivals.observe("unknown", 100, 3.0)  # a class without a target is not recorded
    assert arrivals.rate("unknown", 3.0) == 0
    arrivals.check_invariants()


def test_a_bad_target_or_memory_is_named():
    with pytest.raises(ValueError, match=r"ttft_s\['chat'\]"):
        TighterArrivals(ttft_s={"chat": 0}, memory_s=1.0)
    with pytest.raises(ValueError, match="memory_s"):
        TighterArrivals(ttft_s=TARGETS, memory_s=0)


@given(st.lists(st.tuples(st.sampled_from(["chat", "rag"]), st.floats(0, 5000),
                          st.floats(0, 0.5)), max_size=80),
       st.floats(0, 3), st.floats(0, 3))
def test_the_work_ahead_is_never_negative_and_grows_with_the_place(events, place, more):
    arrivals = TighterArrivals(ttft_s=TARGETS, memory_s=1.5)
    now = 0.0
    for cls, work, gap in events:
        now += gap
        arrivals.observe(cls, work, now)
        arrivals.check_invariants()
    ahead = arrivals.work_ahead(now + place, now)
    assert ahead >= 0
    assert arrivals.work_ahead(now + place + more, now) >= ahead - 1e-6
