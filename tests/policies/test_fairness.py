"""WFQ: the VTC share bound, work conservation, no idle credit, and an oracle machine."""

import itertools
import math

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from policies.ordering.fairness import WFQ, WFQStats

TENANTS = ("a", "b", "c", "d")
weights_ = st.floats(min_value=0.1, max_value=10.0, allow_nan=False)
charges = st.tuples(st.integers(0, 2000), st.integers(0, 500))


def cost(wfq, input_tokens, output_tokens):
    return input_tokens * wfq.input_token_cost + output_tokens * wfq.output_token_cost


def tolerance(wfq):
    return 1e-9 * (1.0 + max((abs(c) for c in wfq.stats().counters.values()), default=0.0))


# -- the defining property: the share bound ----------------------------------------------------


@settings(max_examples=60)
@given(weights=st.lists(weights_, min_size=2, max_size=4), steps=st.lists(charges, max_size=150))
def test_continuously_backlogged_tenants_share_within_m_over_w(weights, steps):
    """Charges <= M per selection keep |S_i/w_i - S_j/w_j| <= M / min(w_i, w_j)."""
    tenants = TENANTS[: len(weights)]
    wfq = WFQ(weights=dict(zip(tenants, weights, strict=True)))
    for tenant in tenants:
        wfq.on_backlogged(tenant)
    service = dict.fromkeys(tenants, 0.0)
    max_cost = 0.0
    for input_tokens, output_tokens in steps:
        chosen = wfq.select()
        c = cost(wfq, input_tokens, output_tokens)
        max_cost = max(max_cost, c)
        wfq.charge(chosen, input_tokens, output_tokens)
        service[chosen] += c
        eps = tolerance(wfq)
        for i, j in itertools.combinations(tenants, 2):
            w_i, w_j = wfq.weight(i), wfq.weight(j)
            gap = abs(service[i] / w_i - service[j] / w_j)
            assert gap <= max_cost / min(w_i, w_j) + eps, (i, j, gap)
        for tenant in tenants:
            assert -eps <= wfq.lag_tokens(tenant) <= max_cost / wfq.weight(tenant) + eps


def test_the_share_bound_is_tight():
    wfq = WFQ(weights={"a": 1.0, "b": 1.0})
    wfq.on_backlogged("a")
    wfq.on_backlogged("b")
    assert wfq.select() == "a"  # tie broken by name
    wfq.charge("a", input_tokens=100)
    assert wfq.lag_tokens("a") == 100.0  # = M / w: the bound is attained
    assert wfq.select() == "b"


def test_weights_set_the_long_run_shares():
    wfq = WFQ(weights={"gold": 4, "silver": 2, "bronze": 1})
    for tenant in ("gold", "silver", "bronze"):
        wfq.on_backlogged(tenant)
    for _ in range(7000):
        wfq.charge(wfq.select(), input_tokens=10, output_tokens=5)
    served = wfq.stats().service_cost
    total = sum(served.values())
    assert served["gold"] / total == pytest.approx(4 / 7, abs=1e-3)
    assert served["bronze"] / total == pytest.approx(1 / 7, abs=1e-3)


ops = st.one_of(
    st.tuples(st.just("toggle"), st.sampled_from(TENANTS)),
    st.tuples(st.just("serve"), charges),
)


@settings(max_examples=60)
@given(weights=st.lists(weights_, min_size=4, max_size=4), script=st.lists(ops, max_size=150))
def test_tenants_coming_and_going_stay_within_the_bound(weights, script):
    """Work conserving; lags in [0, M/w]; co-backlogged pairs within M/w_i + M/w_j; V rises."""
    wfq = WFQ(weights=dict(zip(TENANTS, weights, strict=True)))
    service = dict.fromkeys(TENANTS, 0.0)
    since: dict[tuple[str, str], tuple[float, float]] = {}  # pair -> services when co-backlogged
    max_cost, last_virtual_time = 0.0, 0.0
    for op in script:
        if op[0] == "toggle":
            tenant = op[1]
            if wfq.is_backlogged(tenant):
                wfq.on_idle(tenant)
            else:
                wfq.on_backlogged(tenant)
        else:
            backlogged = [t for t in TENANTS if wfq.is_backlogged(t)]
            if not backlogged:
                with pytest.raises(ValueError, match="at least one backlogged tenant"):
                    wfq.select()
                continue
            chosen = wfq.select()
            assert chosen in backlogged  # work conserving: a backlogged tenant is always served
            (input_tokens, output_tokens) = op[1]
            c = cost(wfq, input_tokens, output_tokens)
            max_cost = max(max_cost, c)
            wfq.charge(chosen, input_tokens, output_tokens)
            service[chosen] += c
        wfq.check_invariants()
        eps = tolerance(wfq)
        assert wfq.virtual_time >= last_virtual_time - eps
        last_virtual_time = wfq.virtual_time
        for tenant in TENANTS:
            if wfq.is_backlogged(tenant):
                assert -eps <= wfq.lag_tokens(tenant) <= max_cost / wfq.weight(tenant) + eps
        for i, j in itertools.combinations(TENANTS, 2):
            if not (wfq.is_backlogged(i) and wfq.is_backlogged(j)):
                since.pop((i, j), None)
                continue
            start_i, start_j = since.setdefault((i, j), (service[i], service[j]))
            w_i, w_j = wfq.weight(i), wfq.weight(j)
            gap = abs((service[i] - start_i) / w_i - (service[j] - start_j) / w_j)
            assert gap <= max_cost / w_i + max_cost / w_j + eps


