"""`DeadlineTest`: a request's first token and decode pace on a replica, from its report."""

from __future__ import annotations

import math

import attrs

from policies.cluster_routing.reports import ClusterRequest, ReplicaReport
from policies.step_model import CONSERVATIVE_PRIOR, StepTimeModel
from policies.validators import fraction


@attrs.frozen(kw_only=True)
class DeadlineTest:
    """Predicts a request's TTFT and TPOT on a replica from its `ReplicaReport`, and whether
    they meet the request's targets.

    The TTFT: the replica's queued prefill tokens ahead of the request plus its uncached ones
    (in context-free tokens, `StepTimeModel.prefill_token_equivalents`), at the prefill rate a
    step of ``token_budget`` tokens beside the running decodes reaches
    (`StepTimeModel.prefill_tokens_per_s`), plus one step. A replica that reports no model is
    predicted with ``fallback_model``.

    A replica's reported headrooms and TPOT bound hold while it is busy. An idle replica
    (nothing running, waiting or queued there, none sent since its report) is judged with
    ``headroom`` and the request's own TPOT target instead: its headrooms are corrected only
    by the requests it decides on, so a router that judged it by the headroom an overload
    left it would never send it the requests that raise it again.
    """

    headroom: float = attrs.field(default=0.9, validator=fraction)
    """Share of the TTFT target a prediction may use (the rest absorbs prediction error), for
    replicas that report no headroom of their own."""
    fallback_model: StepTimeModel = CONSERVATIVE_PRIOR

    def predict_ttft_s(self, request: ClusterRequest, report: ReplicaReport,
                       cached_tokens: int, now: float, *, rate_share: float = 1.0) -> float:
        """Seconds from ``request``'s arrival to its first token if sent to ``report`` now:
        the queued prefill ahead of it (all of it, or on an earliest-deadline-first replica
        what is due no later) and its own, at ``rate_share`` of the replica's prefill rate
        (a tenant over its fair share is planned on part of it), plus one step."""
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
        return max(0.0, now - request.arrival_s) + work / (rate * rate_share) + step

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

    def ttft_share(self, report: ReplicaReport) -> float:
        """The share of a TTFT target a prediction may use on ``report``'s replica: the
        headroom its own admission reports while it is busy, else ``headroom``."""
        if report.ttft_headroom is None or _idle(report):
            return self.headroom
        return report.ttft_headroom

    def meets(self, request: ClusterRequest, report: ReplicaReport, predicted_ttft_s: float,
              ttft_s: float) -> bool:
        """Whether ``predicted_ttft_s`` is within the replica's share of ``ttft_s`` and the
        predicted TPOT within its share of the tighter of the request's TPOT target (if any)
        and the replica's bound for the classes decoding there (``tpot_bound_s``, which its
        own admission holds every classed request to), both as reported while it is busy."""
        if predicted_ttft_s > self.ttft_share(report) * ttft_s:
            return False
        if _idle(report):
            bound, tpot_share = request.tpot_s or math.inf, 1.0
        else:
            bound = min(request.tpot_s or math.inf, report.tpot_bound_s or math.inf)
            tpot_share = report.tpot_headroom or 1.0
        return math.isinf(bound) or self.predict_tpot_s(request, report) <= tpot_share * bound

    def has_room(self, request: ClusterRequest, report: ReplicaReport, now: float, *,
                 rate_share: float = 1.0) -> bool:
        """Whether ``report``'s replica accepts and is predicted to meet ``request``'s targets
        with none of its prompt cached, on ``rate_share`` of its prefill rate (a request
        without a TTFT target fits any accepting replica)."""
        if not report.accepting:
            return False
        if request.ttft_s is None:
            return True
        return self.meets(request, report, self.predict_ttft_s(
            request, report, 0, now, rate_share=rate_share), request.ttft_s)


def _idle(report: ReplicaReport) -> bool:
    """Nothing running, waiting or queued on ``report``'s replica."""
    return report.running_requests == 0 and report.waiting_requests == 0 and (
        report.queued_prefill_tokens == 0)
