"""`TTFTDeadlineRanker`: prefill earliest first-token deadline first."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from policies.slo.classes import (
    ClassGrants,
    SLOTarget,
    resolve_class,
    validate_known_classes,
    validate_targets,
)
from policies.slo.fairness import ClassFairShare
from policies.validators import finite_positive
from policies.views import RequestView


@attrs.frozen(kw_only=True)
class TTFTDeadlineRanker:
    """Earliest first-token deadline first: ``rank_key = arrival_s + ttft_s`` of the request's
    class (``default_ttft_s`` for a class with no target).

    Guarantees: the key is fixed on arrival; among requests of one class, earlier arrivals go
    first; a request is never overtaken by one whose deadline is later, so none waits behind
    later arrivals for longer than the widest gap between two classes' targets.
    ``effective_priority`` is the time left to the deadline, ``rank_key - now``.
    """

    slos: Mapping[str, SLOTarget] = attrs.field(converter=dict, validator=validate_targets)
    default_ttft_s: float = attrs.field(default=60.0, validator=finite_positive)
    tenant_classes: Mapping[str, str] = attrs.field(factory=dict, converter=dict,
                                                    validator=validate_known_classes)
    """Tenant -> the class of its requests that name none (as in `SLOAdmission`)."""
    length_classes: tuple[tuple[int, str], ...] = attrs.field(default=(), converter=tuple,
                                                              validator=validate_known_classes)
    """``(max prompt tokens, class)`` for requests with no class otherwise (as in
    `SLOAdmission`)."""
    grants: ClassGrants | None = None
    """The classes each tenant may be judged in by length (as in `SLOAdmission`)."""
    fairness: ClassFairShare | None = None
    """Shares between the tenants of a class (the same object as `SLOAdmission.fairness`):
    a request of a tenant over its share is ranked `ClassFairShare.lead_s` later, at most its
    class's TTFT target (None: first come, first served within a class)."""

    def ttft_s(self, slo_class: str | None) -> float:
        """The first-token target of ``slo_class``."""
        target = self.slos.get(slo_class) if slo_class is not None else None
        return self.default_ttft_s if target is None else target.ttft_s

    def rank_key(self, request: RequestView) -> float:
        cls = resolve_class(request, self.slos, self.tenant_classes, self.length_classes,
                            self.grants)
        ttft_s = self.ttft_s(cls)
        if self.fairness is None or cls not in self.slos:
            return request.arrival_s + ttft_s
        return request.arrival_s + ttft_s + self.fairness.lead_s(request.tenant, cls,
                                                                 request.arrival_s, ttft_s)

    def effective_priority(self, request: RequestView, now: float) -> float:
        return self.rank_key(request) - now