def test_a_tenant_back_from_idle_cannot_monopolise():
    wfq = WFQ()
    wfq.on_backlogged("busy")
    for _ in range(1000):  # "sleepy" idles while "busy" is served alone
        wfq.charge(wfq.select(), input_tokens=100)
    wfq.on_backlogged("sleepy")
    assert wfq.counter("sleepy") == wfq.counter("busy")  # lifted: no credit for idling
    assert wfq.stats().lifted["sleepy"] == 100_000.0
    served = {"busy": 0, "sleepy": 0}
    for _ in range(100):
        chosen = wfq.select()
        wfq.charge(chosen, input_tokens=100)
        served[chosen] += 100
        assert abs(served["busy"] - served["sleepy"]) <= 100 + 100
    assert served == {"busy": 5000, "sleepy": 5000}


def test_idle_credit_is_also_dropped_when_nobody_was_backlogged():
    wfq = WFQ()
    for tenant in ("a", "b"):
        wfq.on_backlogged(tenant)
    wfq.charge("a", input_tokens=10)
    wfq.charge("b", input_tokens=500)
    wfq.on_idle("a")
    wfq.on_idle("b")  # b leaves last, at 500: the virtual time freezes there
    assert wfq.virtual_time == 500.0
    wfq.on_backlogged("a")
    assert wfq.counter("a") == 500.0


def test_an_idle_tenant_keeps_service_charged_while_idle():
    wfq = WFQ()
    wfq.on_backlogged("a")
    wfq.on_backlogged("b")
    wfq.on_idle("a")
    wfq.charge("a", output_tokens=1000)  # its running requests keep decoding
    wfq.on_backlogged("a")
    assert wfq.counter("a") == 2000.0
    assert wfq.select() == "b"


# -- API details ---------------------------------------------------------------------------


def test_unknown_tenants_get_the_default_weight():
    wfq = WFQ(weights={"gold": 4.0}, default_weight=0.5)
    assert wfq.weight("gold") == 4.0
    assert wfq.weight("anyone") == 0.5
    wfq.charge("anyone", input_tokens=1, output_tokens=1)
    assert wfq.counter("anyone") == (1.0 + 2.0) / 0.5


def test_select_breaks_ties_by_name_and_accepts_a_subset():
    wfq = WFQ()
    for tenant in ("b", "a", "c"):
        wfq.on_backlogged(tenant)
    assert wfq.select() == "a"
    assert wfq.select(["c", "b"]) == "b"


def test_select_refuses_tenants_that_were_never_lifted():
    wfq = WFQ()
    wfq.on_backlogged("a")
    with pytest.raises(KeyError, match="tenant 'z' is not backlogged; call on_backlogged first"):
        wfq.select(["a", "z"])
    with pytest.raises(ValueError, match="select needs at least one backlogged tenant"):
        wfq.select([])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"input_tokens": -1}, "input_tokens must be an integer >= 0, got -1"),
        ({"output_tokens": 1.5}, "output_tokens must be an integer >= 0, got 1.5"),
    ],
)
def test_charge_rejects_bad_token_counts(kwargs, message):
    with pytest.raises(ValueError, match=message):
        WFQ().charge("a", **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"weights": {"a": 0.0}}, "weight of tenant 'a' must be finite and > 0, got 0.0"),
        ({"weights": {"a": -2}}, "weight of tenant 'a' must be finite and > 0, got -2"),
        ({"weights": {"a": math.inf}}, "weight of tenant 'a' must be finite and > 0, got inf"),
        ({"weights": {"a": "4"}}, "weight of tenant 'a' must be a number, got '4'"),
        ({"weights": {1: 1.0}}, "weights keys must be tenant names, got 1"),
        ({"default_weight": 0.0}, "default_weight must be finite and > 0"),
        ({"input_token_cost": -1.0}, "input_token_cost must be finite and >= 0"),
        ({"output_token_cost": math.nan}, "output_token_cost must be finite and >= 0"),
        ({"input_token_cost": 0.0, "output_token_cost": 0.0}, "cannot both be 0"),
    ],
)
def test_invalid_configuration_is_rejected_with_a_precise_message(kwargs, message):
    with pytest.raises(ValueError, match=message):
        WFQ(**kwargs)


