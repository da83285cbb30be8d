"""What `SLOAdmission` decides, and its statistics."""

from __future__ import annotations

import enum
from collections.abc import Mapping

import attrs

from policies.slo.path import PathDelaysStats


class SLOVerdict(enum.Enum):
    """What `SLOAdmission.decide` concluded."""

    ADMIT = "admit"
    DEMOTE = "demote"
    """Admit under the tenant's lower class (`SLODecision.slo_class`)."""
    REJECT = "reject"


@attrs.frozen(kw_only=True)
class SLODecision:
    """`SLOAdmission`'s decision and the predictions it rests on."""

    verdict: SLOVerdict
    slo_class: str | None
    """The class the request is admitted under (its own, or the lower one for DEMOTE)."""
    ttft_s: float | None
    """Predicted time to first token under EDF (None: the request has no known class)."""
    tpot_s: float | None
    """Predicted time per output token."""
    reason: str = ""
    """``slo_ttft`` or ``slo_tpot`` for a rejection."""
    egress_s: float = 0.0
    """The egress delay the deadline was planned with (`PathDelays`): the predicted TTFT
    the client sees is ``ttft_s + egress_s``."""
    retry_after_s: float | None = None


@attrs.frozen(kw_only=True)
class SLOAdmissionStats:
    """A snapshot of an `SLOAdmission`."""

    admitted: int
    demoted: int
    rejected: dict[str, int]
    """Rejections by reason (``slo_ttft``, ``slo_tpot``)."""
    unclassified: int
    """Requests admitted without a prediction: no class, or a class with no target."""
    tracked: int
    """Admitted requests whose deadline the admission test still weighs."""
    headroom: float
    """The lowest class's first-token headroom in force (see ``class_headrooms``)."""
    ttft_error_p90: float | None
    """The highest class's 90th percentile of ``(measured - predicted TTFT) / TTFT target``
    over its recent admitted requests (None before any); measured where the client's first
    token leaves the server once `PathDelays` hears of it, else where the engine produces
    it."""
    path: PathDelaysStats | None = None
    """The learned path around the engine step (None without ``path``)."""
    tpot_headroom: float = 1.0
    """The TPOT headroom in force: the configured one, corrected by how much slower than
    predicted admitted streams reached the client (`SLOAdmission.on_client_stream_end`)."""
    tpot_error_p90: float | None = None
    """90th percentile of ``(client TPOT - predicted TPOT) / TPOT target`` over the recent
    admitted streams (None before any client report)."""
    tpot_late_share: float | None = None
    """The share of the recent admitted streams slower at the client than their TPOT target
    (None before any client report)."""
    tpot_bound_s: float | None = None
    """The tightest TPOT target of the classes decoding now (a protected class's with its
    margin): a classed request is admitted only if its predicted TPOT is within
    ``tpot_headroom`` times this, as well as its own target. None: nothing with a target
    decodes."""
    class_headrooms: Mapping[str, float] = attrs.field(factory=dict)
    """Class -> its first-token headroom in force: the configured one, corrected by how late
    the class's admitted requests' first tokens have come against their predictions
    (`SLOAdmission.feedback_window`)."""
    class_late_shares: Mapping[str, float] = attrs.field(factory=dict)
    """Class -> the share of its recent admitted requests whose first token came past its
    target (classes with none measured yet are absent)."""
