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
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from typing import ClassVar

import attrs

from policies.admission import AdmissionDecision
from policies.output_lengths import OutputLengths
from policies.percentile import percentile
from policies.slo_fairness import ClassFairShare
from policies.slo_path import PathDelays, PathDelaysStats
from policies.step_model import OnlineStepTimeModel, StepTimeModel
from policies.validators import at_least, finite_non_negative, finite_positive
from policies.views import LoadSnapshot, RequestView


@attrs.frozen(kw_only=True)
class SLOTarget:
    """A class's latency targets: first token within ``ttft_s``, then ``tpot_s`` a token."""

    ttft_s: float = attrs.field(validator=finite_positive)
    tpot_s: float = attrs.field(validator=finite_positive)


RELEASE_QUANTILES = 8
"""How many equally likely finishing times each admitted request's KV and slot release is
spread over: the resolution of the expected-free-KV curve (finer costs more per
decision; nothing is fitted to it)."""


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

    Where the scheduler looks each request's prefix-cache hit up on arrival (it does for
    `SLOAdmission`, whose ``reads_prefix_hits`` asks for it), set ``learn_tenant_hits=False``:
    the request's own hit (`RequestView.cached_tokens`) is then the whole estimate, so a
    session's first call is not taken to hit like its tenant's later ones.

    Guarantee: ``backlog_tokens`` is always the sum of the requests' remaining tokens, and the
    decoding context the sum of the decoding requests' prompts (`check_invariants`). O(1) per
    event.
    """

    learn_tenant_hits: bool = True
    """Assume each tenant's learned hit for requests whose own hit is unknown (0)."""
    outputs: OutputLengths = attrs.field(factory=OutputLengths)
    """Finished requests' output lengths: each admitted request's expected output, and how
    much more a decoding one will generate."""

    _entries: dict[str, list] = attrs.field(init=False, factory=dict, repr=False)
    """request id -> [tenant, remaining, chunks seen, tokens granted, prompt tokens]"""
    _backlog: int = attrs.field(init=False, default=0, repr=False)
    _decoding: dict[str, tuple[str | None, int, int]] = attrs.field(init=False, factory=dict,
                                                                     repr=False)
    """request id -> (slo_class, prompt tokens, priority) of admitted requests with their
    prefill done"""
    _decoding_context: int = attrs.field(init=False, default=0, repr=False)
    _prefilling_context: int = attrs.field(init=False, default=0, repr=False)
    """The prompt tokens of the requests with prefill left (the context they will decode over)."""
    _cached: dict[str, int] = attrs.field(init=False, factory=dict, repr=False)
    _on_prefill_done: Callable[[str, float], None] | None = attrs.field(
        init=False, default=None, repr=False)
    _kv: dict[str, tuple[int, float]] = attrs.field(init=False, factory=dict, repr=False)
    """Admitted, unfinished request id -> (the KV tokens it will hold: prompt + expected output,
    its ``max_tokens`` or ``inf``)."""
    _kv_demand: int = attrs.field(init=False, default=0, repr=False)
    _decode_start: dict[str, float] = attrs.field(init=False, factory=dict, repr=False)
    _finishes: deque[float] = attrs.field(init=False, factory=deque, repr=False)
    """When admitted requests finished, within the window last asked of `finish_rate`."""
    _finish_window_s: float = attrs.field(init=False, default=math.inf, repr=False)
    _first_admitted_s: float | None = attrs.field(init=False, default=None, repr=False)

    def listen(self, on_prefill_done: Callable[[str, float], None]) -> None:
        """Call ``on_prefill_done(request id, now)`` when a chunk completes a request's
        prompt (its first token comes with that step)."""
        self._on_prefill_done = on_prefill_done

    def expected_cached_tokens(self, tenant: str) -> int:
        """The prefix-cache hit the ledger has learned for ``tenant``'s requests (0 at first,
        and always without ``learn_tenant_hits``)."""
        return self._cached.get(tenant, 0) if self.learn_tenant_hits else 0

    def _set(self, request: RequestView, remaining: int, chunks: int, granted: int) -> None:
        entry = self._entries.pop(request.request_id, None)
        if entry is not None:
            self._backlog -= entry[1]
            self._prefilling_context -= entry[4]
        if remaining <= 0:
            if request.request_id not in self._decoding:
                self._decoding[request.request_id] = (request.slo_class, request.prompt_tokens,
                                                      request.priority)
                self._decoding_context += request.prompt_tokens
            return
        self._stop_decoding(request.request_id)
        self._entries[request.request_id] = [request.tenant, remaining, chunks, granted,
                                             request.prompt_tokens]
        self._backlog += remaining
        self._prefilling_context += request.prompt_tokens

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
        assumed = max(self.expected_cached_tokens(request.tenant),
                      request.cached_tokens - request.computed_tokens) if chunks == 0 else 0
        remaining = request.prompt_tokens - request.computed_tokens - tokens - assumed
        self._set(request, remaining, chunks + 1, granted + tokens)
        if remaining <= 0:
            self._decode_start.setdefault(request.request_id, now)
            if self._on_prefill_done is not None:
                self._on_prefill_done(request.request_id, now)

    # -- lifecycle -----------------------------------------------------------------

    def on_admitted(self, request: RequestView, now: float) -> None:
        """Count the request's prompt, less its tenant's learned hit (repeats change nothing)."""
        if request.request_id in self._entries or request.request_id in self._decoding:
            return
        if self._first_admitted_s is None:
            self._first_admitted_s = now
        self._set(request, self.prefill_tokens(request), 0, 0)
        footprint = request.prompt_tokens + self.expected_output_tokens(request)
        self._kv[request.request_id] = (footprint, request.max_output_tokens or math.inf)
        self._kv_demand += footprint

    def on_first_scheduled(self, request: RequestView, now: float) -> None:
        pass

    def on_finished(self, request: RequestView, now: float) -> None:
        """Forget the request; learn its output length."""
        entry = self._entries.pop(request.request_id, None)
        if entry is not None:
            self._backlog -= entry[1]
            self._prefilling_context -= entry[4]
        self._stop_decoding(request.request_id)
        kv = self._kv.pop(request.request_id, None)
        if kv is not None:  # an admitted request's slot is free
            self._kv_demand -= kv[0]
            self._finishes.append(now)
            self._forget_finishes(now, self._finish_window_s)
        self._decode_start.pop(request.request_id, None)
        self.outputs.observe(request.output_tokens)

    # -- reading ---------------------------------------------------------------

    def expected_output_tokens(self, request: RequestView) -> int:
        """Output tokens a new ``request`` is expected to generate: the recent finished
        requests' mean, each cut at its ``max_output_tokens`` (`OutputLengths.remaining`)."""
        return round(self.outputs.remaining(0, request.max_output_tokens or math.inf))

    @property
    def kv_demand_tokens(self) -> int:
        """KV tokens the admitted, unfinished requests will hold (prompts + expected outputs)."""
        return self._kv_demand

    def kv_releases(self, now: float, tpot_s: float, prefill_tokens_per_s: float
                    ) -> list[tuple[float, float]]:
        """``(when, KV tokens)`` the admitted requests are expected to free, earliest first, at
        ``tpot_s`` a token. Each request's footprint is spread over `RELEASE_QUANTILES` equally
        likely finishing times (`OutputLengths.remaining_quantiles`), so the running total
        is the KV expected free by then, and every `RELEASE_QUANTILES` entries one slot: one
        decoding finishes what may remain after the tokens it has generated since its
        decoding began (the longer it has run, the longer it may run on); one still in
        prefill, a new request's output after its remaining prefill is done at
        ``prefill_tokens_per_s``. (Each request at its own expected finish would put the
        first releases late: the earliest of many uncertain finishes comes sooner than the
        earliest expected one.)"""
        releases = []
        quantiles = self.outputs.remaining_quantiles
        n = RELEASE_QUANTILES
        for rid, (footprint, limit) in self._kv.items():
            start = self._decode_start.get(rid)
            if start is None:
                entry = self._entries.get(rid)
                start = now + (entry[1] if entry else 0) / prefill_tokens_per_s
                outputs = quantiles(0, n, limit)
            else:
                outputs = quantiles((now - start) / tpot_s, n, limit)
                start = now
            share = footprint / n
            releases.extend((start + output * tpot_s, share) for output in outputs)
        releases.sort()
        return releases

    def finish_rate(self, now: float, window_s: float) -> float:
        """Admitted requests finishing per second, observed over the last ``window_s`` (or
        since the first admission, if later), counting one more finishing now (so a rate is
        never 0, and it falls the longer nothing finishes); ``inf`` before any time passed."""
        self._finish_window_s = window_s  # finishes older are forgotten from now on
        self._forget_finishes(now, window_s)
        if self._first_admitted_s is None or now <= self._first_admitted_s:
            return math.inf
        return (len(self._finishes) + 1) / (now - max(now - window_s, self._first_admitted_s))

    def _forget_finishes(self, now: float, window_s: float) -> None:
        finishes = self._finishes
        while finishes and finishes[0] < now - window_s:
            finishes.popleft()

    def prefill_tokens(self, request: RequestView) -> int:
        """Prefill tokens a new ``request`` needs: its prompt less the expected hit (>= 1)."""
        hit = max(request.cached_tokens, self.expected_cached_tokens(request.tenant))
        return max(request.prompt_tokens - request.computed_tokens - hit, 1)

    def remaining(self, request_id: str) -> int:
        """Prefill tokens ``request_id`` has left (0 when done or unknown)."""
        entry = self._entries.get(request_id)
        return 0 if entry is None else entry[1]

    def with_prefill(self) -> list[tuple[str, int, int]]:
        """``(request id, remaining prefill tokens, tokens before them)`` of every request with
        some left (the last is the context its remaining chunks attend to)."""
        return [(rid, entry[1], entry[4] - entry[1]) for rid, entry in self._entries.items()]

    @property
    def backlog_tokens(self) -> int:
        """All remaining prefill tokens."""
        return self._backlog

    def decoding_ids(self) -> Iterable[str]:
        """The ids of the requests decoding now."""
        return self._decoding.keys()

    def decoding_priorities(self) -> set[int]:
        """The priorities of the requests decoding now."""
        return {priority for _, _, priority in self._decoding.values()}

    @property
    def decoding_context_tokens(self) -> int:
        """The prompt tokens of the requests decoding now (their context, less output)."""
        return self._decoding_context

    @property
    def prefilling(self) -> tuple[int, int]:
        """``(requests with prefill left, their prompt tokens)``: the decodes the batch will
        take on once their prefill is done."""
        return len(self._entries), self._prefilling_context

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
        assert self._prefilling_context == sum(entry[4] for entry in self._entries.values())
        assert self._kv_demand == sum(footprint for footprint, _ in self._kv.values())
        assert set(self._decode_start) <= set(self._kv) | set(self._decoding)
        assert all(v >= 0 for v in self._cached.values())


