"""The business-case workload: the enterprise tenants through five escalating phases.

Built by composition on `benchmarks.replay.enterprise`: each phase is an
`enterprise_trace` of the seven tenants with their request rates scaled per
tenant and per request kind (chat, code, rag), shifted to the phase's start.
On top of that, one tenant's system prompt switches version at the start of
phase 2: from then on its requests open with a new set of prefix block hashes,
so the prefix cache must learn the new prompt while the old one goes stale.

Default schedule, 60 s per phase (300 s):

1. ``baseline``: every tenant at its base rate.
2. ``prompt-switch``: as the baseline; ``acme-bank`` (Gold) rolls out system prompt v2.
3. ``gold-surge``: ``globex-health`` (Gold, chat) sends six times its base rate.
4. ``rag-surge``: every tenant's long-document (RAG) traffic is three times its base rate.
5. ``overload``: every tenant sends three times its base rate.

Base rates are the enterprise tenants' times `BASE_RATE_SCALE`, which leaves the
default engine (`benchmarks.e2e_business_cases.study.SHAPE`, H100 step costs)
about half busy in the baseline; stock vLLM misses the Gold TTFT SLO from phase 3 on.

Every request carries its tenant's tier as ``priority``, its tier and kind as ``slo_class``
(``"<tier>-<kind>"``, e.g. ``gold-rag``: `slo_class`) and a completion deadline by tier
(`TIER_DEADLINES_S`). Each kind of each tenant is its own Poisson stream (the superposition
is the tenant's Poisson stream with the kind drawn by its mix). Everything is drawn from
generators seeded by ``seed``: equal arguments give an equal trace.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

import attrs

from benchmarks.replay.enterprise import (
    BLOCK_SIZE,
    SYSTEM_PROMPT_BLOCKS,
    TENANTS,
    TIER_WEIGHTS,
    TenantProfile,
    enterprise_trace,
)
from benchmarks.replay.metrics import SHORT_PROMPT_TOKENS
from benchmarks.replay.trace import Trace, TraceRequest

SYSTEM_PROMPT_TOKENS = SYSTEM_PROMPT_BLOCKS * BLOCK_SIZE
VERSION_HASH_STRIDE = 1000
"""Version ``v`` of a tenant's system prompt adds ``v * VERSION_HASH_STRIDE`` to each of its
block hashes. `enterprise_trace` spaces tenants' hashes 1,000,000 apart and uses
`SYSTEM_PROMPT_BLOCKS` (< 1000) per tenant, so versions never collide with each other or
with another tenant's prompt."""
BASE_RATE_SCALE = 0.7
"""Factor from the enterprise tenants' rates to this workload's base rates."""
TIER_DEADLINES_S: Mapping[str, float] = {"gold": 30.0, "silver": 60.0, "bronze": 120.0}
"""Completion deadline from arrival, by tier: past it the client has given up."""


def _positive_values(_instance: object, attribute: attrs.Attribute, value: Mapping) -> None:
    for key, multiplier in value.items():
        if not isinstance(multiplier, int | float) or not multiplier > 0:
            raise ValueError(f"{attribute.name}[{key!r}] must be positive, got {multiplier!r}")


@attrs.frozen(kw_only=True)
class Phase:
    """One stretch of the workload: base rates times per-tenant and per-kind multipliers.

    Multipliers are positive (a tenant never goes fully silent), so every
    tenant keeps a Poisson process with a positive rate in every phase.
    """

    name: str
    tenant_multipliers: Mapping[str, float] = attrs.field(factory=dict,
                                                          validator=_positive_values)
    """Tenant name -> factor on all of its traffic (absent: 1)."""
    kind_multipliers: Mapping[str, float] = attrs.field(factory=dict, validator=_positive_values)
    """Request kind (``chat``, ``code``, ``rag``) -> factor on that kind's traffic (absent: 1)."""

    def profile(self, tenant: TenantProfile, rate_scale: float = 1.0) -> TenantProfile:
        """``tenant`` during this phase: each kind's rate scaled, the mix renormalised.

        The returned profile sends kind ``k`` at ``rate_rps * share_k * tenant factor *
        kind factor * rate_scale`` requests per second.
        """
        factor = self.tenant_multipliers.get(tenant.name, 1.0) * rate_scale
        rates = [(kind, tenant.rate_rps * share * factor * self.kind_multipliers.get(kind, 1.0))
                 for kind, share in tenant.mix]
        total = sum(rate for _, rate in rates)
        return attrs.evolve(tenant, rate_rps=total,
                            mix=tuple((kind, rate / total) for kind, rate in rates))


PHASES: tuple[Phase, ...] = (
    Phase(name="baseline"),
    Phase(name="prompt-switch"),
    Phase(name="gold-surge", tenant_multipliers={"globex-health": 6.0}),
    Phase(name="rag-surge", kind_multipliers={"rag": 3.0}),
    Phase(name="overload", tenant_multipliers={t.name: 3.0 for t in TENANTS}),
)
"""The five phases of the business case, in order."""
SWITCH_TENANT = "acme-bank"
"""The tenant whose system prompt moves to version 2 at the start of phase 2."""


