"""`SLORouter`: routes where the request's first token is predicted on time."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from policies.cluster_routing.base import ClusterRouter
from policies.cluster_routing.prediction import DeadlineTest
from policies.cluster_routing.reports import (
    ClusterDecision,
    ClusterRequest,
    ReplicaReport,
    RouteCause,
)
from policies.step_model import CONSERVATIVE_PRIOR, StepTimeModel
from policies.validators import finite_positive, fraction


@attrs.define(eq=False, kw_only=True)
class SLORouter(ClusterRouter):
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

    The prediction is `DeadlineTest`'s (with ``headroom`` and ``fallback_model``).
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
            return self._passed_on(request, reports, now, rejected_by, ClusterDecision(
                request_id=request.request_id, replica=None, cause=RouteCause.NO_RETRY))
        self._retried.add(request.request_id)
        others = [r for r in self._accepting(reports) if r.name != rejected_by]
        if not others:
            return self._passed_on(request, reports, now, rejected_by, ClusterDecision(
                request_id=request.request_id, replica=None, cause=RouteCause.NO_REPLICA))
        decision = self._place(request, others, now, retry=True)
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
            late = min(predicted[r.name] - self._test.ttft_share(r) * request.ttft_s
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

    def _feasible(self, request: ClusterRequest, candidates: list[ReplicaReport],
                  predicted: Mapping[str, float], ttft_s: float) -> list[ReplicaReport]:
        return [r for r in candidates if self._test.meets(request, r, predicted[r.name], ttft_s)]

    def room_test(self) -> DeadlineTest:
        """This router's own deadline test."""
        return self._test

    def check_invariants(self) -> None:
        """The base invariants; retried requests are no more than retries."""
        super().check_invariants()
        assert len(self._retried) <= self._retries
