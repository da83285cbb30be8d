"""Rate: how much a request or tenant may prefill per step.

Token caps (token bucket, tenant prefill budget, step budget, interactive prefill guard) and
tenant quotas. Modules: `isolation`, `prefill_guard`, `step_budget`, `token_bucket`. Every name
here is also exported by `policies`.
"""

from policies.rate.isolation import (
    PrefillBudgetStats,
    QuotaPolicy,
    TenantPrefillBudget,
    TenantQuota,
    TenantUsage,
    TokenCaps,
)
from policies.rate.prefill_guard import InteractivePrefillGuard, PrefillGuardStats
from policies.rate.step_budget import StepPrefillBudget, StepPrefillBudgetStats
from policies.rate.token_bucket import TokenBucket, TokenBucketStats

__all__ = [
    "InteractivePrefillGuard",
    "PrefillBudgetStats",
    "PrefillGuardStats",
    "QuotaPolicy",
    "StepPrefillBudget",
    "StepPrefillBudgetStats",
    "TenantPrefillBudget",
    "TenantQuota",
    "TenantUsage",
    "TokenBucket",
    "TokenBucketStats",
    "TokenCaps",
]
