"""The business-case workload: deterministic, five phases, a prompt switch, surges by phase."""

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.e2e_business_cases.workload import (
    KINDS,
    PHASES,
    SWITCH_TENANT,
    SYSTEM_PROMPT_BLOCKS,
    TIER_DEADLINES_S,
    Phase,
    business_workload,
    is_short,
    slo_class,
    tier_and_kind,
)
from benchmarks.replay.enterprise import TENANTS

SMALL = {"phase_s": 3.0}


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_equal_seeds_give_equal_workloads(seed):
    assert business_workload(seed=seed, **SMALL) == business_workload(seed=seed, **SMALL)


def test_different_seeds_give_different_traces():
    assert business_workload(seed=1, **SMALL).trace != business_workload(seed=2, **SMALL).trace


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), phase_s=st.floats(1.0, 6.0))
def test_every_request_falls_in_the_phase_named_by_its_id(seed, phase_s):
    workload = business_workload(seed=seed, phase_s=phase_s)
    assert [p.name for p in workload.phases] == [p.name for p in PHASES]
    for request in workload.trace.requests:
        assert 0 <= request.arrival_s < len(PHASES) * phase_s
        index = workload.phase_index(request.arrival_s)
        tier, kind = tier_and_kind(request.slo_class)
        assert request.request_id.startswith(f"p{index + 1}-{kind}-")
        assert request.deadline_s == TIER_DEADLINES_S[tier]
        assert len(request.block_hashes) == SYSTEM_PROMPT_BLOCKS


def test_the_switching_tenant_changes_prompt_hashes_at_the_switch_and_no_one_else_does():
    workload = business_workload(seed=0, phase_s=20.0)
    prompts: dict[tuple[str, bool], set] = {}
    for request in workload.trace.requests:
        after = request.arrival_s >= workload.switch_s
        prompts.setdefault((request.tenant, after), set()).add(request.block_hashes)
    for tenant in TENANTS:
        before, after = prompts[(tenant.name, False)], prompts[(tenant.name, True)]
        assert len(before) == len(after) == 1, "one system prompt per tenant and version"
        assert (before == after) == (tenant.name != SWITCH_TENANT)
    every_prompt = [next(iter(v)) for v in prompts.values()]
    assert len({h for p in every_prompt for h in p}) == len(set(map(tuple, every_prompt))) * (
        SYSTEM_PROMPT_BLOCKS)


def test_surges_raise_their_traffic_in_their_phase():
    workload = business_workload(seed=0, phase_s=120.0)
    count = Counter()
    for r in workload.trace.requests:
        phase = workload.phases[workload.phase_index(r.arrival_s)].name
        count[phase, "globex", r.tenant == "globex-health"] += 1
        count[phase, "rag", r.tenant == "piedpiper"] += 1  # a RAG-only tenant
        count[phase, "all", True] += 1
    assert count["gold-surge", "globex", True] > 3 * count["baseline", "globex", True]
    assert count["rag-surge", "rag", True] > 2 * count["baseline", "rag", True]
    assert count["overload", "all", True] > 2 * count["baseline", "all", True]


@given(rate=st.floats(0.1, 10), share=st.floats(0.05, 0.95),
       tenant_factor=st.floats(0.1, 10), rag_factor=st.floats(0.1, 10))
def test_a_phase_scales_each_kinds_rate_by_its_factors(rate, share, tenant_factor, rag_factor):
    tenant = TENANTS[0].__class__(name="t", tier="gold", priority=-1, rate_rps=rate,
                                  mix=(("chat", share), ("rag", 1 - share)))
    phase = Phase(name="p", tenant_multipliers={"t": tenant_factor},
                  kind_multipliers={"rag": rag_factor})
    scaled = dict(phase.profile(tenant, rate_scale=0.5).mix)
    new_rate = phase.profile(tenant, rate_scale=0.5).rate_rps
    assert new_rate * scaled["chat"] == pytest.approx(rate * share * tenant_factor * 0.5)
    assert new_rate * scaled["rag"] == pytest.approx(
        rate * (1 - share) * tenant_factor * rag_factor * 0.5)


def test_multipliers_must_be_positive():
    with pytest.raises(ValueError, match=r"tenant_multipliers\['t'\] must be positive, got 0"):
        Phase(name="p", tenant_multipliers={"t": 0})


def test_short_means_a_short_prompt_after_the_system_prompt():
    assert is_short(512 + 511) and not is_short(512 + 512)


def test_each_request_carries_its_tenants_tier_and_one_of_its_kinds():
    tenants = {t.name: t for t in TENANTS}
    seen = set()
    for request in business_workload(seed=0, phase_s=20.0).trace.requests:
        tier, kind = tier_and_kind(request.slo_class)
        tenant = tenants[request.tenant]
        assert tier == tenant.tier and kind in dict(tenant.mix)
        assert (kind == "code") or request.cancel_after_s is None, "only code is cancelled"
        seen.add((request.tenant, kind))
    assert seen == {(t.name, k) for t in TENANTS for k, _ in t.mix}


def test_slo_classes_are_tier_and_kind():
    assert slo_class("gold", "rag") == "gold-rag"
    assert tier_and_kind("bronze-chat") == ("bronze", "chat")
    assert set(KINDS) == {"chat", "code", "rag"}
    with pytest.raises(ValueError, match="'gold' is not '<tier>-<kind>'"):
        tier_and_kind("gold")
