"""Admission policies: a queue-depth limit and `AdmissionController`."""

from __future__ import annotations

import math
import random
from typing import ClassVar

import attrs

from policies.decisions import AdmissionDecision
from policies.needs import Needs
from policies.validators import finite_non_negative, finite_positive
from policies.views import LoadSnapshot, RequestView


@attrs.frozen(kw_only=True)
class QueueDepthLimit:
    """Rejects new requests while ``max_waiting`` requests already wait.

    Guarantees the waiting queue never grows past ``max_waiting`` through
    admissions (preempted requests re-enter regardless).
    """

    max_waiting: int = attrs.field(validator=attrs.validators.ge(1))
    retry_after_s: float = attrs.field(default=1.0, validator=attrs.validators.ge(0.0))

    def admit(self, request: RequestView, load: LoadSnapshot) -> AdmissionDecision:
        """Reject when the queue is full, with reason ``queue_full``."""
        if load.waiting_requests >= self.max_waiting:
            return AdmissionDecision.reject("queue_full", self.retry_after_s)
        return AdmissionDecision.accept()


_MIN_DRAIN_RATE_RPS = 1e-6
"""Drain rate assumed when none has been measured (avoids dividing by zero)."""


def _optional_at_least(minimum: int):
    def check(_instance: object, attribute: attrs.Attribute, value: int | None) -> None:
        if value is not None and value < minimum:
            raise ValueError(f"{attribute.name} must be >= {minimum} or None, got {value!r}")

    return check


def _fraction_or_none(_instance: object, attribute: attrs.Attribute, value: float | None) -> None:
    if value is not None and not 0.0 < value <= 1.0:
        raise ValueError(f"{attribute.name} must be in (0, 1] or None, got {value!r}")


def _class_limits(_instance: object, attribute: attrs.Attribute, value: dict) -> None:
    for cls, limit in value.items():
        if not isinstance(cls, str) or not cls:
            raise ValueError(f"{attribute.name} keys must be non-empty strings, got {cls!r}")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(
                f"{attribute.name}[{cls!r}] must be an integer >= 0, got {limit!r}"
            )


def _is_random(_instance: object, attribute: attrs.Attribute, value: object) -> None:
    if not isinstance(value, random.Random):
        raise TypeError(f"{attribute.name} must be a random.Random, got {type(value).__name__}")


@attrs.frozen(kw_only=True)
class AdmissionStats:
    """A snapshot of an `AdmissionController`; the mappings are copies."""

    admitted: int
    """Accepting decisions returned by ``admit``."""
    rejected: dict[str, int]
    """Rejections by reason (``queue_full``, ``kv_full``, ``class_full:<cls>``, ``early_drop``)."""
    drain_rate_rps: float
    """Estimated requests leaving the waiting queue per second (EWMA of first schedulings)."""
    waiting_per_class: dict[str, int]
    """Requests admitted and not yet first-scheduled nor finished, per ``slo_class``."""
    pending_requests: int
    """All requests admitted and not yet first-scheduled nor finished, with or without a class."""
    started: int
    """First schedulings counted in the drain rate."""

    @property
    def rejected_total(self) -> int:
        """All rejections, whatever the reason."""
        return sum(self.rejected.values())


