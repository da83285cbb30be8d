"""The ``eviction`` slot's series on ``/metrics``, set from its order's ``stats()``.

With an order that has ``stats()`` (`SegmentedLRU`): ``policies:kv_evictable_blocks{segment}``
(segment sizes), ``policies:kv_evictions_total{segment}`` (evictions by the segment they came
from: ``uncached``, ``orphan``, ``probation``, ``protected``),
``policies:kv_retained_blocks_total{reason}`` (``preempted``: the preemption shield;
``cancelled``: cancellation-aware retention) and ``policies:kv_demoted_blocks_total{reason}``
(``overflow``: PROTECTED over its share; ``stale``: an old prompt version); with session pins
(`DuelingSLRU`) also ``policies:kv_session_pins_total{event}`` (``pinned``: blocks pinned for a
session's next turn; ``hit``: prefix hits on blocks pins held past their place, the hits pins
bought; ``expired``: pins whose predicted gap passed; ``refused``: blocks not pinned, the
pinned share being full or pins off; ``paused``: times judged pins stopped, the shadow LRU
having out-hit its pinning twin), ``policies:kv_session_pinned_blocks{tenant}`` (blocks holding
a pin, by the tenant charged for them) and the ``pinned`` segment of the two metrics above
(pinned blocks held past their place); with waiting-queue awareness
(`SegmentedLRU.keep_waiting`) the ``wanted`` segment (blocks a waiting request will hit) and
``policies:kv_wanted_hits_total{queue="waiting"}`` (prefix hits on them).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from integrations.vllm_v1.metrics import PolicyMetrics, Series
from policies import EvictionStats

EVICTABLE = Series("policies:kv_evictable_blocks",
                   "Evictable prefix-cache blocks, by eviction segment", ("segment",))
EVICTIONS = Series("policies:kv_evictions", "Blocks evicted, by segment", ("segment",),
                   counter=True)
RETAINED = Series("policies:kv_retained_blocks", "Freed blocks kept as protected, by reason",
                  ("reason",), counter=True)
DEMOTED = Series("policies:kv_demoted_blocks",
                 "Blocks demoted out of the protected segment, by reason", ("reason",),
                 counter=True)
PINS = Series("policies:kv_session_pins", "Session pins of finished turns' blocks, by event",
              ("event",), counter=True)
PINNED_BY_TENANT = Series("policies:kv_session_pinned_blocks",
                          "Blocks held by session pins, by the tenant charged", ("tenant",))
WANTED_HITS = Series("policies:kv_wanted_hits",
                     "Prefix hits on blocks kept for a waiting request", ("queue",),
                     counter=True)


def report_eviction(metrics: PolicyMetrics, stats: EvictionStats) -> None:
    """Set the eviction gauges and advance its counters to the order's totals."""
    for segment, blocks in (("uncached", stats.uncached_blocks), ("orphan", stats.orphan_blocks),
                            ("probation", stats.probation_blocks),
                            ("protected", stats.protected_blocks),
                            ("pinned", stats.pinned_blocks), ("wanted", stats.wanted_blocks)):
        metrics.set(EVICTABLE, blocks, segment=segment)
    for segment, total in stats.evictions_by_segment:
        metrics.count_to(EVICTIONS, total, segment=segment)
    for series, label, value, total in (
            (RETAINED, "reason", "preempted", stats.shielded),
            (RETAINED, "reason", "cancelled", stats.retained_cancelled),
            (DEMOTED, "reason", "overflow", stats.demotions),
            (DEMOTED, "reason", "stale", stats.demoted_stale),
            (PINS, "event", "pinned", stats.pins), (PINS, "event", "hit", stats.pin_hits),
            (PINS, "event", "expired", stats.pins_expired),
            (PINS, "event", "refused", stats.pins_refused),
            (PINS, "event", "paused", stats.pin_pauses),
            (WANTED_HITS, "queue", "waiting", stats.wanted_hits)):
        metrics.count_to(series, total, **{label: value})


def report_session_pins(metrics: PolicyMetrics, by_tenant: Mapping[str | None, int]) -> None:
    """Set the blocks session pins hold, by tenant (None: no tenant known)."""
    values: Counter[tuple[str, ...]] = Counter()
    for tenant, blocks in by_tenant.items():
        values[(metrics.tenant_label(tenant) if tenant is not None else "none",)] += blocks
    metrics.show(PINNED_BY_TENANT, values)
