"""`PathDelays`: the ingress and egress delays around the engine step, learned online."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.percentile import percentile
from policies.slo.path import PathDelays


def test_each_term_is_the_p90_of_its_recent_observations():
    path = PathDelays()
    for index in range(10):
        path.observe_ingress(arrival_s=index, now=index + 0.01 * (index + 1))
    assert path.ingress_s(10.0) == pytest.approx(0.091)
    assert path.egress_s(10.0) == 0.0, "no observation: nothing planned"


def test_egress_runs_from_the_engines_first_token_to_the_client_report():
    path = PathDelays()
    path.engine_first_token("a", 1.0)
    assert path.client_first_token("a", 1.25) == pytest.approx(0.25)
    assert path.client_first_token("a", 1.5) is None, "one report per first token"
    assert path.client_first_token("never-judged", 2.0) is None
    stats = path.stats(2.0)
    assert stats.egress_s == pytest.approx(0.25) and stats.egress_samples == 1
    assert stats.client_reports == 3 and stats.unmatched_reports == 2
    assert path.has_client_reports
    path.check_invariants()


def test_observations_older_than_the_horizon_are_forgotten():
    path = PathDelays(horizon_s=5.0)
    path.engine_first_token("slow", 0.0)
    path.client_first_token("slow", 3.0)  # a loaded moment: 3 s of egress
    assert path.egress_s(7.0) == pytest.approx(3.0)
    assert path.egress_s(8.5) == 0.0, "the load passed: it no longer counts"


def test_requests_awaiting_a_client_report_are_bounded_oldest_first():
    path = PathDelays(max_awaiting=3)
    for index in range(5):
        path.engine_first_token(f"r{index}", float(index))
    assert path.stats(5.0).awaiting_client == 3
    assert path.client_first_token("r0", 6.0) is None, "the oldest was dropped"
    assert path.client_first_token("r4", 6.0) == pytest.approx(2.0)
    path.check_invariants()


def test_bad_configuration_names_the_field():
    with pytest.raises(ValueError, match="window must be >= 1"):
        PathDelays(window=0)
    with pytest.raises(ValueError, match="horizon_s"):
        PathDelays(horizon_s=0.0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["in", "first", "report"]),
                          st.integers(0, 20), st.floats(0, 100)), max_size=200))
def test_memory_stays_bounded_and_delays_non_negative(events):
    path = PathDelays(window=8, max_awaiting=4, horizon_s=10.0)
    for kind, request, at in events:
        if kind == "in":
            path.observe_ingress(arrival_s=at, now=at + request * 0.1)
        elif kind == "first":
            path.engine_first_token(f"r{request}", at)
        else:
            path.client_first_token(f"r{request}", at)
        path.check_invariants()
        assert path.ingress_s(at) >= 0 and path.egress_s(at) >= 0


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["ingress", "egress", "ask"]),
                          st.floats(0.0, 3.0), st.floats(0.0, 0.5)), max_size=60))
def test_the_cached_percentile_is_the_one_its_current_samples_give(events):
    """Asked again and again, each term answers what a percentile over its samples within the
    horizon gives now: the cache follows new observations and ones that age out."""
    path = PathDelays(window=8, horizon_s=2.0)
    seen: dict[str, list[tuple[float, float]]] = {"ingress": [], "egress": []}
    now, served = 0.0, 0
    for kind, dt, delay in events:
        now += dt
        if kind == "ingress":
            path.observe_ingress(now - delay, now)
        elif kind == "egress":
            served += 1
            path.engine_first_token(f"r{served}", now - delay)
            path.client_first_token(f"r{served}", now)
        if kind != "ask":
            seen[kind].append((now, now - (now - delay)))  # as measured from the two times
        for term, planned in (("ingress", path.ingress_s(now)), ("egress", path.egress_s(now))):
            recent = [d for t, d in seen[term][-8:] if t >= now - 2.0]
            assert planned == (percentile(recent, 90) if recent else 0.0)
        path.check_invariants()
