"""`SlotPreemption`: a slot for a more important request whose first token is at risk.

vLLM preempts a running request only when KV blocks run out; once ``max_num_seqs``
requests run, a waiting high-priority request waits for one of them to finish, however
long its output (vLLM issue 40004). This policy names, once every slot is taken, a
running request to preempt for a waiting one, under these guarantees:

- the waiting request is at risk: it has produced no token yet and has waited at least
  ``risk_share`` of its class's TTFT target;
- the victim is strictly less important (`importance`: a protected class first, then
  vLLM's ``priority``, lower first), and among those the least important, then the one
  with the fewest computed tokens (the least work to redo);
- against thrash, a request is preempted by this policy at most
  ``max_preemptions_per_request`` times, a request once preempted is never a
  beneficiary, and at most one preemption is named per step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

import attrs

from policies.decisions import Preemption
from policies.needs import Needs
from policies.slo.classes import ClassGrants, SLOTarget, resolve_class
from policies.validators import int_at_least
from policies.views import RequestView


@attrs.frozen
class SlotPreemptionStats:
    """What the policy decided so far."""

    preemptions: int
    """Preemptions named."""
    at_risk_unserved: int
    """Steps with an at-risk waiting request and no less important victim left."""


def _share(_instance: object, attribute: attrs.Attribute, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{attribute.name} must be in [0, 1], got {value!r}")


@attrs.define
class SlotPreemption:
    """Which running request gives up its slot, if any, when every slot is taken."""

    needs: ClassVar[Needs] = Needs(lifecycle=True)

    slos: Mapping[str, SLOTarget]
    """TTFT target of each SLO class (`resolve_class` picks a request's)."""
    length_classes: tuple[tuple[int, str], ...] = ()
    tenant_classes: Mapping[str, str] = attrs.field(factory=dict)
    protected_classes: frozenset[str] = frozenset()
    """Classes more important than any other, whatever their priority."""
    risk_share: float = attrs.field(default=0.5, validator=_share)
    """A waiting request is at risk once it has waited this share of its TTFT target."""
    max_preemptions_per_request: int = attrs.field(default=1, validator=int_at_least(1))
    grants: ClassGrants | None = None
    """The classes each tenant may be judged in by length (as in `SLOAdmission`)."""
    _preempted: dict[str, int] = attrs.field(factory=dict, init=False)
    _count: int = attrs.field(default=0, init=False)
    _unserved: int = attrs.field(default=0, init=False)

    def _class(self, request: RequestView) -> str | None:
        return resolve_class(request, self.slos, self.tenant_classes, self.length_classes,
                             self.grants)

    def importance(self, request: RequestView) -> tuple[int, int]:
        """Lower is more important: a protected class first, then vLLM's priority."""
        return (0 if self._class(request) in self.protected_classes else 1), request.priority

    def _at_risk(self, request: RequestView, now: float) -> bool:
        if request.output_tokens or request.request_id in self._preempted:
            return False
        cls = self._class(request)
        target = self.slos.get(cls) if cls is not None else None
        return target is not None and now - request.arrival_s >= self.risk_share * target.ttft_s

    def choose(self, waiting: Sequence[RequestView], running: Sequence[RequestView],
               now: float) -> Preemption | None:
        """The preemption for the most important at-risk request of ``waiting`` (queue order
        breaks ties), or None. Call only when every slot is taken; ``running`` are the
        requests holding them."""
        at_risk = [r for r in waiting if self._at_risk(r, now)]
        if not at_risk:
            return None
        beneficiary = min(at_risk, key=self.importance)  # min keeps queue order among equals
        rank = self.importance(beneficiary)
        limit = self.max_preemptions_per_request
        victims = [r for r in running if self.importance(r) > rank
                   and self._preempted.get(r.request_id, 0) < limit]
        if not victims:
            self._unserved += 1
            return None
        victim = max(victims, key=lambda r: (self.importance(r), -r.computed_tokens))
        return Preemption(victim=victim.request_id, beneficiary=beneficiary.request_id)

    def on_preempted(self, choice: Preemption) -> None:
        """The engine preempted ``choice.victim`` as named."""
        self._preempted[choice.victim] = self._preempted.get(choice.victim, 0) + 1
        self._count += 1

    def on_finished(self, request: RequestView, now: float) -> None:
        """Forget a finished request (bounded memory)."""
        self._preempted.pop(request.request_id, None)

    def on_admitted(self, request: RequestView, now: float) -> None:
        """Nothing to learn on arrival (a `LifecycleObserver`)."""

    def on_first_scheduled(self, request: RequestView, now: float) -> None:
        """Nothing to learn on a first schedule (a `LifecycleObserver`)."""

    def stats(self) -> SlotPreemptionStats:
        return SlotPreemptionStats(preemptions=self._count, at_risk_unserved=self._unserved)
