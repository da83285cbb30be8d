"""SLO-aware admission: admit a request only if it, and everything admitted, can meet its SLO.

Three pieces, used together (`slo_pipeline` in the business case shows the composition):

* `TTFTDeadlineRanker` (the ``ranking`` slot) orders requests by their first-token deadline,
  ``arrival + ttft_s`` of their SLO class: prefill is served earliest deadline first (EDF).
* `PrefillLedger` (in the ``rate`` slot, beside other caps in `TokenCaps`) is a token-cap
  policy that never caps: it hears every prefill chunk the scheduler grants and keeps each
  admitted request's remaining prefill tokens, and the requests decoding.
* `SLOAdmission` (the ``admission`` slot) decides on arrival. With EDF on one server, a set
  of requests meets its deadlines if and only if, for every request, the prefill work due no
  later than it is done by its deadline; `SLOAdmission` admits a request when that test still
  passes with it added (for it, and for every admitted request due after it that passed
  before), with the prefill rate of `StepTimeModel` at the step's prefill bound. Its TPOT is
  predicted as one step, ``step_s(running + 1, prefill per step, decoding context)``, and
  checked against its own target and the tightest among the requests decoding now, so a
  loose class is never admitted into a batch that would break a tight one.

A request that fails is rejected at once (reason ``slo_ttft`` or ``slo_tpot``, with a
Retry-After; over HTTP a 503), or, where its class names a lower one in ``demotions`` (the
tenant accepts it), admitted under that class if that class's targets pass. Admitting work
that will miss its SLO spends capacity on a request the client has given up on; rejecting it
early tells the client to retry elsewhere while the answer is still useful.

The predictions are model-based: calibrate `StepTimeModel` to the engine (in the replay,
`benchmarks.replay.step_time.fit_step_time_model`; on a GPU, from vLLM's step log) and
tune ``headroom``. The prefill bound should be the one the pipeline enforces
(`StepPrefillBudget.max_prefill_tokens`), so that steps, and so TPOT, are predictable.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping

import attrs

from policies.admission import AdmissionDecision
from policies.validators import at_least, finite_non_negative, finite_positive
from policies.views import LoadSnapshot, RequestView


@attrs.frozen(kw_only=True)
class SLOTarget:
    """A class's latency targets: first token within ``ttft_s``, then ``tpot_s`` a token."""

    ttft_s: float = attrs.field(validator=finite_positive)
    tpot_s: float = attrs.field(validator=finite_positive)


@attrs.frozen(kw_only=True)
class StepTimeModel:
    """An engine step's duration, linear in what it runs: ``base_s + decode_s_per_seq · decodes
    + decode_s_per_context_token · their context tokens + prefill_s_per_token · prefill
    tokens`` (fit it over the batch sizes that matter)."""

    base_s: float = attrs.field(validator=finite_non_negative)
    decode_s_per_seq: float = attrs.field(validator=finite_non_negative)
    prefill_s_per_token: float = attrs.field(validator=finite_positive)
    decode_s_per_context_token: float = attrs.field(default=0.0, validator=finite_non_negative)

    def step_s(self, decodes: int, prefill_tokens: int, context_tokens: int = 0) -> float:
        """Seconds one step with ``decodes`` decoding sequences holding ``context_tokens`` in
        all and ``prefill_tokens`` prefill tokens takes."""
        return (self.base_s + self.decode_s_per_seq * decodes
                + self.decode_s_per_context_token * context_tokens
                + self.prefill_s_per_token * prefill_tokens)

    def prefill_tokens_per_s(self, decodes: int, prefill_tokens_per_step: int,
                             context_tokens: int = 0) -> float:
        """Prefill throughput when every step carries ``prefill_tokens_per_step`` beside
        ``decodes`` decoding sequences of ``context_tokens`` in all."""
        return prefill_tokens_per_step / self.step_s(decodes, prefill_tokens_per_step,
                                                     context_tokens)


