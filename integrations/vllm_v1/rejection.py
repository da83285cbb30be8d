"""`Rejection`: why the engine refused a request, as one typed value end to end.

The scheduler finishes a refused request with ``finish_reason="abort"`` and a
``stop_reason`` that `Rejection.stop_reason` encodes; the HTTP layer decodes it
with `Rejection.parse` and answers with `Rejection.message`, which HTTP clients
decode with `Rejection.from_message`. This module is the only place
that knows the encoding, and `Rejection.http_status` the only place that maps a
reason to a status: 400 for a request that can never succeed, 429 for the
client's own quota, 503 for server overload.
"""

from __future__ import annotations

import math
import re

import attrs

from policies import AdmissionDecision

_LABEL = re.compile(r"[a-z_]+")
_MESSAGE = re.compile(r"request rejected by the scheduler: (?P<reason>[a-z_]+)(?:: (?P<detail>[^;]*))?")
_ENCODED = re.compile(
    r"^rejected:(?P<reason>[a-z_]+)(?::(?P<detail>[^;]*))?;retry_after_s=(?P<retry>[0-9.eE+-]+)$")

CLIENT_ERRORS = frozenset({"invalid_metadata", "prompt_too_long"})
"""Reasons that retrying cannot fix: HTTP 400."""
CLIENT_QUOTAS = frozenset({"class_full", "rate_limited"})
"""Reasons that are the client's own quota: HTTP 429. ``class_full`` (`AdmissionController`:
the request's SLO class has its share of the queue); ``rate_limited``, the label for a
policy of yours that limits a client's rate. Every other reason is overload: 503."""


@attrs.frozen(kw_only=True)
class Rejection:
    """A refused request: ``reason`` (a label such as ``queue_full``), an optional
    ``detail`` (``class_full``'s class, ``invalid_metadata``'s message) and when to retry."""

    reason: str = attrs.field(validator=attrs.validators.matches_re(r"[a-z_]+"))
    detail: str = attrs.field(default="", converter=lambda text: str(text).replace(";", ","))
    """Free text; a ';' becomes ',' (it would end the encoded reason)."""
    retry_after_s: float = 0.0

    @classmethod
    def from_decision(cls, decision: AdmissionDecision) -> Rejection:
        """The rejection an admission policy decided: its reason's leading label is the
        reason, the rest the detail (``class_full:gold``, ``rate_limited tenant=a``)."""
        label = _LABEL.match(decision.reason)
        reason = label[0] if label else "rejected"
        detail = decision.reason[len(label[0]):] if label else decision.reason
        return cls(reason=reason, detail=detail.lstrip(": "),
                   retry_after_s=decision.retry_after_s or 0.0)

    @classmethod
    def parse(cls, stop_reason: object) -> Rejection | None:
        """The rejection a ``stop_reason`` encodes, or None if it encodes none."""
        match = _ENCODED.match(stop_reason) if isinstance(stop_reason, str) else None
        if match is None:
            return None
        return cls(reason=match["reason"], detail=match["detail"] or "",
                   retry_after_s=float(match["retry"]))

    @classmethod
    def from_message(cls, text: str, retry_after_s: float = 0.0) -> Rejection | None:
        """The rejection an HTTP error body's `message` describes (see `message`), if any."""
        match = _MESSAGE.search(text)
        if match is None:
            return None
        return cls(reason=match["reason"], detail=match["detail"] or "",
                   retry_after_s=retry_after_s)

    @property
    def stop_reason(self) -> str:
        """E.g. ``rejected:queue_full;retry_after_s=1`` or ``rejected:class_full:gold;retry_after_s=2``."""
        detail = f":{self.detail}" if self.detail else ""
        return f"rejected:{self.reason}{detail};retry_after_s={self.retry_after_s:g}"

    @property
    def http_status(self) -> int:
        """400 (retrying cannot help), 429 (the client's quota) or 503 (overload)."""
        if self.reason in CLIENT_ERRORS:
            return 400
        return 429 if self.reason in CLIENT_QUOTAS else 503

    @property
    def retry_after_header(self) -> str | None:
        """Whole seconds, at least 1, for a 429/503; None for a 400 (do not retry)."""
        if self.http_status == 400:
            return None
        return str(max(1, math.ceil(self.retry_after_s)))

    @property
    def message(self) -> str:
        """The sentence an HTTP client reads."""
        what = f"{self.reason}: {self.detail}" if self.detail else self.reason
        retry = self.retry_after_header
        return f"request rejected by the scheduler: {what}" + (
            f"; retry after {retry} s" if retry else "")

