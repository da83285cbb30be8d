"""`SpeculationBudget` (class caps and the load rule) and `cap_drafts` (its use before a step)."""

from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies import LoadSnapshot
from policies.speculative import SpeculationBudget


def load(waiting=0, kv_usage=0.1):
    return LoadSnapshot(now=0.0, waiting_requests=waiting, running_requests=4,
                        kv_usage=kv_usage, token_budget=2048)


def test_overrides_then_default():
    budget = SpeculationBudget(default_max_draft_tokens=16)
    budget.set_limit("bronze", 2)
    assert budget.limit("bronze") == 2
    assert budget.limit("gold") == 16
    assert budget.limit(None) == 16
    budget.clear("bronze")
    assert budget.limit("bronze") == 16


def test_load_rule_caps_unprotected_classes_only_while_busy():
    budget = SpeculationBudget(default_max_draft_tokens=16, busy_max_draft_tokens=0,
                               protected_classes={"gold"})
    assert budget.limit("bronze", load()) == 16, "idle: no cap"
    assert budget.limit("bronze", load(waiting=1)) == 0, "a queue makes the engine busy"
    assert budget.limit("bronze", load(kv_usage=0.9)) == 0, "so does a full KV cache"
    assert budget.limit("gold", load(waiting=5, kv_usage=0.9)) == 16
    assert budget.limit("bronze") == 16, "no load given: the rule is not applied"


def test_waiting_threshold_can_be_disabled():
    budget = SpeculationBudget(busy_max_draft_tokens=4, busy_waiting_requests=None)
    assert budget.limit("x", load(waiting=100)) == 32
    assert budget.limit("x", load(kv_usage=0.85)) == 4


@pytest.mark.parametrize("kwargs, message", [
    ({"default_max_draft_tokens": -1}, "default_max_draft_tokens must be >= 0"),
    ({"busy_max_draft_tokens": -2}, "busy_max_draft_tokens must be >= 0"),
    ({"busy_kv_usage": 1.5}, r"busy_kv_usage must be in \[0, 1\]"),
])
def test_bad_configuration_is_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SpeculationBudget(**kwargs)


@given(default=st.integers(0, 64), busy_cap=st.none() | st.integers(0, 64),
       waiting=st.integers(0, 8), kv_usage=st.floats(0, 1), override=st.integers(0, 64))
def test_limit_never_exceeds_the_class_limit(default, busy_cap, waiting, kv_usage, override):
    budget = SpeculationBudget(default_max_draft_tokens=default, busy_max_draft_tokens=busy_cap)
    budget.set_limit("a", override)
    snapshot = load(waiting, kv_usage)
    assert budget.limit("a", snapshot) <= override
    assert budget.limit("b", snapshot) <= default
    if busy_cap is not None and budget.busy(snapshot):
        assert budget.limit("b", snapshot) <= busy_cap


def test_cap_drafts_trims_per_class_without_mutating_shared_lists():
    from integrations.vllm_v1.speculative.budget import cap_drafts

    placeholders = [-1] * 8  # the async scheduler gives every request this same list
    requests = [SimpleNamespace(spec_token_ids=placeholders, slo_class=c)
                for c in ("gold", "bronze", None)]
    requests.append(SimpleNamespace(spec_token_ids=[], slo_class="bronze"))
    budget = SpeculationBudget(default_max_draft_tokens=8)
    budget.set_limit("bronze", 3)
    budget.set_limit("", 0)
    withheld = cap_drafts(requests, budget, lambda r: r.slo_class, load())
    assert [len(r.spec_token_ids) for r in requests] == [8, 3, 0, 0]
    assert placeholders == [-1] * 8
    assert withheld == {"bronze": 5, "": 8}
