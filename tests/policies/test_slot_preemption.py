"""Slot preemption: who is at risk, who gives up a slot, and the bound against thrash."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies import LifecycleObserver, PreemptionPolicy, RequestView, SLOTarget, SlotPreemption

SLOS = {"gold": SLOTarget(ttft_s=1.0, tpot_s=0.1), "bronze": SLOTarget(ttft_s=10.0, tpot_s=0.2)}


def view(request_id, *, slo_class="bronze", arrival_s=0.0, priority=0, output_tokens=0,
         computed_tokens=0):
    return RequestView(request_id=request_id, arrival_s=arrival_s, prompt_tokens=64,
                       slo_class=slo_class, priority=priority, output_tokens=output_tokens,
                       computed_tokens=computed_tokens)


def policy(**changes):
    return SlotPreemption(slos=SLOS, protected_classes=frozenset({"gold"}), **changes)


RUNNING = [view("b-long", computed_tokens=900, output_tokens=5),
           view("b-short", computed_tokens=100, output_tokens=5)]


def test_it_is_a_preemption_policy_and_a_lifecycle_observer():
    assert isinstance(policy(), PreemptionPolicy) and isinstance(policy(), LifecycleObserver)


def test_a_waiting_request_is_at_risk_once_it_has_spent_its_share_of_the_ttft_target():
    gold = view("g", slo_class="gold")
    assert policy().choose([gold], RUNNING, now=0.49) is None
    choice = policy().choose([gold], RUNNING, now=0.5)
    # the least work to redo: the bronze request with the fewest computed tokens
    assert (choice.victim, choice.beneficiary) == ("b-short", "g")


def test_only_a_strictly_less_important_request_is_a_victim():
    bronze = view("b-waiting", priority=-1)  # more urgent priority, same unprotected class
    assert policy().choose([bronze], RUNNING, now=9.0).victim == "b-short"
    same = view("b-same", priority=0)
    assert policy().choose([same], RUNNING, now=9.0) is None
    # a protected class outranks any priority
    gold_running = [view("g-run", slo_class="gold", priority=5, output_tokens=1)]
    assert policy().choose([bronze], gold_running, now=9.0) is None
    assert policy().choose([view("g", slo_class="gold", priority=9)], RUNNING,
                           now=9.0) is not None


def test_the_least_important_victim_goes_first():
    running = [view("p1", priority=1, computed_tokens=10, output_tokens=1),
               view("p3", priority=3, computed_tokens=5000, output_tokens=1)]
    assert policy().choose([view("g", slo_class="gold")], running, now=1.0).victim == "p3"


def test_the_most_important_at_risk_request_is_served_and_queue_order_breaks_ties():
    waiting = [view("b", priority=0), view("g1", slo_class="gold"),
               view("g2", slo_class="gold")]
    assert policy().choose(waiting, RUNNING, now=9.0).beneficiary == "g1"


def test_a_request_with_a_token_already_or_without_a_class_target_is_never_at_risk():
    started = view("g", slo_class="gold", output_tokens=1)
    unknown = view("u", slo_class=None, priority=-9)
    assert policy().choose([started, unknown], RUNNING, now=100.0) is None


def test_each_request_is_preempted_at_most_its_limit_and_a_victim_never_benefits():
    p = policy(max_preemptions_per_request=1)
    first = p.choose([view("g1", slo_class="gold")], RUNNING, now=1.0)
    p.on_preempted(first)
    second = p.choose([view("g2", slo_class="gold")], RUNNING, now=1.0)
    assert second.victim == "b-long"
    p.on_preempted(second)
    assert p.choose([view("g3", slo_class="gold")], RUNNING, now=1.0) is None
    # the victim, waiting again with no token yet, does not preempt anyone in turn
    victim_waiting = view("b-short", priority=-5)
    assert p.choose([victim_waiting], [view("x", priority=9, output_tokens=1)], now=9.0) is None
    stats = p.stats()
    assert stats.preemptions == 2 and stats.at_risk_unserved == 1
    p.on_finished(view("b-short"), now=10.0)
    assert p.choose([view("g4", slo_class="gold")], [view("b-short")], now=1.0) is not None


@pytest.mark.parametrize("changes", [{"risk_share": -0.1}, {"risk_share": 1.5},
                                     {"max_preemptions_per_request": 0}])
def test_bad_settings_are_refused_naming_the_field(changes):
    with pytest.raises(ValueError, match=next(iter(changes))):
        policy(**changes)


requests = st.builds(
    lambda i, cls, priority, arrival, output: view(
        f"r{i}", slo_class=cls, priority=priority, arrival_s=arrival, output_tokens=output),
    st.integers(0, 30), st.sampled_from(["gold", "bronze", None]), st.integers(-2, 2),
    st.floats(0, 20), st.sampled_from([0, 0, 3]))


unique = {"max_size": 6, "unique_by": lambda r: r.request_id}


@given(st.lists(st.tuples(st.lists(requests, **unique), st.lists(requests, **unique),
                          st.floats(0, 40)), max_size=25),
       st.integers(1, 3))
def test_guarantees_hold_for_any_sequence_of_steps(steps, limit):
    p = policy(max_preemptions_per_request=limit)
    victims: dict[str, int] = {}
    for waiting, running, now in steps:
        waiting_ids = {r.request_id for r in waiting}
        running = [r for r in running if r.request_id not in waiting_ids]
        choice = p.choose(waiting, running, now)
        if choice is None:
            continue
        beneficiary = next(r for r in waiting if r.request_id == choice.beneficiary)
        victim = next(r for r in running if r.request_id == choice.victim)
        assert beneficiary.output_tokens == 0 and choice.beneficiary not in victims
        assert now - beneficiary.arrival_s >= 0.5 * SLOS[beneficiary.slo_class].ttft_s
        assert p.importance(victim) > p.importance(beneficiary)
        p.on_preempted(choice)
        victims[choice.victim] = victims.get(choice.victim, 0) + 1
        assert victims[choice.victim] <= limit
    assert p.stats().preemptions == sum(victims.values())
