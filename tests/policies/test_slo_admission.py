"""SLO-aware admission: the prefill ledger, the EDF feasibility test, TPOT bounds, demotion."""

import math

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import (
    AdmissionPolicy,
    LifecycleObserver,
    LoadSnapshot,
    PrefillLedger,
    RankingPolicy,
    RequestView,
    SLOAdmission,
    SLOTarget,
    SLOVerdict,
    StepTimeModel,
    TokenCapPolicy,
    TTFTDeadlineRanker,
)
from policies.slo import RELEASE_QUANTILES, ClassGrants, resolve_class
from policies.slo.path import PathDelays

# 1,000 prefill tokens a step of 0.05 s: 20,000 prefill tokens/s, whatever runs.
MODEL = StepTimeModel(base_s=0.026, decode_s_per_seq=0.0, prefill_s_per_token=2.4e-5)
PER_STEP = 1000
SLOS = {"gold": SLOTarget(ttft_s=0.5, tpot_s=0.06), "bronze": SLOTarget(ttft_s=10.0, tpot_s=0.2),
        "tight": SLOTarget(ttft_s=0.5, tpot_s=0.01)}


def load(now=0.0, running=0):
    return LoadSnapshot(now=now, waiting_requests=0, running_requests=running, kv_usage=0.1,
                        token_budget=8192)


def view(request_id, prompt_tokens, *, slo_class="gold", arrival_s=0.0, priority=0,
         computed_tokens=0, tenant="t"):
    return RequestView(request_id=request_id, arrival_s=arrival_s, prompt_tokens=prompt_tokens,
                       slo_class=slo_class, priority=priority, computed_tokens=computed_tokens,
                       tenant=tenant)


def policy(**kwargs):
    ledger = PrefillLedger()
    options = {"slos": SLOS, "ledger": ledger, "step_model": MODEL,
               "max_prefill_tokens_per_step": PER_STEP, **kwargs}
    return SLOAdmission(**options)


def admit_all(admission, *requests, now=0.0):
    """Admit each request as the scheduler would: the decision, then the observers."""
    decisions = []
    for request in requests:
        decision = admission.admit(request, load(now))
        decisions.append(decision)
        if decision.admitted:
            admission.ledger.on_admitted(request, now)
            admission.on_admitted(request, now)
    return decisions


def test_the_policies_fit_their_pipeline_slots():
    admission = policy()
    assert isinstance(admission, AdmissionPolicy) and isinstance(admission, LifecycleObserver)
    assert isinstance(admission.ledger, TokenCapPolicy)
    assert isinstance(admission.ledger, LifecycleObserver)
    assert isinstance(TTFTDeadlineRanker(slos=SLOS), RankingPolicy)


def test_step_time_model_is_linear_in_what_the_step_runs():
    model = StepTimeModel(base_s=0.01, decode_s_per_seq=0.001, prefill_s_per_token=1e-5,
                          decode_s_per_context_token=1e-7)
    assert model.step_s(10, 1000, 20000) == pytest.approx(0.01 + 0.01 + 0.01 + 0.002)
    assert model.prefill_tokens_per_s(0, 1000) == pytest.approx(1000 / 0.02)


def test_ledger_follows_chunks_to_decoding_and_forgets_finished_requests():
    ledger = PrefillLedger()
    rag = view("rag", 3000, slo_class="bronze")
    ledger.on_admitted(rag, 0.0)
    assert ledger.backlog_tokens == 3000 and ledger.remaining("rag") == 3000
    assert ledger.token_cap(rag, load()) is None, "the ledger never caps"
    ledger.on_scheduled(rag, 1000, 0.0)
    assert ledger.remaining("rag") == 2000
    ledger.on_scheduled(view("rag", 3000, computed_tokens=1000, slo_class="bronze"), 2000, 0.1)
    assert ledger.backlog_tokens == 0
    assert set(ledger.decoding_ids()) == {"rag"} and ledger.decoding_context_tokens == 3000
    ledger.on_finished(rag, 1.0)
    assert ledger.stats().decoding == 0 and ledger.decoding_context_tokens == 0
    ledger.check_invariants()


def test_ledger_learns_a_tenants_prefix_hit_from_a_second_chunk():
    ledger = PrefillLedger()
    first = view("a", 3000)
    ledger.on_admitted(first, 0.0)
    ledger.on_scheduled(first, 1000, 0.0)  # vLLM found 512 cached tokens: computed is 1512
    ledger.on_scheduled(view("a", 3000, computed_tokens=1512), 1488, 0.1)
    assert ledger.expected_cached_tokens("t") == 512
    second = view("b", 1000)
    ledger.on_admitted(second, 0.2)
    assert ledger.remaining("b") == 1000 - 512
    ledger.on_scheduled(second, 488, 0.2)  # one chunk covers the rest after the hit
    assert ledger.remaining("b") == 0 and ledger.stats().decoding == 2
    ledger.check_invariants()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.sampled_from(["admit", "chunk", "finish"]),
                          st.integers(1, 4000)), max_size=60))