@attrs.frozen(kw_only=True)
class PrefillLedgerStats:
    """A snapshot of a `PrefillLedger`."""

    requests_with_prefill: int
    """Admitted requests with prefill tokens left (by the ledger's estimate)."""
    backlog_tokens: int
    """Their remaining prefill tokens."""
    decoding: int
    """Admitted requests whose prefill is done and that have not finished."""
    decoding_context_tokens: int
    """The prompt tokens of the requests decoding."""


@attrs.define(eq=False, kw_only=True)
class PrefillLedger:
    """Each admitted request's remaining prefill tokens, and the requests decoding.

    A token-cap policy that never caps (`token_cap` returns ``None``): put it in the ``rate``
    slot, with `TokenCaps` beside other caps, so it hears every prefill chunk. A request enters
    with its whole prompt (less its tenant's learned prefix-cache hit) on admission, starts
    decoding when a chunk completes its prompt and leaves when it finishes. The scheduler's
    view of a request starting this step does not show its prefix-cache hit yet, so the
    ledger learns each tenant's hit from its requests that take more than one chunk (the
    second chunk's view shows what the first really covered) and assumes it for the others;
    a request wrongly taken as done is put back by its next chunk.

    Guarantee: ``backlog_tokens`` is always the sum of the requests' remaining tokens, and the
    decoding context the sum of the decoding requests' prompts (`check_invariants`). O(1) per
    event.
    """

    _entries: dict[str, list] = attrs.field(init=False, factory=dict, repr=False)
    """request id -> [tenant, remaining, chunks seen, tokens granted]"""
    _backlog: int = attrs.field(init=False, default=0, repr=False)
    _decoding: dict[str, tuple[str | None, int, int]] = attrs.field(init=False, factory=dict,
                                                                     repr=False)
    """request id -> (slo_class, prompt tokens, priority) of admitted requests with their
    prefill done"""
    _decoding_context: int = attrs.field(init=False, default=0, repr=False)
    _cached: dict[str, int] = attrs.field(init=False, factory=dict, repr=False)

    def expected_cached_tokens(self, tenant: str) -> int:
        """The prefix-cache hit the ledger has learned for ``tenant``'s requests (0 at first)."""
        return self._cached.get(tenant, 0)

    def _set(self, request: RequestView, remaining: int, chunks: int, granted: int) -> None:
        entry = self._entries.pop(request.request_id, None)
        if entry is not None:
            self._backlog -= entry[1]
        if remaining <= 0:
            if request.request_id not in self._decoding:
                self._decoding[request.request_id] = (request.slo_class, request.prompt_tokens,
                                                      request.priority)
                self._decoding_context += request.prompt_tokens
            return
        self._stop_decoding(request.request_id)
        self._entries[request.request_id] = [request.tenant, remaining, chunks, granted]
        self._backlog += remaining

    def _stop_decoding(self, request_id: str) -> None:
        entry = self._decoding.pop(request_id, None)
        if entry is not None:
            self._decoding_context -= entry[1]

    # -- token-cap policy -------------------------------------------------------

    def token_cap(self, request: RequestView, load: LoadSnapshot) -> None:
        """Never caps."""
        return None

    def on_scheduled(self, request: RequestView, tokens: int, now: float) -> None:
        """A prefill chunk of ``tokens`` after ``request.computed_tokens``."""
        entry = self._entries.get(request.request_id)
        chunks, granted = (entry[2], entry[3]) if entry is not None else (0, 0)
        if chunks == 1 and request.computed_tokens > granted:  # the first chunk's hit, revealed
            self._cached[request.tenant] = request.computed_tokens - granted
        assumed = self.expected_cached_tokens(request.tenant) if chunks == 0 else 0
        remaining = request.prompt_tokens - request.computed_tokens - tokens - assumed
        self._set(request, remaining, chunks + 1, granted + tokens)

    # -- lifecycle -----------------------------------------------------------------

    def on_admitted(self, request: RequestView, now: float) -> None:
        """Count the request's prompt, less its tenant's learned hit (repeats change nothing)."""
        if request.request_id in self._entries or request.request_id in self._decoding:
            return
        self._set(request, self.prefill_tokens(request), 0, 0)

    def on_first_scheduled(self, request: RequestView, now: float) -> None:
        pass

    def on_finished(self, request: RequestView, now: float) -> None:
        """Forget the request."""
        entry = self._entries.pop(request.request_id, None)
        if entry is not None:
            self._backlog -= entry[1]
        self._stop_decoding(request.request_id)

    # -- reading ---------------------------------------------------------------

    def prefill_tokens(self, request: RequestView) -> int:
        """Prefill tokens a new ``request`` needs: its prompt less the expected hit (>= 1)."""
        hit = max(request.cached_tokens, self.expected_cached_tokens(request.tenant))
        return max(request.prompt_tokens - request.computed_tokens - hit, 1)

    def remaining(self, request_id: str) -> int:
        """Prefill tokens ``request_id`` has left (0 when done or unknown)."""
        entry = self._entries.get(request_id)
        return 0 if entry is None else entry[1]

    def with_prefill(self) -> list[tuple[str, int]]:
        """``(request id, remaining prefill tokens)`` of every request with some left."""
        return [(rid, entry[1]) for rid, entry in self._entries.items()]

    @property
    def backlog_tokens(self) -> int:
        """All remaining prefill tokens."""
        return self._backlog

    def decoding_classes(self) -> set[str | None]:
        """The SLO classes of the requests decoding now."""
        return {cls for cls, _, _ in self._decoding.values()}

    def decoding_priorities(self) -> set[int]:
        """The priorities of the requests decoding now."""
        return {priority for _, _, priority in self._decoding.values()}

    @property
    def decoding_context_tokens(self) -> int:
        """The prompt tokens of the requests decoding now (their context, less output)."""
        return self._decoding_context

    def stats(self) -> PrefillLedgerStats:
        """A frozen snapshot (see `PrefillLedgerStats`)."""
        return PrefillLedgerStats(requests_with_prefill=len(self._entries),
                                  backlog_tokens=self._backlog, decoding=len(self._decoding),
                                  decoding_context_tokens=self._decoding_context)

    def check_invariants(self) -> None:
        """Sums match their parts; nothing negative; no request both prefilling and decoding."""
        assert all(entry[1] > 0 for entry in self._entries.values())
        assert self._backlog == sum(entry[1] for entry in self._entries.values())
        assert not set(self._entries) & set(self._decoding)
        assert self._decoding_context == sum(p for _, p, _ in self._decoding.values())
        assert all(v >= 0 for v in self._cached.values())


