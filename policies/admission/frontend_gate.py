"""`FrontendGate`: refuse at the door a request whose wait in the frontend alone breaks its TTFT.

Before the scheduler sees a request, the API server reads, checks and tokenizes it and hands it
to the engine core: the frontend's pre-engine stage. Under load that stage queues, and its wait
counts in the client's time to first token although the engine never sees it. The gate counts
the requests in the stage (`enter` / `leave`), learns the stage's service rate online
(completions per second of busy time, over a window of busy time) and, for an arriving request with ``k``
requests ahead, predicts its wait as ``k / rate``. When that wait alone exceeds the request's
TTFT target, admitting it cannot meet the target: it is refused at once (reason
``frontend_busy``), with a Retry-After of the predicted wait.

Guarantees (`decide`): an idle stage (``k = 0``) admits; without a measured rate (fewer than
``min_completions`` completions in the window) every request is admitted; the decision is
monotone in ``k`` (admitted at ``k`` implies admitted at every smaller ``k``) and in the
target. Time is a parameter (``now``, seconds of a monotonic clock).
"""

from __future__ import annotations

import itertools
import math
from collections import deque

import attrs

from policies.admission.controller import AdmissionDecision
from policies.validators import finite_positive, int_at_least

REASON = "frontend_busy"
"""The rejection reason of a request the gate refuses."""


@attrs.frozen(kw_only=True)
class FrontendGateStats:
    """A snapshot of a `FrontendGate`."""

    in_stage: int
    """Requests in the stage now."""
    rate_per_s: float | None
    """The learned service rate (completions per busy second); None until measured."""
    admitted: int
    """Requests the gate admitted."""
    rejected: int
    """Requests the gate refused."""
    last_wait_s: float
    """The predicted wait of the last request decided (0 without a rate)."""
    completions: int
    """Completions in the rate's window."""


@attrs.define(eq=False, kw_only=True)
class FrontendGate:
    """Admits a request only if its predicted wait in the frontend stage is within its TTFT.

    The rate is the completions in the last ``window_s`` seconds of busy time (time with at
    least one request in the stage; at most ``max_samples``) over the busy time since the
    oldest of them, so a stage that stops completing while busy sees its rate fall, and an
    idle stage keeps the rate it last measured: a burst after a quiet spell meets a gate
    that already knows how fast the stage drains.
    """

    window_s: float = attrs.field(default=10.0, validator=finite_positive)
    """How many busy seconds back completions count toward the rate."""
    min_completions: int = attrs.field(default=8, validator=int_at_least(2))
    """Completions in the window needed before the rate is trusted (and anything refused)."""
    max_samples: int = attrs.field(default=1024, validator=int_at_least(2))
    """The most completions the window keeps (the newest)."""

    _in_stage: int = attrs.field(init=False, default=0, repr=False)
    _busy_s: float = attrs.field(init=False, default=0.0, repr=False)
    """Cumulative busy seconds up to ``_last_s``."""
    _last_s: float = attrs.field(init=False, default=-math.inf, repr=False)
    _done: deque[tuple[float, float]] = attrs.field(init=False, factory=deque, repr=False)
    """(when, busy seconds then) of each completion in the window, oldest first."""
    _admitted: int = attrs.field(init=False, default=0, repr=False)
    _rejected: int = attrs.field(init=False, default=0, repr=False)
    _last_wait_s: float = attrs.field(init=False, default=0.0, repr=False)

    def _advance(self, now: float) -> None:
        if now < self._last_s:
            raise ValueError(f"now must not go backwards: {now!r} < {self._last_s!r}")
        if self._in_stage > 0:
            self._busy_s += now - self._last_s
        self._last_s = now
        while self._done and self._done[0][1] < self._busy_s - self.window_s:
            self._done.popleft()

    def enter(self, now: float) -> int:
        """A request entered the stage; returns the requests ahead of it (``k``)."""
        self._advance(now)
        self._in_stage += 1
        return self._in_stage - 1

    def leave(self, now: float, *, served: bool = True) -> None:
        """A request left the stage; ``served``: it went through (a completion of the stage),
        not refused by the gate or answered with an error.

        Raises:
            ValueError: no request is in the stage.
        """
        if self._in_stage == 0:
            raise ValueError("leave() without a request in the stage")
        self._advance(now)
        self._in_stage -= 1
        if served:
            self._done.append((now, self._busy_s))
            if len(self._done) > self.max_samples:
                self._done.popleft()

    def rate_per_s(self, now: float) -> float | None:
        """The stage's service rate, or None until ``min_completions`` completions in the
        window span some busy time."""
        self._advance(now)
        return self._rate()

    def _rate(self) -> float | None:
        if len(self._done) < self.min_completions:
            return None
        busy = self._busy_s - self._done[0][1]
        return (len(self._done) - 1) / busy if busy > 0 else None

    def wait_s(self, ahead: int, now: float) -> float:
        """The predicted wait behind ``ahead`` requests (0 without a rate)."""
        if ahead < 0:
            raise ValueError(f"ahead must be >= 0, got {ahead!r}")
        rate = self.rate_per_s(now)
        return 0.0 if rate is None or ahead == 0 else ahead / rate

    def decide(self, ahead: int, ttft_s: float, now: float) -> AdmissionDecision:
        """Admit unless the wait behind ``ahead`` requests exceeds ``ttft_s`` (counted);
        a refusal's ``retry_after_s`` is the predicted wait."""
        if not ttft_s > 0:
            raise ValueError(f"ttft_s must be > 0, got {ttft_s!r}")
        wait = self.wait_s(ahead, now)
        self._last_wait_s = wait
        if wait > ttft_s:
            self._rejected += 1
            return AdmissionDecision.reject(REASON, wait)
        self._admitted += 1
        return AdmissionDecision.accept()

    @property
    def in_stage(self) -> int:
        """Requests in the stage now."""
        return self._in_stage

    def stats(self) -> FrontendGateStats:
        """A frozen snapshot (see `FrontendGateStats`); the rate as of the last event."""
        return FrontendGateStats(in_stage=self._in_stage, rate_per_s=self._rate(),
                                 admitted=self._admitted, rejected=self._rejected,
                                 last_wait_s=self._last_wait_s, completions=len(self._done))

    def check_invariants(self) -> None:
        """Counts are non-negative; completions are in time order with busy time never
        decreasing and never past the busy time so far; the window holds ``max_samples``
        at most."""
        assert self._in_stage >= 0 and self._admitted >= 0 and self._rejected >= 0
        assert len(self._done) <= self.max_samples
        done = list(self._done)
        assert all(a[0] <= b[0] and a[1] <= b[1] for a, b in itertools.pairwise(done))
        assert all(busy <= self._busy_s for _, busy in self._done)
