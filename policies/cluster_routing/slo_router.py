"""`SLORouter`: routes where the request's first token is predicted on time."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from policies.cluster_routing.base import ClusterRouter
from policies.cluster_routing.reports import *  # noqa
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
