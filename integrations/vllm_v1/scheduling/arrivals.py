"""Arrivals: what a new request is admitted with (its view and rank key), the admission
gates' verdict, deadline expiry in the queue, and the rejections waiting to be reported.

`Arrivals` reads the engine's load through a function the scheduler passes in, so it runs
without a vLLM scheduler.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import attrs

from integrations.vllm_v1.metrics import PolicyMetrics
from integrations.vllm_v1.pipeline import Pipeline
from integrations.vllm_v1.rejection import Rejection
from integrations.vllm_v1.scheduling.faults import PolicyFaults
from integrations.vllm_v1.scheduling.ordering import ViewOf, sort_number
from integrations.vllm_v1.vllm_surface.names import Request
from policies import DeadlinePolicy, LoadSnapshot, RequestView, needs_of


@attrs.frozen
class Rejected:
    """A request refused (or expired) and not yet reported to its client."""

    request: Request
    rejection: Rejection


@attrs.define(eq=False, kw_only=True)
class Arrivals:
    """Admission gates (``admission``, then ``watermarks``), the rank key on admission, and
    the rejections to report with the next step's outputs.

    A raising gate admits (seam ``admission``, as stock vLLM would); a raising or invalid
    rank key falls back to the arrival time (seam ``ranking``, stock fcfs).
    """

    pipeline: Pipeline
    load_snapshot: Callable[[float], LoadSnapshot]
    """The engine's load as policies see it, at ``now``."""
    faults: PolicyFaults
    metrics: PolicyMetrics | None = None
    rejected: list[Rejected] = attrs.field(init=False, factory=list)
    """Rejections not yet reported (`take_rejected`)."""
    ranks_under_load: bool = attrs.field(init=False)
    reads_hits: bool = attrs.field(init=False)
    """Whether a policy reads the arrival's prefix-cache hit (`RequestView.cached_tokens`)."""
    deadlines: DeadlinePolicy | None = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.deadlines = self.pipeline.deadline_policy
        self.ranks_under_load = needs_of(self.pipeline.ranking).load_at_rank
        self.reads_hits = self.ranks_under_load or any(
            needs_of(p).prefix_hits for p in self.pipeline.policies)

    def verdict(self, view: RequestView, now: float) -> Rejection | None:
        """The first gate's rejection, or None: admitted (also when a gate raises)."""
        try:
            return self._gates(view, now)
        except Exception as error:  # noqa: BLE001 - contained: admitted, as stock vLLM would
            self.faults.record("admission", error)
            return None

    def _gates(self, view: RequestView, now: float) -> Rejection | None:
        gates = [g for g in (self.pipeline.admission, self.pipeline.watermarks) if g is not None]
        load = self.load_snapshot(now) if gates else None
        for gate in gates:
            decision = gate.admit(view, load)
            if not decision.admitted:
                return Rejection.from_decision(decision)
        return None

    def rank_key(self, view: RequestView, arrival_time: float, now: float) -> float:
        """The ranking policy's key for an admitted request (``arrival_time`` if it fails)."""
        try:
            return sort_number(self._rank(view, now), "rank key")
        except Exception as error:  # noqa: BLE001 - contained: arrival order (stock fcfs)
            self.faults.record("ranking", error, self.pipeline.ranking)
            return arrival_time

    def _rank(self, view: RequestView, now: float) -> float:
        ranking = self.pipeline.ranking
        if not self.ranks_under_load:
            return ranking.rank_key(view)
        return ranking.rank_key_under_load(view, self.load_snapshot(now))  # the hit is in view

    def reject(self, request: Request, rejection: Rejection) -> None:
        """Report ``request`` as refused with the next step's outputs."""
        self.rejected.append(Rejected(request, rejection))
        if self.metrics is not None:
            self.metrics.rejected(rejection.reason)

    def take_rejected(self) -> list[Rejected]:
        """The rejections not yet reported; none are left."""
        rejected, self.rejected = self.rejected, []
        return rejected

    def expired(self, heads: Iterable[Request], view: ViewOf, now: float) -> list[Request]:
        """The queue heads whose deadline can no longer be met (none without a deadline
        policy)."""
        if self.deadlines is None:
            return []
        return [r for r in heads if self.deadlines.is_expired(view(r), now)]
