"""One protocol per policy family the scheduler integration can plug in.

Policies never see vLLM objects: they get frozen views and the step's ``now``
and return plain values or frozen decisions (`policies.decisions`). This module sits at the
bottom of ``policies`` with the views and the decisions: it imports no policy.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

from policies.decisions import AdmissionDecision, Preemption
from policies.views import LoadSnapshot, RequestView, StepFeatures


@runtime_checkable
class RankingPolicy(Protocol):
    """Orders waiting and running requests; a lower key is served first."""

    def rank_key(self, request: RequestView) -> float:
        """A key that does not change while the request waits."""
        ...

    def effective_priority(self, request: RequestView, now: float) -> float:
        """Urgency at ``now``; ranks requests exactly as ``rank_key`` does."""
        ...


@runtime_checkable
class AdmissionPolicy(Protocol):
    """Decides, on arrival, whether a request enters the engine at all."""

    def admit(self, request: RequestView, load: LoadSnapshot) -> AdmissionDecision:
        """Accept, or reject with a reason and a Retry-After hint."""
        ...


@runtime_checkable
class TokenCapPolicy(Protocol):
    """Caps the prefill tokens one request may be scheduled in one step."""

    def token_cap(self, request: RequestView, load: LoadSnapshot) -> int | None:
        """At most this many prefill tokens this step (``None``: no cap; at least 1 is kept)."""
        ...

    def on_scheduled(self, request: RequestView, tokens: int, now: float) -> None:
        """The scheduler gave ``request`` ``tokens`` prefill tokens in the step that started at ``now``.

        Called for prefill chunks only: decodes are never capped.
        """
        ...


@runtime_checkable
class KVBlockQuota(Protocol):
    """An admission gate on KV usage that also bounds each request's KV blocks (`KVWatermarks`)."""

    def level(self, kv_usage: float) -> int:
        """The usage band ``kv_usage`` falls in (0 green, 1 yellow, 2 red)."""
        ...

    def block_quota(self, request: RequestView, kv_usage: float) -> int | None:
        """KV blocks ``request`` may hold at ``kv_usage`` (``None``: unbounded)."""
        ...


@runtime_checkable
class LifecycleObserver(Protocol):
    """Told about each admitted request's life; any policy that keeps per-request state implements it."""

    def on_admitted(self, request: RequestView, now: float) -> None:
        """``request`` entered the engine's waiting queue."""
        ...

    def on_first_scheduled(self, request: RequestView, now: float) -> None:
        """``request`` was scheduled for the first time (its queueing delay ended)."""
        ...

    def on_finished(self, request: RequestView, now: float) -> None:
        """``request`` left the engine (completed, aborted or cancelled)."""
        ...


@runtime_checkable
class LevelPolicy(Protocol):
    """Puts requests into priority levels that move with service (e.g. MLFQ); 0 is most urgent."""

    def level(self, request: RequestView) -> int:
        """The request's current level."""
        ...

    def on_scheduled(self, request: RequestView, tokens: int, now: float) -> None:
        """``request`` received ``tokens`` tokens of service."""
        ...

    def on_preempted(self, request: RequestView) -> None:
        """``request`` lost its KV cache to a preemption."""
        ...


@runtime_checkable
class FairnessPolicy(Protocol):
    """Chooses which backlogged tenant's queue to serve next (e.g. WFQ)."""

    def select(self, backlogged: Iterable[str] | None = None) -> str:
        """The tenant to serve next among ``backlogged`` (all backlogged tenants if None)."""
        ...

    def on_backlogged(self, tenant: str) -> None:
        """``tenant`` now has requests waiting."""
        ...

    def on_idle(self, tenant: str) -> None:
        """``tenant`` has no request waiting any more."""
        ...

    def charge(self, tenant: str, input_tokens: int = 0, output_tokens: int = 0) -> None:
        """Account service given to ``tenant``."""
        ...

    def counter(self, tenant: str) -> float:
        """``tenant``'s weighted service so far (lower is served first)."""
        ...


@runtime_checkable
class DeadlinePolicy(Protocol):
    """A ranking that knows deadlines: expired waiting requests are dropped, late ones demoted."""

    def is_expired(self, request: RequestView, now: float) -> bool:
        """A waiting request that can no longer meet its deadline."""
        ...

    def is_late(self, request: RequestView, now: float) -> bool:
        """A running request already past the point where it can meet its deadline."""
        ...


@runtime_checkable
class StepObserver(Protocol):
    """Learns from each engine step: what it ran and how long it took (`OnlineStepTimeModel`)."""

    def observe(self, features: StepFeatures, duration_s: float) -> None:
        """One step of ``features`` took ``duration_s`` seconds."""
        ...


@runtime_checkable
class PreemptionPolicy(Protocol):
    """Names a running request to preempt for a waiting one once every slot is taken
    (`SlotPreemption`); the engine preempts it and tells the policy."""

    def choose(self, waiting: Sequence[RequestView], running: Sequence[RequestView],
               now: float) -> Preemption | None:
        """The preemption to make now (``waiting`` in queue order, first few), or None."""
        ...

    def on_preempted(self, choice: Preemption) -> None:
        """The engine preempted ``choice.victim``."""
        ...
