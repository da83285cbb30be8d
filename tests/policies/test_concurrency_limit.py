"""`ConcurrencyLimit`: AIMD on lateness (no limit until a late report beyond the late budget,
one decrease per round, additive increase only while the limit binds), its bounds and its
Retry-After, as properties over random histories."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.admission.concurrency_limit import REASON, ClassConcurrencyLimits, ConcurrencyLimit


def fill(limit, n):
    for _ in range(n):
        assert limit.acquire().admitted


def test_nothing_is_refused_until_a_report_is_late():
    limit = ConcurrencyLimit(max_limit=64)
    fill(limit, 64)
    limit.report(late=False, entered_s=0.0, now=1.0)
    assert limit.limit == 64
    decision = limit.acquire()
    assert not decision.admitted and decision.reason == REASON


def test_a_late_report_cuts_to_the_load_in_flight_once_per_round():
    limit = ConcurrencyLimit(backoff=0.5, late_budget=0)
    fill(limit, 21)
    limit.release(1.0)  # a request stays in flight 1 s: a round
    limit.report(late=True, entered_s=1.0, now=2.0)
    assert limit.limit == 10  # 20 in flight x 0.5
    limit.report(late=True, entered_s=1.5, now=3.5)  # entered before the cut: same round
    assert limit.limit == 10
    limit.report(late=True, entered_s=2.5, now=2.9)  # under a round after the cut
    assert limit.limit == 10
    limit.report(late=True, entered_s=2.5, now=3.0)  # entered after it, a round later
    assert limit.limit == 5
    assert limit.stats().late == 4 and limit.stats().decreases == 2
    assert not limit.acquire().admitted  # 20 in flight >= 5


def test_on_time_reports_grow_the_limit_only_while_it_binds():
    limit = ConcurrencyLimit(backoff=0.5, late_budget=0)
    fill(limit, 8)
    limit.report(late=True, entered_s=0.0, now=1.0)
    assert limit.limit == 4
    for _ in range(4):
        limit.release(1.0)
    assert limit.in_flight == 4
    for _ in range(40):  # 4 in flight: binding while the limit is at most 8
        limit.report(late=False, entered_s=2.0, now=3.0)
    assert limit.limit == 8
    grown = limit.limit
    for _ in range(4):
        limit.release(1.0)
    for _ in range(100):
        limit.report(late=False, entered_s=2.0, now=3.0)  # nothing in flight: idle
    assert limit.limit == grown


def test_retry_after_is_when_a_place_frees_up_on_average():
    limit = ConcurrencyLimit(backoff=0.5, late_budget=0)
    assert limit.retry_after_s() == 0.0
    fill(limit, 4)
    limit.release(2.0)
    limit.report(late=True, entered_s=0.0, now=1.0)  # 3 in flight x 0.5 -> 1
    assert limit.limit == 1
    assert limit.acquire().retry_after_s == pytest.approx(2.0)


def test_with_weights_a_quiet_tenant_passes_a_door_a_noisy_one_filled():
    limit = ConcurrencyLimit(backoff=0.5, late_budget=0, weights={"quiet": 1, "noisy": 1})
    for _ in range(8):
        assert limit.acquire("noisy").admitted
    limit.report(late=True, entered_s=0.0, now=1.0)
    assert limit.limit == 4 and limit.share("noisy") == 4  # alone: the whole limit
    assert limit.share("quiet") == 2  # once both are in flight: half each
    assert not limit.acquire("noisy").admitted  # over the limit and over its share
    assert limit.acquire("quiet").admitted and limit.acquire("quiet").admitted
    assert not limit.acquire("quiet").admitted  # its share (2 of 4) is reached
    assert limit.in_flight == 10
    for _ in range(7):
        limit.release(1.0, "noisy")
    assert limit.acquire("noisy").admitted  # 3 in flight, under the limit: anyone
    limit.check_invariants()


def test_late_reports_within_the_budget_do_not_lower_the_limit_a_run_of_them_does():
    limit = ConcurrencyLimit(late_budget=0.1, late_memory=20)
    fill(limit, 30)
    for _ in range(3):  # one late report in twenty: a late share of 5 %, within 10 %
        for _ in range(19):
            limit.report(late=False, entered_s=0.0, now=1.0)
        limit.report(late=True, entered_s=0.0, now=1.0)
        assert limit.limit == 4096
    limit.report(late=True, entered_s=0.0, now=1.0)  # two in a row: over the budget
    assert limit.limit == 27  # 0.9 x the 30 in flight
    assert limit.stats().late == 4 and limit.stats().decreases == 1
    assert limit.stats().late_share > 0.1


def test_with_no_budget_the_first_late_report_lowers_the_limit():
    limit = ConcurrencyLimit(late_budget=0)
    fill(limit, 10)
    limit.report(late=True, entered_s=0.0, now=1.0)
    assert limit.limit == 9


@pytest.mark.parametrize("fields", [{"backoff": 1.0}, {"backoff": 0.0}, {"min_limit": 0},
                                    {"late_budget": 1.0}, {"late_budget": -0.1},
                                    {"late_memory": 0},
                                    {"min_limit": 5, "max_limit": 4},
                                    {"max_limit": 2.5}, {"weights": {"a": 0}},
                                    {"weights": {"a": True}}])
def test_bad_fields_are_named(fields):
    with pytest.raises(ValueError, match=next(iter(fields)) if len(fields) == 1 else "min_limit"):
        ConcurrencyLimit(**fields)


def test_release_without_a_request_or_with_a_bad_time_is_refused():
    limit = ConcurrencyLimit()
    with pytest.raises(ValueError, match="without a request"):
        limit.release(1.0)
    fill(limit, 1)
    with pytest.raises(ValueError, match="held_s"):
        limit.release(float("nan"))


# A history: (gap, what, tenant) with what one of acquire, release, on-time, late.
EVENTS = st.lists(st.tuples(st.floats(0, 1), st.sampled_from("arOL"), st.sampled_from("xyz")),
                  max_size=120)


@given(EVENTS, st.integers(1, 4), st.integers(4, 64), st.floats(0.1, 0.95), st.booleans(),
       st.sampled_from([0.0, 0.05, 0.5]))
def test_any_history_keeps_the_bounds_and_admits_below_the_limit_or_the_share(
        events, min_limit, max_limit, backoff, weighted, late_budget):
    weights = {"x": 1.0, "y": 3.0} if weighted else None
    limit = ConcurrencyLimit(min_limit=min_limit, max_limit=max_limit, backoff=backoff,
                             weights=weights, late_budget=late_budget)
    now, entered, mine = 0.0, [], {}
    for gap, what, tenant in events:
        now += gap
        if what == "a":
            expected = limit.in_flight < limit.limit or (
                weighted and mine.get(tenant, 0) < limit.share(tenant))
            assert limit.acquire(tenant).admitted == expected
            if expected:
                entered.append((now, tenant))
                mine[tenant] = mine.get(tenant, 0) + 1
        elif what == "r" and entered:
            started, owner = entered.pop(0)
            limit.release(now - started, owner)
            mine[owner] -= 1
        elif what in "OL":
            limit.report(late=what == "L", entered_s=entered[0][0] if entered else now, now=now)
        assert min_limit <= limit.limit <= max_limit
        assert limit.in_flight == sum(mine.values())
        limit.check_invariants()


# ClassConcurrencyLimits: one limit per class, nested by first-token target.

def nested(**limit_fields):
    return ClassConcurrencyLimits(ttft_s={"chat": 0.5, "rag": 2.0, "batch": 2.0},
                                  limit=lambda: ConcurrencyLimit(late_budget=0,
                                                                 **limit_fields))


def test_a_class_counts_its_own_requests_and_the_tighter_classes():
    limits = nested()
    for _ in range(3):
        assert limits.acquire("chat").admitted
    assert limits.acquire("rag").admitted and limits.acquire("batch").admitted
    counted = {name: limit.in_flight for name, limit in limits.limits.items()}
    assert counted == {"chat": 3, "rag": 5, "batch": 5}
    assert limits.limits["rag"] is limits.limits["batch"]  # one target, one limit
    assert limits.in_flight == 5
    limits.release("chat", 1.0)
    limits.release("rag", 1.0)
    assert {name: limit.in_flight for name, limit in limits.limits.items()} == {
        "chat": 2, "rag": 3, "batch": 3}
    limits.check_invariants()


def test_a_tight_class_late_lowers_its_own_limit_and_loose_requests_fill_the_rest():
    limits = nested(backoff=0.5)
    for _ in range(8):
        assert limits.acquire("chat").admitted
    limits.report("chat", late=True, entered_s=0.0, now=1.0)
    assert {name: limit.limit for name, limit in limits.limits.items()} == {
        "chat": 4, "rag": 4096, "batch": 4096}
    assert not limits.acquire("chat").admitted  # 8 chat in flight >= 4
    assert limits.acquire("rag").admitted  # rag's limit learned nothing late
    assert limits.stats()["chat"].rejected == 1


def test_a_loose_class_late_does_not_refuse_the_tight_class():
    limits = nested(backoff=0.5)
    for _ in range(8):
        assert limits.acquire("rag").admitted
    limits.report("rag", late=True, entered_s=0.0, now=1.0)
    assert limits.limits["rag"].limit == 4
    assert not limits.acquire("batch").admitted  # batch shares rag's target and limit
    assert limits.acquire("chat").admitted  # served ahead of them: not behind their limit
    assert limits.limits["rag"].in_flight == 9  # but counted ahead of rag's requests
    limits.check_invariants()


def test_class_limits_name_a_bad_target():
    with pytest.raises(ValueError, match="at least one class"):
        ClassConcurrencyLimits(ttft_s={})
    with pytest.raises(ValueError, match=r"ttft_s\['chat'\]"):
        ClassConcurrencyLimits(ttft_s={"chat": 0})


@given(st.lists(st.tuples(st.floats(0, 1), st.sampled_from("arOL"), st.sampled_from(
    ["chat", "rag", "batch"])), max_size=120))
def test_any_class_history_keeps_the_nesting(events):
    limits = nested(backoff=0.5, max_limit=16)
    now, entered = 0.0, []
    for gap, what, slo_class in events:
        now += gap
        if what == "a":
            if limits.acquire(slo_class).admitted:
                entered.append((now, slo_class))
        elif what == "r" and entered:
            started, owner = entered.pop(0)
            limits.release(owner, now - started)
        elif what in "OL":
            limits.report(slo_class, late=what == "L", entered_s=now, now=now)
        assert limits.in_flight == len(entered)
        assert limits.limits["chat"].in_flight == sum(c == "chat" for _, c in entered)
        limits.check_invariants()


def test_a_loose_limit_below_the_tight_load_grows_back_on_the_tight_classes_on_time():
    # rag's limit fell to 4 while 8 chat requests are in flight: rag can admit nothing, so
    # only chat's on-time reports can show that the load it counts is served on time.
    limits = nested(backoff=0.5)
    for _ in range(8):
        assert limits.acquire("rag").admitted
    limits.report("rag", late=True, entered_s=0.0, now=1.0)
    for _ in range(8):
        limits.release("rag", 1.0)
    for _ in range(8):
        assert limits.acquire("chat").admitted
    assert limits.limits["rag"].limit == 4 and not limits.acquire("rag").admitted
    for step in range(40):
        limits.report("chat", late=False, entered_s=1.0, now=2.0 + step)
    assert limits.limits["rag"].limit > 8 and limits.acquire("rag").admitted
    assert limits.limits["rag"].stats().on_time == 0, "rag's own record is its own"
    limits.report("chat", late=True, entered_s=1.0, now=50.0)
    assert limits.limits["rag"].stats().late == 1, "a tight class's lateness stays its own"
    limits.check_invariants()
