"""`SLOAdmission`: admit a request only if it, and everything admitted, can meet its SLO."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import ClassVar

import attrs

from policies.admission.controller import AdmissionDecision
from policies.needs import Needs
from policies.slo.arrivals import TighterArrivals
from policies.slo.classes import (
    ClassGrants,
    SLOTarget,
    check_class_tables,
    resolve_class,
    validate_targets,
)
from policies.slo.decisions import SLOAdmissionStats, SLODecision, SLOVerdict
from policies.slo.fairness import ClassFairShare
from policies.slo.feasibility import edf_lateness
from policies.slo.feedback import HeadroomFeedback, PredictionFeedback
from policies.slo.ledger import PrefillLedger
from policies.slo.path import PathDelays
from policies.slo.step_room import StepRoom
from policies.slo.waits import CapacityWaits
from policies.step_model import OnlineStepTimeModel, StepTimeModel
from policies.validators import at_least, finite_non_negative, finite_positive
from policies.views import LoadSnapshot, RequestView


@attrs.define(eq=False, kw_only=True)
class SLOAdmission:
    """Admits a request only when it, and every admitted request due after it that could meet
    its first-token deadline, still can with it added, and its predicted TPOT is within its
    target and that of every class decoding; otherwise demotes it (when its class has a lower
    one in ``demotions`` that passes) or rejects it with a Retry-After.

    The first-token test is EDF's: with requests sorted as `TTFTDeadlineRanker` serves them
    (``arrival + ttft_s`` of their own class, plus a fairness lead) and ``W(r)`` the remaining
    prefill of those served no later than request ``r``, ``r`` is on time when
    ``now + W(r) / rate + step ≤ arrival + headroom · ttft_s``, at ``rate`` prefill tokens/s
    (``prefill_per_step`` tokens a step of `StepTimeModel`). It holds for every request if
    prefill is served in that order at that rate. The headroom tightens what is tested, never
    the order: a class whose headroom fell is still served after a tighter class's later
    arrivals, as the engine serves it.

    Guarantees:
        * A request of a class without a target (or with no class) is always admitted, and so
          is a request that finds the engine idle (nothing running or waiting).
        * Monotone: with more prefill work admitted ahead, or more requests running, a request
          that was rejected is still rejected, everything else equal.
        * Every rejection carries ``retry_after_s`` in ``[min_retry_after_s,
          max_retry_after_s]``: the request's predicted lateness, the time the work due before
          it needs to drain that far.
        * Pure: decisions depend only on the arguments and on what ``ledger`` has heard.

    Cost: O(n log n) per arrival, ``n`` the admitted requests with prefill left (the EDF
    test sorts them by deadline).
    """

    slos: Mapping[str, SLOTarget] = attrs.field(converter=dict, validator=validate_targets)
    """Target of each ``slo_class``."""
    ledger: PrefillLedger = attrs.field(validator=attrs.validators.instance_of(PrefillLedger))
    """The work ahead; the same object must sit in the pipeline's ``rate`` slot."""
    step_model: StepTimeModel | OnlineStepTimeModel = attrs.field(
        validator=attrs.validators.instance_of((StepTimeModel, OnlineStepTimeModel)))
    """The engine's step time: fixed, or learned from its steps (`OnlineStepTimeModel`, the
    same object in the pipeline's ``step_model`` slot, which feeds it)."""
    max_prefill_tokens_per_step: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(at_least(1)))
    """Prefill tokens per step while requests decode (the `StepPrefillBudget` bound);
    ``None``: the engine's whole token budget."""
    headroom: float = attrs.field(default=1.0, validator=finite_positive)
    """Admit when the predicted TTFT is within ``headroom`` times the target."""
    tpot_headroom: float = attrs.field(default=1.0, validator=finite_positive)
    """... and the predicted TPOT within ``tpot_headroom`` times the tightest TPOT target."""
    planning_share: Mapping[int, float] = attrs.field(factory=dict, converter=dict)
    """Priority -> the share of the prefill rate requests of that priority are planned on
    (absent: 1). Below 1 it reserves the rest for more urgent arrivals: work admitted at a
    low priority leaves them room, so they do not make it late."""
    demotions: Mapping[str, str] = attrs.field(factory=dict, converter=dict)
    """Class -> the lower class its tenant accepts instead of a rejection."""
    protected_tpot_s: Mapping[int, float] = attrs.field(factory=dict, converter=dict)
    """Priority -> a TPOT every step must stay within while a request of that priority
    decodes (on top of the decoding classes' targets): the protected tiers' TPOT."""
    length_classes: tuple[tuple[int, str], ...] = attrs.field(default=(), converter=tuple)
    """For a request whose ``slo_class`` has no target: ``(max prompt tokens, class)`` pairs,
    the first whose bound the prompt is within gives its class (e.g. ``((511, "short"),
    (2**31, "long"))``); none: the request is admitted unjudged."""
    tenant_classes: Mapping[str, str] = attrs.field(factory=dict, converter=dict)
    """Tenant -> the class of its requests whose ``slo_class`` has no target (before
    ``length_classes``)."""
    protected_classes: frozenset[str] = attrs.field(default=frozenset(), converter=frozenset)
    """Classes whose TPOT every step keeps within ``protected_headroom`` of the target while
    one of their requests decodes (a margin for the step model's error)."""
    protected_headroom: float = attrs.field(default=1.0, validator=finite_positive)
    tpot_step_bound: bool = False
    """Size each step's prefill from the TPOT targets of the classes decoding, through the
    step model (`step_prefill_tokens`), instead of ``max_prefill_tokens_per_step`` alone
    (which then is the floor): a loose TPOT lets prefill through faster, a protected one
    holds it back."""
    min_retry_after_s: float = attrs.field(default=1.0, validator=finite_non_negative)
    max_retry_after_s: float = attrs.field(default=60.0, validator=finite_non_negative)
    feedback_window: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    """Correct ``headroom``, for each class apart, from the last this many of the class's
    admitted requests' first tokens (0: off; `HeadroomFeedback`): first tokens later than
    predicted (a step model still learning, waits the model does not see) lower it, earlier
    ones (a pessimistic model) raise it."""
    min_headroom: float = attrs.field(default=0.25, validator=finite_positive)
    max_headroom: float = attrs.field(default=1.0, validator=finite_positive)
    feedback_memory_s: float | None = attrs.field(
        default=None, validator=attrs.validators.optional(finite_positive))
    """The feedback forgets errors older than this (`HeadroomFeedback.memory_s`): after a
    transient the headroom returns to what the requests admitted since then show. None:
    only ``feedback_window`` bounds them."""
    arrivals_memory_s: float | None = attrs.field(
        default=None, validator=attrs.validators.optional(finite_positive))
    """Plan for the requests still to come (`TighterArrivals`): a request is predicted to
    wait also for the prefill its tighter classes will admit ahead of it, at the rate they
    admitted over the last this many seconds. None: only admitted work is planned."""
    grants: ClassGrants | None = None
    """The classes each tenant may be judged in by length (`resolve_class`)."""
    path: PathDelays | None = attrs.field(
        default=None, validator=attrs.validators.optional(
            attrs.validators.instance_of(PathDelays)))
    """The path outside the engine step, learned online: deadlines are planned end to end
    (a first token is due ``egress_s`` before the client's deadline), a request that the
    path alone makes late is rejected even on an idle engine, and the feedback measures
    lateness where the first token leaves the server (`on_client_first_token`)."""
    fairness: ClassFairShare | None = attrs.field(
        default=None, validator=attrs.validators.optional(
            attrs.validators.instance_of(ClassFairShare)))
    """Weighted shares between the tenants of each class, fed by this policy (the same object
    as `TTFTDeadlineRanker.fairness`). A request of a tenant over its share is planned on
    `ClassFairShare.share` of the prefill rate and served `ClassFairShare.lead_s` later; one
    of a tenant under its share is tested against the work served before it only, and
    admitted requests that were over their share in its class yield to it (their share left
    it that room). None: first come, first served within a class."""

    _deadlines: dict[str, tuple[float, float, float, str]] = attrs.field(
        init=False, factory=dict, repr=False)
    """Admitted request id -> (its place in the order (`_place`), its latest acceptable
    first-token time, planning share, the class it was over its share in or "")."""
    _admitted: int = attrs.field(init=False, default=0, repr=False)
    _demoted: int = attrs.field(init=False, default=0, repr=False)
    _rejected: dict[str, int] = attrs.field(init=False, factory=dict, repr=False)
    _unclassified: int = attrs.field(init=False, default=0, repr=False)
    _pending_class: dict[str, str] = attrs.field(init=False, factory=dict, repr=False)
    _class_of: dict[str, str] = attrs.field(init=False, factory=dict, repr=False)
    """Admitted request id -> the class it is judged by (its TPOT binds while it decodes)."""
    _asked_class: dict[str, str] = attrs.field(init=False, factory=dict, repr=False)
    """Demoted request id -> the class it asked for."""
    _now: float = attrs.field(init=False, default=0.0, repr=False)
    """The latest time it was told of (for `stats`)."""
    _feedback: PredictionFeedback = attrs.field(init=False, repr=False)
    """``headroom`` corrected by first tokens, ``tpot_headroom`` by client streams."""
    _step_room: StepRoom = attrs.field(init=False, repr=False)
    """The prefill a step may carry within the TPOT bound in force (`step_prefill_tokens`)."""
    _waits: CapacityWaits = attrs.field(init=False, repr=False)
    """When KV and a slot are free for a new request (`kv_ready_s`)."""
    _arrivals: TighterArrivals | None = attrs.field(init=False, default=None, repr=False)
    """Prefill admitted per class recently, as the rate later arrivals keep."""

    needs: ClassVar[Needs] = Needs(lifecycle=True, prefix_hits=True)
    """Each arrival's prefix-cache hit is looked up (`RequestView.cached_tokens`): cached
    tokens are not prefill work."""

    def __attrs_post_init__(self) -> None:
        if self.min_retry_after_s > self.max_retry_after_s:
            raise ValueError("min_retry_after_s must be <= max_retry_after_s, got "
                             f"{self.min_retry_after_s!r} and {self.max_retry_after_s!r}")
        for priority, share in self.planning_share.items():
            if isinstance(share, bool) or not isinstance(share, int | float) or not (
                    0 < share <= 1):
                raise ValueError(f"planning_share[{priority!r}] must be in (0, 1], got "
                                 f"{share!r}")
        check_class_tables(self.slos, length_classes=self.length_classes,
                           tenant_classes=self.tenant_classes,
                           protected_classes=self.protected_classes, demotions=self.demotions)
        def feedback(headroom: float) -> HeadroomFeedback:
            return HeadroomFeedback(headroom=headroom, window=self.feedback_window,
                                    min_headroom=self.min_headroom,
                                    max_headroom=self.max_headroom,
                                    memory_s=self.feedback_memory_s)

        self._feedback = PredictionFeedback(
            ttft={cls: feedback(self.headroom) for cls in self.slos},
            tpot=feedback(self.tpot_headroom), path=self.path)
        self._step_room = StepRoom(
            step_model=self.step_model, ledger=self.ledger,
            floor_tokens=self.max_prefill_tokens_per_step,
            tpot_bound_s=self._step_tpot_bound_s)
        self._waits = CapacityWaits(
            ledger=self.ledger, step_model=self.step_model, rate_and_step=self._rate_and_step,
            finish_window_s=max(target.ttft_s for target in self.slos.values()) if (
                self.slos) else 0.0)
        if self.arrivals_memory_s is not None:
            self._arrivals = TighterArrivals(
                ttft_s={cls: target.ttft_s for cls, target in self.slos.items()},
                memory_s=self.arrivals_memory_s)
        if self.feedback_window or self.path is not None:
            self.ledger.listen(self._first_token)

    def target_class(self, request: RequestView) -> str | None:
        """The class ``request`` is judged by (`resolve_class`)."""
        return resolve_class(request, self.slos, self.tenant_classes, self.length_classes,
                             self.grants)

    def judged_class(self, request_id: str) -> tuple[str, str | None] | None:
        """``(class judged, class asked for when demoted, else None)`` of an admitted
        request, from its admission until it finishes; None when it is not judged."""
        cls = self._class_of.get(request_id)
        return None if cls is None else (cls, self._asked_class.get(request_id))

    def egress_s(self, now: float) -> float:
        """The egress delay deadlines are planned with at ``now`` (0 without ``path``)."""
        return 0.0 if self.path is None else self.path.egress_s(now)

    # -- predictions ------------------------------------------------------------

    def prefill_per_step(self, load: LoadSnapshot) -> int:
        """Prefill tokens one step carries under load (`step_prefill_tokens` at no context
        when the bound follows the TPOT targets)."""
        if self.tpot_step_bound:
            return self.step_prefill_tokens(load, 0)
        bound = self.max_prefill_tokens_per_step
        return load.token_budget if bound is None else min(bound, load.token_budget)

    def step_prefill_tokens(self, load: LoadSnapshot, context_tokens: int) -> int:
        """The most prefill tokens, after ``context_tokens`` in KV, one step may carry so that
        it stays within ``tpot_headroom`` of the tightest TPOT of the classes decoding (with
        the protected margins), on the step model; the whole token budget when nothing
        decodes; never fewer than ``max_prefill_tokens_per_step`` (`StepRoom`)."""
        return self._step_room.prefill_tokens(load, context_tokens)

    def token_cap(self, request: RequestView, load: LoadSnapshot) -> int:
        """A per-step bound for `StepPrefillBudget`'s ``bound``: `StepRoom.token_cap`."""
        return self._step_room.token_cap(request, load)

    def _rate_and_step(self, load: LoadSnapshot) -> tuple[float, float]:
        per_step = self.prefill_per_step(load)
        step_s = self.step_model.step_s(load.running_requests + 1, per_step,
                                        self.ledger.decoding_context_tokens)
        return per_step / step_s, step_s

    def _due(self, request: RequestView, cls: str, egress_s: float) -> float:
        """When the engine must produce ``request``'s first token in class ``cls``: its
        deadline at the class's headroom in force, less the egress delay."""
        return (request.arrival_s + self._feedback.ttft[cls].value * self.slos[cls].ttft_s
                - egress_s)

    def _place(self, request: RequestView, lead_s: float) -> float:
        """``request``'s place in the engine's order: `TTFTDeadlineRanker.rank_key`, by the
        class the request resolves to itself (a demoted request keeps it) plus ``lead_s``."""
        own = self.target_class(request)
        return request.arrival_s + self.slos[own].ttft_s + lead_s

    def _first_token(self, request_id: str, now: float) -> None:
        """The engine produced ``request_id``'s first token: feedback from here, or, once the
        server reports where first tokens leave (`on_client_first_token`), from there."""
        self._now = max(self._now, now)
        self._feedback.engine_first_token(request_id, now)

    def on_client_first_token(self, request_id: str, sent_s: float) -> None:
        """``request_id``'s first token left the API server at ``sent_s`` (the clock of
        ``arrival_s``): learn the egress delay and, with ``feedback_window``, how late the
        client saw it against the prediction. Ignored without ``path`` or for a request it
        does not know (never judged, or forgotten: bounded memory)."""
        if self.path is None:
            return
        self._now = max(self._now, sent_s)
        self._feedback.client_first_token(request_id, sent_s)

    def on_client_stream_end(self, request_id: str, first_s: float, last_s: float,
                             chunks: int) -> None:
        """``request_id``'s stream reached the client as ``chunks`` chunks with output from
        ``first_s`` to ``last_s``: with ``feedback_window``, learn how much slower than
        predicted tokens reached the client (the TPOT headroom in force is ``tpot_headroom``
        less the 90th percentile of that excess, as a share of the TPOT target, within
        ``[min_headroom, max_headroom]``). Ignored without ``path``, for a request it does
        not know, or for a stream of one chunk."""
        self._feedback.client_stream_end(request_id, first_s, last_s, chunks)

    def share(self, priority: int) -> float:
        """The share of the prefill rate a request of ``priority`` is planned on."""
        return self.planning_share.get(priority, 1.0)

    def _placement(self, request: RequestView, cls: str, now: float
                   ) -> tuple[float, float, str]:
        """``(share of the rate, lead, the class it is over its share in or "")`` of
        ``request`` judged in ``cls``: its priority's share, times `ClassFairShare.share`
        where its tenant is over its share (`fairness`)."""
        share = self.share(request.priority)
        if self.fairness is None or not self.fairness.over_share(request.tenant, cls, now):
            return share, 0.0, ""
        lead = self.fairness.lead_s(request.tenant, cls, now, self.slos[cls].ttft_s)
        return share * self.fairness.share(request.tenant, cls, now), lead, cls

    def kv_ready_s(self, request: RequestView, load: LoadSnapshot) -> float:
        """When the KV cache has room for ``request`` beside what is admitted
        (`CapacityWaits.kv_ready_s`)."""
        return self._waits.kv_ready_s(request, load)

    def _late(self, load: LoadSnapshot, key: float, due: float, share: float, tokens: float,
              kv_ready_s: float | None = None, yielded_in: str = "") -> tuple[float, float]:
        """`edf_lateness` of a new request at place ``key`` against the admitted ones with
        prefill left, at the prefill rate of a step under ``load`` (an unstarted admitted
        request waits for one more slot with it admitted: with every slot taken, an urgent
        arrival takes the slot a waiting request was counting on), behind the tighter
        classes' arrivals still to come (with ``arrivals_memory_s``)."""
        rate, step_s = self._rate_and_step(load)
        equivalents = self.step_model.prefill_token_equivalents
        items = sorted((*self._deadlines.get(rid, (math.inf, math.inf, 1.0, "")),
                        equivalents(work, context))
                       for rid, work, context in self.ledger.with_prefill())
        return edf_lateness(
            now=load.now, key=key, due=due, share=share, tokens=tokens, rate=rate,
            step_s=step_s, items=items,
            started=load.running_requests - len(self.ledger.decoding_ids()),
            slot_ready_s=functools.partial(self._waits.slot_ready_s, load),
            kv_ready_s=kv_ready_s, yielded_in=yielded_in,
            arriving=None if self._arrivals is None else self._arrivals.arriving(key, load.now))

    def _work(self, request: RequestView) -> float:
        """``request``'s prefill, in context-free prefill tokens (`prefill_token_equivalents`)."""
        tokens = self.ledger.prefill_tokens(request)
        return self.step_model.prefill_token_equivalents(tokens, request.prompt_tokens - tokens)

    def predict_ttft_s(self, request: RequestView, load: LoadSnapshot) -> float:
        """Seconds until ``request``'s first token if admitted now, under EDF on its share."""
        cls = self.target_class(request)
        target = self.slos[cls] if cls is not None else None
        if target is None:
            return math.inf
        due = self._due(request, cls, self.egress_s(load.now))
        share, lead, over_in = self._placement(request, cls, load.now)
        late, _ = self._late(load, self._place(request, lead), due, share, self._work(request),
                             self.kv_ready_s(request, load), "" if over_in else cls)
        return late + due - request.arrival_s

    def predict_tpot_s(self, request: RequestView, load: LoadSnapshot) -> float:
        """Seconds per output token once ``request`` decodes beside the running requests: the
        step time measured lately (`OnlineStepTimeModel.recent_step_s`, which carries the
        engine's usual prefill mix) plus what its own decode adds and what the decodes of the
        admitted requests still in prefill will add (they join the batch before it is done:
        without them, a burst of long prompts admitted together was each priced on the batch
        before the burst); with a fixed model, one step with a full prefill chunk beside
        every running request."""
        recent = getattr(self.step_model, "recent_step_s", None)
        if recent is not None:
            waiting, context = self.ledger.prefilling
            return recent + self.step_model.decode_s(request.prompt_tokens + context,
                                                     waiting + 1)
        tokens = self.ledger.prefill_tokens(request)
        backlog = self.ledger.backlog_tokens + tokens
        return self.step_model.step_s(load.running_requests + 1,
                                      min(self.prefill_per_step(load), backlog),
                                      self.ledger.decoding_context_tokens + request.prompt_tokens,
                                      request.prompt_tokens - tokens)

    def _tpot_bound_s(self, target: SLOTarget) -> float:
        """The tightest TPOT target among ``target`` and the classes decoding now."""
        return min(target.tpot_s, self._decoding_tpot_bound_s())

    def _step_tpot_bound_s(self) -> float:
        """The TPOT every step must stay within now: the tightest of the classes decoding,
        at the TPOT headroom in force (`StepRoom`)."""
        return self._feedback.tpot.value * self._decoding_tpot_bound_s()

    def _decoding_tpot_bound_s(self) -> float:
        """The tightest TPOT target of the classes decoding now (with protected margins)."""
        bound = math.inf
        classes = self._class_of
        for cls in {classes.get(rid) for rid in self.ledger.decoding_ids()}:
            other = self.slos.get(cls) if cls is not None else None
            if other is not None:
                margin = self.protected_headroom if cls in self.protected_classes else 1.0
                bound = min(bound, margin * other.tpot_s)
        if self.protected_tpot_s:
            for priority in self.ledger.decoding_priorities():
                bound = min(bound, self.protected_tpot_s.get(priority, math.inf))
        return bound

    def decide(self, request: RequestView, load: LoadSnapshot) -> SLODecision:
        """Admit, demote or reject ``request`` (no state changes: see `admit`)."""
        self._waits.hold(load)  # the ledger stands still while it decides
        try:
            return self._decide(request, load)
        finally:
            self._waits.release()

    def _decide(self, request: RequestView, load: LoadSnapshot) -> SLODecision:
        own = self.target_class(request)
        if own is None:
            return SLODecision(verdict=SLOVerdict.ADMIT, slo_class=request.slo_class,
                               ttft_s=None, tpot_s=None)
        target = self.slos[own]
        egress = self.egress_s(load.now)
        path_late = load.now - request.arrival_s + egress - target.ttft_s
        if path_late > 0:
            # The path outside the engine alone makes it late, whatever the engine does.
            retry = min(max(path_late, self.min_retry_after_s), self.max_retry_after_s)
            return SLODecision(verdict=SLOVerdict.REJECT, slo_class=own,
                               ttft_s=load.now - request.arrival_s, tpot_s=None,
                               reason="slo_ttft", retry_after_s=retry, egress_s=egress)
        if (load.running_requests == 0 and load.waiting_requests == 0
                and self.ledger.backlog_tokens == 0):
            # An idle engine: nobody else to protect, and stock vLLM would serve it; it is
            # also how a learned step model sees its first steps.
            return SLODecision(verdict=SLOVerdict.ADMIT, slo_class=own,
                               ttft_s=self.predict_ttft_s(request, load),
                               tpot_s=self.predict_tpot_s(request, load), egress_s=egress)
        tokens = self._work(request)
        kv_ready = self.kv_ready_s(request, load)
        tpot = self.predict_tpot_s(request, load)
        first = None
        for verdict, cls in ((SLOVerdict.ADMIT, own), (SLOVerdict.DEMOTE, self.demotions.get(own))):
            if cls is None:
                continue
            goal = self.slos[cls]
            due = self._due(request, cls, egress)
            share, lead, over_in = self._placement(request, cls, load.now)
            own_late, added = self._late(load, self._place(request, lead), due, share, tokens,
                                         kv_ready, "" if over_in else cls)
            ttft = own_late + due - request.arrival_s
            first = first or (ttft, own_late)
            if (own_late <= 0 and added <= 0
                    and tpot <= self._feedback.tpot.value * self._tpot_bound_s(goal)):
                return SLODecision(verdict=verdict, slo_class=cls, ttft_s=ttft, tpot_s=tpot,
                                   egress_s=egress)
        ttft, own_late = first
        reason = "slo_tpot" if tpot > self._feedback.tpot.value * self._tpot_bound_s(target) and (
            own_late <= 0) else "slo_ttft"
        retry = min(max(own_late, self.min_retry_after_s), self.max_retry_after_s)
        return SLODecision(verdict=SLOVerdict.REJECT, slo_class=own, ttft_s=ttft,
                           tpot_s=tpot, reason=reason, retry_after_s=retry, egress_s=egress)

    def admit(self, request: RequestView, load: LoadSnapshot) -> AdmissionDecision:
        """`decide`, counted, as the pipeline's admission decision.

        A DEMOTE is admitted under the lower class's deadline in the admission test, but the
        scheduler does not yet re-rank the request (it keeps its own class's key), so configure
        ``demotions`` only where that is acceptable.
        """
        self._now = max(self._now, load.now)
        if self.path is not None:
            self.path.observe_ingress(request.arrival_s, load.now)
        self._feedback.expire(load.now)
        decision = self.decide(request, load)
        if decision.verdict is SLOVerdict.REJECT:
            self._rejected[decision.reason] = self._rejected.get(decision.reason, 0) + 1
            return AdmissionDecision.reject(f"{decision.reason}:{decision.slo_class}",
                                            decision.retry_after_s)
        if decision.ttft_s is None:
            self._unclassified += 1
        elif decision.verdict is SLOVerdict.DEMOTE:
            self._demoted += 1
            self._pending_class[request.request_id] = decision.slo_class
        else:
            self._admitted += 1
        if decision.ttft_s is not None and (self.feedback_window or self.path is not None):
            target = self.slos[decision.slo_class]
            self._feedback.on_decided(request.request_id, slo_class=decision.slo_class,
                                      ttft_s=decision.ttft_s,
                                      ttft_target_s=target.ttft_s, egress_s=decision.egress_s,
                                      tpot_s=decision.tpot_s, tpot_target_s=target.tpot_s)
        return AdmissionDecision.accept()

    # -- lifecycle -----------------------------------------------------------------

    def on_admitted(self, request: RequestView, now: float) -> None:
        """Weigh the request's deadline in later tests (under its demoted class, if so)."""
        own = self.target_class(request)
        cls = self._pending_class.pop(request.request_id, None) or own
        target = self.slos[cls] if cls is not None else None
        if target is not None:
            self._class_of[request.request_id] = cls
            if self._arrivals is not None:
                self._arrivals.observe(own or cls, self._work(request), now)
            if cls != own and own is not None:
                self._asked_class[request.request_id] = own
            egress = self._feedback.on_admitted(request.request_id, request.arrival_s)
            share, lead, over_in = self._placement(request, cls, now)
            self._deadlines[request.request_id] = (self._place(request, lead),
                                                   self._due(request, cls, egress), share,
                                                   over_in)
            if self.fairness is not None:
                self.fairness.on_admitted(request.request_id, request.tenant, cls,
                                          self.ledger.prefill_tokens(request),
                                          self.ledger.expected_output_tokens(request), now)

    def on_first_scheduled(self, request: RequestView, now: float) -> None:
        pass

    def on_finished(self, request: RequestView, now: float) -> None:
        if self.fairness is not None:
            self.fairness.on_finished(request.request_id, request.output_tokens, now)
        self._deadlines.pop(request.request_id, None)
        self._pending_class.pop(request.request_id, None)
        self._class_of.pop(request.request_id, None)
        self._asked_class.pop(request.request_id, None)
        self._feedback.forget(request.request_id)

    def stats(self) -> SLOAdmissionStats:
        """A frozen snapshot (see `SLOAdmissionStats`)."""
        ttft = self._feedback.ttft
        errors = [p90 for f in ttft.values() if (p90 := f.error_p90) is not None]
        bound = self._decoding_tpot_bound_s()
        return SLOAdmissionStats(admitted=self._admitted, demoted=self._demoted,
                                 rejected=dict(self._rejected), unclassified=self._unclassified,
                                 tracked=len(self._deadlines),
                                 headroom=min((f.value for f in ttft.values()),
                                              default=self.headroom),
                                 ttft_error_p90=max(errors, default=None),
                                 class_headrooms={cls: f.value for cls, f in ttft.items()},
                                 class_late_shares={cls: share for cls, f in ttft.items()
                                                    if (share := f.late_share) is not None},
                                 path=None if self.path is None else self.path.stats(self._now),
                                 tpot_headroom=self._feedback.tpot.value,
                                 tpot_error_p90=self._feedback.tpot.error_p90,
                                 tpot_late_share=self._feedback.tpot.late_share,
                                 tpot_bound_s=None if math.isinf(bound) else bound)

    def check_invariants(self) -> None:
        """Counters are never negative; the ledger's own invariants hold."""
        assert self._admitted >= 0 and self._demoted >= 0 and self._unclassified >= 0
        assert all(v > 0 for v in self._rejected.values())
        assert set(self._asked_class) <= set(self._class_of)
        self.ledger.check_invariants()
        self._feedback.check_invariants()
        if self.fairness is not None:
            self.fairness.check_invariants()
        if self.path is not None:
            self.path.check_invariants()
        if self._arrivals is not None:
            self._arrivals.check_invariants()