def test_ledger_sums_always_match_their_parts(events):
    ledger = PrefillLedger()
    computed: dict[str, int] = {}
    for index, action, tokens in events:
        rid = f"r{index}"
        request = view(rid, 4000, computed_tokens=min(computed.get(rid, 0), 4000))
        if action == "admit":
            ledger.on_admitted(request, 0.0)
            computed.setdefault(rid, 0)
        elif action == "chunk" and rid in computed:
            ledger.on_scheduled(request, min(tokens, 4000 - request.computed_tokens) or 1, 0.0)
            computed[rid] = min(computed[rid] + tokens, 4000)
        elif action == "finish":
            ledger.on_finished(request, 0.0)
            computed.pop(rid, None)
        ledger.check_invariants()
        assert ledger.backlog_tokens >= 0


def test_a_request_without_a_target_is_admitted_unjudged():
    admission = policy()
    decision = admission.decide(view("x", 99999, slo_class="unknown"), load())
    assert decision.verdict is SLOVerdict.ADMIT and decision.ttft_s is None
    assert admission.admit(view("x", 99999, slo_class=None), load()).admitted
    assert admission.stats().unclassified == 1


def test_edf_admits_while_the_work_due_first_fits_before_the_deadline():
    # 20,000 prefill tokens/s and 0.05 s steps: a Gold request (0.5 s, headroom 1) fits while
    # the Gold work ahead of it plus its own stays within (0.5 - 0.05) s * 20,000 = 9,000 tokens.
    admission = policy()
    decisions = admit_all(admission, *(view(f"g{i}", 1000) for i in range(10)))
    assert [d.admitted for d in decisions] == [True] * 9 + [False]
    assert decisions[-1].reason == "slo_ttft:gold"
    assert 1.0 <= decisions[-1].retry_after_s <= 60.0
    assert admission.stats().admitted == 9 and admission.stats().rejected == {"slo_ttft": 1}
    admission.check_invariants()


def test_a_later_deadline_waits_behind_earlier_ones_and_does_not_delay_them():
    admission = policy()
    admit_all(admission, *(view(f"g{i}", 1000) for i in range(4)))
    bronze = view("b", 50000, slo_class="bronze")
    assert admission.decide(bronze, load()).ttft_s == pytest.approx((4000 + 50000) / 20000
                                                                    + 0.05)
    assert admission.admit(bronze, load()).admitted


def test_an_urgent_request_that_would_make_an_admitted_one_late_is_rejected():
    admission = policy()
    admit_all(admission, view("b", 198600, slo_class="bronze"))  # due at 10 s, done at 9.98 s
    decision = admission.decide(view("g", 1000), load())
    assert decision.verdict is SLOVerdict.REJECT, "it fits itself but would make b late"
    assert admission.decide(view("g", 10), load()).verdict is SLOVerdict.ADMIT



def test_a_headroom_tightens_deadlines_but_plans_the_order_the_engine_serves():
    # At headroom 0.5 a bronze request arriving at 0 must have its first token by 5 s and a
    # gold one arriving at 4.8 s by 5.05 s: later than bronze's. But the engine ranks them by
    # their targets (gold 5.3 s, bronze 10 s), so gold is served first and the plan says so.
    admission = policy(headroom=0.5)
    ranker = TTFTDeadlineRanker(slos=SLOS)
    bronze = view("b", 80_000, slo_class="bronze")  # 4 s of prefill: late already at 4.8 s
    assert admit_all(admission, bronze)[0].admitted
    gold = view("g", 1000, arrival_s=4.8)
    assert ranker.rank_key(gold) < ranker.rank_key(bronze)
    decision = admission.decide(gold, load(4.8))
    assert decision.verdict is SLOVerdict.ADMIT, "planned behind bronze, it would be late"
    assert decision.ttft_s == pytest.approx(1000 / 20000 + 0.05)

    # Served first, it may not make an admitted request that is on time late: bronze with
    # 2,000 tokens left is due at 5 s and done at 4.95 s; 1,500 gold tokens ahead make it 5.025.
    admission = policy(headroom=0.5)
    assert admit_all(admission, view("b", 2000, slo_class="bronze"))[0].admitted
    decision = admission.decide(view("g", 1500, arrival_s=4.8), load(4.8))
    assert decision.verdict is SLOVerdict.REJECT and decision.reason == "slo_ttft"

def test_a_planning_share_keeps_room_for_urgent_arrivals():
    shared, unshared = policy(planning_share={1: 0.5}), policy()
    for admission in (shared, unshared):
        admit_all(admission, view("b", 40000, slo_class="bronze", priority=1), view("g", 1000))
    b2 = view("b2", 60000, slo_class="bronze", priority=1)
    assert unshared.admit(b2, load()).admitted, "(101,000 tokens at 20,000/s: 5.1 s)"
    assert not shared.admit(b2, load()).admitted, "(101,000 tokens at 10,000/s: 10.15 s)"


