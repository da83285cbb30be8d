"""Tenant isolation: the step's prefill budget, running-slot and KV quotas; composing token caps.

`TenantPrefillBudget` keeps one tenant's long prefills (a RAG surge, say) from
taking the whole per-step token budget: in each step a tenant's prefill tokens
stay within its weighted share of the budget, shared among the tenants that
have prefill work outstanding. `TokenCaps` applies several token-cap policies
at once (the smallest cap wins), so the budget composes with `TokenBucket`.
`TenantQuota` passes over a tenant that holds more than its weighted share of
running slots or KV blocks while another tenant under its share waits.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import ClassVar, Protocol, runtime_checkable

import attrs

from policies.needs import Needs, needs_of
from policies.protocols import LifecycleObserver, TokenCapPolicy
from policies.validators import finite_positive
from policies.views import LoadSnapshot, RequestView


def _positive_weights(_instance: object, attribute: attrs.Attribute, value: Mapping) -> None:
    for tenant, weight in value.items():
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not (
            math.isfinite(weight) and weight > 0
        ):
            raise ValueError(f"{attribute.name}[{tenant!r}] must be a finite number > 0, "
                             f"got {weight!r}")


@attrs.frozen(kw_only=True)
class PrefillBudgetStats:
    """A snapshot of a `TenantPrefillBudget`."""

    tenants_with_prefill: int
    """Tenants with at least one admitted request whose prefill is not done."""
    requests_with_prefill: int
    """Admitted requests whose prefill is not done."""
    tokens_withheld: int
    """Sum over ``token_cap`` calls of the remaining prefill the cap held back."""


@attrs.define(eq=False, kw_only=True)
class TenantPrefillBudget:
    """Per step, a tenant's prefill tokens stay within ``floor(budget · w / W)``.

    ``W`` sums the weights of the tenants with prefill outstanding (plus the
    asking request's tenant), so a tenant alone gets the whole budget
    (work-conserving across tenants), and with several each gets at least its
    weighted share whatever the others ask. Decodes are never capped.
    """

    needs: ClassVar[Needs] = Needs(lifecycle=True)

    weights: Mapping[str, float] = attrs.field(factory=dict, converter=dict,
                                               validator=_positive_weights)
    """Weight by tenant; others weigh ``default_weight``."""
    default_weight: float = attrs.field(default=1.0, validator=finite_positive)

    _outstanding: dict[str, str] = attrs.field(init=False, repr=False, factory=dict)
    _per_tenant: dict[str, int] = attrs.field(init=False, repr=False, factory=dict)
    _used: dict[str, int] = attrs.field(init=False, repr=False, factory=dict)
    _step_load: LoadSnapshot | None = attrs.field(init=False, repr=False, default=None)
    _withheld: int = attrs.field(init=False, repr=False, default=0)

    def weight(self, tenant: str) -> float:
        return self.weights.get(tenant, self.default_weight)

    def share_tokens(self, tenant: str, budget_tokens: int) -> int:
        """``tenant``'s share of ``budget_tokens`` among the tenants with prefill outstanding."""
        active = set(self._per_tenant) | {tenant}
        total = sum(self.weight(t) for t in active)
        return math.floor(budget_tokens * self.weight(tenant) / total)

    def token_cap(self, request: RequestView, load: LoadSnapshot) -> int:
        """What is left of the tenant's share this step (the scheduler's snapshot marks the step)."""
        if load is not self._step_load:
            self._step_load = load
            self._used.clear()
        cap = max(0, self.share_tokens(request.tenant, load.token_budget)
                  - self._used.get(request.tenant, 0))
        remaining = request.prompt_tokens - request.computed_tokens
        self._withheld += max(0, min(remaining, load.token_budget) - cap)
        return cap

    def on_scheduled(self, request: RequestView, tokens: int, now: float) -> None:
        self._used[request.tenant] = self._used.get(request.tenant, 0) + tokens
        if request.computed_tokens + tokens >= request.prompt_tokens:
            self._settle(request.request_id)

    def on_admitted(self, request: RequestView, now: float) -> None:
        if request.computed_tokens < request.prompt_tokens:
            self._outstanding[request.request_id] = request.tenant
            self._per_tenant[request.tenant] = self._per_tenant.get(request.tenant, 0) + 1

    def on_first_scheduled(self, request: RequestView, now: float) -> None:
        pass

    def on_finished(self, request: RequestView, now: float) -> None:
        self._settle(request.request_id)

    def _settle(self, request_id: str) -> None:
        tenant = self._outstanding.pop(request_id, None)
        if tenant is not None:
            self._per_tenant[tenant] -= 1
            if not self._per_tenant[tenant]:
                del self._per_tenant[tenant]

    def stats(self) -> PrefillBudgetStats:
        return PrefillBudgetStats(tenants_with_prefill=len(self._per_tenant),
                                  requests_with_prefill=len(self._outstanding),
                                  tokens_withheld=self._withheld)

    def check_invariants(self) -> None:
        counts: dict[str, int] = {}
        for tenant in self._outstanding.values():
            counts[tenant] = counts.get(tenant, 0) + 1
        assert counts == self._per_tenant, (counts, self._per_tenant)


def _token_caps(_instance: object, attribute: attrs.Attribute, value: tuple) -> None:
    if not value:
        raise ValueError(f"{attribute.name} needs at least one token-cap policy")
    for policy in value:
        if not isinstance(policy, TokenCapPolicy):
            raise ValueError(f"{attribute.name} must hold token-cap policies, got {policy!r}")


@attrs.frozen(kw_only=True)
class TokenCaps:
    """Several token-cap policies as one: the smallest cap applies; all hear every event."""

    needs: ClassVar[Needs] = Needs(lifecycle=True)

    policies: tuple[TokenCapPolicy, ...] = attrs.field(converter=tuple, validator=_token_caps)

    def token_cap(self, request: RequestView, load: LoadSnapshot) -> int | None:
        caps = [c for c in (p.token_cap(request, load) for p in self.policies) if c is not None]
        return min(caps, default=None)

    def on_scheduled(self, request: RequestView, tokens: int, now: float) -> None:
        for policy in self.policies:
            policy.on_scheduled(request, tokens, now)

    def on_admitted(self, request: RequestView, now: float) -> None:
        for policy in self._observers():
            policy.on_admitted(request, now)

    def on_first_scheduled(self, request: RequestView, now: float) -> None:
        for policy in self._observers():
            policy.on_first_scheduled(request, now)

    def on_finished(self, request: RequestView, now: float) -> None:
        for policy in self._observers():
            policy.on_finished(request, now)

    def _observers(self) -> list[LifecycleObserver]:
        return [p for p in self.policies if needs_of(p).lifecycle]


@attrs.frozen(kw_only=True)
class TenantUsage:
    """What each tenant holds now, and the engine's capacity."""

    running_requests: Mapping[str, int]
    kv_blocks: Mapping[str, int]
    max_running_requests: int
    total_kv_blocks: int


@runtime_checkable
class QuotaPolicy(Protocol):
    """Which backlogged tenants the fairness policy may pick, given what each holds now
    (`TenantQuota`); the ``quotas`` slot of a pipeline."""

    def eligible(self, backlogged: list[str], usage: TenantUsage) -> list[str]:
        """A subset of ``backlogged``, non-empty when it is (the fairness policy picks among
        them)."""
        ...


@attrs.frozen(kw_only=True)
class TenantQuota:
    """Tenants over their weighted share of running slots or KV blocks wait while others can go.

    A tenant's share is ``w / W`` over the tenants that are backlogged or running.
    ``eligible`` keeps the backlogged tenants under ``headroom ×`` their share of both
    ``max_running_requests`` and ``total_kv_blocks``; when none is under, it keeps them
    all (work-conserving: spare capacity is never left idle for a quota's sake).
    """

    weights: Mapping[str, float] = attrs.field(factory=dict, converter=dict,
                                               validator=_positive_weights)
    default_weight: float = attrs.field(default=1.0, validator=finite_positive)
    headroom: float = attrs.field(default=1.0, validator=finite_positive)
    """Multiple of the fair share a tenant may hold before it is passed over."""

    def weight(self, tenant: str) -> float:
        return self.weights.get(tenant, self.default_weight)

    def share(self, tenant: str, active: set[str]) -> float:
        """``tenant``'s weighted share among ``active`` tenants (``tenant`` counts as active)."""
        active = active | {tenant}
        return self.weight(tenant) / sum(self.weight(t) for t in active)

    def over_quota(self, tenant: str, usage: TenantUsage, active: set[str]) -> bool:
        """Whether ``tenant`` holds at least its quota of running slots or of KV blocks."""
        quota = self.headroom * self.share(tenant, active)
        return (usage.running_requests.get(tenant, 0) >= quota * usage.max_running_requests
                or usage.kv_blocks.get(tenant, 0) >= quota * usage.total_kv_blocks)

    def eligible(self, backlogged: list[str], usage: TenantUsage) -> list[str]:
        """The backlogged tenants under quota, or all of them if none is."""
        active = set(backlogged) | {t for t, n in usage.running_requests.items() if n}
        under = [t for t in backlogged if not self.over_quota(t, usage, active)]
        return under or backlogged
