"""Routers for a cluster of colocated replicas: the peers users pick, and `SLORouter`.

Every router sees the same things: a `ClusterRequest` (its prompt as chained block keys,
its session, its SLO targets) and one `ReplicaReport` per replica (queued prefill tokens,
running requests, KV usage and, where the replica learns one, its step-time model), and
returns a frozen `ClusterDecision`. What a router knows of the replicas' prefix caches is
what it sent where (a `PrefixIndex`, the approximate mode of Dynamo's and llm-d's routers).

Peers, from their published descriptions:

- `RoundRobinReplicas`: each accepting replica in turn.
- `PowerOfTwoReplicas` (Ray Serve's default): of two random replicas, fewer ongoing requests.
- `KVOverlapReplicas` (Dynamo's KV router): lowest ``overlap_weight * prefill_blocks +
  decode_blocks``, prefill blocks counting the queued prompt tokens and this prompt's
  uncached ones, decode blocks the active KV.
- `SessionStickyReplicas`: a session stays on the replica its first call went to (the
  least loaded then); calls without a session go to the least loaded.
- `StickyUntilSaturated` (llm-d's default since 2026-08): the replica holding the longest
  cached prefix, unless its token load (queued prefill tokens) has reached a calibrated
  ``saturation_tokens``; then, and with no cache hit, the lowest token load.

`SLORouter` predicts each replica's TTFT for the request from its report (the learned step
model's prefill rate over the queued and uncached tokens, beside the running decodes) and
routes among the replicas that meet the deadline, preferring the session's replica, then the
earliest first token (a cached prefix shortens it). With none, it demotes where the
request declares a lower class that some replica meets, else rejects with a Retry-After. A
replica's own rejection gets one retry (`retry`) elsewhere, within the deadline.
"""

from __future__ import annotations

import enum
import random
from collections import Counter, OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from types import MappingProxyType

import attrs

from policies.pd_index import PrefixIndex
from policies.step_model import CONSERVATIVE_PRIOR, StepTimeModel
from policies.validators import finite_non_negative, finite_positive, fraction, int_at_least
from policies.views import DEFAULT_TENANT

__all__ = [
    "ClusterDecision",
    "ClusterRequest",
    "ClusterRouterStats",
    "KVOverlapReplicas",
    "PowerOfTwoReplicas",
    "ReplicaReport",
    "RoundRobinReplicas",
    "RouteCause",
    "SLORouter",
    "SessionStickyReplicas",
    "StickyUntilSaturated",
]

_positive_int = int_at_least(1)
_non_negative_int = int_at_least(0)


class RouteCause(enum.Enum):
    """Why a replica was chosen, or why none was."""

    ROUND_ROBIN = "round_robin"
    LEAST_LOADED = "least_loaded"
    CACHE = "cache"
    """The longest cached prefix (or lowest cost counting it)."""
    SESSION = "session"
    """The replica the request's session is on."""
    FEASIBLE = "feasible"
    """`SLORouter`: a replica predicted to meet the deadline (no session or cache preference)."""
    DEMOTED = "demoted"
    """`SLORouter`: none meets the request's class; one meets its declared lower class."""
    RETRIED = "retried"
    """`SLORouter.retry`: placed on another replica after one rejected it."""
    NO_FEASIBLE = "no_feasible"
    """Rejected: no accepting replica is predicted to meet the deadline."""
    NO_REPLICA = "no_replica"
    """Rejected: no replica is accepting."""
    NO_RETRY = "no_retry"
    """Rejected after a replica's rejection: this router does not retry, or did once already."""


def _unique_names(_instance: object, attribute: attrs.Attribute, value: tuple[str, ...]) -> None:
    if not value:
        raise ValueError(f"{attribute.name} must name at least one replica")
    if len(set(value)) != len(value):
        raise ValueError(f"{attribute.name} has duplicates: {list(value)!r}")


