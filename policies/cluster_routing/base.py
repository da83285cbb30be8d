"""`ClusterRouter`: what every cluster router shares (validation, counters, prefix index, session pins)."""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from types import MappingProxyType

import attrs

from policies.cluster_routing.prediction import DeadlineTest
from policies.cluster_routing.reports import (
    ClusterDecision,
    ClusterRequest,
    ClusterRouterStats,
    ReplicaReport,
    RouteCause,
    positive_int,
)
from policies.pd.index import PrefixIndex


def _unique_names(_instance: object, attribute: attrs.Attribute, value: tuple[str, ...]) -> None:
    if not value:
        raise ValueError(f"{attribute.name} must name at least one replica")
    if len(set(value)) != len(value):
        raise ValueError(f"{attribute.name} has duplicates: {list(value)!r}")


@attrs.define(eq=False, kw_only=True)
class ClusterRouter:
    """Shared bookkeeping: validation, counters, the prefix index and session pins."""

    replicas: tuple[str, ...] = attrs.field(converter=tuple, validator=_unique_names)
    block_size_tokens: int = attrs.field(default=16, validator=positive_int)
    """Tokens per block key of `ClusterRequest.block_keys`."""
    index_capacity_blocks: int = attrs.field(default=100_000, validator=positive_int)
    """Blocks the prefix index remembers per replica (its KV cache, in blocks)."""
    max_sessions: int = attrs.field(default=100_000, validator=positive_int)
    """Session pins remembered (least recently used forgotten first)."""
    _index: PrefixIndex = attrs.field(init=False, repr=False)
    _sessions: OrderedDict[str, str] = attrs.field(init=False, repr=False, factory=OrderedDict)
    _causes: Counter[RouteCause] = attrs.field(init=False, repr=False, factory=Counter)
    _by_replica: Counter[str] = attrs.field(init=False, repr=False, factory=Counter)
    _retries: int = attrs.field(init=False, default=0, repr=False)
    _retries_placed: int = attrs.field(init=False, default=0, repr=False)
    _rejected_with_room: int = attrs.field(init=False, default=0, repr=False)

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
        """After ``rejected_by`` refused ``request``: this router passes the rejection on
        (counted in ``rejected_with_room`` when another replica had room)."""
        self._retries += 1
        return self._passed_on(request, reports, now, rejected_by, ClusterDecision(
            request_id=request.request_id, replica=None, cause=RouteCause.NO_RETRY))

    def on_finished(self, request_id: str, output_tokens: int | None, now: float) -> None:
        """``request_id`` ended at ``now`` (any outcome) after generating ``output_tokens``
        (None: not known). Nothing to release here; a router that charges tenants settles
        the charge."""

    def fair_rate_share(self, request: ClusterRequest, now: float) -> float:
        """The share of a replica's prefill rate ``request`` is planned on: 1 (this router
        weighs no tenants)."""
        return 1.0

    def room_test(self) -> DeadlineTest:
        """The test `replica_with_room` applies (`DeadlineTest`'s defaults)."""
        return _ROOM_TEST

    def replica_with_room(self, request: ClusterRequest, reports: Mapping[str, ReplicaReport],
                          now: float, *, excluding: frozenset[str] = frozenset()) -> str | None:
        """The first of `replicas` outside ``excluding`` that accepts and is predicted
        (`room_test`, nothing of the prompt cached, on the request's `fair_rate_share`) to
        meet ``request``'s targets; None if none is. Changes nothing."""
        test = self.room_test()
        share = self.fair_rate_share(request, now)
        return next((name for name in self.replicas if name not in excluding
                     and test.has_room(request, reports[name], now, rate_share=share)), None)

    def _passed_on(self, request: ClusterRequest, reports: Mapping[str, ReplicaReport],
                   now: float, rejected_by: str, decision: ClusterDecision) -> ClusterDecision:
        """Record a retry that placed ``request`` nowhere: ``rejected_by``'s rejection reaches
        the client, counted when another replica had room."""
        if self.replica_with_room(request, reports, now,
                                  excluding=frozenset({rejected_by})) is not None:
            self._rejected_with_room += 1
        return self._record(request, decision, remember=False)

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
            rejected_with_room=self._rejected_with_room,
            sessions=len(self._sessions), by_replica=MappingProxyType(dict(self._by_replica)))

    def check_invariants(self) -> None:
        """Counts agree, pins name known replicas, the index is consistent."""
        assert sum(self._by_replica.values()) == sum(
            n for cause, n in self._causes.items() if cause not in _REJECTIONS)
        assert set(self._by_replica) <= set(self.replicas)
        assert set(self._sessions.values()) <= set(self.replicas)
        assert len(self._sessions) <= self.max_sessions
        assert 0 <= self._retries_placed <= self._retries
        assert 0 <= self._rejected_with_room <= self._retries - self._retries_placed
        self._index.check_invariants()


_ROOM_TEST = DeadlineTest()
_REJECTIONS = frozenset({RouteCause.NO_FEASIBLE, RouteCause.NO_REPLICA, RouteCause.NO_RETRY})


def least_loaded(candidates: Sequence[ReplicaReport]) -> ReplicaReport:
    """Fewest ongoing requests, then fewest queued prefill tokens, then first listed."""
    return min(candidates, key=lambda r: (r.ongoing_requests, r.queued_prefill_tokens))