def test_tpot_is_checked_against_the_tightest_class_decoding():
    busy = StepTimeModel(base_s=0.03, decode_s_per_seq=0.0001, prefill_s_per_token=2e-5)
    admission = policy(step_model=busy)
    assert admission.admit(view("b", 100, slo_class="bronze"), load(running=100)).admitted
    assert admission.stats().tpot_bound_s is None, "nothing decodes yet"
    tight = view("t", 100, slo_class="tight")
    admission.on_admitted(tight, 0.0)
    admission.ledger.on_scheduled(tight, 100, 0.0)  # decoding now
    decision = admission.decide(view("b2", 100, slo_class="bronze"), load(running=100))
    assert decision.verdict is SLOVerdict.REJECT and decision.reason == "slo_tpot"
    assert admission.stats().tpot_bound_s == admission.slos["tight"].tpot_s, (
        "the bound a router must predict against")


def test_protected_priorities_bound_every_admission_while_they_decode():
    busy = StepTimeModel(base_s=0.03, decode_s_per_seq=0.0001, prefill_s_per_token=2e-5)
    admission = policy(step_model=busy, protected_tpot_s={-1: 0.045})
    assert admission.admit(view("b", 100, slo_class="bronze"), load(running=150)).admitted
    admission.ledger.on_scheduled(view("vip", 100, slo_class=None, priority=-1), 100, 0.0)
    assert not admission.admit(view("b2", 100, slo_class="bronze"), load(running=150)).admitted


def test_a_tenant_that_accepts_a_lower_class_is_demoted_instead_of_rejected():
    admission = policy(demotions={"gold": "bronze"})
    admit_all(admission, *(view(f"g{i}", 1000) for i in range(9)))
    decision = admission.decide(view("g9", 1000), load())
    assert decision.verdict is SLOVerdict.DEMOTE and decision.slo_class == "bronze"
    admit_all(admission, view("g9", 1000))
    assert admission.stats().demoted == 1


def test_length_classes_judge_requests_without_a_class():
    admission = policy(length_classes=((511, "gold"), (2**31, "bronze")))
    assert admission.target_class(view("s", 300, slo_class=None)) == "gold"
    assert admission.target_class(view("l", 3000, slo_class=None)) == "bronze"
    assert admission.target_class(view("own", 300, slo_class="tight")) == "tight"


@settings(max_examples=50, deadline=None)
@given(ahead=st.lists(st.integers(1, 5000), max_size=8), extra=st.integers(1, 5000),
       prompt=st.integers(1, 6000), running=st.integers(0, 200))
def test_more_work_ahead_never_turns_a_rejection_into_an_admission(ahead, extra, prompt,
                                                                   running):
    busy = StepTimeModel(base_s=0.01, decode_s_per_seq=0.0002, prefill_s_per_token=2e-5)
    light, heavy = policy(step_model=busy), policy(step_model=busy)
    for i, tokens in enumerate(ahead):
        for admission in (light, heavy):
            request = view(f"a{i}", tokens, slo_class="bronze", arrival_s=-5.0)
            admission.ledger.on_admitted(request, 0.0)
            admission.on_admitted(request, 0.0)
    heavy.ledger.on_admitted(view("more", extra, slo_class="bronze", arrival_s=-5.0), 0.0)
    new = view("new", prompt, slo_class="gold")
    if light.decide(new, load(running=running)).verdict is not SLOVerdict.ADMIT:
        assert heavy.decide(new, load(running=running)).verdict is SLOVerdict.REJECT
        assert heavy.decide(new, load(running=running + 10)).verdict is SLOVerdict.REJECT


def test_deadline_ranker_orders_by_first_token_deadline():
    ranker = TTFTDeadlineRanker(slos=SLOS, default_ttft_s=30.0)
    bronze_early = view("b", 10, slo_class="bronze", arrival_s=0.0)
    gold_late = view("g", 10, slo_class="gold", arrival_s=5.0)
    assert ranker.rank_key(gold_late) == 5.5 < ranker.rank_key(bronze_early) == 10.0
    assert ranker.rank_key(view("n", 10, slo_class=None)) == 30.0
    assert ranker.effective_priority(gold_late, 5.0) == pytest.approx(0.5)


def test_bad_configuration_is_rejected():
    with pytest.raises(ValueError, match=r"demotions\['gold'\] = 'nope' has no target"):
        policy(demotions={"gold": "nope"})
    with pytest.raises(ValueError, match="length_classes: class 'nope'"):
        policy(length_classes=((10, "nope"),))
    with pytest.raises(ValueError, match=r"planning_share\[1\] must be in \(0, 1\]"):
        policy(planning_share={1: 0.0})
    with pytest.raises(ValueError, match="ttft_s must be finite and > 0"):
        SLOTarget(ttft_s=0.0, tpot_s=0.1)
    with pytest.raises(ValueError, match="min_retry_after_s must be <= max_retry_after_s"):
        policy(min_retry_after_s=5.0, max_retry_after_s=1.0)
    with pytest.raises(ValueError, match="slos must map class names to SLOTarget"):
        policy(slos={"gold": 0.5})
    assert math.isinf(policy().predict_ttft_s(view("x", 10, slo_class=None), load()))


def kv_load(now=0.0, running=1, capacity=10_000):
    return LoadSnapshot(now=now, waiting_requests=1, running_requests=running, kv_usage=0.5,
                        token_budget=8192, kv_capacity_tokens=capacity)