def _tokens_within(room_s: float, context_tokens: int, model: StepTimeModel) -> float:
    """The prefill tokens after ``context_tokens`` in KV that ``model`` runs in ``room_s``
    (0 when there is no room): the root of its linear-plus-pairs prefill cost."""
    if room_s <= 0:
        return 0.0
    linear = model.prefill_s_per_token + model.prefill_s_per_pair * (context_tokens + 0.5)
    quadratic = model.prefill_s_per_pair / 2
    if quadratic > 0:
        return (math.sqrt(linear * linear + 4 * quadratic * room_s) - linear) / (2 * quadratic)
    return room_s / linear


def _targets(_instance: object, attribute: attrs.Attribute, value: Mapping) -> None:
    for cls, target in value.items():
        if not isinstance(cls, str) or not isinstance(target, SLOTarget):
            raise ValueError(f"{attribute.name} must map class names to SLOTarget, got "
                             f"{cls!r}: {target!r}")


@attrs.frozen(kw_only=True)
class ClassGrants:
    """The classes each tenant may be judged in: named tenants' grants, and everyone
    else's (anonymous requests included)."""

    by_tenant: Mapping[str, frozenset[str]] = attrs.field(
        factory=dict, converter=lambda grants: {t: frozenset(c) for t, c in grants.items()})
    others: frozenset[str] | None = attrs.field(
        default=None, converter=attrs.converters.optional(frozenset))
    """The classes of every tenant not in ``by_tenant``; None: every class."""

    def allows(self, tenant: str, slo_class: str) -> bool:
        """Whether ``tenant``'s requests may be judged in ``slo_class``."""
        granted = self.by_tenant.get(tenant, self.others)
        return granted is None or slo_class in granted