@attrs.frozen(kw_only=True)
class ReplicaReport:
    """What one replica reports to the router before a decision."""

    name: str
    queued_prefill_tokens: int = attrs.field(validator=_non_negative_int)
    """Prompt tokens admitted and not computed yet."""
    running_requests: int = attrs.field(validator=_non_negative_int)
    waiting_requests: int = attrs.field(default=0, validator=_non_negative_int)
    decode_context_tokens: int = attrs.field(default=0, validator=_non_negative_int)
    """KV tokens of the running requests (what each decode step reads)."""
    queued_prefill_deadlines: tuple[tuple[float, int], ...] | None = attrs.field(
        default=None, converter=attrs.converters.optional(tuple))
    """``(first-token deadline, prefill tokens left)`` of each queued request, where the
    replica serves prefill earliest deadline first; None: first come, first served (all of
    ``queued_prefill_tokens`` is ahead of a new request)."""
    prefilling_requests: int = attrs.field(default=0, validator=_non_negative_int)
    """Admitted requests with prefill left (they join the decode batch when it is done)."""
    prefilling_prompt_tokens: int = attrs.field(default=0, validator=_non_negative_int)
    """Their prompt tokens (the context their decodes will read)."""
    kv_usage: float = attrs.field(default=0.0, validator=fraction)
    kv_capacity_tokens: int = attrs.field(validator=_positive_int)
    token_budget: int = attrs.field(validator=_positive_int)
    """Tokens one engine step schedules at most (``max_num_batched_tokens``)."""
    step_model: StepTimeModel | None = None
    """The replica's learned step model (`OnlineStepTimeModel.model`); None: it learns none."""
    recent_step_s: float | None = None
    """The replica's recent step time (`OnlineStepTimeModel.recent_step_s`)."""
    ttft_headroom: float | None = attrs.field(
        default=None, validator=attrs.validators.optional(finite_positive))
    """Share of a TTFT target the replica's own admission lets a prediction use now
    (`SLOAdmissionStats.headroom`); None: it reports none."""
    tpot_headroom: float | None = attrs.field(
        default=None, validator=attrs.validators.optional(finite_positive))
    """The same for TPOT targets (`SLOAdmissionStats.tpot_headroom`)."""
    accepting: bool = True
    """False while draining or unhealthy: nothing is routed there."""

    @property
    def ongoing_requests(self) -> int:
        """Requests waiting or running."""
        return self.running_requests + self.waiting_requests


@attrs.frozen(kw_only=True)
class ClusterRequest:
    """One request as the router sees it (times in seconds on the router's clock)."""

    request_id: str
    arrival_s: float = attrs.field(validator=finite_non_negative)
    prompt_tokens: int = attrs.field(validator=_positive_int)
    block_keys: tuple[Hashable, ...] = attrs.field(default=(), converter=tuple)
    """Chained keys of the prompt's full blocks (`chain_keys`)."""
    session_id: str | None = None
    tenant: str = DEFAULT_TENANT
    ttft_s: float | None = None
    """First-token target of the request's class (None: no target, always feasible)."""
    tpot_s: float | None = None
    demote_ttft_s: float | None = None
    """First-token target of the lower class its tenant accepts instead of a rejection."""


@attrs.frozen(kw_only=True)
class ClusterDecision:
    """A routing decision: the replica (None: rejected at the router) and why."""

    request_id: str
    replica: str | None
    cause: RouteCause
    cached_tokens: int = 0
    """Prompt tokens the router expects the replica to hold already."""
    predicted_ttft_s: float | None = None
    """`SLORouter`: the predicted first token, from arrival."""
    retry_after_s: float | None = None
    """Set on a rejection: when the client may try again."""

    @property
    def accepted(self) -> bool:
        """Whether the request goes to a replica."""
        return self.replica is not None


