"""State machines over the real SLO objects: `SLOAdmission` with its `PrefillLedger` (and a
learned `OnlineStepTimeModel`, `PathDelays` and feedback), and `OnlineStepTimeModel` alone."""

import math

import attrs
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from policies import (
    ClassGrants,
    LoadSnapshot,
    OnlineStepTimeModel,
    PathDelays,
    PrefillLedger,
    RequestView,
    SLOAdmission,
    SLOTarget,
    StepFeatures,
    StepTimeModel,
)

PRIOR = StepTimeModel(base_s=0.02, decode_s_per_seq=2e-4, prefill_s_per_token=2e-5,
                      decode_s_per_context_token=1e-8, prefill_s_per_pair=1e-10)
SLOS = {"gold": SLOTarget(ttft_s=0.5, tpot_s=0.06), "silver": SLOTarget(ttft_s=2.0, tpot_s=0.1),
        "bronze": SLOTarget(ttft_s=10.0, tpot_s=0.3)}
MIN_RETRY_S, MAX_RETRY_S = 0.5, 20.0
TOKEN_BUDGET = 4096


class SLOAdmissionMachine(RuleBasedStateMachine):
    """Requests arrive, are decided, admitted ones are prefilled in chunks, produce a first
    token, decode and finish; engine steps feed the learned step model; clients report
    first tokens and streams. Ledger and admission stay consistent throughout."""

    def __init__(self) -> None:
        super().__init__()
        self.steps = OnlineStepTimeModel(prior=PRIOR, refit_every=4)
        self.ledger = PrefillLedger(learn_tenant_hits=False)
        self.admission = SLOAdmission(
            slos=SLOS, ledger=self.ledger, step_model=self.steps,
            max_prefill_tokens_per_step=512, tpot_step_bound=True,
            length_classes=((256, "gold"), (2**31, "bronze")),
            tenant_classes={"silver-tenant": "silver"}, demotions={"gold": "silver"},
            grants=ClassGrants(by_tenant={"a": {"gold", "silver", "bronze"}},
                               others={"silver", "bronze"}),
            protected_classes={"gold"}, protected_headroom=0.9,
            min_retry_after_s=MIN_RETRY_S, max_retry_after_s=MAX_RETRY_S,
            feedback_window=3, arrivals_memory_s=2.0,
            path=PathDelays(window=16, horizon_s=5.0, max_awaiting=8))
        self.now = 0.0
        self.counter = 0
        self.pending: dict[str, RequestView] = {}  # arrived, not yet decided
        self.prefilling: dict[str, RequestView] = {}  # admitted, prompt not fully computed
        self.decoding: dict[str, RequestView] = {}  # first token produced
        self.streams: list[str] = []  # first token produced, client not yet told

    def load(self, *, waiting: int | None = None, running: int | None = None) -> LoadSnapshot:
        return LoadSnapshot(
            now=self.now,
            waiting_requests=len(self.pending) if waiting is None else waiting,
            running_requests=len(self.prefilling) + len(self.decoding)
            if running is None else running,
            kv_usage=0.1, token_budget=TOKEN_BUDGET, kv_capacity_tokens=200_000,
            max_running_requests=16)

    @rule(dt=st.floats(0.0, 0.5))
    def tick(self, dt: float) -> None:
        self.now += dt

    @rule(prompt=st.integers(1, 3000), tenant=st.sampled_from(["a", "b", "silver-tenant"]),
          slo_class=st.sampled_from([None, "gold", "bronze", "unknown"]),
          priority=st.integers(0, 1), max_tokens=st.sampled_from([None, 16, 256]),
          lag_s=st.floats(0.0, 0.3))
    def arrive(self, prompt, tenant, slo_class, priority, max_tokens, lag_s) -> None:
        self.counter += 1
        rid = f"r{self.counter}"
        self.pending[rid] = RequestView(
            request_id=rid, arrival_s=max(self.now - lag_s, 0.0), prompt_tokens=prompt,
            tenant=tenant, slo_class=slo_class, priority=priority, max_output_tokens=max_tokens)

    @precondition(lambda self: self.pending)
    @rule(data=st.data())
    def decide(self, data) -> None:
        rid = data.draw(st.sampled_from(sorted(self.pending)))
        request = self.pending.pop(rid)
        load = self.load()
        decision = self.admission.admit(request, load)
        if decision.admitted:
            self.ledger.on_admitted(request, self.now)
            self.admission.on_admitted(request, self.now)
            self.prefilling[rid] = request
            return
        assert decision.retry_after_s is not None
        assert MIN_RETRY_S <= decision.retry_after_s <= MAX_RETRY_S
        assert not math.isnan(decision.retry_after_s)

    @precondition(lambda self: self.prefilling)
    @rule(data=st.data(), fraction=st.floats(0.05, 1.0))
    def chunk(self, data, fraction: float) -> None:
        """One prefill chunk within the admission's own cap; the one that completes the
        prompt brings the first token (the ledger tells the admission)."""
        rid = data.draw(st.sampled_from(sorted(self.prefilling)))
        request = self.prefilling[rid]
        load = self.load()
        cap = self.admission.token_cap(request, load)
        assert 1 <= cap <= TOKEN_BUDGET
        left = request.prompt_tokens - request.computed_tokens
        tokens = max(1, min(left, cap, math.ceil(fraction * left)))
        self.ledger.on_scheduled(request, tokens, self.now)
        computed = request.computed_tokens + tokens
        if computed >= request.prompt_tokens:
            del self.prefilling[rid]
            self.decoding[rid] = attrs.evolve(request, computed_tokens=computed)
            self.streams.append(rid)
        else:
            self.prefilling[rid] = attrs.evolve(request, computed_tokens=computed)

    @precondition(lambda self: self.streams)
    @rule(delay_s=st.floats(0.0, 0.2), chunks=st.integers(1, 40))
    def client_first_token(self, delay_s: float, chunks: int) -> None:
        rid = self.streams.pop(0)
        self.admission.on_client_first_token(rid, self.now + delay_s)
        self.admission.on_client_stream_end(rid, self.now + delay_s,
                                            self.now + delay_s + 0.05 * chunks, chunks)

    @precondition(lambda self: self.decoding or self.prefilling)
    @rule(data=st.data(), output=st.integers(1, 300))
    def finish(self, data, output: int) -> None:
        """A request finishes (decoded, or cancelled while still in prefill)."""
        rid = data.draw(st.sampled_from(sorted({*self.decoding, *self.prefilling})))
        request = self.decoding.pop(rid, None) or self.prefilling.pop(rid)
        done = attrs.evolve(request, output_tokens=output)
        self.ledger.on_finished(done, self.now)
        self.admission.on_finished(done, self.now)
        if rid in self.streams:
            self.streams.remove(rid)

    @rule(prefill=st.integers(0, 2048), slowdown=st.floats(0.5, 3.0))
    def step_observed(self, prefill: int, slowdown: float) -> None:
        decodes = tuple(r.prompt_tokens for r in self.decoding.values())
        features = StepFeatures.of(((prefill, 100),) if prefill else (), decodes)
        self.steps.observe(features, PRIOR.features_s(features) * slowdown)
        self.now += PRIOR.features_s(features) * slowdown

    @invariant()
    def consistent(self) -> None:
        self.ledger.check_invariants()
        self.admission.check_invariants()
        self.steps.check_invariants()
        stats = self.admission.stats()
        assert 0.25 <= stats.headroom <= 1.0 and 0.25 <= stats.tpot_headroom <= 1.0
        assert self.ledger.stats().requests_with_prefill <= len(self.prefilling)

    @invariant()
    def idle_engine_admits_a_feasible_request(self) -> None:
        """With nothing running, waiting or owed, a request whose path leaves it time is
        admitted (decided without changing state)."""
        if self.prefilling or self.decoding or self.ledger.backlog_tokens:
            return
        request = RequestView(request_id="probe", arrival_s=self.now, prompt_tokens=64,
                              tenant="a", slo_class="gold")
        if self.admission.egress_s(self.now) >= SLOS["gold"].ttft_s:
            return  # the path alone makes any gold request late
        decision = self.admission.decide(request, self.load(waiting=0, running=0))
        assert decision.verdict.value == "admit", decision


SLOAdmissionMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=60,
                                                 deadline=None)
TestSLOAdmissionMachine = SLOAdmissionMachine.TestCase


class OnlineStepTimeModelMachine(RuleBasedStateMachine):
    """Steps of any mix, including pauses and nonsense durations: coefficients stay
    non-negative, the fit refreshes exactly every ``refit_every`` learned steps, the
    observation count counts the finite, positive durations, and the recent step time is a
    running average within the range of the durations seen."""

    REFIT_EVERY = 5

    def __init__(self) -> None:
        super().__init__()
        self.model = OnlineStepTimeModel(prior=PRIOR, refit_every=self.REFIT_EVERY,
                                         window_steps=50.0, error_window=10)
        self.learned = 0
        self.low, self.high = math.inf, 0.0
        self.fit = self.model.model

    @rule(decodes=st.lists(st.integers(1, 20_000), max_size=20),
          prefills=st.lists(st.tuples(st.integers(1, 4096), st.integers(0, 30_000)),
                            max_size=4),
          noise=st.floats(0.2, 5.0))
    def observe(self, decodes, prefills, noise) -> None:
        features = StepFeatures.of(tuple(prefills), tuple(decodes))
        duration = PRIOR.features_s(features) * noise
        self.model.observe(features, duration)
        self.learned += 1
        self.low, self.high = min(self.low, duration), max(self.high, duration)
        if self.learned % self.REFIT_EVERY:
            assert self.model.model == self.fit  # stable between refits
        self.fit = self.model.model

    @rule(duration=st.sampled_from([0.0, -1.0, math.inf, math.nan]))
    def ignored(self, duration: float) -> None:
        before = (self.model.observations, self.model.model, self.model.recent_step_s)
        self.model.observe(StepFeatures.of(((10, 0),), (100,)), duration)
        assert (self.model.observations, self.model.model, self.model.recent_step_s) == before

    @invariant()
    def consistent(self) -> None:
        self.model.check_invariants()
        assert self.model.observations == self.learned
        stats = self.model.stats()
        assert stats.observations == self.learned
        if self.learned == 0:
            assert self.model.recent_step_s is None and self.model.model == PRIOR
            assert stats.relative_error_p50 is None
        else:
            recent = self.model.recent_step_s
            assert self.low * (1 - 1e-9) <= recent <= self.high * (1 + 1e-9)
            assert 0 <= stats.relative_error_p50 <= stats.relative_error_p99
        fit = self.model.model
        assert fit.prefill_s_per_token > 0
        assert self.model.step_s(4, 100, 1000) == fit.step_s(4, 100, 1000) >= 0


OnlineStepTimeModelMachine.TestCase.settings = settings(max_examples=40,
                                                        stateful_step_count=40, deadline=None)
TestOnlineStepTimeModelMachine = OnlineStepTimeModelMachine.TestCase