def test_a_request_waits_for_kv_until_enough_decoding_requests_finish():
    admission = policy()
    ledger = admission.ledger
    first = RequestView(request_id="a", arrival_s=0.0, prompt_tokens=6000, max_output_tokens=100,
                        slo_class="bronze")
    ledger.on_admitted(first, 0.0)
    admission.on_admitted(first, 0.0)
    assert ledger.kv_demand_tokens == 6100
    fits = RequestView(request_id="b", arrival_s=0.0, prompt_tokens=3000, max_output_tokens=100,
                       slo_class="bronze")
    assert admission.kv_ready_s(fits, kv_load()) == 0.0  # 6,100 + 3,100 <= 10,000
    big = attrs.evolve(fits, request_id="c", prompt_tokens=5000)
    step_s = MODEL.step_s(1, PER_STEP)  # 0.05 s: 20,000 prefill tokens/s
    # "a" frees its KV once its 6,000-token prefill and 100 output tokens are done
    assert admission.kv_ready_s(big, kv_load()) == pytest.approx(6000 / 20_000 + 100 * step_s)
    too_big = attrs.evolve(fits, request_id="d", prompt_tokens=20_000)
    assert admission.kv_ready_s(too_big, kv_load()) == math.inf, "more than all of it frees"
    ledger.on_scheduled(first, 6000, 0.0)  # its prefill is done: it decodes from now
    assert admission.kv_ready_s(big, kv_load()) == pytest.approx(100 * step_s)
    late = admission.decide(big, kv_load())
    assert late.ttft_s >= 100 * step_s
    ledger.on_finished(attrs.evolve(first, output_tokens=100), 1.0)
    assert ledger.kv_demand_tokens == 0 and ledger.expected_output_tokens(big) == 100
    ledger.check_invariants()


def test_with_every_slot_taken_a_request_starts_when_an_admitted_one_finishes():
    admission = policy()
    ledger = admission.ledger
    running = [RequestView(request_id=f"run{i}", arrival_s=0.0, prompt_tokens=100,
                           max_output_tokens=out, slo_class="bronze")
               for i, out in enumerate((400, 200))]
    for request in running:
        ledger.on_admitted(request, 0.0)
        admission.on_admitted(request, 0.0)
        ledger.on_scheduled(request, 100, 0.0)  # both decode from now on
    step_s = MODEL.step_s(1, PER_STEP)
    new = view("new", 100, slo_class="gold")

    def slots(max_running):
        return LoadSnapshot(now=0.0, waiting_requests=0, running_requests=2, kv_usage=0.1,
                            token_budget=8192, max_running_requests=max_running)

    free = admission.predict_ttft_s(new, slots(3))
    assert free < 0.1  # a slot is free: its prefill and one step
    # both slots taken: it starts when the shorter request ends, 200 tokens on
    full = admission.predict_ttft_s(new, slots(2))
    assert full == pytest.approx(200 * step_s + free, rel=0.05)
    assert admission.decide(new, slots(2)).verdict is SLOVerdict.REJECT  # 10 s > gold's 0.5 s
    assert admission.decide(new, slots(3)).verdict is SLOVerdict.ADMIT
    assert admission.predict_ttft_s(new, slots(None)) == free, "no slot count: none assumed"


def test_with_every_slot_taken_slots_free_no_faster_than_they_have_been_freed():
    # One short request finished early; the two running since 8.9 s are expected, from it,
    # to end within a few steps, but in 9 s only one slot was freed: the next comes later.
    admission = policy()
    ledger = admission.ledger
    early = RequestView(request_id="early", arrival_s=0.0, prompt_tokens=100, slo_class="bronze")
    ledger.on_admitted(early, 0.0)
    ledger.on_scheduled(early, 100, 0.0)
    ledger.on_finished(attrs.evolve(early, output_tokens=10), 1.0)
    for i in range(2):
        running = RequestView(request_id=f"run{i}", arrival_s=8.9, prompt_tokens=100,
                              slo_class="bronze")
        ledger.on_admitted(running, 8.9)
        admission.on_admitted(running, 8.9)
        ledger.on_scheduled(running, 100, 8.9)
    full = LoadSnapshot(now=9.0, waiting_requests=0, running_requests=2, kv_usage=0.1,
                        token_budget=8192, max_running_requests=2)
    assert ledger.finish_rate(9.0, 10.0) == pytest.approx(2 / 9.0)  # one finish, one now
    expected = ledger.kv_releases(9.0, MODEL.step_s(2, 0), 20_000)[RELEASE_QUANTILES - 1][0]
    assert expected < 9.5  # what the finished request's length alone says
    new = view("new", 100, slo_class="bronze", arrival_s=9.0)
    assert admission.predict_ttft_s(new, full) >= 9.0 / 2  # bronze's 10 s: that window
    assert ledger.finish_rate(9.0, 5.0) == pytest.approx(1 / 5.0), "the finish at 1 s is old"
    assert ledger.finish_rate(100.0, 10.0) < ledger.finish_rate(9.0, 10.0), "none: slower"