def resolve_class(request: RequestView, slos: Mapping[str, SLOTarget],
                  tenant_classes: Mapping[str, str],
                  length_classes: tuple[tuple[int, str], ...],
                  grants: ClassGrants | None = None) -> str | None:
    """The class ``request`` is judged by: its own ``slo_class`` if it has a target, else its
    tenant's class, else the first length class whose bound its prompt is within. A length
    class the tenant is not granted (``grants``) gives way to the tightest granted class
    whose TTFT target is no tighter; None if there is none."""
    if request.slo_class is not None and request.slo_class in slos:
        return request.slo_class
    by_tenant = tenant_classes.get(request.tenant)
    if by_tenant is not None:
        return by_tenant
    for bound, cls in length_classes:
        if request.prompt_tokens <= bound:
            if grants is None or grants.allows(request.tenant, cls):
                return cls
            looser = [(target.ttft_s, name) for name, target in slos.items()
                      if target.ttft_s >= slos[cls].ttft_s
                      and grants.allows(request.tenant, name)]
            return min(looser)[1] if looser else None
    return None


def _classes_known(instance: object, attribute: attrs.Attribute, value: object) -> None:
    slos = instance.slos
    names = value.values() if isinstance(value, Mapping) else (
        [cls for _, cls in value] if attribute.name == "length_classes" else value)
    for cls in names:
        if cls not in slos:
            raise ValueError(f"{attribute.name}: class {cls!r} has no target in slos")


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
    tenant_classes: Mapping[str, str] = attrs.field(factory=dict, converter=dict,
                                                    validator=_classes_known)
    """Tenant -> the class of its requests that name none (as in `SLOAdmission`)."""
    length_classes: tuple[tuple[int, str], ...] = attrs.field(default=(), converter=tuple,
                                                              validator=_classes_known)
    """``(max prompt tokens, class)`` for requests with no class otherwise (as in
    `SLOAdmission`)."""
    grants: ClassGrants | None = None
    """The classes each tenant may be judged in by length (as in `SLOAdmission`)."""
    fairness: ClassFairShare | None = None
    """Shares between the tenants of a class (the same object as `SLOAdmission.fairness`):
    a request of a tenant over its share is ranked `ClassFairShare.lead_s` later, at most its
    class's TTFT target (None: first come, first served within a class)."""

    def ttft_s(self, slo_class: str | None) -> float:
        """The first-token target of ``slo_class``."""
        target = self.slos.get(slo_class) if slo_class is not None else None
        return self.default_ttft_s if target is None else target.ttft_s

    def rank_key(self, request: RequestView) -> float:
        cls = resolve_class(request, self.slos, self.tenant_classes, self.length_classes,
                            self.grants)
        ttft_s = self.ttft_s(cls)
        if self.fairness is None or cls not in self.slos:
            return request.arrival_s + ttft_s
        return request.arrival_s + ttft_s + self.fairness.lead_s(request.tenant, cls,
                                                                 request.arrival_s, ttft_s)

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
    egress_s: float = 0.0
    """The egress delay the deadline was planned with (`PathDelays`): the predicted TTFT
    the client sees is ``ttft_s + egress_s``."""
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
    headroom: float
    """The headroom in force: the configured one, corrected by how late admitted requests'
    first tokens have come against their predictions (`SLOAdmission.feedback_window`)."""
    ttft_error_p90: float | None
    """90th percentile of ``(measured - predicted TTFT) / TTFT target`` over the recent
    admitted requests (None before any); measured where the client's first token leaves
    the server once `PathDelays` hears of it, else where the engine produces it."""
    path: PathDelaysStats | None = None
    """The learned path around the engine step (None without ``path``)."""
    tpot_headroom: float = 1.0
    """The TPOT headroom in force: the configured one, corrected by how much slower than
    predicted admitted streams reached the client (`SLOAdmission.on_client_stream_end`)."""
    tpot_error_p90: float | None = None
    """90th percentile of ``(client TPOT - predicted TPOT) / TPOT target`` over the recent
    admitted streams (None before any client report)."""


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

    slos: Mapping[str, SLOTarget] = attrs.field(converter=dict, validator=_targets)
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
    """Correct ``headroom`` from the last this many admitted requests' first tokens (0: off):
    the headroom in force is ``headroom`` less the 90th percentile of their lateness against
    the prediction, as a share of their TTFT target, within ``[min_headroom, max_headroom]``.
    Predictions that come true leave it as configured; first tokens later than predicted (a
    step model still learning, waits the model does not see) lower it; earlier ones (a
    pessimistic model over-rejecting) raise it, past 1 when they come that much earlier."""
    min_headroom: float = attrs.field(default=0.25, validator=finite_positive)
    max_headroom: float = attrs.field(default=1.0, validator=finite_positive)
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
    """Admitted request id -> (its place in the order: latest acceptable first-token time plus
    its fairness lead, planning share, that lead, the class it was over its share in or
    "")."""
    _admitted: int = attrs.field(init=False, default=0, repr=False)
    _demoted: int = attrs.field(init=False, default=0, repr=False)
    _rejected: dict[str, int] = attrs.field(init=False, factory=dict, repr=False)
    _unclassified: int = attrs.field(init=False, default=0, repr=False)
    _pending_class: dict[str, str] = attrs.field(init=False, factory=dict, repr=False)
    _class_of: dict[str, str] = attrs.field(init=False, factory=dict, repr=False)
    """Admitted request id -> the class it is judged by (its TPOT binds while it decodes)."""
    _predicted: dict[str, tuple[float, float, float]] = attrs.field(init=False, factory=dict,
                                                                    repr=False)
    """Admitted request id -> (arrival, predicted TTFT, TTFT target), until its first token."""
    _pending_prediction: dict[str, tuple[float, float, float]] = attrs.field(
        init=False, factory=dict, repr=False)
    """Request id -> (predicted TTFT, TTFT target, planned egress), from decision to
    admission."""
    _awaiting_client: OrderedDict[str, tuple[float, float, float]] = attrs.field(
        init=False, factory=OrderedDict, repr=False)
    """Request id -> (arrival, predicted TTFT at the client, TTFT target), from the
    engine's first token to the client report (bounded like `PathDelays.max_awaiting`)."""
    _asked_class: dict[str, str] = attrs.field(init=False, factory=dict, repr=False)
    """Demoted request id -> the class it asked for."""
    _now: float = attrs.field(init=False, default=0.0, repr=False)
    """The latest time it was told of (for `stats`)."""
    _errors: deque[float] = attrs.field(init=False, factory=deque, repr=False)
    _headroom_now: float = attrs.field(init=False, default=0.0, repr=False)
    _tpot_errors: deque[float] = attrs.field(init=False, factory=deque, repr=False)
    _tpot_headroom_now: float = attrs.field(init=False, default=0.0, repr=False)
    _predicted_tpot: OrderedDict[str, tuple[float, float]] = attrs.field(
        init=False, factory=OrderedDict, repr=False)
    """Admitted request id -> (predicted TPOT, TPOT target), until its stream's client report
    (bounded like `PathDelays.max_awaiting`; kept past its finish, when the report comes)."""
    _step_bound: tuple[LoadSnapshot, float, StepTimeModel] | None = attrs.field(
        init=False, default=None, repr=False)
    """This step's prefill room and the model it was priced on (`_step_room`)."""
    _step_spent: list | None = attrs.field(init=False, default=None, repr=False)
    """[this step's load, seconds of its room its chunks' caps took, their tokens]
    (`token_cap`)."""
    _finish_window_s: float = attrs.field(init=False, default=0.0, repr=False)
    """The longest first-token target: the wait for a slot is planned at most that far ahead,
    so the slot-release rate is measured over as long (`_slot_ready_s`)."""
    _releases_memo: tuple[LoadSnapshot, list[tuple[float, float]] | None] | None = attrs.field(
        init=False, default=None, repr=False)
    """While `decide` runs: its load and the KV releases once computed (`_releases`)."""

    reads_prefix_hits: ClassVar[bool] = True
    """Asks the scheduler to look each arrival's prefix-cache hit up (`RequestView.cached_tokens`):
    cached tokens are not prefill work."""

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
        for name in (*self.tenant_classes.values(), *self.protected_classes):
            if name not in self.slos:
                raise ValueError(f"class {name!r} (tenant_classes / protected_classes) has no "
                                 "target in slos")
        for cls, lower in self.demotions.items():
            if lower not in self.slos:
                raise ValueError(f"demotions[{cls!r}] = {lower!r} has no target in slos")
        self._headroom_now = self.headroom
        self._tpot_headroom_now = self.tpot_headroom
        self._finish_window_s = max(target.ttft_s for target in self.slos.values()) if (
            self.slos) else 0.0
        if self.feedback_window:
            self._errors = deque(maxlen=self.feedback_window)
            self._tpot_errors = deque(maxlen=self.feedback_window)
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
        decodes; never fewer than ``max_prefill_tokens_per_step`` (the floor that keeps
        prefill moving; 1 when None)."""
        room_s, model = self._step_room(load)
        if room_s == math.inf:
            return load.token_budget
        return int(min(max(_tokens_within(room_s, context_tokens, model),
                           self._step_floor(load)), load.token_budget))

    def _step_floor(self, load: LoadSnapshot) -> int:
        return min(self.max_prefill_tokens_per_step or 1, load.token_budget)

    def _step_room(self, load: LoadSnapshot) -> tuple[float, StepTimeModel]:
        """Seconds a step of ``load`` has for prefill beside its decodes (``inf`` when nothing
        with a TPOT target decodes) and the model it was priced on; once per step, for every
        prefill request's cap in it."""
        cached = self._step_bound
        if cached is not None and cached[0] is load:
            return cached[1], cached[2]
        model = getattr(self.step_model, "model", self.step_model)
        room_s = self._tpot_headroom_now * self._decoding_tpot_bound_s()
        if room_s != math.inf:
            room_s -= model.step_s(load.running_requests, 0, self.ledger.decoding_context_tokens)
        self._step_bound = (load, room_s, model)
        return room_s, model

    def token_cap(self, request: RequestView, load: LoadSnapshot) -> int:
        """A per-step bound for `StepPrefillBudget`'s ``bound`` (which subtracts, in tokens,
        what it has granted this step): the tokens this step's earlier chunks were allowed,
        plus as many as fit, after ``request``'s context, in the room those chunks left at
        their own contexts; never below the floor (`step_prefill_tokens`). Pricing each chunk
        at its own context keeps a chunk after a short context from taking the room a chunk
        after a long one has spent: counted in tokens alone, such steps overshot the room
        (``mooncake-synthetic``: steps of 118 ms against 90 ms)."""
        room_s, model = self._step_room(load)
        if room_s == math.inf:
            return load.token_budget
        spent = self._step_spent
        if spent is None or spent[0] is not load:
            spent = self._step_spent = [load, 0.0, 0]
        context = max(request.computed_tokens, request.cached_tokens)
        granted = spent[2]
        limit = int(min(max(granted + _tokens_within(room_s - spent[1], context, model),
                            self._step_floor(load)), load.token_budget))
        take = max(min(limit - granted, request.prompt_tokens - context), 0)
        spent[1] += model.prefill_token_equivalents(take, context) * model.prefill_s_per_token
        spent[2] += take
        return limit

    def _rate_and_step(self, load: LoadSnapshot) -> tuple[float, float]:
        per_step = self.prefill_per_step(load)
        step_s = self.step_model.step_s(load.running_requests + 1, per_step,
                                        self.ledger.decoding_context_tokens)
        return per_step / step_s, step_s

    def _due(self, request: RequestView, target: SLOTarget, egress_s: float) -> float:
        """When the engine must produce ``request``'s first token: its deadline at the
        headroom in force, less the egress delay."""
        return request.arrival_s + self._headroom_now * target.ttft_s - egress_s

    def _first_token(self, request_id: str, now: float) -> None:
        """The engine produced ``request_id``'s first token: feedback from here, or, once the
        server reports where first tokens leave (`on_client_first_token`), from there."""
        self._now = max(self._now, now)
        entry = self._predicted.pop(request_id, None)
        if self.path is not None:
            self.path.engine_first_token(request_id, now)
            if entry is not None:
                self._awaiting_client[request_id] = entry
                while len(self._awaiting_client) > self.path.max_awaiting:
                    self._awaiting_client.popitem(last=False)
            if self.path.has_client_reports:
                return
        if entry is not None:
            arrival, predicted, target = entry
            self._learn((now - arrival - predicted) / target)

    def on_client_first_token(self, request_id: str, sent_s: float) -> None:
        """``request_id``'s first token left the API server at ``sent_s`` (the clock of
        ``arrival_s``): learn the egress delay and, with ``feedback_window``, how late the
        client saw it against the prediction. Ignored without ``path`` or for a request it
        does not know (never judged, or forgotten: bounded memory)."""
        if self.path is None:
            return
        self._now = max(self._now, sent_s)
        self.path.client_first_token(request_id, sent_s)
        entry = self._awaiting_client.pop(request_id, None)
        if entry is not None:
            arrival, predicted, target = entry
            self._learn((sent_s - arrival - predicted) / target)

    def on_client_stream_end(self, request_id: str, first_s: float, last_s: float,
                             chunks: int) -> None:
        """``request_id``'s stream reached the client as ``chunks`` chunks with output from
        ``first_s`` to ``last_s``: with ``feedback_window``, learn how much slower than
        predicted tokens reached the client (the TPOT headroom in force is ``tpot_headroom``
        less the 90th percentile of that excess, as a share of the TPOT target, within
        ``[min_headroom, max_headroom]``). Ignored without ``path``, for a request it does
        not know, or for a stream of one chunk."""
        entry = self._predicted_tpot.pop(request_id, None)
        if self.path is None or entry is None or chunks < 2 or not self.feedback_window:
            return
        predicted, target = entry
        self._tpot_errors.append(((last_s - first_s) / (chunks - 1) - predicted) / target)
        if len(self._tpot_errors) >= min(20, self.feedback_window):
            self._tpot_headroom_now = min(max(
                self.tpot_headroom - percentile(self._tpot_errors, 90), self.min_headroom),
                self.max_headroom)

    def _learn(self, error: float) -> None:
        """One first token's lateness against its prediction, as a share of its target."""
        if not self.feedback_window:
            return
        self._errors.append(error)
        if len(self._errors) >= min(20, self.feedback_window):
            self._headroom_now = min(max(self.headroom - self._p90(), self.min_headroom),
                                     self.max_headroom)

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
        """When the KV cache has room for ``request`` beside what is admitted: now, if the
        admitted requests' prompts and expected outputs leave room for its own; else when
        enough admitted requests will have finished, each at the step time measured lately
        (`OnlineStepTimeModel.recent_step_s`, else the model's full step) a token; ``inf``
        if they cannot free enough. ``now`` when the capacity is unknown."""
        capacity = load.kv_capacity_tokens
        footprint = request.prompt_tokens + self.ledger.expected_output_tokens(request)
        need = self.ledger.kv_demand_tokens + footprint - (capacity or 0)
        if capacity is None or need <= 0:
            return load.now
        freed = 0
        for when, tokens in self._releases(load):
            freed += tokens
            if freed >= need - 1e-6:  # shares of a footprint may sum a rounding short
                return when
        return math.inf

    def _slot_ready_s(self, load: LoadSnapshot, ahead: int) -> float:
        """When a slot is free for a request with ``ahead`` admitted, unstarted requests
        before it in EDF order: now while the running requests and those leave a slot; else
        when enough admitted requests will have finished, by the later of two estimates:
        their expected finishes (as in `kv_ready_s`; ``inf`` if they cannot free enough) and
        the rate at which slots have been freed lately (`PrefillLedger.finish_rate`). The
        expected finishes learn from finished requests only, and with every slot taken the
        first to finish are the short ones: on the ``reasoning`` trace, with 256 slots full
        and one request finished, they put the next free slot 0.01 s away where it came
        2-5 s later. Now when the slot count is unknown."""
        need = load.running_requests + ahead + 1 - (load.max_running_requests or math.inf)
        if need <= 0:
            return load.now
        releases = self._releases(load)
        index = int(need) * RELEASE_QUANTILES - 1  # every RELEASE_QUANTILES entries, a slot
        expected = releases[index][0] if index < len(releases) else math.inf
        rate = self.ledger.finish_rate(load.now, self._finish_window_s)
        return max(expected, load.now + need / rate)

    def _releases(self, load: LoadSnapshot) -> list[tuple[float, float]]:
        """`PrefillLedger.kv_releases` at the step time measured lately (else the model's full
        step); sorted once per `decide` (its KV and slot waits, admitted and demoted tries)."""
        memo = self._releases_memo
        if memo is not None and memo[0] is load and memo[1] is not None:
            return memo[1]
        rate, step_s = self._rate_and_step(load)
        tpot_s = getattr(self.step_model, "recent_step_s", None) or step_s
        releases = self.ledger.kv_releases(load.now, tpot_s, rate)
        if memo is not None and memo[0] is load:
            self._releases_memo = (load, releases)
        return releases

    def _late(self, load: LoadSnapshot, due: float, share: float, tokens: float,
              kv_ready_s: float | None = None, lead_s: float = 0.0,
              yielded_in: str = "") -> tuple[float, float]:
        """``(lateness of a new request, most lateness it adds to an admitted one due later
        that was on time)`` under EDF; each request is planned on its share of the rate, and
        lateness <= 0 is on time. A new request starts once KV (``kv_ready_s``) and a slot
        (`_slot_ready_s`) are free for it; an unstarted admitted one due later waits for one
        more slot with it admitted (with every slot taken, an urgent arrival takes the slot
        a waiting request was counting on). It takes its place ``lead_s`` after its deadline
        (a tenant over its share, `fairness`); admitted requests that were over their share
        in class ``yielded_in`` are not protected from it (their share left it that room)."""
        rate, step_s = self._rate_and_step(load)
        equivalents = self.step_model.prefill_token_equivalents
        items = sorted((*self._deadlines.get(rid, (math.inf, 1.0, 0.0, "")),
                        equivalents(work, context))
                       for rid, work, context in self.ledger.with_prefill())
        key = due + lead_s
        started = load.running_requests - len(self.ledger.decoding_ids())
        own_late, added, ahead = -math.inf, -math.inf, 0.0
        placed, before = False, 0
        for index, (item_key, item_share, item_lead, item_over, work) in enumerate(items):
            if not placed and key < item_key:
                placed = True
                own_late = load.now + (ahead + tokens) / (rate * share) + step_s - due
            ahead += work
            before += not placed
            if placed and item_key < math.inf and not (yielded_in and item_over == yielded_in):
                item_due = item_key - item_lead
                item_rate = rate * item_share
                was = load.now + ahead / item_rate + step_s - item_due
                late = was + tokens / item_rate
                if index >= started:  # not started: it waits for a slot
                    own = work / item_rate + step_s - item_due
                    was = max(was, self._slot_ready_s(load, index - started) + own)
                    late = max(late, self._slot_ready_s(load, index - started + 1) + own)
                if was <= 0 < late:
                    added = max(added, late)
        if not placed:
            own_late = load.now + (ahead + tokens) / (rate * share) + step_s - due
        # it starts once KV and a slot are free (unstarted requests ahead of it want slots)
        unstarted = max(0, before - started)
        ready = max(kv_ready_s or load.now, self._slot_ready_s(load, unstarted))
        if ready > load.now:
            own_late = max(own_late, ready + tokens / (rate * share) + step_s - due)
        return own_late, added

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
        due = self._due(request, target, self.egress_s(load.now))
        share, lead, over_in = self._placement(request, cls, load.now)
        late, _ = self._late(load, due, share, self._work(request),
                             self.kv_ready_s(request, load), lead, "" if over_in else cls)
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
        self._releases_memo = (load, None)  # the ledger stands still while it decides
        try:
            return self._decide(request, load)
        finally:
            self._releases_memo = None

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
            due = self._due(request, goal, egress)
            share, lead, over_in = self._placement(request, cls, load.now)
            own_late, added = self._late(load, due, share, tokens, kv_ready, lead,
                                         "" if over_in else cls)
            ttft = own_late + due - request.arrival_s
            first = first or (ttft, own_late)
            if (own_late <= 0 and added <= 0
                    and tpot <= self._tpot_headroom_now * self._tpot_bound_s(goal)):
                return SLODecision(verdict=verdict, slo_class=cls, ttft_s=ttft, tpot_s=tpot,
                                   egress_s=egress)
        ttft, own_late = first
        reason = "slo_tpot" if tpot > self._tpot_headroom_now * self._tpot_bound_s(target) and (
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
            self._pending_prediction[request.request_id] = (
                decision.ttft_s, self.slos[decision.slo_class].ttft_s, decision.egress_s)
            if self.path is not None and decision.tpot_s is not None:
                self._predicted_tpot[request.request_id] = (
                    decision.tpot_s, self.slos[decision.slo_class].tpot_s)
                while len(self._predicted_tpot) > self.path.max_awaiting:
                    self._predicted_tpot.popitem(last=False)
        return AdmissionDecision.accept()

    # -- lifecycle -----------------------------------------------------------------

    def on_admitted(self, request: RequestView, now: float) -> None:
        """Weigh the request's deadline in later tests (under its demoted class, if so)."""
        own = self.target_class(request)
        cls = self._pending_class.pop(request.request_id, None) or own
        target = self.slos[cls] if cls is not None else None
        if target is not None:
            self._class_of[request.request_id] = cls
            if cls != own and own is not None:
                self._asked_class[request.request_id] = own
            egress = 0.0
            prediction = self._pending_prediction.pop(request.request_id, None)
            if prediction is not None:
                ttft, ttft_target, egress = prediction
                self._predicted[request.request_id] = (request.arrival_s, ttft + egress,
                                                       ttft_target)
            share, lead, over_in = self._placement(request, cls, now)
            self._deadlines[request.request_id] = (self._due(request, target, egress) + lead,
                                                   share, lead, over_in)
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
        self._predicted.pop(request.request_id, None)
        self._pending_prediction.pop(request.request_id, None)

    def stats(self) -> SLOAdmissionStats:
        """A frozen snapshot (see `SLOAdmissionStats`)."""
        return SLOAdmissionStats(admitted=self._admitted, demoted=self._demoted,
                                 rejected=dict(self._rejected), unclassified=self._unclassified,
                                 tracked=len(self._deadlines), headroom=self._headroom_now,
                                 ttft_error_p90=self._p90(),
                                 path=None if self.path is None else self.path.stats(self._now),
                                 tpot_headroom=self._tpot_headroom_now,
                                 tpot_error_p90=percentile(self._tpot_errors, 90)
                                 if self._tpot_errors else None)

    def _p90(self) -> float | None:
        return percentile(self._errors, 90) if self._errors else None

    def check_invariants(self) -> None:
        """Counters are never negative; the ledger's own invariants hold."""
        assert self._admitted >= 0 and self._demoted >= 0 and self._unclassified >= 0
        assert all(v > 0 for v in self._rejected.values())
        assert set(self._asked_class) <= set(self._class_of)
        self.ledger.check_invariants()
        if self.fairness is not None:
            self.fairness.check_invariants()
        if self.path is not None:
            self.path.check_invariants()
            assert len(self._awaiting_client) <= self.path.max_awaiting
            assert len(self._predicted_tpot) <= self.path.max_awaiting
