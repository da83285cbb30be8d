"""`TighterArrivals`: the prefill later arrivals of tighter classes put ahead of a request."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.slo.arrivals import TighterArrivals
from policies.slo.feasibility import edf_lateness, slots_free_s
from policies.slo.ledger import RELEASE_QUANTILES

TARGETS = {"chat": 0.5, "rag": 2.0}


def test_a_loose_request_expects_the_tight_class_to_keep_arriving_ahead_of_it():
    arrivals = TighterArrivals(ttft_s=TARGETS, memory_s=2.0)
    for k in range(20):  # 10 chat requests a second, 200 tokens each: 2,000 tokens/s
        arrivals.observe("chat", 200, k * 0.1)
    now = 1.95
    assert arrivals.rate("chat", now) == pytest.approx(2000)
    assert arrivals.request_rate("chat", now) == pytest.approx(10)
    # A rag request arriving now is served after chat arriving within 1.5 s: 3,000 tokens,
    # 15 requests ...
    assert arrivals.arriving(now + 2.0, now)(math.inf) == pytest.approx((3000, 15))
    # ... of which 1,000 tokens and 5 requests in the next half second
    assert arrivals.arriving(now + 2.0, now)(0.5) == pytest.approx((1000, 5))
    # A chat request arriving now is served before every later chat request.
    assert arrivals.arriving(now + 0.5, now)(math.inf) == pytest.approx((0, 0), abs=1e-6)
    # rag admissions never rank ahead of a request already here.
    arrivals.observe("rag", 1500, now)
    assert arrivals.arriving(now + 2.0, now)(math.inf) == pytest.approx((3000, 15))
    arrivals.check_invariants()


def test_admissions_older_than_the_memory_are_forgotten():
    arrivals = TighterArrivals(ttft_s=TARGETS, memory_s=2.0)
    arrivals.observe("chat", 400, 0.0)
    assert arrivals.rate("chat", 1.0) == pytest.approx(200)
    assert arrivals.rate("chat", 2.5) == 0 and arrivals.arriving(4.5, 2.5)(math.inf) == (0, 0)
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
    tokens, requests = arrivals.arriving(now + place, now)(math.inf)
    assert tokens >= 0 and requests >= 0
    assert all(a >= b - 1e-6 for a, b in zip(arrivals.arriving(now + place + more, now)(math.inf),
                                             (tokens, requests), strict=True))
    assert all(a <= b + 1e-6 for a, b in zip(arrivals.arriving(now + place, now)(more),
                                             (tokens, requests), strict=True))


def test_what_arrives_while_a_request_waits_is_served_before_it():
    def first_token(arriving, slot_ready_s=lambda k, arriving: 0.0):
        own, added = edf_lateness(now=0.0, key=2.0, due=0.0, share=1.0, tokens=1000,
                                  rate=20_000, step_s=0.05, items=(), started=0,
                                  slot_ready_s=slot_ready_s, kv_ready_s=None, yielded_in="",
                                  arriving=arriving)
        assert added == -math.inf
        return own

    # Alone: 1,000 tokens at 20,000 a second and one step.
    assert first_token(None) == pytest.approx(0.1)
    # Prefill arriving ahead at half the prefill rate: T = 0.1 + 0.5 T.
    assert first_token(lambda w: (10_000 * min(w, 1.5), 0.0)) == pytest.approx(0.2, abs=2e-3)
    # As fast as it is served: it waits until arrivals no longer rank ahead (1.5 s).
    assert first_token(lambda w: (20_000 * min(w, 1.5), 0.0)) == pytest.approx(1.6, abs=2e-3)
    # Nothing arrives ahead: its slot, not the arrivals, decides.
    assert first_token(lambda w: (0.0, 0.0), lambda k, arriving: 0.5) == pytest.approx(0.6)


def test_arrivals_that_take_the_slots_first_delay_a_request_on_an_engine_slots_limit():
    """Every slot taken, slots freed at 10 a second and 10 tight requests a second arriving
    ahead (with almost no prefill) up to 1.5 s: each freed slot goes to an arrival, so the
    request starts only once arrivals stop ranking ahead of it."""
    def slot_ready_s(unstarted, arriving):  # no slot free now; 10 freed a second
        return (unstarted + arriving + 1) / 10

    own, _ = edf_lateness(now=0.0, key=2.0, due=0.0, share=1.0, tokens=1000, rate=20_000,
                          step_s=0.05, items=(), started=0, slot_ready_s=slot_ready_s,
                          kv_ready_s=None, yielded_in="",
                          arriving=lambda w: (1.0 * min(w, 1.5), 10 * min(w, 1.5)))
    assert own == pytest.approx(1.7, abs=2e-3)  # 1.6 s for a slot, then 0.1 s of prefill
    alone, _ = edf_lateness(now=0.0, key=2.0, due=0.0, share=1.0, tokens=1000, rate=20_000,
                            step_s=0.05, items=(), started=0, slot_ready_s=slot_ready_s,
                            kv_ready_s=None, yielded_in="", arriving=None)
    assert alone == pytest.approx(0.2)


def test_a_request_that_finds_a_slot_free_keeps_it_whatever_arrives_during_its_prefill():
    def slot_ready_s(unstarted, arriving):  # one slot free now; 10 freed a second
        need = unstarted + arriving
        return 0.0 if need <= 0 else need / 10

    own, _ = edf_lateness(now=0.0, key=2.0, due=0.0, share=1.0, tokens=1000, rate=20_000,
                          step_s=0.05, items=(), started=0, slot_ready_s=slot_ready_s,
                          kv_ready_s=None, yielded_in="",
                          arriving=lambda w: (1.0 * min(w, 1.5), 10 * min(w, 1.5)))
    assert own == pytest.approx(0.1, abs=2e-3)


def test_slots_for_requests_still_to_arrive_come_at_the_rate_slots_are_freed():
    releases = [(float(k), 1.0) for k in range(1, 33)]  # 4 slots' worth of expected finishes
    assert slots_free_s(0.0, 2, releases, 10.0) == releases[2 * RELEASE_QUANTILES - 1][0]
    assert slots_free_s(0.0, 2, releases, 10.0, arriving=2) == pytest.approx(0.2)
    assert slots_free_s(0.0, 6, releases, 10.0) == math.inf, "more than the admitted free"
    assert slots_free_s(0.0, 6, releases, 10.0, arriving=3) == releases[3 * RELEASE_QUANTILES - 1][0]