def test_an_arrival_that_would_take_the_slot_an_admitted_request_waits_for_is_rejected():
    # Both slots taken: one frees at 5 s (100 tokens left), the other at 12.8 s (the 256-token
    # prior). A bronze request (due 10 s) waits for the first; a silver one (due 6 s) fits
    # in that slot, but would push the bronze one to the second, past its deadline.
    slos = {**SLOS, "silver": SLOTarget(ttft_s=6.0, tpot_s=0.2)}
    admission = policy(slos=slos)
    ledger = admission.ledger
    for i, out in enumerate((100, 400)):
        running = RequestView(request_id=f"run{i}", arrival_s=0.0, prompt_tokens=100,
                              max_output_tokens=out, slo_class="bronze")
        ledger.on_admitted(running, 0.0)
        admission.on_admitted(running, 0.0)
        ledger.on_scheduled(running, 100, 0.0)
    full = LoadSnapshot(now=0.0, waiting_requests=0, running_requests=2, kv_usage=0.1,
                        token_budget=8192, max_running_requests=2)
    silver = view("silver", 100, slo_class="silver")
    assert admission.decide(silver, full).verdict is SLOVerdict.ADMIT
    waiting = view("waiting", 100, slo_class="bronze")
    assert admission.decide(waiting, full).verdict is SLOVerdict.ADMIT
    ledger.on_admitted(waiting, 0.0)
    admission.on_admitted(waiting, 0.0)
    assert admission.decide(silver, full).verdict is SLOVerdict.REJECT


def bronze_first_tokens(admission, late_by):
    """Admit 20 bronze requests (10 s target) at 0 s, each first token ``late_by`` seconds
    after its prediction (before it, if negative)."""
    ledger = admission.ledger
    for index in range(20):
        request = view(f"r{late_by}-{index}", 100, slo_class="bronze", arrival_s=0.0)
        decision = admission.decide(request, load())
        assert admission.admit(request, load()).admitted
        ledger.on_admitted(request, 0.0)
        admission.on_admitted(request, 0.0)
        ledger.on_scheduled(request, 100, decision.ttft_s + late_by)  # the first token
        ledger.on_finished(request, 30.0)
        admission.on_finished(request, 30.0)


def test_first_tokens_later_than_predicted_lower_the_headroom_and_earlier_ones_raise_it():
    admission = policy(feedback_window=20, headroom=0.9)
    for late_by in (2.0, -5.0):
        bronze_first_tokens(admission, late_by)
        stats = admission.stats()
        if late_by > 0:
            assert stats.ttft_error_p90 == pytest.approx(0.2)
            assert stats.headroom == stats.class_headrooms["bronze"] == pytest.approx(0.7)
        else:
            assert stats.class_headrooms["bronze"] == 1.0, "never more than the target itself"
        others = {cls: h for cls, h in stats.class_headrooms.items() if cls != "bronze"}
        assert others and set(others.values()) == {0.9}, "another class's lateness is its own"
    admission.check_invariants()


def test_each_class_reports_the_share_of_its_first_tokens_past_their_target():
    admission = policy(feedback_window=40, headroom=0.9)
    for late_by in (2.0, 12.0):  # after the prediction: within the 10 s target, then past it
        bronze_first_tokens(admission, late_by)
        stats = admission.stats()
        assert stats.class_late_shares["bronze"] == (0.0 if late_by < 10 else 0.5)
    assert "gold" not in admission.stats().class_late_shares, "nothing measured yet"
    admission.check_invariants()


def test_tenant_and_length_classes_resolve_the_same_in_ranking_and_admission():
    slos = {"chat": SLOTarget(ttft_s=0.5, tpot_s=0.1), "rag": SLOTarget(ttft_s=5.0, tpot_s=0.1)}
    ranker = TTFTDeadlineRanker(slos=slos, tenant_classes={"acme": "rag"},
                                length_classes=((1000, "chat"), (2**31, "rag")))
    admission = policy(slos=slos, tenant_classes={"acme": "rag"},
                       length_classes=((1000, "chat"), (2**31, "rag")))
    for request, cls in ((view("a", 100, slo_class=None), "chat"),
                         (view("b", 5000, slo_class=None), "rag"),
                         (view("c", 100, slo_class=None, tenant="acme"), "rag"),
                         (view("d", 5000, slo_class="chat"), "chat")):
        assert admission.target_class(request) == cls
        assert ranker.rank_key(request) == slos[cls].ttft_s
    with pytest.raises(ValueError, match="tenant_classes: class 'nope' has no target"):
        TTFTDeadlineRanker(slos=slos, tenant_classes={"acme": "nope"})


def test_an_idle_engine_admits_what_it_cannot_serve_in_time():
    slow = StepTimeModel(base_s=1.0, decode_s_per_seq=0.0, prefill_s_per_token=1.0)
    admission = policy(step_model=slow)
    assert admission.admit(view("a", 5000), load()).admitted, "idle: stock vLLM would serve it"
    admission.ledger.on_admitted(view("a", 5000), 0.0)
    assert not admission.admit(view("b", 5000), load()).admitted


