"""Admission decisions and the simplest admission policy, a queue-depth limit."""

from __future__ import annotations

import attrs

from policies.views import LoadSnapshot, RequestView


@attrs.frozen(kw_only=True)
class AdmissionDecision:
    """Whether a request may enter the engine; a rejection says why and when to retry."""

    admitted: bool
    reason: str = ""
    retry_after_s: float | None = None

    @classmethod
    def accept(cls) -> AdmissionDecision:
        """The request may enter."""
        return _ACCEPT

    @classmethod
    def reject(cls, reason: str, retry_after_s: float) -> AdmissionDecision:
        """The request is refused; the client may retry after ``retry_after_s``."""
        if not reason:
            raise ValueError("a rejection needs a reason")
        if retry_after_s < 0:
            raise ValueError(f"retry_after_s must be >= 0, got {retry_after_s!r}")
        return cls(admitted=False, reason=reason, retry_after_s=retry_after_s)


_ACCEPT = AdmissionDecision(admitted=True)


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