@attrs.frozen(kw_only=True)
class ClusterRouterStats:
    """Counters of one router.

    ``routed`` + ``rejected`` = calls to `route` and `retry`; ``by_cause`` splits them.
    ``retries`` counts `retry` calls, ``retries_placed`` those that found a replica.
    """

    routed: int
    rejected: int
    by_cause: Mapping[str, int]
    retries: int
    retries_placed: int
    sessions: int
    by_replica: Mapping[str, int]


@attrs.define(eq=False, kw_only=True)
class _ClusterRouter:
    """Shared bookkeeping: validation, counters, the prefix index and session pins."""

    replicas: tuple[str, ...] = attrs.field(converter=tuple, validator=_unique_names)
    block_size_tokens: int = attrs.field(default=16, validator=_positive_int)
    """Tokens per block key of `ClusterRequest.block_keys`."""
    index_capacity_blocks: int = attrs.field(default=100_000, validator=_positive_int)
    """Blocks the prefix index remembers per replica (its KV cache, in blocks)."""
    max_sessions: int = attrs.field(default=100_000, validator=_positive_int)
    """Session pins remembered (least recently used forgotten first)."""
    _index: PrefixIndex = attrs.field(init=False, repr=False)
    _sessions: OrderedDict[str, str] = attrs.field(init=False, repr=False, factory=OrderedDict)
    _causes: Counter[RouteCause] = attrs.field(init=False, repr=False, factory=Counter)
    _by_replica: Counter[str] = attrs.field(init=False, repr=False, factory=Counter)
    _retries: int = attrs.field(init=False, default=0, repr=False)
    _retries_placed: int = attrs.field(init=False, default=0, repr=False)

    def __attrs_post_init__(self) -> None:
        self._index = PrefixIndex(capacity_blocks=self.index_capacity_blocks)

    def route(self, request: ClusterRequest, reports: Mapping[str, ReplicaReport],
              now: float) -> ClusterDecision:
        """The replica for ``request`` (or a rejection), from every replica's report at ``now``.

        Raises:
            KeyError: when ``reports`` lacks one of `replicas`.
        """
        candidates = self._accepting(reports)
        if not candidates:
            return self._record(request, ClusterDecision(
                request_id=request.request_id, replica=None, cause=RouteCause.NO_REPLICA))
        return self._record(request, self._choose(request, candidates, now))

    def retry(self, request: ClusterRequest, reports: Mapping[str, ReplicaReport], now: float,
              *, rejected_by: str) -> ClusterDecision:
        """After ``rejected_by`` refused ``request``: this router passes the rejection on."""
        self._retries += 1
        return self._record(request, ClusterDecision(
            request_id=request.request_id, replica=None, cause=RouteCause.NO_RETRY))

    def _choose(self, request: ClusterRequest, candidates: list[ReplicaReport],
                now: float) -> ClusterDecision:
        raise NotImplementedError

    def _accepting(self, reports: Mapping[str, ReplicaReport]) -> list[ReplicaReport]:
        out = []
        for name in self.replicas:
            try:
                report = reports[name]
            except KeyError:
                raise KeyError(f"reports has no entry for replica {name!r}") from None
            if report.accepting:
                out.append(report)
        return out

    def _cached_tokens(self, request: ClusterRequest) -> dict[str, int]:
        """Prompt tokens each replica is expected to hold (the last token is always computed)."""
        matched = self._index.match(request.block_keys) if request.block_keys else {}
        return {name: min(blocks * self.block_size_tokens, request.prompt_tokens - 1)
                for name, blocks in matched.items()}

    def _session_replica(self, request: ClusterRequest) -> str | None:
        if request.session_id is None:
            return None
        return self._sessions.get(request.session_id)

    def _record(self, request: ClusterRequest, decision: ClusterDecision, *,
                remember: bool = True) -> ClusterDecision:
        """Count ``decision``; with ``remember``, the replica now holds the prompt and the
        session."""
        self._causes[decision.cause] += 1
        if decision.replica is not None:
            self._by_replica[decision.replica] += 1
            if not remember:
                return decision
            if request.block_keys:
                self._index.insert((decision.replica,), request.block_keys)
            if request.session_id is not None:
                self._sessions[request.session_id] = decision.replica
                self._sessions.move_to_end(request.session_id)
                while len(self._sessions) > self.max_sessions:
                    self._sessions.popitem(last=False)
        return decision

    def stats(self) -> ClusterRouterStats:
        """A snapshot of the counters."""
        rejected = sum(n for cause, n in self._causes.items() if cause in _REJECTIONS)
        return ClusterRouterStats(
            routed=sum(self._causes.values()) - rejected, rejected=rejected,
            by_cause=MappingProxyType({c.value: n for c, n in sorted(
                self._causes.items(), key=lambda item: item[0].value)}),
            retries=self._retries, retries_placed=self._retries_placed,
            sessions=len(self._sessions), by_replica=MappingProxyType(dict(self._by_replica)))

    def check_invariants(self) -> None:
        """Counts agree, pins name known replicas, the index is consistent."""
        assert sum(self._by_replica.values()) == sum(
            n for cause, n in self._causes.items() if cause not in _REJECTIONS)
        assert set(self._by_replica) <= set(self.replicas)
        assert set(self._sessions.values()) <= set(self.replicas)
        assert len(self._sessions) <= self.max_sessions
        assert 0 <= self._retries_placed <= self._retries
        self._index.check_invariants()


