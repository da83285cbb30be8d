"""`SLORouter`: routes where the request's first token is predicted on time."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from policies.cluster_routing.base import ClusterRouter
from policies.cluster_routing.prediction import DeadlineTest
from policies.cluster_routing.reports import (
    ClusterDecision,
    ClusterRequest,
    ClusterRouterStats,
    ReplicaReport,
    RouteCause,
)
from policies.output_lengths import OutputLengths
from policies.slo.fairness import ClassFairShare
from policies.step_model import CONSERVATIVE_PRIOR, StepTimeModel
from policies.validators import finite_positive, fraction

UNCLASSED = ""
"""The `ClassFairShare` class of requests whose ``slo_class`` is None."""


@attrs.define(eq=False, kw_only=True)
class SLORouter(ClusterRouter):
    """Routes where the request's first token is predicted on time; rejects when nowhere is.

    Guarantees:
        * A request is sent only to a replica whose predicted TTFT (from arrival, the time
          already spent included) is within ``headroom`` times its target (its declared lower
          class's, when demoted), and whose predicted TPOT is within its TPOT target and
          the bound the replica reports for the classes decoding there (with
          ``keep_sessions``, only where the replicas judge nothing themselves: see below); a
          request with no TTFT target is always feasible.
        * With ``keep_sessions``, a call whose session's replica accepts is placed there or
          nowhere, and a session's call refused by a replica is passed on, never moved
          (moving re-prefills its whole context on a replica that holds none of it). Where
          the replicas report their own SLO admission (``ttft_headroom``), the router does
          not reject on its prediction: a call predicted late is sent all the same
          (`RouteCause.DEFERRED`), to its session's replica or, for a new session, the one
          predicted earliest, and that replica's admission, which sees its cache exactly,
          decides.
        * Among feasible replicas: the session's replica first (its cache holds the session's
          context), then the earliest predicted first token (which counts each replica's
          cached prefix of the prompt), then the order of `replicas`.
        * Every rejection carries ``retry_after_s`` in ``[min_retry_after_s,
          max_retry_after_s]``: the least predicted lateness over the accepting replicas.
        * `retry` places a request at most once, on another replica, under the same test;
          the session stays pinned where it was.
        * A busy replica that reports its own admission's headrooms (``ttft_headroom``,
          ``tpot_headroom``) is judged with them instead of ``headroom`` and 1, so that what
          the router sends there passes the replica's own test as far as the prediction goes;
          an idle one with ``headroom`` and the request's own TPOT target
          (`DeadlineTest`).
        * With ``fairness``, tenants share each class across the cluster by weight: every
          request routed is charged to its tenant (`ClassFairShare.on_admitted`) its uncached
          prefill (on the chosen replica) plus its expected decode (the recent finished
          requests' mean), replaced by what it generated in `on_finished`. A request of a
          tenant over its weighted share among the class's active tenants is predicted on
          `ClassFairShare.share` of each replica's prefill rate, so when the replicas fill
          up it is refused (or demoted) first and the room left goes to the tenants under
          their shares. Work-conserving: a tenant alone in its class, or under its share, is
          planned on the whole rate.

    The prediction is `DeadlineTest`'s (with ``headroom`` and ``fallback_model``).
    """

    headroom: float = attrs.field(default=0.9, validator=fraction)
    """Share of the TTFT target a prediction may use (the rest absorbs prediction error), for
    replicas that report no headroom of their own."""
    fallback_model: StepTimeModel = CONSERVATIVE_PRIOR
    min_retry_after_s: float = attrs.field(default=0.5, validator=finite_positive)
    max_retry_after_s: float = attrs.field(default=30.0, validator=finite_positive)
    keep_sessions: bool = False
    """A session whose replica accepts stays there, even on a retry; calls are judged by
    the replicas' own admission where they have one (else by the prediction: rejected or
    demoted when late). Default: a call is moved to the earliest feasible replica, and the
    router rejects what no replica is predicted to serve on time."""
    fairness: ClassFairShare | None = None
    """The tenants' weights and charges across the cluster (the ``slo`` declaration's
    ``fairness``, `SLOSpec.fairness_weights`); None: no tenant is weighed."""
    _outputs: OutputLengths = attrs.field(init=False, factory=OutputLengths, repr=False)
    _expected: dict[str, float] = attrs.field(init=False, factory=dict, repr=False)
    """Request id -> the decode it was charged on routing, until it finishes."""
    _over_share_routed: int = attrs.field(init=False, default=0, repr=False)
    _over_share_rejected: int = attrs.field(init=False, default=0, repr=False)
    _retried: set[str] = attrs.field(init=False, factory=set, repr=False)
    _test: DeadlineTest = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._test = DeadlineTest(headroom=self.headroom, fallback_model=self.fallback_model)
        if self.min_retry_after_s > self.max_retry_after_s:
            raise ValueError(f"min_retry_after_s ({self.min_retry_after_s}) must be <= "
                             f"max_retry_after_s ({self.max_retry_after_s})")

    def predict_ttft_s(self, request: ClusterRequest, report: ReplicaReport, cached_tokens: int,
                       now: float) -> float:
        """`DeadlineTest.predict_ttft_s` with this router's fallback model."""
        return self._test.predict_ttft_s(request, report, cached_tokens, now)

    def predict_tpot_s(self, request: ClusterRequest, report: ReplicaReport) -> float:
        """`DeadlineTest.predict_tpot_s` with this router's fallback model."""
        return self._test.predict_tpot_s(request, report)

    def fair_rate_share(self, request: ClusterRequest, now: float) -> float:
        """The share of a replica's prefill rate ``request`` is planned on:
        `ClassFairShare.share` of its tenant in its class (1 without ``fairness``)."""
        if self.fairness is None:
            return 1.0
        return self.fairness.share(request.tenant, request.slo_class or UNCLASSED, now)

    def _choose(self, request: ClusterRequest, candidates: list[ReplicaReport],
                now: float) -> ClusterDecision:
        share = self.fair_rate_share(request, now)
        decision = self._place(request, candidates, now, retry=False, rate_share=share)
        if share < 1.0:
            self._over_share_routed += decision.accepted
            self._over_share_rejected += not decision.accepted
        if decision.accepted and self.fairness is not None:
            expected = self._expected[request.request_id] = self._outputs.remaining(0)
            self.fairness.on_admitted(
                request.request_id, request.tenant, request.slo_class or UNCLASSED,
                request.prompt_tokens - decision.cached_tokens, expected, now)
        return decision

    def on_finished(self, request_id: str, output_tokens: int | None, now: float) -> None:
        """``request_id`` ended: its tenant's expected decode charge becomes
        ``output_tokens`` (None: not known, the expected charge stays), which the expected
        output of later requests learns from, and it no longer counts against its single
        retry."""
        expected = self._expected.pop(request_id, None)
        if output_tokens is not None:
            self._outputs.observe(output_tokens)
        if self.fairness is not None and expected is not None:
            self.fairness.on_finished(
                request_id, expected if output_tokens is None else output_tokens, now)
        self.forget(request_id)

    def retry(self, request: ClusterRequest, reports: Mapping[str, ReplicaReport], now: float,
              *, rejected_by: str) -> ClusterDecision:
        """Place ``request`` on another replica after ``rejected_by`` refused it: once per
        request, only where its deadline is still predicted met, and never a session's
        call with ``keep_sessions``.

        Raises:
            KeyError: when ``reports`` lacks one of `replicas`, or ``rejected_by`` is unknown.
        """
        if rejected_by not in self.replicas:
            raise KeyError(f"rejected_by {rejected_by!r} is not one of {list(self.replicas)!r}")
        self._retries += 1
        if request.request_id in self._retried or (
                self.keep_sessions and self._session_replica(request) is not None):
            return self._passed_on(request, reports, now, rejected_by, ClusterDecision(
                request_id=request.request_id, replica=None, cause=RouteCause.NO_RETRY))
        self._retried.add(request.request_id)
        others = [r for r in self._accepting(reports) if r.name != rejected_by]
        if not others:
            return self._passed_on(request, reports, now, rejected_by, ClusterDecision(
                request_id=request.request_id, replica=None, cause=RouteCause.NO_REPLICA))
        decision = self._place(request, others, now, retry=True,
                               rate_share=self.fair_rate_share(request, now))
        if not decision.accepted:
            return self._passed_on(request, reports, now, rejected_by, decision)
        self._retries_placed += 1
        # The session's context stays where its earlier calls ran, and a replica that refused
        # once may refuse again: a retry moves neither the session nor the expected cache.
        return self._record(request, decision, remember=False)

    def forget(self, request_id: str) -> None:
        """``request_id`` is finished: it no longer counts against its single retry."""
        self._retried.discard(request_id)

    def _place(self, request: ClusterRequest, candidates: list[ReplicaReport], now: float, *,
               retry: bool, rate_share: float) -> ClusterDecision:
        cached = self._cached_tokens(request)
        pinned = self._session_replica(request)
        order = {name: i for i, name in enumerate(self.replicas)}
        if self.keep_sessions and not retry and any(r.name == pinned for r in candidates):
            candidates = [r for r in candidates if r.name == pinned]
        predicted = {r.name: self._test.predict_ttft_s(request, r, cached.get(r.name, 0), now,
                                                       rate_share=rate_share)
                     for r in candidates}
        if request.ttft_s is None:
            feasible = list(candidates)
        else:
            feasible = self._feasible(request, candidates, predicted, request.ttft_s)
        demoted = False
        if not feasible and request.demote_ttft_s is not None:
            feasible = self._feasible(request, candidates, predicted, request.demote_ttft_s)
            demoted = bool(feasible)
        judged = [] if feasible or retry or not self.keep_sessions else [
            r for r in candidates if r.ttft_headroom is not None]
        if judged:
            name = min(judged, key=lambda r: (predicted[r.name], order[r.name])).name
            return ClusterDecision(request_id=request.request_id, replica=name,
                                   cause=RouteCause.DEFERRED, cached_tokens=cached.get(name, 0),
                                   predicted_ttft_s=predicted[name])
        if not feasible:
            late = min(predicted[r.name] - self._test.ttft_share(r) * request.ttft_s
                       for r in candidates)
            retry_after = min(max(late, self.min_retry_after_s), self.max_retry_after_s)
            return ClusterDecision(request_id=request.request_id, replica=None,
                                   cause=RouteCause.NO_FEASIBLE, retry_after_s=retry_after,
                                   predicted_ttft_s=min(predicted.values()))
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

    def _feasible(self, request: ClusterRequest, candidates: list[ReplicaReport],
                  predicted: Mapping[str, float], ttft_s: float) -> list[ReplicaReport]:
        return [r for r in candidates if self._test.meets(request, r, predicted[r.name], ttft_s)]

    def room_test(self) -> DeadlineTest:
        """This router's own deadline test."""
        return self._test

    def stats(self) -> ClusterRouterStats:
        """The base counters and the requests of tenants over their share, routed and
        rejected (the charges themselves: ``fairness.stats()``)."""
        return attrs.evolve(super().stats(), over_share_routed=self._over_share_routed,
                            over_share_rejected=self._over_share_rejected)

    def check_invariants(self) -> None:
        """The base invariants; retried requests are no more than retries; over-share
        decisions are no more than the decisions; the fair share's own invariants."""
        super().check_invariants()
        assert len(self._retried) <= self._retries
        assert self._over_share_routed + self._over_share_rejected <= sum(self._causes.values())
        assert len(self._expected) <= sum(self._by_replica.values())
        if self.fairness is not None:
            self.fairness.check_invariants()
