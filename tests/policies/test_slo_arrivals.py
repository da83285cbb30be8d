"""`TighterArrivals`: the prefill later arrivals of tighter classes put ahead of a request."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.slo.arrivals import TighterArrivals
from policies.slo.feasibility import edf_lateness

TARGETS = {"chat": 0.5, "rag": 2.0}


def test_a_loose_request_expects_the_tight_class_to_keep_arriving_ahead_of_it():
    arrivals = TighterArrivals(ttft_s=TARGETS, memory_s=2.0)
    for k in range(20):  # 10 chat requests a second, 200 tokens each: 2,000 tokens/s
        arrivals.observe("chat", 200, k * 0.1)
    now = 1.95
    assert arrivals.rate("chat", now) == pytest.approx(2000)
    # A rag request arriving now is served after chat arriving within 1.5 s: 3,000 tokens.
    assert arrivals.ahead(now + 2.0, now) == pytest.approx(3000)
    # ... of which 1,000 in the next half second
    assert arrivals.ahead(now + 2.0, now, 0.5) == pytest.approx(1000)
    # A chat request arriving now is served before every later chat request.
    assert arrivals.ahead(now + 0.5, now) == pytest.approx(0, abs=1e-6)
    # rag admissions never rank ahead of a request already here.
    arrivals.observe("rag", 1500, now)
    assert arrivals.ahead(now + 2.0, now) == pytest.approx(3000)
    arrivals.check_invariants()


def test_admissions_older_than_the_memory_are_forgotten():
    arrivals = TighterArrivals(ttft_s=TARGETS, memory_s=2.0)
    arrivals.observe("chat", 400, 0.0)
    assert arrivals.rate("chat", 1.0) == pytest.approx(200)
    assert arrivals.rate("chat", 2.5) == 0 and arrivals.ahead(4.5, 2.5) == 0
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
def test_what_is_ahead_is_never_negative_and_grows_with_the_place(events, place, more):
    arrivals = TighterArrivals(ttft_s=TARGETS, memory_s=1.5)
    now = 0.0
    for cls, work, gap in events:
        now += gap
        arrivals.observe(cls, work, now)
        arrivals.check_invariants()
    tokens = arrivals.ahead(now + place, now)
    assert tokens >= 0
    assert arrivals.ahead(now + place + more, now) >= tokens - 1e-6
    assert arrivals.ahead(now + place, now, more) <= tokens + 1e-6


def test_what_arrives_while_a_request_waits_is_served_before_it():
    def first_token(arriving, slot_ready_s=lambda k: 0.0):
        own, added = edf_lateness(now=0.0, key=2.0, due=0.0, share=1.0, tokens=1000,
                                  rate=20_000, step_s=0.05, items=(), started=0,
                                  slot_ready_s=slot_ready_s, kv_ready_s=None, yielded_in="",
                                  arriving=arriving)
        assert added == -math.inf
        return own

    # Alone: 1,000 tokens at 20,000 a second and one step.
    assert first_token(None) == pytest.approx(0.1)
    # Prefill arriving ahead at half the prefill rate: T = 0.1 + 0.5 T.
    assert first_token(lambda w: 10_000 * min(w, 1.5)) == pytest.approx(0.2, abs=2e-3)
    # As fast as it is served: it waits until arrivals no longer rank ahead (1.5 s).
    assert first_token(lambda w: 20_000 * min(w, 1.5)) == pytest.approx(1.6, abs=2e-3)
    # Nothing arrives ahead: its slot, not the arrivals, decides.
    assert first_token(lambda w: 0.0, lambda k: 0.5) == pytest.approx(0.6)