def test_configured_weights_cannot_be_changed_behind_its_back():
    weights = {"a": 1.0}
    wfq = WFQ(weights=weights)
    weights["a"] = 100.0
    assert wfq.weight("a") == 1.0
    with pytest.raises(TypeError):
        wfq.weights["a"] = 2.0


def test_stats_is_a_frozen_snapshot():
    wfq = WFQ(weights={"gold": 2.0})
    wfq.on_backlogged("gold")
    wfq.charge("gold", input_tokens=10, output_tokens=3)
    snapshot = wfq.stats()
    wfq.charge("gold", input_tokens=1000)
    assert isinstance(snapshot, WFQStats)
    assert snapshot.counters == {"gold": 8.0}
    assert snapshot.service_cost == {"gold": 16.0}
    assert (snapshot.input_tokens, snapshot.output_tokens) == ({"gold": 10}, {"gold": 3})
    assert snapshot.weights == {"gold": 2.0}
    assert snapshot.backlogged == frozenset({"gold"})
    assert snapshot.lag_tokens == {"gold": 0.0}
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        snapshot.virtual_time = 1.0
    with pytest.raises(TypeError):
        snapshot.counters["gold"] = 0.0


# -- stateful: the real object against an oracle ----------------------------------------------


class WFQMachine(RuleBasedStateMachine):
    """Drives `WFQ` with arbitrary event orders and compares it with a plain model."""

    @initialize(weights=st.lists(weights_, min_size=2, max_size=2))
    def setup(self, weights):
        configured = dict(zip(TENANTS[:2], weights, strict=True))  # c, d take the default weight
        self.wfq = WFQ(weights=configured, default_weight=1.5, input_token_cost=1.0,
                       output_token_cost=3.0)
        self.weight = {t: configured.get(t, 1.5) for t in TENANTS}
        self.counter = dict.fromkeys(TENANTS, 0.0)
        self.backlogged: set[str] = set()
        self.frozen_virtual_time = 0.0
        self.last_virtual_time = 0.0

    def model_virtual_time(self):
        if self.backlogged:
            return min(self.counter[t] for t in self.backlogged)
        return self.frozen_virtual_time

    @rule(tenant=st.sampled_from(TENANTS))
    def backlog(self, tenant):
        if tenant not in self.backlogged:
            self.counter[tenant] = max(self.counter[tenant], self.model_virtual_time())
            self.backlogged.add(tenant)
        self.wfq.on_backlogged(tenant)

    @rule(tenant=st.sampled_from(TENANTS))
    def idle(self, tenant):
        if tenant in self.backlogged:
            self.backlogged.discard(tenant)
            if not self.backlogged:  # the last to leave sets the virtual time
                self.frozen_virtual_time = self.counter[tenant]
        self.wfq.on_idle(tenant)

    @rule(tenant=st.sampled_from(TENANTS), tokens=charges)
    def charge(self, tenant, tokens):
        input_tokens, output_tokens = tokens
        self.counter[tenant] += (input_tokens + 3.0 * output_tokens) / self.weight[tenant]
        self.wfq.charge(tenant, input_tokens, output_tokens)

    @precondition(lambda self: self.backlogged)
    @rule(subset=st.sets(st.sampled_from(TENANTS), min_size=1))
    def select(self, subset):
        candidates = (subset & self.backlogged) or self.backlogged
        expected = min(candidates, key=lambda t: (self.counter[t], t))
        assert self.wfq.select(candidates) == expected

    @precondition(lambda self: not self.backlogged)
    @rule()
    def select_with_nobody_backlogged(self):
        with pytest.raises(ValueError):
            self.wfq.select()

    @invariant()
    def agrees_with_the_model(self):
        self.wfq.check_invariants()
        stats = self.wfq.stats()
        assert stats.backlogged == frozenset(self.backlogged)
        for tenant in TENANTS:
            assert self.wfq.counter(tenant) == self.counter[tenant]  # same float operations
            assert self.wfq.weight(tenant) == self.weight[tenant]
        virtual_time = self.wfq.virtual_time
        assert virtual_time == self.model_virtual_time()
        assert virtual_time >= self.last_virtual_time  # V never goes back
        self.last_virtual_time = virtual_time
        for tenant in self.backlogged:
            assert self.wfq.lag_tokens(tenant) >= 0


WFQMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)
TestWFQMachine = WFQMachine.TestCase
