"""``enterprise``: a synthetic 7-tenant workload (first version) on real length distributions.

An enterprise AI platform serving seven tenants from one engine: Gold, Silver and
Bronze tiers running short chat, code completion (which clients often cancel) and
long-document RAG. Prompt and output lengths are drawn from the real Azure 2023
traces (conversation rows for chat, code rows for completion; RAG prompts are a
retrieved document of 3-7k tokens on top of the system prompt). Each tenant's
requests open with the tenant's system prompt, expressed as shared block hashes
so the replay sees real prefix-cache hits. Arrivals are Poisson per tenant.
Everything is drawn from one ``random.Random(seed)``.
"""

from __future__ import annotations

import functools
import random

import attrs

from benchmarks.replay.datasets import _read_trace
from benchmarks.replay.trace import Trace, TraceRequest

BLOCK_SIZE = 16
SYSTEM_PROMPT_BLOCKS = 32  # 512 tokens


@attrs.frozen(kw_only=True)
class TenantProfile:
    """One tenant: tier, request mix and rate."""

    name: str
    tier: str
    priority: int
    rate_rps: float
    mix: tuple[tuple[str, float], ...]
    """(kind, share) with kind in chat, code, rag."""


TENANTS: tuple[TenantProfile, ...] = (
    TenantProfile(name="acme-bank", tier="gold", priority=-1, rate_rps=1.6,
                  mix=(("chat", 0.7), ("rag", 0.3))),
    TenantProfile(name="globex-health", tier="gold", priority=-1, rate_rps=1.2,
                  mix=(("chat", 1.0),)),
    TenantProfile(name="initech", tier="silver", priority=0, rate_rps=1.5,
                  mix=(("code", 1.0),)),
    TenantProfile(name="umbrella", tier="silver", priority=0, rate_rps=1.0,
                  mix=(("chat", 0.8), ("rag", 0.2))),
    TenantProfile(name="hooli", tier="silver", priority=0, rate_rps=1.2,
                  mix=(("code", 0.8), ("chat", 0.2))),
    TenantProfile(name="piedpiper", tier="bronze", priority=1, rate_rps=0.6,
                  mix=(("rag", 1.0),)),
    TenantProfile(name="vandelay", tier="bronze", priority=1, rate_rps=0.9,
                  mix=(("chat", 1.0),)),
)
"""The seven tenants; weights by tier are Gold 4, Silver 2, Bronze 1."""

TIER_WEIGHTS = {"gold": 4.0, "silver": 2.0, "bronze": 1.0}
CODE_CANCEL_SHARE = 0.3
"""Share of code completions the client cancels (the user kept typing)."""


@functools.cache
def _lengths(name: str) -> tuple[tuple[int, int], ...]:
    return tuple((r.prompt_tokens, r.output_tokens) for r in _read_trace(name).requests)


def enterprise_trace(*, duration_s: float = 300.0, seed: int = 0,
                     tenants: tuple[TenantProfile, ...] = TENANTS) -> Trace:
    """The workload over ``duration_s`` seconds; identical for identical arguments."""
    rng = random.Random(seed)
    chat, code = _lengths("azure-conv"), _lengths("azure-code")
    requests = []
    for t_index, tenant in enumerate(tenants):
        kinds, shares = zip(*tenant.mix, strict=True)
        system = tuple((t_index + 1) * 1_000_000 + j for j in range(SYSTEM_PROMPT_BLOCKS))
        now = rng.expovariate(tenant.rate_rps)
        while now < duration_s:
            kind = rng.choices(kinds, weights=shares)[0]
            cancel = None
            if kind == "code":
                prompt, output = rng.choice(code)
                if rng.random() < CODE_CANCEL_SHARE:
                    cancel = rng.uniform(0.2, 2.0)
            else:
                prompt, output = rng.choice(chat)
                if kind == "rag":
                    prompt = min(prompt + rng.randint(3000, 7000), 16000)
            prompt += SYSTEM_PROMPT_BLOCKS * BLOCK_SIZE
            requests.append(TraceRequest(
                request_id=f"{tenant.name}-{len(requests)}", arrival_s=now,
                prompt_tokens=prompt, output_tokens=output, tenant=tenant.name,
                priority=tenant.priority, slo_class=tenant.tier, block_hashes=system,
                cancel_after_s=cancel))
            now += rng.expovariate(tenant.rate_rps)
    return Trace(name="enterprise", requests=tuple(requests), block_size=BLOCK_SIZE)
