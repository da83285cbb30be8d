"""What policies decide: the frozen decisions the protocols (`policies.protocols`) return.

This module sits at the bottom of ``policies`` with the views and the protocols: it imports
no policy, so an interface never depends on an implementation.
"""

from __future__ import annotations

import attrs


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


@attrs.frozen
class Preemption:
    """Preempt running request ``victim`` so that waiting request ``beneficiary`` can start."""

    victim: str
    beneficiary: str