_REJECTIONS = frozenset({RouteCause.NO_FEASIBLE, RouteCause.NO_REPLICA, RouteCause.NO_RETRY})


def _least_loaded(candidates: Sequence[ReplicaReport]) -> ReplicaReport:
    """Fewest ongoing requests, then fewest queued prefill tokens, then first listed."""
    return min(candidates, key=lambda r: (r.ongoing_requests, r.queued_prefill_tokens))


@attrs.define(eq=False, kw_only=True)
class RoundRobinReplicas(_ClusterRouter):
    """Each accepting replica in turn, whatever its load or cache."""

    _next: int = attrs.field(init=False, default=0, repr=False)

    def _choose(self, request: ClusterRequest, candidates: list[ReplicaReport],
                now: float) -> ClusterDecision:
        report = candidates[self._next % len(candidates)]
        self._next += 1
        return ClusterDecision(request_id=request.request_id, replica=report.name,
                               cause=RouteCause.ROUND_ROBIN)


@attrs.define(eq=False, kw_only=True)
class PowerOfTwoReplicas(_ClusterRouter):
    """Ray Serve's default: of two random accepting replicas, the one with fewer ongoing
    requests (ties: the first draw). Deterministic given ``rng``."""

    rng: random.Random = attrs.field(factory=lambda: random.Random(0))

    def _choose(self, request: ClusterRequest, candidates: list[ReplicaReport],
                now: float) -> ClusterDecision:
        if len(candidates) == 1:
            chosen = candidates[0]
        else:
            first, second = self.rng.sample(candidates, 2)
            chosen = second if second.ongoing_requests < first.ongoing_requests else first
        return ClusterDecision(request_id=request.request_id, replica=chosen.name,
                               cause=RouteCause.LEAST_LOADED)


