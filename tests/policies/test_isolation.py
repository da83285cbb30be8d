"""TenantPrefillBudget: per-step weighted shares of the prefill budget; TokenCaps composes."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies import (
    LoadSnapshot,
    RequestView,
    TenantPrefillBudget,
    TenantQuota,
    TenantUsage,
    TokenBucket,
    TokenCaps,
)

TENANTS = ["gold", "silver", "bronze"]
WEIGHTS = {"gold": 4.0, "silver": 2.0}


def load(now=0.0, budget=8192):
    return LoadSnapshot(now=now, waiting_requests=0, running_requests=0, kv_usage=0.1,
                        token_budget=budget)


def view(rid, tenant, prompt, computed=0):
    return RequestView(request_id=rid, arrival_s=0.0, prompt_tokens=prompt,
                       computed_tokens=computed, tenant=tenant)


@given(st.lists(st.tuples(st.sampled_from(TENANTS), st.integers(1, 20_000)), min_size=1,
                max_size=30),
       st.integers(16, 8192))
def test_a_step_never_gives_a_tenant_more_than_its_share(requests, budget):
    policy = TenantPrefillBudget(weights=WEIGHTS)
    views = [view(f"r{i}", t, n) for i, (t, n) in enumerate(requests)]
    for v in views:
        policy.on_admitted(v, 0.0)
    step = load(budget=budget)
    granted: dict[str, int] = {}
    outstanding = set()
    for v in views:  # the scheduler asks in its own order and grants at most the cap
        tokens = min(policy.token_cap(v, step), v.prompt_tokens)
        if tokens:
            policy.on_scheduled(v, tokens, 0.0)
            granted[v.tenant] = granted.get(v.tenant, 0) + tokens
        if tokens < v.prompt_tokens:
            outstanding.add(v.tenant)
    # Tenants with prefill still outstanding after the step competed all step long: no
    # other tenant got more than its weighted share against them.
    for tenant, tokens in granted.items():
        rivals = sum(policy.weight(t) for t in outstanding - {tenant})
        assert tokens <= budget * policy.weight(tenant) / (policy.weight(tenant) + rivals)
    policy.check_invariants()


def test_a_tenant_alone_gets_the_whole_budget_and_shares_shrink_as_tenants_arrive():
    policy = TenantPrefillBudget(weights=WEIGHTS)
    policy.on_admitted(view("a", "bronze", 50_000), 0.0)
    assert policy.token_cap(view("a", "bronze", 50_000), load()) == 8192
    policy.on_admitted(view("b", "gold", 50_000), 0.0)
    step = load()
    assert policy.token_cap(view("b", "gold", 50_000), step) == 6553  # 4/5 of 8192
    assert policy.token_cap(view("a", "bronze", 50_000), step) == 1638  # 1/5


def test_the_share_is_per_step_and_finished_prefills_stop_counting():
    policy = TenantPrefillBudget()
    a, b = view("a", "x", 10_000), view("b", "y", 100)
    policy.on_admitted(a, 0.0)
    policy.on_admitted(b, 0.0)
    step = load()
    assert policy.token_cap(a, step) == 4096
    policy.on_scheduled(a, 4096, 0.0)
    assert policy.token_cap(a, step) == 0  # spent this step
    policy.on_scheduled(b, 100, 0.0)  # b's prefill is done: y no longer competes
    assert policy.stats().tenants_with_prefill == 1
    assert policy.token_cap(view("a", "x", 10_000, 4096), load(now=1.0)) == 8192
    policy.on_finished(a, 2.0)
    assert policy.stats().requests_with_prefill == 0
    policy.check_invariants()


def test_token_caps_take_the_smallest_cap_and_forward_every_event():
    budget = TenantPrefillBudget()
    bucket = TokenBucket(capacity_tokens=100, min_refill_per_s=10.0, max_refill_per_s=10.0)
    caps = TokenCaps(policies=(budget, bucket))
    request = view("a", "x", 5000)
    caps.on_admitted(request, 0.0)
    assert budget.stats().requests_with_prefill == 1
    step = load()
    assert caps.token_cap(request, step) <= 100  # the bucket's cap is below the budget's
    caps.on_finished(request, 1.0)
    assert budget.stats().requests_with_prefill == 0


def test_token_caps_need_token_cap_policies():
    with pytest.raises(ValueError, match="at least one"):
        TokenCaps(policies=())
    with pytest.raises(ValueError, match="token-cap policies"):
        TokenCaps(policies=(object(),))


def test_weights_must_be_positive():
    with pytest.raises(ValueError, match=r"weights\['a'\] must be a finite number > 0"):
        TenantPrefillBudget(weights={"a": 0})


def usage(running, blocks=None, max_running=8, total_blocks=1000):
    return TenantUsage(running_requests=running, kv_blocks=blocks or {},
                       max_running_requests=max_running, total_kv_blocks=total_blocks)


def test_quota_passes_over_a_tenant_at_its_share_of_slots_or_blocks():
    quota = TenantQuota(weights={"gold": 3.0})
    # gold's share is 3/4 of 8 slots = 6; bronze's 2
    assert quota.eligible(["gold", "bronze"], usage({"gold": 6, "bronze": 1})) == ["bronze"]
    assert quota.eligible(["gold", "bronze"], usage({"gold": 5, "bronze": 2})) == ["gold"]
    assert quota.eligible(["gold", "bronze"],
                          usage({"gold": 1}, blocks={"bronze": 250})) == ["gold"]


def test_quota_is_work_conserving():
    quota = TenantQuota()
    assert quota.eligible(["a"], usage({"a": 8})) == ["a"]  # alone: everything
    both_over = usage({"a": 4, "b": 4})
    assert quota.eligible(["a", "b"], both_over) == ["a", "b"]


@given(st.dictionaries(st.sampled_from(TENANTS), st.integers(0, 8), min_size=1),
       st.lists(st.sampled_from(TENANTS), min_size=1, unique=True))
def test_quota_never_empties_the_choice_and_only_narrows_it(running, backlogged):
    chosen = TenantQuota(weights=WEIGHTS).eligible(backlogged, usage(running))
    assert chosen and set(chosen) <= set(backlogged)