@attrs.define(eq=False, kw_only=True)
class AdmissionController:
    """Bounded queues under overload, every rejection with a reason and a Retry-After.

    Gates, checked in this order (the first that fails names the reason):

    1. ``queue_full``: ``load.waiting_requests >= max_waiting``.
    2. ``kv_full``: ``load.kv_usage >= max_kv_usage``.
    3. ``class_full:<cls>``: the request's ``slo_class`` has ``max_waiting_per_class[cls]``
       requests admitted and not yet first-scheduled (nor finished).
    4. ``early_drop``: RED-style random early drop, with probability
       `drop_probability` ``(load.waiting_requests, request.priority)``, drawn
       from the injected ``rng`` (only when that probability is positive, so
       the deterministic gates never consume random numbers).

    Every rejection carries ``retry_after_s = clamp(waiting / max(drain_rate_rps,
    1e-6), min_retry_after_s, max_retry_after_s)`` (see `retry_after_s`).

    Guarantees:
        * Through admissions, the waiting queue never exceeds ``max_waiting``
          and class ``cls`` never has more than ``max_waiting_per_class[cls]``
          requests admitted and not yet started (when the caller reports each
          accepted request through ``on_admitted`` before the next ``admit``).
        * Per-class counts are never negative: the lifecycle hooks tolerate any
          order; a request counts from ``on_admitted`` until the first of
          ``on_first_scheduled`` / ``on_finished``, and repeated or unknown
          calls change nothing.
        * Requests with ``priority <= urgent_priority_at_most`` are never
          early-dropped.
        * Same seed, same calls: same decisions.
    """

    needs: ClassVar[Needs] = Needs(lifecycle=True)

    rng: random.Random = attrs.field(validator=_is_random)
    """Source of the early-drop coin flips; seed it for reproducible runs."""
    max_waiting: int | None = attrs.field(default=None, validator=_optional_at_least(1))
    """Reject (``queue_full``) while this many requests wait; ``None``: no limit."""
    max_kv_usage: float | None = attrs.field(default=None, validator=_fraction_or_none)
    """Reject (``kv_full``) while KV usage is at least this; ``None``: no KV gate."""
    red_min_waiting: int | None = attrs.field(default=None, validator=_optional_at_least(0))
    """Waiting count at which early drop starts (probability 0 there); ``None``: off."""
    red_max_waiting: int | None = attrs.field(default=None, validator=_optional_at_least(1))
    """Waiting count at which the drop probability reaches ``red_max_drop_probability``."""
    red_max_drop_probability: float = attrs.field(default=0.1)
    """Drop probability at and above ``red_max_waiting``, for non-urgent priorities."""
    urgent_priority_at_most: int = -1
    """Requests with priority ``<=`` this are never early-dropped."""
    full_drop_priority_from: int = 1
    """Requests with priority ``>=`` this get the full drop probability (see `drop_probability`)."""
    max_waiting_per_class: dict[str, int] = attrs.field(
        factory=dict, converter=dict, validator=_class_limits
    )
    """Per ``slo_class``: most requests admitted and not yet first-scheduled."""
    drain_window_s: float = attrs.field(default=10.0, validator=finite_positive)
    """Time constant of the drain-rate EWMA."""
    min_retry_after_s: float = attrs.field(default=1.0, validator=finite_non_negative)
    """Smallest Retry-After a rejection carries."""
    max_retry_after_s: float = attrs.field(default=60.0, validator=finite_non_negative)
    """Largest Retry-After a rejection carries."""

    _pending: dict[str, str | None] = attrs.field(init=False, repr=False, factory=dict)
    _class_counts: dict[str, int] = attrs.field(init=False, repr=False, factory=dict)
    _drain_rate_rps: float = attrs.field(init=False, repr=False, default=0.0)
    _drain_time_s: float = attrs.field(init=False, repr=False, default=-math.inf)
    _admitted: int = attrs.field(init=False, repr=False, default=0)
    _rejected: dict[str, int] = attrs.field(init=False, repr=False, factory=dict)
    _started: int = attrs.field(init=False, repr=False, default=0)

    def __attrs_post_init__(self) -> None:
        if (self.red_min_waiting is None) != (self.red_max_waiting is None):
            raise ValueError("red_min_waiting and red_max_waiting must be set together")
        if self.red_min_waiting is not None and self.red_min_waiting >= self.red_max_waiting:
            raise ValueError(
                "red_min_waiting must be below red_max_waiting, got "
                f"{self.red_min_waiting!r} and {self.red_max_waiting!r}"
            )
        if not 0.0 <= self.red_max_drop_probability <= 1.0:
            raise ValueError(
                f"red_max_drop_probability must be in [0, 1], got {self.red_max_drop_probability!r}"
            )
        if self.urgent_priority_at_most >= self.full_drop_priority_from:
            raise ValueError(
                "urgent_priority_at_most must be below full_drop_priority_from, got "
                f"{self.urgent_priority_at_most!r} and {self.full_drop_priority_from!r}"
            )
        if self.min_retry_after_s > self.max_retry_after_s:
            raise ValueError(
                "min_retry_after_s must be <= max_retry_after_s, got "
                f"{self.min_retry_after_s!r} and {self.max_retry_after_s!r}"
            )

    # -- decisions -----------------------------------------------------------

    def admit(self, request: RequestView, load: LoadSnapshot) -> AdmissionDecision:
        """Accept, or reject with the first failing gate's reason and a Retry-After."""
        reason = self._rejection_reason(request, load)
        if reason is None:
            self._admitted += 1
            return AdmissionDecision.accept()
        self._rejected[reason] = self._rejected.get(reason, 0) + 1
        return AdmissionDecision.reject(reason, self.retry_after_s(load.waiting_requests, load.now))

    def _rejection_reason(self, request: RequestView, load: LoadSnapshot) -> str | None:
        if self.max_waiting is not None and load.waiting_requests >= self.max_waiting:
            return "queue_full"
        if self.max_kv_usage is not None and load.kv_usage >= self.max_kv_usage:
            return "kv_full"
        cls = request.slo_class
        limit = self.max_waiting_per_class.get(cls) if cls is not None else None
        if limit is not None and self._class_counts.get(cls, 0) >= limit:
            return f"class_full:{cls}"
        probability = self.drop_probability(load.waiting_requests, request.priority)
        if probability > 0.0 and self.rng.random() < probability:
            return "early_drop"
        return None

    def drop_probability(self, waiting_requests: int, priority: int) -> float:
        """Early-drop probability; never decreases with the queue nor with the priority value.

        ``line(w) * priority_scale(priority)``, where ``line(w)`` is 0 below
        ``red_min_waiting``, rises linearly to ``red_max_drop_probability`` at
        ``red_max_waiting`` and stays there above it (the hard limit is
        ``max_waiting``), and ``priority_scale`` is 0 at and below
        ``urgent_priority_at_most``, 1 at and above ``full_drop_priority_from``
        and linear in between (with the defaults: 0 for priority -1, 0.5 for 0,
        1 for 1 and above). 0 when early drop is off.
        """
        if self.red_min_waiting is None or self.red_max_waiting is None:
            return 0.0
        span = self.red_max_waiting - self.red_min_waiting
        fill = min(max(waiting_requests - self.red_min_waiting, 0), span) / span
        urgent, full = self.urgent_priority_at_most, self.full_drop_priority_from
        scale = min(max(priority - urgent, 0), full - urgent) / (full - urgent)
        return self.red_max_drop_probability * fill * scale

    def drain_rate_rps(self, now: float) -> float:
        """Requests leaving the waiting queue per second, an EWMA over ``drain_window_s``.

        Each first scheduling at time ``t_i`` adds an impulse of
        ``exp(-(now - t_i) / drain_window_s) / drain_window_s``, so a steady
        drain of ``r`` requests per second reads ``r`` (after a few windows),
        and the estimate decays to 0 when nothing starts. 0 before any event.
        """
        if not self._drain_rate_rps:
            return 0.0
        elapsed_s = max(now - self._drain_time_s, 0.0)
        return self._drain_rate_rps * math.exp(-elapsed_s / self.drain_window_s)

    def retry_after_s(self, waiting_requests: int, now: float) -> float:
        """Time for the queue to drain, bounded: always in [min_retry_after_s, max_retry_after_s].

        ``clamp(waiting_requests / max(drain_rate_rps(now), 1e-6), min_retry_after_s,
        max_retry_after_s)``: with no measured drain yet, a non-empty queue
        reads ``max_retry_after_s``.
        """
        rate = max(self.drain_rate_rps(now), _MIN_DRAIN_RATE_RPS)
        return min(max(waiting_requests / rate, self.min_retry_after_s), self.max_retry_after_s)

    # -- lifecycle -------------------------------------------------------------

    def on_admitted(self, request: RequestView, now: float) -> None:
        """Count ``request`` in its class until it starts or finishes (repeats change nothing)."""
        if request.request_id in self._pending:
            return
        cls = request.slo_class
        self._pending[request.request_id] = cls
        if cls is not None:
            self._class_counts[cls] = self._class_counts.get(cls, 0) + 1

    def on_first_scheduled(self, request: RequestView, now: float) -> None:
        """Stop counting ``request`` and record a drain event at ``now`` (if it was pending)."""
        if self._release(request.request_id):
            self._record_drain(now)

    def on_finished(self, request: RequestView, now: float) -> None:
        """Stop counting ``request`` if it never started (a drop is not a drain event)."""
        self._release(request.request_id)

    def _release(self, request_id: str) -> bool:
        if request_id not in self._pending:
            return False
        cls = self._pending.pop(request_id)
        if cls is not None:
            remaining = self._class_counts[cls] - 1
            if remaining:
                self._class_counts[cls] = remaining
            else:
                del self._class_counts[cls]
        return True

    def _record_drain(self, now: float) -> None:
        # Clocks read at different points of one step may disagree slightly: an
        # event reported earlier than the last one counts at the last one's time.
        time_s = max(now, self._drain_time_s)
        self._drain_rate_rps = self.drain_rate_rps(time_s) + 1.0 / self.drain_window_s
        self._drain_time_s = time_s
        self._started += 1

    # -- introspection ---------------------------------------------------------

    def waiting_in_class(self, slo_class: str) -> int:
        """Requests of ``slo_class`` admitted and not yet first-scheduled nor finished."""
        return self._class_counts.get(slo_class, 0)

    def stats(self, now: float | None = None) -> AdmissionStats:
        """A frozen snapshot; the drain rate is read at ``now`` (default: the last drain event)."""
        at_s = self._drain_time_s if now is None else now
        return AdmissionStats(
            admitted=self._admitted,
            rejected=dict(self._rejected),
            drain_rate_rps=self.drain_rate_rps(at_s),
            waiting_per_class=dict(self._class_counts),
            pending_requests=len(self._pending),
            started=self._started,
        )

    def check_invariants(self) -> None:
        """Assert that per-class counts match the pending requests and nothing is negative."""
        recount: dict[str, int] = {}
        for cls in self._pending.values():
            if cls is not None:
                recount[cls] = recount.get(cls, 0) + 1
        assert self._class_counts == recount, (self._class_counts, recount)
        assert all(count > 0 for count in self._class_counts.values()), self._class_counts
        assert self._admitted >= 0 and self._started >= 0
        assert all(count > 0 for count in self._rejected.values()), self._rejected
        assert 0.0 <= self._drain_rate_rps < math.inf, self._drain_rate_rps