@attrs.define(eq=False, kw_only=True)
class KVOverlapReplicas(_ClusterRouter):
    """Dynamo's KV router, aggregated: the lowest ``overlap_weight * (queued prefill tokens +
    uncached prompt tokens) / block + kv_usage * capacity blocks``; ties at random."""

    overlap_weight: float = attrs.field(default=1.0, validator=finite_non_negative)
    """Dynamo's ``--kv-overlap-score-weight``."""
    rng: random.Random = attrs.field(factory=lambda: random.Random(0))

    def cost(self, report: ReplicaReport, prompt_tokens: int, cached_tokens: int) -> float:
        """The replica's cost logit for this prompt (lower is better)."""
        uncached = prompt_tokens - cached_tokens
        return (self.overlap_weight * (report.queued_prefill_tokens + uncached)
                + report.kv_usage * report.kv_capacity_tokens) / self.block_size_tokens

    def _choose(self, request: ClusterRequest, candidates: list[ReplicaReport],
                now: float) -> ClusterDecision:
        cached = self._cached_tokens(request)
        costs = [self.cost(r, request.prompt_tokens, cached.get(r.name, 0)) for r in candidates]
        lowest = min(costs)
        chosen = self.rng.choice([r for r, c in zip(candidates, costs, strict=True)
                                  if c == lowest])
        hit = cached.get(chosen.name, 0)
        return ClusterDecision(request_id=request.request_id, replica=chosen.name,
                               cause=RouteCause.CACHE if hit else RouteCause.LEAST_LOADED,
                               cached_tokens=hit)


@attrs.define(eq=False, kw_only=True)
class SessionStickyReplicas(_ClusterRouter):
    """A session stays on its first call's replica while that replica accepts; a new session
    (or a call without one) goes to the least loaded replica."""

    def _choose(self, request: ClusterRequest, candidates: list[ReplicaReport],
                now: float) -> ClusterDecision:
        pinned = self._session_replica(request)
        cached = self._cached_tokens(request)
        for report in candidates:
            if report.name == pinned:
                return ClusterDecision(request_id=request.request_id, replica=pinned,
                                       cause=RouteCause.SESSION,
                                       cached_tokens=cached.get(pinned, 0))
        chosen = _least_loaded(candidates).name
        return ClusterDecision(request_id=request.request_id, replica=chosen,
                               cause=RouteCause.LEAST_LOADED, cached_tokens=cached.get(chosen, 0))


@attrs.define(eq=False, kw_only=True)
class StickyUntilSaturated(_ClusterRouter):
    """llm-d's default: the replica with the longest cached prefix until its queued prefill
    tokens reach ``saturation_tokens``, then (and with no hit) the lowest token load."""

    saturation_tokens: int = attrs.field(validator=_positive_int)
    """The calibrated token-load limit (e.g. one second of the replica's prefill throughput)."""

    def _choose(self, request: ClusterRequest, candidates: list[ReplicaReport],
                now: float) -> ClusterDecision:
        cached = self._cached_tokens(request)
        warm = [r for r in candidates if cached.get(r.name, 0) > 0
                and r.queued_prefill_tokens < self.saturation_tokens]
        if warm:
            chosen = max(warm, key=lambda r: (cached[r.name], -r.queued_prefill_tokens)).name
            return ClusterDecision(request_id=request.request_id, replica=chosen,
                                   cause=RouteCause.CACHE, cached_tokens=cached[chosen])
        chosen = min(candidates, key=lambda r: (r.queued_prefill_tokens,
                                                r.ongoing_requests)).name
        return ClusterDecision(request_id=request.request_id, replica=chosen,
                               cause=RouteCause.LEAST_LOADED, cached_tokens=cached.get(chosen, 0))