def test_a_learned_model_predicts_tpot_from_the_steps_it_measured():
    from policies import OnlineStepTimeModel, StepFeatures

    learned = OnlineStepTimeModel()
    admission = policy(step_model=learned)
    request = view("a", 2000)
    before = admission.predict_tpot_s(request, load(running=8))  # the prior, full chunks
    for _ in range(500):
        learned.observe(StepFeatures(decodes=8, decode_context_tokens=8000), 0.012)
    after = admission.predict_tpot_s(request, load(running=8))
    assert after == pytest.approx(learned.recent_step_s + learned.model.decode_s(2000))
    assert after < before



def test_admitted_requests_still_in_prefill_count_in_the_batch_a_new_one_decodes_in():
    from policies import OnlineStepTimeModel, StepFeatures

    learned = OnlineStepTimeModel()
    admission = policy(step_model=learned)
    for _ in range(500):
        learned.observe(StepFeatures(decodes=8, decode_context_tokens=8000), 0.012)
    request = view("new", 2000)
    alone = admission.predict_tpot_s(request, load(running=8))
    for name in ("p1", "p2"):
        admission.ledger.on_admitted(view(name, 6000), 0.0)
    burst = admission.predict_tpot_s(request, load(running=8))
    assert burst == pytest.approx(alone + learned.model.decode_s(12_000, decodes=2))
    assert burst > alone
    admission.ledger.on_finished(view("p1", 6000), 1.0)  # leaves with its prefill undone
    assert admission.ledger.prefilling == (1, 6000)
    admission.ledger.check_invariants()

def test_the_step_bound_follows_the_tpot_of_the_classes_decoding():
    model = StepTimeModel(base_s=0.01, decode_s_per_seq=0.0, prefill_s_per_token=1e-5,
                          prefill_s_per_pair=1e-9)
    admission = policy(step_model=model, tpot_step_bound=True, max_prefill_tokens_per_step=256,
                       tpot_headroom=1.0)
    assert admission.step_prefill_tokens(load(running=1), 0) == 8192, "nothing decodes"
    for rid, cls in (("b", "bronze"), ("g", "gold")):
        request = view(rid, 100, slo_class=cls)
        admission.on_admitted(request, 0.0)
        admission.ledger.on_admitted(request, 0.0)
        admission.ledger.on_scheduled(request, 100, 0.0)  # decoding now
        step = load(running=1)
        tokens = admission.step_prefill_tokens(step, 0)
        room = SLOS[cls].tpot_s - model.step_s(1, 0, admission.ledger.decoding_context_tokens)
        assert model.step_s(1, tokens, admission.ledger.decoding_context_tokens) <= (
            SLOS[cls].tpot_s + 1e-9)
        assert tokens == min(8192, int(room / 1e-5)) or tokens < room / 1e-5
        deep = admission.step_prefill_tokens(step, 20_000)
        assert 256 <= deep < tokens, "a chunk deep in a context costs more per token"
    tight = view("t", 100, slo_class="tight")  # 10 ms: no room beside a 10 ms base
    admission.on_admitted(tight, 0.0)
    admission.ledger.on_admitted(tight, 0.0)
    admission.ledger.on_scheduled(tight, 100, 0.0)
    assert admission.step_prefill_tokens(load(running=1), 0) == 256, "the floor"


def test_a_steps_chunks_share_its_room_each_priced_at_its_own_context():
    from policies import StepPrefillBudget

    model = StepTimeModel(base_s=0.01, decode_s_per_seq=0.0, prefill_s_per_token=1e-5,
                          prefill_s_per_pair=1e-9)
    admission = policy(step_model=model, tpot_step_bound=True, max_prefill_tokens_per_step=64,
                       tpot_headroom=1.0)
    budget = StepPrefillBudget(max_prefill_tokens=64, interactive_prompt_tokens=0,
                               bound=admission)
    gold = view("g", 100, slo_class="gold")
    for policy_ in (admission, admission.ledger, budget):
        policy_.on_admitted(gold, 0.0)
    for policy_ in (admission.ledger, budget):
        policy_.on_scheduled(gold, 100, 0.0)  # decoding: the 50 ms Gold TPOT binds
    room = SLOS["gold"].tpot_s - model.step_s(1, 0, 100)
    step = load(running=1)
    deep = view("deep", 60_000, computed_tokens=30_000)  # a chunk after 30k tokens first,
    short = view("short", 30_000)  # then one at the start of a prompt
    grants = []
    for request in (deep, short):
        cap = budget.token_cap(request, step)
        grants.append((min(cap, request.prompt_tokens - request.computed_tokens),
                       request.computed_tokens))
    spent = sum(model.prefill_s_per_token * tokens
                + model.prefill_s_per_pair * tokens * (context + (tokens + 1) / 2)
                for tokens, context in grants)
    assert grants[0][0] > 64 and spent <= room + 1e-9  # counted in tokens, the short chunk
    # would have got the whole room's tokens at context 0 less the deep chunk's: over it


# -- end-to-end deadlines: the path outside the engine step ----------------------------------


