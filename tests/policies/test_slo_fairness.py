"""`ClassFairShare`: weighted shares between the tenants of one SLO class."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from policies import (
    LoadSnapshot,
    PrefillLedger,
    RequestView,
    SLOAdmission,
    SLOTarget,
    StepTimeModel,
    TTFTDeadlineRanker,
)
from policies.slo.fairness import ClassFairShare


def admit(fair, request_id, tenant, tokens, now, slo_class="chat", expected=0):
    fair.on_admitted(request_id, tenant, slo_class, tokens, expected, now)


# -- validation ---------------------------------------------------------------------


@pytest.mark.parametrize("weight", [0, -1, math.inf, math.nan, True, "2"])
def test_weights_must_be_positive_numbers_naming_the_tenant(weight):
    with pytest.raises(ValueError, match=r"^weights\.team-a must be a positive number, got "):
        ClassFairShare(weights={"team-a": weight})


def test_tenant_names_and_knobs_are_validated():
    with pytest.raises(ValueError, match="weights keys must be non-empty tenant names"):
        ClassFairShare(weights={"": 1})
    with pytest.raises(ValueError, match="half_life_s must be finite and > 0"):
        ClassFairShare(half_life_s=0)
    with pytest.raises(ValueError, match="default_weight must be finite and > 0"):
        ClassFairShare(default_weight=-1)
    with pytest.raises(ValueError, match="decode_token_cost must be finite and >= 0"):
        ClassFairShare(decode_token_cost=-0.5)
    with pytest.raises(ValueError, match="must be >= 0"):
        ClassFairShare().on_admitted("r", "a", "chat", -1, 0, 0.0)


# -- who is over its share ------------------------------------------------------------


def test_a_tenant_sending_three_times_its_share_is_over_it_and_leaves_room_for_the_other():
    fair = ClassFairShare()
    for i in range(30):
        admit(fair, f"n{i}", "noisy", 100, now=i * 0.1)
        if i % 3 == 0:
            admit(fair, f"q{i}", "quiet", 100, now=i * 0.1)
    assert fair.over_share("noisy", "chat", 3.0) and not fair.over_share("quiet", "chat", 3.0)
    # planned on what quiet's quarter of the class's work leaves
    assert fair.share("noisy", "chat", 3.0) == pytest.approx(0.75, abs=0.01)
    assert fair.share("quiet", "chat", 3.0) == 1.0
    assert fair.lead_s("quiet", "chat", 3.0, max_lead_s=60.0) == 0.0
    # (3/4) / (1/2) - 1 = one half of the mean life of a charge
    lead = fair.lead_s("noisy", "chat", 3.0, max_lead_s=60.0)
    assert lead == pytest.approx(0.5 * 10.0 / math.log(2), rel=0.02)
    assert fair.lead_s("noisy", "chat", 3.0, max_lead_s=0.5) == 0.5
    stats = fair.stats()
    assert stats.shares["chat"]["noisy"] == pytest.approx(0.75, abs=0.01)
    assert stats.fair_shares["chat"] == {"noisy": 0.5, "quiet": 0.5}
    assert stats.over_share_admissions["noisy"] > 0 and "quiet" not in (
        stats.over_share_admissions)
    fair.check_invariants()


def test_weights_set_the_shares_and_other_classes_do_not_count():
    fair = ClassFairShare(weights={"team-a": 2, "team-b": 1})
    admit(fair, "a", "team-a", 200, now=0.0)
    admit(fair, "b", "team-b", 100, now=0.0)
    admit(fair, "c", "team-c", 10_000, now=0.0, slo_class="batch")
    for tenant in ("team-a", "team-b"):  # exactly at their weights: nobody is over
        assert not fair.over_share(tenant, "chat", 0.0)
        assert fair.share(tenant, "chat", 0.0) == 1.0
    admit(fair, "a2", "team-a", 1, now=0.0)
    assert fair.over_share("team-a", "chat", 0.0)
    assert fair.share("team-a", "chat", 0.0) == pytest.approx(1 - 100 / 301)
    assert fair.share("team-c", "batch", 0.0) == 1.0  # alone in its class
    # a newcomer has charged nothing: under its share, and it counts among the weights
    assert fair.share("team-d", "chat", 0.0) == 1.0
    assert fair.stats().fair_shares["chat"]["team-a"] == pytest.approx(2 / 3)


def test_a_tenant_over_its_share_is_planned_on_what_the_others_under_theirs_leave():
    fair = ClassFairShare(weights={"team-a": 1, "team-b": 3})
    admit(fair, "a", "team-a", 300, now=0.0)
    admit(fair, "b", "team-b", 700, now=0.0)  # b is under its 3/4: a gets what b leaves
    assert fair.share("team-a", "chat", 0.0) == pytest.approx(0.3)
    admit(fair, "b2", "team-b", 10_000, now=0.0)  # b over: a used little, b keeps most
    assert fair.share("team-b", "chat", 0.0) == pytest.approx(1 - 300 / 11_000)


def test_decode_is_charged_as_expected_then_as_generated():
    fair = ClassFairShare(decode_token_cost=2.0)
    admit(fair, "r", "a", 100, now=0.0, expected=50)
    assert fair.stats().charged_tokens == {"a": 200.0}
    fair.on_finished("r", 10, now=0.0)
    assert fair.stats().charged_tokens == {"a": 120.0}
    fair.on_finished("r", 10, now=0.0)  # unknown now: ignored
    fair.on_finished("never-admitted", 10, now=0.0)
    assert fair.stats().in_flight == 0
    fair.check_invariants()


def test_a_finished_request_replaces_its_expected_decode_at_its_decayed_weight():
    fair = ClassFairShare(half_life_s=1.0)
    admit(fair, "a1", "a", 0, now=0.0, expected=1000)
    admit(fair, "b1", "b", 400, now=1.0)  # a: 500 by now, b: 400
    assert fair.over_share("a", "chat", 1.0)
    fair.on_finished("a1", 0, now=1.0)  # a generated nothing: its charge is gone
    assert fair.over_share("b", "chat", 1.0) and not fair.over_share("a", "chat", 1.0)
    fair.check_invariants()


def test_old_charges_fade_with_the_half_life():
    fair = ClassFairShare(half_life_s=10.0)
    admit(fair, "a1", "a", 1000, now=0.0)  # still in flight: a stays active
    admit(fair, "b1", "b", 10, now=100.0)  # 1000 / 2**10 < 10
    assert fair.over_share("b", "chat", 100.0) and not fair.over_share("a", "chat", 100.0)


def test_a_tenant_gone_for_a_half_life_no_longer_holds_a_share():
    fair = ClassFairShare(half_life_s=5.0)
    admit(fair, "n1", "noisy", 1000, now=0.0)
    admit(fair, "q1", "quiet", 10, now=0.0)
    fair.on_finished("q1", 0, now=1.0)
    assert fair.over_share("noisy", "chat", 6.0)  # quiet left 5 s ago: still active
    assert fair.share("noisy", "chat", 6.5) == 1.0  # gone: noisy is alone again
    admit(fair, "n2", "noisy", 10, now=6.5)
    assert fair.stats().fair_shares == {"chat": {"noisy": 1.0}}
    fair.check_invariants()


# -- properties -----------------------------------------------------------------------

TENANTS = ("a", "b", "c", "d")


@settings(max_examples=60, deadline=None)
@given(weights=st.lists(st.integers(1, 4), min_size=2, max_size=4),
       rng=st.randoms(use_true_random=False))
def test_shares_converge_to_the_weights_when_charges_go_to_tenants_not_over(weights, rng):
    """Every tenant always has work (backlog); each of 400 requests served, of 50 to M = 100
    tokens at 2,000 tokens/s, goes to a tenant not over its share (which one, drawn at
    random). Shares then stay within ``[w/W - (n-1)·M/ΣD, w/W + M/ΣD]``, and ΣD grows
    towards rate × mean life, so they end within 0.1 of the weights."""
    tenants = TENANTS[:len(weights)]
    fair = ClassFairShare(weights=dict(zip(tenants, weights, strict=False)), half_life_s=5.0)
    rate_tokens_per_s, now, worst = 2000.0, 0.0, 100
    for tenant in tenants:  # a long request each keeps every tenant active
        admit(fair, f"{tenant}-session", tenant, 0, now)
    for index in range(400):
        eligible = [t for t in tenants if not fair.over_share(t, "chat", now)]
        assert eligible, "the tenant lowest per weight is never over its share"
        tenant, tokens = rng.choice(eligible), rng.randint(50, worst)
        admit(fair, f"r{index}", tenant, tokens, now)
        fair.on_finished(f"r{index}", 0, now)
        now += tokens / rate_tokens_per_s
        stats = fair.stats()
        shares, fair_shares = stats.shares["chat"], stats.fair_shares["chat"]
        total = stats.recent_tokens["chat"]
        for t in tenants:
            assert shares[t] <= fair_shares[t] + worst / total + 1e-6
            assert shares[t] >= fair_shares[t] - (len(tenants) - 1) * worst / total - 1e-6
    assert all(abs(shares[t] - fair_shares[t]) <= 0.1 for t in tenants), shares
    fair.check_invariants()


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["lone", "other", "finish"]),
                              st.integers(0, 5000), st.integers(0, 500),
                              st.floats(0, 20)), max_size=60))
def test_a_tenant_alone_in_its_class_is_never_limited(ops):
    """Whatever a lone tenant sends, and whatever others do in other classes, it is never
    over its share: planned on the whole rate, ranked on its arrival."""
    fair = ClassFairShare(half_life_s=2.0)
    now, open_ids = 0.0, []
    for index, (kind, tokens, output, dt) in enumerate(ops):
        now += dt
        if kind == "finish" and open_ids:
            fair.on_finished(open_ids.pop(0), output, now)
        else:
            tenant, cls = ("lone", "chat") if kind == "lone" else (f"t{index % 3}", "batch")
            admit(fair, f"r{index}", tenant, tokens, now, slo_class=cls, expected=output)
            open_ids.append(f"r{index}")
        assert fair.share("lone", "chat", now) == 1.0
        assert fair.lead_s("lone", "chat", now, max_lead_s=math.inf) == 0.0
        assert not fair.over_share("lone", "chat", now)
    fair.check_invariants()


class FairShareMachine(RuleBasedStateMachine):
    """Admissions and finishes across classes and tenants, against a count of what is in
    flight and of the tokens charged."""

    def __init__(self):
        super().__init__()
        self.fair = ClassFairShare(weights={"a": 3, "b": 1}, half_life_s=1.0,
                                   decode_token_cost=2.0)
        self.now = 0.0
        self.open: dict[str, tuple[str, int]] = {}
        self.charged: dict[str, float] = {}
        self.count = 0

    @rule(tenant=st.sampled_from(TENANTS), cls=st.sampled_from(["chat", "batch"]),
          prefill=st.integers(0, 1000), expected=st.integers(0, 100), dt=st.floats(0, 2))
    def admit(self, tenant, cls, prefill, expected, dt):
        self.now += dt
        self.count += 1
        request_id = f"r{self.count}"
        share = self.fair.share(tenant, cls, self.now)
        lead = self.fair.lead_s(tenant, cls, self.now, max_lead_s=5.0)
        over = self.fair.over_share(tenant, cls, self.now)
        assert 0 < share <= 1 and 0 <= lead <= 5.0 and (lead > 0) == over
        # at least its weight over every tenant's (a bound on the active ones')
        every = sum(self.fair.weight(t) for t in TENANTS)
        assert share == 1.0 if not over else share >= self.fair.weight(tenant) / every - 1e-9
        self.fair.on_admitted(request_id, tenant, cls, prefill, expected, self.now)
        self.open[request_id] = (tenant, expected)
        self.charged[tenant] = self.charged.get(tenant, 0.0) + prefill + 2.0 * expected

    @precondition(lambda self: self.open)
    @rule(data=st.data(), output=st.integers(0, 100), dt=st.floats(0, 2))
    def finish(self, data, output, dt):
        self.now += dt
        request_id = data.draw(st.sampled_from(sorted(self.open)))
        tenant, expected = self.open.pop(request_id)
        self.fair.on_finished(request_id, output, self.now)
        self.charged[tenant] += 2.0 * (output - expected)

    @invariant()
    def consistent(self):
        self.fair.check_invariants()
        stats = self.fair.stats()
        assert stats.in_flight == len(self.open)
        assert stats.charged_tokens == pytest.approx(self.charged)
        for cls, fair_shares in stats.fair_shares.items():
            assert sum(fair_shares.values()) == pytest.approx(1.0)
            assert any(not self.fair.over_share(t, cls, self.now) for t in fair_shares)


FairShareMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=40,
                                              deadline=None)
TestFairShareMachine = FairShareMachine.TestCase


# -- with SLOAdmission and TTFTDeadlineRanker -------------------------------------------

# 1,000 prefill tokens a step of 0.05 s: 20,000 prefill tokens/s, whatever runs.
MODEL = StepTimeModel(base_s=0.026, decode_s_per_seq=0.0, prefill_s_per_token=2.4e-5)
SLOS = {"chat": SLOTarget(ttft_s=0.5, tpot_s=1.0)}
LOAD = LoadSnapshot(now=0.0, waiting_requests=1, running_requests=1, kv_usage=0.1,
                    token_budget=8192)


def slo_admission(fairness):
    return SLOAdmission(slos=SLOS, ledger=PrefillLedger(), step_model=MODEL,
                        max_prefill_tokens_per_step=1000, fairness=fairness)


def arrive(admission, request_id, tenant):
    """Decide on a 1,000-token request at 0 s and, if admitted, tell the observers."""
    request = RequestView(request_id=request_id, arrival_s=0.0, prompt_tokens=1000,
                          tenant=tenant, slo_class="chat", max_output_tokens=1)
    admitted = admission.admit(request, LOAD).admitted
    if admitted:
        admission.ledger.on_admitted(request, 0.0)
        admission.on_admitted(request, 0.0)
    return admitted


@pytest.mark.parametrize("fair", [True, False])
def test_a_flood_leaves_room_for_the_share_of_a_tenant_already_there(fair):
    admission = slo_admission(ClassFairShare() if fair else None)
    assert arrive(admission, "q1", "quiet")
    noisy = sum(arrive(admission, f"n{i}", "noisy") for i in range(20))
    # alone, 9 requests fit the 0.5 s target at 20,000 tokens/s (less one step)
    # with fairness: two on the whole rate (not over quiet's share yet), then each on what
    # quiet's part of the class's work leaves (2/3, 3/4, 4/5, 5/6 of the rate)
    assert noisy == (6 if fair else 8)
    assert arrive(admission, "q2", "quiet") is fair
    if fair:  # served before the flood, which was planned with room for it
        assert arrive(admission, "q3", "quiet")
        assert admission.fairness.stats().over_share_admissions == {"noisy": 4}
    admission.check_invariants()


def test_the_ranker_serves_a_tenant_over_its_share_later_by_at_most_its_target():
    fairness = ClassFairShare()
    ranker = TTFTDeadlineRanker(slos=SLOS, fairness=fairness)
    fairness.on_admitted("q1", "quiet", "chat", 1000, 0, 0.0)
    fairness.on_admitted("n1", "noisy", "chat", 3000, 0, 0.0)

    def key(tenant):
        return ranker.rank_key(RequestView(request_id="r", arrival_s=1.0, prompt_tokens=10,
                                           tenant=tenant, slo_class="chat"))

    assert key("quiet") == 1.5 and key("noisy") == 1.5 + 0.5
    assert TTFTDeadlineRanker(slos=SLOS).rank_key(RequestView(
        request_id="r", arrival_s=1.0, prompt_tokens=10, tenant="noisy",
        slo_class="chat")) == 1.5