@attrs.define(eq=False, kw_only=True)
class SLORouter(_ClusterRouter):
    """Routes where the request's first token is predicted on time; rejects when nowhere is.

    Guarantees:
        * A request is sent only to a replica whose predicted TTFT (from arrival, the time
          already spent included) is within ``headroom`` times its target (its declared lower
          class's, when demoted), and whose predicted TPOT is within its TPOT target; a
          request with no TTFT target is always feasible.
        * With ``keep_sessions``, a call whose session's replica accepts is placed there or
          nowhere (a retry may still go elsewhere).
        * Among feasible replicas: the session's replica first (its cache holds the session's
          context), then the earliest predicted first token (which counts each replica's
          cached prefix of the prompt), then the order of `replicas`.
        * Every rejection carries ``retry_after_s`` in ``[min_retry_after_s,
          max_retry_after_s]``: the least predicted lateness over the accepting replicas.
        * `retry` places a request at most once, on another replica, under the same test;
          the session stays pinned where it was.
        * A replica that reports its own admission's headrooms (``ttft_headroom``,
          ``tpot_headroom``) is judged with them instead of ``headroom`` and 1, so that what
          the router sends there passes the replica's own test as far as the prediction goes.

    The prediction: the replica's queued prefill tokens plus this prompt's uncached ones
    (in context-free tokens, `StepTimeModel.prefill_token_equivalents`), at the prefill rate
    a step of ``token_budget`` tokens beside the running decodes reaches
    (`StepTimeModel.prefill_tokens_per_s`), plus one step. A replica that reports no model
    is predicted with ``fallback_model``.
    """

    headroom: float = attrs.field(default=0.9, validator=fraction)
    """Share of the TTFT target a prediction may use (the rest absorbs prediction error), for
    replicas that report no headroom of their own."""
    fallback_model: StepTimeModel = CONSERVATIVE_PRIOR
    min_retry_after_s: float = attrs.field(default=0.5, validator=finite_positive)
    max_retry_after_s: float = attrs.field(default=30.0, validator=finite_positive)
    keep_sessions: bool = False
    """A session whose replica accepts stays there: when that replica cannot meet the
    deadline the call is rejected (or demoted) instead of moved to a replica without the
    session's context. Default: moved to the earliest feasible replica."""
    _retried: set[str] = attrs.field(init=False, factory=set, repr=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        if self.min_retry_after_s > self.max_retry_after_s:
            raise ValueError(f"min_retry_after_s ({self.min_retry_after_s}) must be <= "
                             f"max_retry_after_s ({self.max_retry_after_s})")

    def predict_ttft_s(self, request: ClusterRequest, report: ReplicaReport, cached_tokens: int,
                       now: float) -> float:
        """Seconds from ``request``'s arrival to its first token if sent to ``report`` now:
        the queued prefill ahead of it (all of it, or on an earliest-deadline-first replica
        what is due no later) and its own, at the replica's prefill rate, plus one step."""
        model = report.step_model or self.fallback_model
        uncached = request.prompt_tokens - cached_tokens
        ahead = report.queued_prefill_tokens
        if report.queued_prefill_deadlines is not None and request.ttft_s is not None:
            due = request.arrival_s + request.ttft_s
            ahead = sum(t for d, t in report.queued_prefill_deadlines if d <= due)
        work = ahead + model.prefill_token_equivalents(uncached, cached_tokens)
        rate = model.prefill_tokens_per_s(report.running_requests, report.token_budget,
                                          report.decode_context_tokens)
        step = model.step_s(report.running_requests, min(report.token_budget, uncached),
                            report.decode_context_tokens, cached_tokens)
        return max(0.0, now - request.arrival_s) + work / rate + step

    def predict_tpot_s(self, request: ClusterRequest, report: ReplicaReport) -> float:
        """Seconds per output token once ``request`` decodes there: the recent step plus the
        decodes it and the requests still in prefill there add (with nothing running or no
        recent step reported, one step of all of them beside the running decodes)."""
        model = report.step_model or self.fallback_model
        joining = report.prefilling_requests + 1
        context = report.prefilling_prompt_tokens + request.prompt_tokens
        if report.recent_step_s is not None and report.running_requests:
            return report.recent_step_s + model.decode_s(context, joining)
        return model.step_s(report.running_requests + joining, 0,
                            report.decode_context_tokens + context)

    def _choose(self, request: ClusterRequest, candidates: list[ReplicaReport],
                now: float) -> ClusterDecision:
        return self._place(request, candidates, now, retry=False)

    def retry(self, request: ClusterRequest, reports: Mapping[str, ReplicaReport], now: float,
              *, rejected_by: str) -> ClusterDecision:
        """Place ``request`` on another replica after ``rejected_by`` refused it: once per
        request, only where its deadline is still predicted met.

        Raises:
            KeyError: when ``reports`` lacks one of `replicas`, or ``rejected_by`` is unknown.
        """
        if rejected_by not in self.replicas:
            raise KeyError(f"rejected_by {rejected_by!r} is not one of {list(self.replicas)!r}")
        self._retries += 1
        if request.request_id in self._retried:
            return self._record(request, ClusterDecision(
                request_id=request.request_id, replica=None, cause=RouteCause.NO_RETRY))
        self._retried.add(request.request_id)
        others = [r for r in self._accepting(reports) if r.name != rejected_by]
        if not others:
            return self._record(request, ClusterDecision(
                request_id=request.request_id, replica=None, cause=RouteCause.NO_REPLICA))
        decision = self._place(request, others, now, retry=True)
        self._retries_placed += decision.accepted
        # The session's context stays where its earlier calls ran, and a replica that refused
        # once may refuse again: a retry moves neither the session nor the expected cache.
        return self._record(request, decision, remember=False)

    def forget(self, request_id: str) -> None:
        """``request_id`` is finished: it no longer counts against its single retry."""
        self._retried.discard(request_id)

    def _place(self, request: ClusterRequest, candidates: list[ReplicaReport], now: float, *,
               retry: bool) -> ClusterDecision:
        cached = self._cached_tokens(request)
        pinned = self._session_replica(request)
        if self.keep_sessions and not retry and any(r.name == pinned for r in candidates):
            candidates = [r for r in candidates if r.name == pinned]
        predicted = {r.name: self.predict_ttft_s(request, r, cached.get(r.name, 0), now)
                     for r in candidates}
        if request.ttft_s is None:
            feasible = list(candidates)
        else:
            feasible = self._feasible(request, candidates, predicted, request.ttft_s)
        demoted = False
        if not feasible and request.demote_ttft_s is not None:
            feasible = self._feasible(request, candidates, predicted, request.demote_ttft_s)
            demoted = bool(feasible)
        if not feasible:
            late = min(predicted[r.name] - self._ttft_share(r) * request.ttft_s
                       for r in candidates)
            retry_after = min(max(late, self.min_retry_after_s), self.max_retry_after_s)
            return ClusterDecision(request_id=request.request_id, replica=None,
                                   cause=RouteCause.NO_FEASIBLE, retry_after_s=retry_after,
                                   predicted_ttft_s=min(predicted.values()))
        order = {name: i for i, name in enumerate(self.replicas)}
        chosen = min(feasible, key=lambda r: (r.name != pinned, predicted[r.name],
                                              order[r.name]))
        name = chosen.name
        if retry:
            cause = RouteCause.RETRIED
        elif demoted:
            cause = RouteCause.DEMOTED
        elif name == pinned:
            cause = RouteCause.SESSION
        elif cached.get(name, 0):
            cause = RouteCause.CACHE
        else:
            cause = RouteCause.FEASIBLE
        return ClusterDecision(request_id=request.request_id, replica=name, cause=cause,
                               cached_tokens=cached.get(name, 0),
                               predicted_ttft_s=predicted[name])

    def _ttft_share(self, report: ReplicaReport) -> float:
        return self.headroom if report.ttft_headroom is None else report.ttft_headroom

    def _feasible(self, request: ClusterRequest, candidates: list[ReplicaReport],
                  predicted: Mapping[str, float], ttft_s: float) -> list[ReplicaReport]:
        return [r for r in candidates if predicted[r.name] <= self._ttft_share(r) * ttft_s and (
            request.tpot_s is None
            or self.predict_tpot_s(request, r) <= (r.tpot_headroom or 1.0) * request.tpot_s)]

    def check_invariants(self) -> None:
        """The base invariants; retried requests are no more than retries."""
        super().check_invariants()
        assert len(self._retried) <= self._retries
