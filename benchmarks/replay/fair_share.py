"""Fairness as Jain first defined it: each tenant's service over its fair share.

The windowed index in `benchmarks.replay.metrics.fairness` needs tenants with
requests queued at the same moment; a scheduler that keeps queues short (or an
admission policy that turns requests away) leaves it nothing to judge. Here each
tenant's *demand* is the tokens its requests asked for, the *capacity* is the
tokens actually served to the group, and the fair share is the weighted max-min
allocation of that capacity: no tenant gets more than it asked for, and what
satisfied tenants leave is shared by weight among the rest. Jain's index of
``served / fair share`` is 1 when every tenant got exactly its fair share, and
falls as rejections or starvation skew service away from it. It judges volume,
not latency: a system that serves everything late scores 1.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from benchmarks.replay.metrics import jain_index
from benchmarks.replay.records import RequestRecord


def weighted_max_min(demands: Mapping[str, float], weights: Mapping[str, float],
                     capacity: float) -> dict[str, float]:
    """Water-filling: each tenant gets at most its demand, capacity splits by weight among the
    tenants still unsatisfied, and the allocations sum to ``min(capacity, total demand)``."""
    allocation = dict.fromkeys(demands, 0.0)
    active = {t for t, d in demands.items() if d > 0}
    left = capacity
    while active and left > 0:
        total_weight = sum(weights[t] for t in active)
        offer = {t: left * weights[t] / total_weight for t in active}
        satisfied = {t for t in active if allocation[t] + offer[t] >= demands[t]}
        if not satisfied:
            for t in active:
                allocation[t] += offer[t]
            break
        for t in satisfied:
            left -= demands[t] - allocation[t]
            allocation[t] = demands[t]
        active -= satisfied
    return allocation


def _served_tokens(record: RequestRecord) -> int:
    """Prompt tokens once it produced a token, plus the tokens it produced."""
    produced = len(record.token_times_s)
    return (record.prompt_tokens if produced else 0) + produced


def fair_share_jain(records: Iterable[RequestRecord], *,
                    weights: Mapping[str, float] | None = None) -> float | None:
    """Jain's index of each tenant's served tokens over its weighted max-min fair share.

    A completed or rejected request demands its prompt plus its full output; a cancelled one
    only what it was served before the client left. None when no tenant demanded anything.
    """
    demand: Counter[str] = Counter()
    served: Counter[str] = Counter()
    for r in records:
        tokens = _served_tokens(r)
        demand[r.tenant] += tokens if r.outcome == "cancelled" else (
            r.prompt_tokens + r.output_tokens)
        served[r.tenant] += tokens
    weight = {t: (weights or {}).get(t, 1.0) for t in demand}
    fair = weighted_max_min(demand, weight, sum(served.values()))
    shares = [served[t] / fair[t] for t in demand if fair[t] > 0]
    return jain_index(shares) if shares else None