def _targets(_instance: object, attribute: attrs.Attribute, value: Mapping) -> None:
    for cls, target in value.items():
        if not isinstance(cls, str) or not isinstance(target, SLOTarget):
            raise ValueError(f"{attribute.name} must map class names to SLOTarget, got "
                             f"{cls!r}: {target!r}")


@attrs.frozen(kw_only=True)
class TTFTDeadlineRanker:
    """Earliest first-token deadline first: ``rank_key = arrival_s + ttft_s`` of the request's
    class (``default_ttft_s`` for a class with no target).

    Guarantees: the key is fixed on arrival; among requests of one class, earlier arrivals go
    first; a request is never overtaken by one whose deadline is later, so none waits behind
    later arrivals for longer than the widest gap between two classes' targets.
    ``effective_priority`` is the time left to the deadline, ``rank_key - now``.
    """

    slos: Mapping[str, SLOTarget] = attrs.field(converter=dict, validator=_targets)
    default_ttft_s: float = attrs.field(default=60.0, validator=finite_positive)

    def ttft_s(self, slo_class: str | None) -> float:
        """The first-token target of ``slo_class``."""
        target = self.slos.get(slo_class) if slo_class is not None else None
        return self.default_ttft_s if target is None else target.ttft_s

    def rank_key(self, request: RequestView) -> float:
        return request.arrival_s + self.ttft_s(request.slo_class)

    def effective_priority(self, request: RequestView, now: float) -> float:
        return self.rank_key(request) - now