def first_token_cycle(admission, request, *, engine_late_s, egress_s):
    """Admit ``request`` at its arrival, produce its first token ``engine_late_s`` after the
    engine's prediction and report it leaving the server ``egress_s`` later."""
    decision = admission.decide(request, load(request.arrival_s))
    assert admission.admit(request, load(request.arrival_s)).admitted
    admission.ledger.on_admitted(request, request.arrival_s)
    admission.on_admitted(request, request.arrival_s)
    produced = request.arrival_s + decision.ttft_s + engine_late_s
    admission.ledger.on_scheduled(request, request.prompt_tokens, produced)
    admission.ledger.on_finished(request, produced + 0.1)
    admission.on_finished(request, produced + 0.1)
    admission.on_client_first_token(request.request_id, produced + egress_s)
    return decision


def test_deadlines_are_planned_with_the_learned_egress_delay():
    admission = policy(path=PathDelays(), feedback_window=20)
    for index in range(20):  # first tokens leave the server 0.2 s after the engine made them
        first_token_cycle(admission, view(f"r{index}", 100, arrival_s=index * 1.0),
                          engine_late_s=0.0, egress_s=0.2)
    now = 19.5
    assert admission.egress_s(now) == pytest.approx(0.2)
    assert admission.stats().path.egress_s == pytest.approx(0.2)
    # Work ahead that fit a 0.5 s deadline at the engine no longer fits one 0.2 s earlier:
    # 9,000 tokens fit (0.5 - 0.05) s at 20,000 tokens/s; 0.3 s fits only 5,000.
    ahead = [view(f"a{i}", 1000, arrival_s=now) for i in range(5)]
    decisions = admit_all(admission, *ahead, view("late", 1000, arrival_s=now), now=now)
    assert [d.admitted for d in decisions[:4]] == [True] * 4
    assert not decisions[-1].admitted
    admission.check_invariants()


def test_lateness_the_client_sees_lowers_the_headroom_past_the_old_floor():
    admission = policy(path=PathDelays(horizon_s=1.0), feedback_window=20, headroom=0.9,
                       min_headroom=0.05)
    for index in range(20):  # on time at the engine, 1 s late at the client (0.5 s target)
        first_token_cycle(admission, view(f"r{index}", 100, arrival_s=index * 10.0),
                          engine_late_s=0.0, egress_s=1.0)
    # each egress sample was forgotten (1 s horizon) before the next request: only the
    # feedback knew the client's lateness, and it holds admission to what is well on time
    stats = admission.stats()
    assert stats.ttft_error_p90 == pytest.approx(2.0)
    assert stats.headroom == 0.05, "far below the floor of 0.25 that still admitted late"
    admission.ledger.on_admitted(view("busy", 1000, arrival_s=300.0), 300.0)
    assert not admission.admit(view("next", 1000, arrival_s=300.0), load(300.0)).admitted


def test_a_request_the_path_alone_makes_late_is_rejected_even_on_an_idle_engine():
    path = PathDelays()
    admission = policy(path=path)
    path.engine_first_token("old", 9.0)
    path.client_first_token("old", 9.4)  # 0.4 s of egress
    request = view("r", 100, arrival_s=9.8)  # reached the engine 0.2 s after arrival
    decision = admission.decide(request, load(10.0))
    assert decision.verdict is SLOVerdict.REJECT and decision.reason == "slo_ttft"
    assert decision.retry_after_s == 1.0
    assert admission.admit(view("s", 100, arrival_s=10.0), load(10.0)).admitted, (
        "0.4 s of egress still leaves a 0.5 s target room on an idle engine")


def test_without_client_reports_feedback_comes_from_the_engine_as_before():
    with_path = policy(path=PathDelays(), feedback_window=20, headroom=0.9)
    without = policy(feedback_window=20, headroom=0.9)
    for admission in (with_path, without):
        for index in range(20):
            request = view(f"r{index}", 100, slo_class="bronze")
            decision = admission.decide(request, load())
            assert admission.admit(request, load()).admitted
            admission.ledger.on_admitted(request, 0.0)
            admission.on_admitted(request, 0.0)
            admission.ledger.on_scheduled(request, 100, decision.ttft_s + 2.0)
    assert with_path.stats().headroom == without.stats().headroom == pytest.approx(0.7)
    assert with_path.stats().path.ingress_samples == 20


def test_judged_class_names_the_class_asked_for_when_demoted():
    admission = policy(demotions={"gold": "bronze"})
    admit_all(admission, *(view(f"g{i}", 1000) for i in range(10)))
    assert admission.judged_class("g0") == ("gold", None)
    assert admission.judged_class("g9") == ("bronze", "gold")
    assert admission.judged_class("nobody") is None
    admission.on_finished(view("g9", 1000), 1.0)
    assert admission.judged_class("g9") is None
    admission.check_invariants()


def test_rejections_name_the_class_they_were_judged_in():
    admission = policy()
    decisions = admit_all(admission, *(view(f"g{i}", 1000) for i in range(10)))
    assert decisions[-1].reason == "slo_ttft:gold"


