"""The tiered KV connector's counters on vLLM's own metrics path (Prometheus ``/metrics``,
``LLM.get_metrics()``), through vLLM's connector-stats hooks. Named ``vllm:kv_tier_*`` like
vLLM's own connectors' metrics (``LLM.get_metrics()`` returns ``vllm:`` names only).

The scheduler-side connector sends the change since its last report
(`KVTierConnectorStats`); vLLM's stat logger, in the front-end process, adds it to:

* ``vllm:kv_tier_blocks{tier}``: blocks held per tier (gauge)
* ``vllm:kv_tier_loaded_tokens_total{tier}``: tokens loaded from each tier
* ``vllm:kv_tier_resumed_requests_total``: preempted requests scheduled again
* ``vllm:kv_tier_restored_tokens_total`` / ``vllm:kv_tier_recomputed_tokens_total``:
  tokens those resumed requests loaded from a tier / had to compute again
* ``vllm:kv_tier_saved_blocks_total``, ``vllm:kv_tier_dropped_blocks_total``
* ``vllm:kv_tier_prefetched_blocks_total``, ``vllm:kv_tier_prefetch_hits_total``,
  ``vllm:kv_tier_prefetch_wasted_total`` (accuracy = hits / (hits + wasted))
"""

from __future__ import annotations

from typing import Any

from integrations.vllm_v1.vllm_surface.names import KVConnectorPromMetrics, KVConnectorStats

GAUGES = {"blocks": "Blocks held, by tier"}
TIER_COUNTERS = {"loaded_tokens": "Tokens loaded into the GPU cache, by source tier"}
COUNTERS = {
    "resumed_requests": "Preempted requests scheduled again",
    "restored_tokens": "Tokens preempted requests loaded from a tier when resuming",
    "recomputed_tokens": "Tokens preempted requests computed again when resuming",
    "saved_blocks": "Blocks copied to the CPU tier",
    "dropped_blocks": "Blocks dropped from the last tier they could occupy",
    "prefetched_blocks": "Blocks promoted by a prefetch",
    "prefetch_hits": "Prefetched blocks loaded before leaving their tier",
    "prefetch_wasted": "Prefetched blocks demoted or dropped before being loaded",
}


def snapshot(counters: dict[str, int], blocks_by_tier: dict[str, int],
             loaded_by_tier: dict[str, int]) -> dict[str, Any]:
    """The cumulative values a report is the difference of."""
    return {"blocks": dict(blocks_by_tier), "loaded_tokens": dict(loaded_by_tier),
            **{name: counters.get(name, 0) for name in COUNTERS}}


def report(current: dict[str, Any], previous: dict[str, Any] | None) -> dict[str, Any] | None:
    """Gauges as they are and counters' increase since ``previous``; ``None`` if nothing changed."""
    if current == previous:
        return None
    previous = previous or {}
    delta: dict[str, Any] = {"blocks": current["blocks"]}
    before = previous.get("loaded_tokens", {})
    delta["loaded_tokens"] = {tier: n - before.get(tier, 0)
                              for tier, n in current["loaded_tokens"].items()}
    for name in COUNTERS:
        delta[name] = current[name] - previous.get(name, 0)
    return delta


class KVTierConnectorStats(KVConnectorStats):
    """One or more reports, summed (gauges: the latest)."""

    def reset(self) -> None:
        self.data = {}

    def is_empty(self) -> bool:
        return not self.data

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        if not other.data:
            return self
        if not self.data:
            self.data = other.data
            return self
        merged = {"blocks": other.data["blocks"], "loaded_tokens": dict(self.data["loaded_tokens"])}
        for tier, n in other.data["loaded_tokens"].items():
            merged["loaded_tokens"][tier] = merged["loaded_tokens"].get(tier, 0) + n
        for name in COUNTERS:
            merged[name] = self.data[name] + other.data[name]
        self.data = merged
        return self

    def reduce(self) -> dict[str, int | float]:
        flat: dict[str, int | float] = {name: self.data.get(name, 0) for name in COUNTERS}
        for group in ("blocks", "loaded_tokens"):
            for tier, n in self.data.get(group, {}).items():
                flat[f"{group}_{tier}"] = n
        return flat


class KVTierPromMetrics(KVConnectorPromMetrics):
    """Registers the ``vllm:kv_tier_*`` metrics and adds each report to them."""

    def __init__(self, vllm_config: Any, metric_types: dict[type, type],
                 labelnames: list[str], per_engine_labelvalues: dict[int, list[object]]) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        with_tier = [*labelnames, "tier"]
        self._metrics = {
            **{name: self._gauge_cls(name=f"vllm:kv_tier_{name}", documentation=doc,
                                     labelnames=with_tier, multiprocess_mode="mostrecent")
               for name, doc in GAUGES.items()},
            **{name: self._counter_cls(name=f"vllm:kv_tier_{name}", documentation=doc,
                                       labelnames=with_tier)
               for name, doc in TIER_COUNTERS.items()},
            **{name: self._counter_cls(name=f"vllm:kv_tier_{name}", documentation=doc,
                                       labelnames=labelnames)
               for name, doc in COUNTERS.items()},
        }

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        labels = self.per_engine_labelvalues[engine_idx]
        for tier, n in transfer_stats_data.get("blocks", {}).items():
            self._metrics["blocks"].labels(*labels, tier).set(n)
        for tier, n in transfer_stats_data.get("loaded_tokens", {}).items():
            if n:
                self._metrics["loaded_tokens"].labels(*labels, tier).inc(n)
        for name in COUNTERS:
            if transfer_stats_data.get(name):
                self._metrics[name].labels(*labels).inc(transfer_stats_data[name])
