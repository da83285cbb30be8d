"""`PDPlanner`: the P:D split it picks is optimal, fits, respects the ITL bound and hysteresis."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.pd.planner import FixedCapacity, PDDemand, PDPlan, PDPlanner

CAPACITY = FixedCapacity(prefill_tokens_per_s=20_000, decode_tokens_per_s=1_000,
                         colocated_gap_s=0.3)


def demand(prefill: float, decode: float) -> PDDemand:
    return PDDemand(window_s=60, requests=1, prompt_tokens_per_s=0, prefill_tokens_per_s=0,
                    decode_tokens_per_s=0, prefill_instances=prefill, decode_instances=decode)


work_st = st.floats(0, 20, allow_nan=False)
instances_st = st.integers(1, 12)
itl_st = st.sampled_from([None, 0.1, 0.5])


@given(instances_st, work_st, work_st, itl_st)
def test_best_is_optimal_over_every_allowed_plan_and_fits(instances, prefill, decode, itl):
    planner = PDPlanner(instances=instances, capacity=CAPACITY, itl_slo_s=itl)
    need = demand(prefill, decode)
    best = planner.best(need)
    assert best.instances == instances
    assert best.colocated or (best.prefill >= 1 and best.decode >= 1)
    if best.colocated and instances > 1:
        assert itl is None or CAPACITY.colocated_itl_s() <= itl
    every = [PDPlan(prefill=p, decode=instances - p) for p in range(1, instances)]
    if planner.colocated_allowed() or instances == 1:
        every.append(PDPlan(prefill=0, decode=instances))
    assert all(PDPlanner.utilization(best, need) <= PDPlanner.utilization(p, need) + 1e-12
               for p in every)


@given(instances_st.filter(lambda n: n > 1), work_st, work_st, st.floats(0.01, 100))
def test_the_choice_does_not_depend_on_the_demands_scale(instances, prefill, decode, scale):
    planner = PDPlanner(instances=instances, capacity=CAPACITY, itl_slo_s=0.1)
    plain, scaled = demand(prefill, decode), demand(prefill * scale, decode * scale)
    assert PDPlanner.utilization(planner.best(scaled), scaled) == pytest.approx(
        PDPlanner.utilization(planner.best(plain), scaled))


@given(instances_st.filter(lambda n: n > 1), work_st, work_st, st.floats(0, 20))
def test_more_decode_work_never_takes_decode_instances_away(instances, prefill, decode, extra):
    planner = PDPlanner(instances=instances, capacity=CAPACITY, itl_slo_s=0.1)  # no colocation
    before = planner.best(demand(prefill, decode))
    after = planner.best(demand(prefill, decode + extra))
    assert after.decode >= before.decode


@given(instances_st.filter(lambda n: n > 1), work_st, work_st)
def test_without_an_itl_bound_colocation_is_never_worse(instances, prefill, decode):
    planner = PDPlanner(instances=instances, capacity=CAPACITY)
    assert planner.best(demand(prefill, decode)).colocated


def observe(planner, start, count, *, prompt, output, spacing=0.5):
    for i in range(count):
        planner.observe(start + i * spacing, prompt_tokens=prompt, output_tokens=output)
    return start + count * spacing


def test_it_replans_when_the_mix_shifts_and_only_then():
    planner = PDPlanner(instances=8, capacity=CAPACITY, itl_slo_s=0.1, window_s=60)
    # prefill-heavy: 2 req/s x 20k prompt tokens = 2 instances, x 100 outputs = 0.2 instances
    now = observe(planner, 0.0, 120, prompt=20_000, output=100)
    prefill_heavy = planner.plan(now)
    assert prefill_heavy.prefill > prefill_heavy.decode
    # the same mix with noise: the plan stays
    now = observe(planner, now, 120, prompt=19_000, output=110)
    assert planner.plan(now) == prefill_heavy
    # decode-heavy: 2 req/s x 1k prompt = 0.1, x 2,000 outputs = 4 instances
    now = observe(planner, now, 120, prompt=1_000, output=2_000)
    decode_heavy = planner.plan(now)
    assert decode_heavy.decode > decode_heavy.prefill
    stats = planner.stats()
    assert stats.changes == 2 and stats.plans == 3 and stats.current == decode_heavy
    assert stats.in_window == 119 and stats.observed == 360 and not stats.colocated_allowed
    planner.check_invariants()


@settings(max_examples=50)
@given(st.lists(st.tuples(st.floats(0, 5), st.integers(1, 50_000), st.integers(0, 3_000)),
                min_size=1, max_size=40), st.floats(0, 0.5))
def test_hysteresis_keeps_a_plan_within_its_margin(requests, hysteresis):
    planner = PDPlanner(instances=6, capacity=CAPACITY, itl_slo_s=0.1, hysteresis=hysteresis,
                        initial_plan=PDPlan(prefill=3, decode=3))
    now = 0.0
    for gap, prompt, output in requests:
        now += gap
        planner.observe(now, prompt_tokens=prompt, output_tokens=output)
    need = planner.demand(now)
    chosen = planner.plan(now)
    kept = PDPlan(prefill=3, decode=3)
    best = planner.best(need)
    if PDPlanner.utilization(best, need) >= (1 - hysteresis) * PDPlanner.utilization(kept, need):
        assert chosen == kept
    else:
        assert chosen == best
    planner.check_invariants()


def test_demand_counts_the_window_only():
    planner = PDPlanner(instances=4, capacity=CAPACITY, window_s=10)
    observe(planner, 0.0, 10, prompt=20_000, output=1_000, spacing=1.0)  # t = 0..9
    full = planner.demand(9.0)
    assert full.requests == 10 and full.window_s == 9.0
    assert full.prefill_instances == pytest.approx(10 * 1.0 / 9.0)  # 1 s of prefill each
    assert full.decode_tokens_per_s == pytest.approx(10_000 / 9.0)
    later = planner.demand(15.0)  # arrivals at 0..5 left the window
    assert later.requests == 4 and later.window_s == 10


def test_a_single_instance_is_colocated_and_plans_are_named():
    planner = PDPlanner(instances=1, capacity=CAPACITY, itl_slo_s=0.01)
    observe(planner, 0.0, 3, prompt=1000, output=10)
    assert planner.plan(2.0) == PDPlan(prefill=0, decode=1)
    assert PDPlan(prefill=0, decode=4).name == "4C" and PDPlan(prefill=3, decode=1).name == "3P1D"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"instances": 0}, "instances must be an integer >= 1"),
    ({"capacity": object()}, "capacity must implement CapacityModel"),
    ({"itl_slo_s": 0.0}, "itl_slo_s must be finite and > 0"),
    ({"window_s": -1.0}, "window_s must be finite and > 0"),
    ({"hysteresis": 1.5}, r"hysteresis must be in \[0, 1\]"),
    ({"min_prefill": 3, "min_decode": 2}, "min_prefill \\+ min_decode must be at most"),
    ({"initial_plan": PDPlan(prefill=1, decode=1)}, "initial_plan must be a PDPlan of 4"),
])
def test_constructor_rejects_bad_config(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PDPlanner(**{"instances": 4, "capacity": CAPACITY, **kwargs})


def test_observations_must_be_in_order_and_consistent():
    planner = PDPlanner(instances=2, capacity=CAPACITY)
    planner.observe(5.0, prompt_tokens=10, output_tokens=1)
    with pytest.raises(ValueError, match="now must not go backwards"):
        planner.observe(4.0, prompt_tokens=10, output_tokens=1)
    with pytest.raises(ValueError, match="cached_tokens <= prompt_tokens"):
        planner.observe(6.0, prompt_tokens=10, output_tokens=1, cached_tokens=11)
    with pytest.raises(ValueError, match="decode must be an integer >= 1"):
        PDPlan(prefill=2, decode=0)
