"""Weighted max-min water-filling and the fair-share Jain index."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.replay.fair_share import fair_share_jain, weighted_max_min
from benchmarks.replay.records import RequestRecord

TENANTS = ["a", "b", "c"]


@given(demands=st.lists(st.integers(0, 1000), min_size=3, max_size=3),
       weights=st.lists(st.integers(1, 8), min_size=3, max_size=3),
       capacity=st.integers(0, 3000))
def test_water_filling_is_capped_by_demand_conserving_and_weighted(demands, weights, capacity):
    demand = dict(zip(TENANTS, map(float, demands), strict=True))
    weight = dict(zip(TENANTS, map(float, weights), strict=True))
    fair = weighted_max_min(demand, weight, capacity)
    assert all(-1e-9 <= fair[t] <= demand[t] + 1e-9 for t in TENANTS)
    assert sum(fair.values()) == pytest.approx(min(capacity, sum(demands)), abs=1e-6)
    # An unsatisfied tenant never gets less per weight than any other tenant.
    for t in TENANTS:
        if fair[t] < demand[t] - 1e-6:
            assert all(fair[t] / weight[t] >= fair[u] / weight[u] - 1e-6 for u in TENANTS)


def test_water_filling_gives_what_a_small_tenant_leaves_to_the_others_by_weight():
    fair = weighted_max_min({"a": 100.0, "b": 1000.0, "c": 1000.0},
                            {"a": 1.0, "b": 2.0, "c": 1.0}, 700.0)
    assert fair == pytest.approx({"a": 100.0, "b": 400.0, "c": 200.0})


def record(tenant, prompt, output, outcome, produced=None):
    produced = output if produced is None else produced
    return RequestRecord(request_id=f"{tenant}{prompt}{outcome}", arrival_s=0.0,
                         prompt_tokens=prompt, output_tokens=output, tenant=tenant, priority=0,
                         slo_class=None, token_times_s=[1.0] * produced, outcome=outcome)


def test_jain_is_one_when_everyone_is_served_and_falls_when_admission_skews():
    served = [record("a", 100, 10, "completed"), record("b", 100, 10, "completed")]
    assert fair_share_jain(served) == pytest.approx(1.0)
    # Both asked for 220 tokens and 330 were served, 220 to "a": fair shares were 165 each,
    # so the normalised services are 4/3 and 2/3.
    skewed = [*served, record("a", 100, 10, "completed"),
              record("b", 100, 10, "rejected", produced=0)]
    assert fair_share_jain(skewed) == pytest.approx(4 / (2 * (16 / 9 + 4 / 9)))
    # At weights 3:1, "a"'s fair share is all it asked for and "b" gets the rest: fair.
    assert fair_share_jain(skewed, weights={"a": 3.0, "b": 1.0}) == pytest.approx(1.0)


def test_a_cancelled_request_demands_only_what_it_was_served():
    records = [record("a", 100, 10, "completed"), record("b", 100, 50, "cancelled", produced=10)]
    assert fair_share_jain(records) == pytest.approx(1.0)


def test_no_demand_gives_none():
    assert fair_share_jain([]) is None