class SLOVerdict(enum.Enum):
    """What `SLOAdmission.decide` concluded."""

    ADMIT = "admit"
    DEMOTE = "demote"
    """Admit under the tenant's lower class (`SLODecision.slo_class`)."""
    REJECT = "reject"


@attrs.frozen(kw_only=True)
class SLODecision:
    """`SLOAdmission`'s decision and the predictions it rests on."""

    verdict: SLOVerdict
    slo_class: str | None
    """The class the request is admitted under (its own, or the lower one for DEMOTE)."""
    ttft_s: float | None
    """Predicted time to first token under EDF (None: the request has no known class)."""
    tpot_s: float | None
    """Predicted time per output token."""
    reason: str = ""
    """``slo_ttft`` or ``slo_tpot`` for a rejection."""
    retry_after_s: float | None = None


@attrs.frozen(kw_only=True)
class SLOAdmissionStats:
    """A snapshot of an `SLOAdmission`."""

    admitted: int
    demoted: int
    rejected: dict[str, int]
    """Rejections by reason (``slo_ttft``, ``slo_tpot``)."""
    unclassified: int
    """Requests admitted without a prediction: no class, or a class with no target."""
    tracked: int
    """Admitted requests whose deadline the admission test still weighs."""


@attrs.define(eq=False, kw_only=True)
class SLOAdmission:
    """Admits a request only when it, and every admitted request due after it that could meet
    its first-token deadline, still can with it added, and its predicted TPOT is within its
    target and that of every class decoding; otherwise demotes it (when its class has a lower
    one in ``demotions`` that passes) or rejects it with a Retry-After.

    The first-token test is EDF's: with requests sorted by deadline ``d`` and ``W(d)`` the
    remaining prefill of those due no later, request ``d`` is on time when
    ``now + W(d) / rate + step ≤ arrival + headroom · ttft_s``, at ``rate`` prefill tokens/s
    (``prefill_per_step`` tokens a step of `StepTimeModel`). It holds for every request if
    prefill is served earliest deadline first (`TTFTDeadlineRanker`) at that rate.

    Guarantees:
        * A request of a class without a target (or with no class) is always admitted.
        * Monotone: with more prefill work admitted ahead, or more requests running, a request
          that was rejected is still rejected, everything else equal.
        * Every rejection carries ``retry_after_s`` in ``[min_retry_after_s,
          max_retry_after_s]``: the request's predicted lateness, the time the work due before
          it needs to drain that far.
        * Pure: decisions depend only on the arguments and on what ``ledger`` has heard.

    Cost: O(n log n) per arrival, ``n`` the admitted requests with prefill left (the EDF
    test sorts them by deadline).
    """

    slos: Mapping[str, SLOTarget] = attrs.field(converter=dict, validator=_targets)
    """Target of each ``slo_class``."""
    ledger: PrefillLedger = attrs.field(validator=attrs.validators.instance_of(PrefillLedger))
    """The work ahead; the same object must sit in the pipeline's ``rate`` slot."""
    step_model: StepTimeModel = attrs.field(
        validator=attrs.validators.instance_of(StepTimeModel))
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
    min_retry_after_s: float = attrs.field(default=1.0, validator=finite_non_negative)
    max_retry_after_s: float = attrs.field(default=60.0, validator=finite_non_negative)

    _deadlines: dict[str, tuple[float, float]] = attrs.field(init=False, factory=dict,
                                                              repr=False)
    """Admitted request id -> (latest acceptable first-token time, planning share)."""
    _admitted: int = attrs.field(init=False, default=0, repr=False)
    _demoted: int = attrs.field(init=False, default=0, repr=False)
    _rejected: dict[str, int] = attrs.field(init=False, factory=dict, repr=False)
    _unclassified: int = attrs.field(init=False, default=0, repr=False)
    _pending_class: dict[str, str] = attrs.field(init=False, factory=dict, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.min_retry_after_s > self.max_retry_after_s:
            raise ValueError("min_retry_after_s must be <= max_retry_after_s, got "
                             f"{self.min_retry_after_s!r} and {self.max_retry_after_s!r}")
        for priority, share in self.planning_share.items():
            if isinstance(share, bool) or not isinstance(share, int | float) or not (
                    0 < share <= 1):
                raise ValueError(f"planning_share[{priority!r}] must be in (0, 1], got "
                                 f"{share!r}")
        for bound, cls in self.length_classes:
            if cls not in self.slos:
                raise ValueError(f"length_classes: class {cls!r} (prompts up to {bound}) has "
                                 "no target in slos")
        for cls, lower in self.demotions.items():
            if lower not in self.slos:
                raise ValueError(f"demotions[{cls!r}] = {lower!r} has no target in slos")

    def target_class(self, request: RequestView) -> str | None:
        """The class ``request`` is judged by: its own if it has a target, else by length."""
        if request.slo_class is not None and request.slo_class in self.slos:
            return request.slo_class
        for bound, cls in self.length_classes:
            if request.prompt_tokens <= bound:
                return cls
        return None

    # -- predictions ------------------------------------------------------------

    def prefill_per_step(self, load: LoadSnapshot) -> int:
        """Prefill tokens one step carries under load."""
        bound = self.max_prefill_tokens_per_step
        return load.token_budget if bound is None else min(bound, load.token_budget)

    def _rate_and_step(self, load: LoadSnapshot) -> tuple[float, float]:
        per_step = self.prefill_per_step(load)
        step_s = self.step_model.step_s(load.running_requests + 1, per_step,
                                        self.ledger.decoding_context_tokens)
        return per_step / step_s, step_s

    def _due(self, request: RequestView, target: SLOTarget) -> float:
        return request.arrival_s + self.headroom * target.ttft_s

    def share(self, priority: int) -> float:
        """The share of the prefill rate a request of ``priority`` is planned on."""
        return self.planning_share.get(priority, 1.0)

    def _late(self, load: LoadSnapshot, due: float, share: float, tokens: int
              ) -> tuple[float, float]:
        """``(lateness of a new request, most lateness it adds to an admitted one due later
        that was on time)`` under EDF; each request is planned on its share of the rate, and
        lateness <= 0 is on time."""
        rate, step_s = self._rate_and_step(load)
        items = sorted((*self._deadlines.get(rid, (math.inf, 1.0)), work)
                       for rid, work in self.ledger.with_prefill())
        own_late, added, ahead = -math.inf, -math.inf, 0.0
        placed = False
        for item_due, item_share, work in items:
            if not placed and due < item_due:
                placed = True
                own_late = load.now + (ahead + tokens) / (rate * share) + step_s - due
            ahead += work
            if placed and item_due < math.inf:
                item_rate = rate * item_share
                was = load.now + ahead / item_rate + step_s - item_due
                late = was + tokens / item_rate
                if was <= 0 < late:
                    added = max(added, late)
        if not placed:
            own_late = load.now + (ahead + tokens) / (rate * share) + step_s - due
        return own_late, added

    def predict_ttft_s(self, request: RequestView, load: LoadSnapshot) -> float:
        """Seconds until ``request``'s first token if admitted now, under EDF on its share."""
        cls = self.target_class(request)
        target = self.slos[cls] if cls is not None else None
        if target is None:
            return math.inf
        due = self._due(request, target)
        late, _ = self._late(load, due, self.share(request.priority),
                             self.ledger.prefill_tokens(request))
        return late + due - request.arrival_s

    def predict_tpot_s(self, request: RequestView, load: LoadSnapshot) -> float:
        """Seconds per output token once ``request`` decodes beside the running requests."""
        backlog = self.ledger.backlog_tokens + self.ledger.prefill_tokens(request)
        return self.step_model.step_s(load.running_requests + 1,
                                      min(self.prefill_per_step(load), backlog),
                                      self.ledger.decoding_context_tokens + request.prompt_tokens)

    def _tpot_bound_s(self, target: SLOTarget) -> float:
        """The tightest TPOT target among ``target`` and the classes decoding now."""
        bound = target.tpot_s
        for cls in self.ledger.decoding_classes():
            other = self.slos.get(cls) if cls is not None else None
            if other is not None and other.tpot_s < bound:
                bound = other.tpot_s
        if self.protected_tpot_s:
            for priority in self.ledger.decoding_priorities():
                bound = min(bound, self.protected_tpot_s.get(priority, math.inf))
        return bound

    def decide(self, request: RequestView, load: LoadSnapshot) -> SLODecision:
        """Admit, demote or reject ``request`` (no state changes: see `admit`)."""
        own = self.target_class(request)
        if own is None:
            return SLODecision(verdict=SLOVerdict.ADMIT, slo_class=request.slo_class,
                               ttft_s=None, tpot_s=None)
        target = self.slos[own]
        tokens = self.ledger.prefill_tokens(request)
        tpot = self.predict_tpot_s(request, load)
        first = None
        for verdict, cls in ((SLOVerdict.ADMIT, own), (SLOVerdict.DEMOTE, self.demotions.get(own))):
            if cls is None:
                continue
            goal = self.slos[cls]
            due = self._due(request, goal)
            own_late, added = self._late(load, due, self.share(request.priority), tokens)
            ttft = own_late + due - request.arrival_s
            first = first or (ttft, own_late)
            if (own_late <= 0 and added <= 0
                    and tpot <= self.tpot_headroom * self._tpot_bound_s(goal)):
                return SLODecision(verdict=verdict, slo_class=cls, ttft_s=ttft, tpot_s=tpot)
        ttft, own_late = first
        reason = "slo_tpot" if tpot > self.tpot_headroom * self._tpot_bound_s(target) and (
            own_late <= 0) else "slo_ttft"
        retry = min(max(own_late, self.min_retry_after_s), self.max_retry_after_s)
        return SLODecision(verdict=SLOVerdict.REJECT, slo_class=own, ttft_s=ttft,
                           tpot_s=tpot, reason=reason, retry_after_s=retry)

    def admit(self, request: RequestView, load: LoadSnapshot) -> AdmissionDecision:
        """`decide`, counted, as the pipeline's admission decision.

        A DEMOTE is admitted under the lower class's deadline in the admission test, but the
        scheduler does not yet re-rank the request (it keeps its own class's key), so configure
        ``demotions`` only where that is acceptable.
        """
        decision = self.decide(request, load)
        if decision.verdict is SLOVerdict.REJECT:
            self._rejected[decision.reason] = self._rejected.get(decision.reason, 0) + 1
            return AdmissionDecision.reject(decision.reason, decision.retry_after_s)
        if decision.ttft_s is None:
            self._unclassified += 1
        elif decision.verdict is SLOVerdict.DEMOTE:
            self._demoted += 1
            self._pending_class[request.request_id] = decision.slo_class
        else:
            self._admitted += 1
        return AdmissionDecision.accept()

    # -- lifecycle -----------------------------------------------------------------

    def on_admitted(self, request: RequestView, now: float) -> None:
        """Weigh the request's deadline in later tests (under its demoted class, if so)."""
        cls = self._pending_class.pop(request.request_id, None) or self.target_class(request)
        target = self.slos[cls] if cls is not None else None
        if target is not None:
            self._deadlines[request.request_id] = (self._due(request, target),
                                                   self.share(request.priority))

    def on_first_scheduled(self, request: RequestView, now: float) -> None:
        pass

    def on_finished(self, request: RequestView, now: float) -> None:
        self._deadlines.pop(request.request_id, None)
        self._pending_class.pop(request.request_id, None)

    def stats(self) -> SLOAdmissionStats:
        """A frozen snapshot (see `SLOAdmissionStats`)."""
        return SLOAdmissionStats(admitted=self._admitted, demoted=self._demoted,
                                 rejected=dict(self._rejected), unclassified=self._unclassified,
                                 tracked=len(self._deadlines))

    def check_invariants(self) -> None:
        """Counters are never negative; the ledger's own invariants hold."""
        assert self._admitted >= 0 and self._demoted >= 0 and self._unclassified >= 0
        assert all(v > 0 for v in self._rejected.values())
        self.ledger.check_invariants()