def test_a_length_class_a_tenant_is_not_granted_gives_way_to_the_next_looser_one():
    slos = {"chat": SLOTarget(ttft_s=0.5, tpot_s=0.1), "rag": SLOTarget(ttft_s=2.0, tpot_s=0.1),
            "batch": SLOTarget(ttft_s=20.0, tpot_s=0.2)}
    grants = ClassGrants(by_tenant={"acme": {"chat", "rag", "batch"}},
                         others={"batch", "rag"})
    lengths = ((511, "chat"), (2**31, "rag"))
    ranker = TTFTDeadlineRanker(slos=slos, length_classes=lengths, grants=grants)
    admission = policy(slos=slos, length_classes=lengths, grants=grants)
    for request, cls in ((view("a", 100, slo_class=None, tenant="acme"), "chat"),
                         (view("b", 100, slo_class=None, tenant="default"), "rag"),
                         (view("c", 5000, slo_class=None, tenant="default"), "rag")):
        assert admission.target_class(request) == cls
        assert ranker.rank_key(request) == slos[cls].ttft_s
    nothing = ClassGrants(others=set())
    assert resolve_class(view("d", 100, slo_class=None), slos, {}, lengths, nothing) is None


def test_streams_slower_at_the_client_than_predicted_lower_the_tpot_headroom():
    admission = policy(path=PathDelays(), feedback_window=20, tpot_headroom=0.9)
    predicted = []
    for index in range(20):
        request = view(f"r{index}", 100, arrival_s=index * 10.0)
        predicted.append(first_token_cycle(admission, request, engine_late_s=0.0,
                                           egress_s=0.0).tpot_s)
        first = index * 10.0 + 1.0
        # 11 chunks, each 0.03 s (half the 0.06 s gold target) slower than predicted
        admission.on_client_stream_end(f"r{index}", first,
                                       first + 10 * (predicted[-1] + 0.03), 11)
    stats = admission.stats()
    assert stats.tpot_error_p90 == pytest.approx(0.5)
    assert stats.tpot_headroom == pytest.approx(0.4)
    assert stats.tpot_late_share == 0.0, "slower than predicted, still within the target"
    assert admission.stats().headroom == 1.0, "first tokens were on time"
    busy = view("busy", 100, arrival_s=300.0)
    admission.ledger.on_admitted(busy, 300.0)  # not idle: the TPOT test applies
    decision = admission.decide(view("next", 100, arrival_s=300.0), load(300.0, running=1))
    assert decision.tpot_s <= 0.9 * 0.06, "within the configured headroom..."
    assert decision.verdict is SLOVerdict.REJECT and decision.reason == "slo_tpot", (
        "...but not within what the clients measured")
    admission.on_client_stream_end("r0", 0.0, 100.0, 11)  # reported twice: ignored
    assert admission.stats().tpot_error_p90 == pytest.approx(0.5)
    admission.check_invariants()


def test_the_share_of_streams_slower_than_their_target_is_reported():
    admission = policy(path=PathDelays(), feedback_window=20, tpot_headroom=0.9)
    for index in range(8):
        request = view(f"r{index}", 100, arrival_s=index * 10.0)
        first_token_cycle(admission, request, engine_late_s=0.0, egress_s=0.0)
        tpot = 0.07 if index % 4 == 0 else 0.05  # a quarter past the 0.06 s gold target
        first = index * 10.0 + 1.0
        admission.on_client_stream_end(f"r{index}", first, first + 10 * tpot, 11)
    assert admission.stats().tpot_late_share == 0.25


def test_without_stream_reports_the_tpot_headroom_is_the_configured_one():
    admission = policy(path=PathDelays(), feedback_window=20, tpot_headroom=0.9)
    for index in range(20):
        first_token_cycle(admission, view(f"r{index}", 100, arrival_s=index * 10.0),
                          engine_late_s=0.0, egress_s=0.0)
    stats = admission.stats()
    assert stats.tpot_headroom == 0.9 and stats.tpot_error_p90 is stats.tpot_late_share is None


def test_a_loose_request_is_planned_behind_the_tight_requests_still_to_come():
    # Gold admitted 19,000 prefill tokens a second over the last 10 s, 95 % of the engine's
    # 20,000. A bronze request arriving at 10 s waits for the gold requests arriving while it
    # waits (they rank ahead of it for 9.5 s): its first token at T = 0.05 + (1,000 +
    # 19,000 T) / 20,000, T = 2 s, where the admitted work alone says 0.1 s.
    planned, unplanned = policy(arrivals_memory_s=10.0), policy()
    for admission in (planned, unplanned):
        for k in range(190):
            gold = view(f"g{k}", 1000, arrival_s=0.05 + k / 19)
            assert admit_all(admission, gold, now=gold.arrival_s)[0].admitted
            admission.ledger.on_finished(gold, gold.arrival_s)
            admission.on_finished(gold, gold.arrival_s)
    bronze = view("b", 1000, slo_class="bronze", arrival_s=10.0)
    assert unplanned.decide(bronze, load(10.0)).ttft_s == pytest.approx(1000 / 20000 + 0.05)
    assert planned.decide(bronze, load(10.0)).ttft_s == pytest.approx(2.0, abs=2e-3)
    # A gold request is served before every later gold request: nothing more to plan for.
    gold = view("g", 1000, arrival_s=10.0)
    assert planned.decide(gold, load(10.0)).ttft_s == pytest.approx(1000 / 20000 + 0.05)
    planned.check_invariants()
