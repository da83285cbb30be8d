"""The peers users pick, from their published descriptions."""

from __future__ import annotations

import random

import attrs

from policies.cluster_routing.base import ClusterRouter, least_loaded
from policies.cluster_routing.reports import *  # noqa
from policies.cluster_routing.reports import (
    ClusterDecision,
    ClusterRequest,
    ReplicaReport,
    RouteCause,
    positive_int,
)
from policies.validators import finite_non_negative


@attrs.define(eq=False, kw_only=True)
class RoundRobinReplicas(ClusterRouter):
    """Each accepting replica in turn, whatever its load or cache."""

    _next: int = attrs.field(init=False, default=0, repr=False)

    def _choose(self, request: ClusterRequest, candidates: list[ReplicaReport],
                now: float) -> ClusterDecision:
        report = candidates[self._next % len(candidates)]
        self._next += 1
        return ClusterDecision(request_id=request.request_id, replica=report.name,
                               cause=RouteCause.ROUND_ROBIN)


@attrs.define(eq=False, kw_only=True)
class PowerOfTwoReplicas(ClusterRouter):
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
class KVOverlapReplicas(ClusterRouter):
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
class SessionStickyReplicas(ClusterRouter):
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
        chosen = least_loaded(candidates).name
        return ClusterDecision(request_id=request.request_id, replica=chosen,
                               cause=RouteCause.LEAST_LOADED, cached_tokens=cached.get(chosen, 0))


@attrs.define(eq=False, kw_only=True)
class StickyUntilSaturated(ClusterRouter):
    """llm-d's default: the replica with the longest cached prefix until its queued prefill
    tokens reach ``saturation_tokens``, then (and with no hit) the lowest token load."""

    saturation_tokens: int = attrs.field(validator=positive_int)
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
