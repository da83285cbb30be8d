"""Rate: how much a request or tenant may prefill per step.

Token caps (token bucket, tenant prefill budget, step budget, interactive prefill guard) and
tenant quotas. Modules: `isolation`, `prefill_guard`, `step_budget`, `token_bucket`. Its public
names are exported by `policies` (`from policies import ...`).
"""