@attrs.frozen(kw_only=True)
class BusinessWorkload:
    """The phased trace and what a study needs to read it back by phase and tier.

    Phase ``i`` (0-based) covers arrivals in ``[i * phase_s, (i + 1) * phase_s)``;
    every request of the trace falls in exactly one phase.
    """

    trace: Trace
    phases: tuple[Phase, ...]
    phase_s: float
    switch_tenant: str
    switch_s: float
    """When `switch_tenant`'s system prompt changes version (the start of phase 2)."""
    tenants: tuple[TenantProfile, ...] = TENANTS

    def phase_index(self, arrival_s: float) -> int:
        """The 0-based phase an arrival time falls in (the last phase keeps its end)."""
        return min(int(arrival_s // self.phase_s), len(self.phases) - 1)

    @property
    def weights(self) -> dict[str, float]:
        """Each tenant's fair-share weight: its tier's weight (Gold 4, Silver 2, Bronze 1)."""
        return {t.name: TIER_WEIGHTS[t.tier] for t in self.tenants}

    @property
    def tiers(self) -> dict[str, str]:
        """Tenant name -> tier."""
        return {t.name: t.tier for t in self.tenants}


def is_short(prompt_tokens: int) -> bool:
    """Whether a request is short: its own prompt, after the shared system prompt, is short.

    Every prompt opens with a `SYSTEM_PROMPT_TOKENS` system prompt (normally a
    prefix-cache hit); what is left is short below
    `benchmarks.replay.metrics.SHORT_PROMPT_TOKENS`, as in the replay's metrics.
    """
    return prompt_tokens - SYSTEM_PROMPT_TOKENS < SHORT_PROMPT_TOKENS


KINDS: tuple[str, ...] = ("chat", "code", "rag")
"""The request kinds of the enterprise tenants (`TenantProfile.mix`)."""


def slo_class(tier: str, kind: str) -> str:
    """The SLO class a request of ``kind`` from a ``tier`` tenant carries: ``"<tier>-<kind>"``."""
    return f"{tier}-{kind}"


def tier_and_kind(cls: str) -> tuple[str, str]:
    """``(tier, kind)`` of an SLO class built by `slo_class`.

    Raises:
        ValueError: for a class that is not ``"<tier>-<kind>"`` with a known kind.
    """
    tier, sep, kind = cls.rpartition("-")
    if not sep or kind not in KINDS:
        raise ValueError(f"SLO class {cls!r} is not '<tier>-<kind>' with a kind in {KINDS}")
    return tier, kind


def _system_prompt(tenant_index: int) -> tuple[int, ...]:
    # `enterprise_trace`'s system-prompt hashes for the tenant at this index of `TENANTS`.
    return tuple((tenant_index + 1) * 1_000_000 + j for j in range(SYSTEM_PROMPT_BLOCKS))


def _kind_profiles(profiles: tuple[TenantProfile, ...], kind: str) -> tuple[TenantProfile, ...]:
    """The tenants that send ``kind``, each sending only that kind at its rate of it."""
    return tuple(attrs.evolve(t, rate_rps=t.rate_rps * share, mix=((kind, 1.0),))
                 for t in profiles for k, share in t.mix if k == kind and share > 0)


def _phase_requests(index: int, phase: Phase, *, phase_s: float, seed: int,
                    rate_scale: float, switch_s: float) -> list[TraceRequest]:
    profiles = tuple(phase.profile(t, rate_scale) for t in TENANTS)
    position = {t.name: i for i, t in enumerate(TENANTS)}
    start_s = index * phase_s
    seeds = random.Random(seed)
    requests = []
    for kind in KINDS:
        trace = enterprise_trace(duration_s=phase_s, seed=seeds.getrandbits(32),
                                 tenants=_kind_profiles(profiles, kind))
        for request in trace.requests:
            arrival_s = start_s + request.arrival_s
            hashes = _system_prompt(position[request.tenant])
            if request.tenant == SWITCH_TENANT and arrival_s >= switch_s:
                hashes = tuple(h + VERSION_HASH_STRIDE for h in hashes)
            tier = request.slo_class
            requests.append(attrs.evolve(
                request, request_id=f"p{index + 1}-{kind}-{request.request_id}",
                arrival_s=arrival_s, block_hashes=hashes, slo_class=slo_class(tier, kind),
                deadline_s=TIER_DEADLINES_S[tier]))
    return sorted(requests, key=lambda r: (r.arrival_s, r.request_id))


def business_workload(*, seed: int = 0, phase_s: float = 60.0,
                      rate_scale: float = BASE_RATE_SCALE) -> BusinessWorkload:
    """The five-phase workload; identical for identical arguments.

    Args:
        seed: seeds one generator that draws each phase's own seed.
        phase_s: seconds per phase (60 s gives the 300 s study).
        rate_scale: factor from the enterprise tenants' rates to the base rates.
    """
    if not phase_s > 0 or not rate_scale > 0:
        raise ValueError(f"phase_s and rate_scale must be positive, got {phase_s!r}, "
                         f"{rate_scale!r}")
    seeds = random.Random(seed)
    requests: list[TraceRequest] = []
    for index, phase in enumerate(PHASES):
        requests += _phase_requests(index, phase, phase_s=phase_s,
                                    seed=seeds.getrandbits(32), rate_scale=rate_scale,
                                    switch_s=phase_s)
    return BusinessWorkload(
        trace=Trace(name="business-case", requests=tuple(requests), block_size=BLOCK_SIZE),
        phases=PHASES, phase_s=phase_s, switch_tenant=SWITCH_TENANT, switch_s=phase_s)
