"""Prometheus export of the suffix-automaton proposer's figures (``policies:spec_*``).

vLLM's ``/metrics`` already carries its own spec-decode counters (``vllm:spec_decode_num_drafts``,
``..._num_draft_tokens``, ``..._num_accepted_tokens``, ``..._per_pos``). These add what only the
proposer knows: tau and coverage as the proposer saw them, its propose/update latency and its
cache sizes.

The proposer runs in the engine process, the HTTP server in another. Metrics reach the
server's ``/metrics`` through prometheus_client's multiprocess mode: export
``PROMETHEUS_MULTIPROC_DIR`` (an empty directory) before starting the server; both processes
inherit it and vLLM's endpoint then collects every process's files. Without it the metrics stay
in the engine process's default registry.
"""

from __future__ import annotations

from typing import Any

import attrs

COUNTERS = {
    "steps": "Verification steps of drafted-for requests.",
    "draft_steps": "Steps that verified a non-empty draft.",
    "drafted_tokens": "Draft tokens proposed.",
    "accepted_tokens": "Draft tokens accepted.",
    "emitted_tokens": "Tokens emitted by steps of drafted-for requests.",
}
GAUGES = {
    "tau": "Tokens per step (emitted / steps).",
    "acceptance_rate": "Accepted / drafted tokens.",
    "coverage": "Share of steps with a draft.",
    "propose_p50_us": "Median per-request propose time, microseconds.",
    "propose_p99_us": "99th percentile per-request propose time, microseconds.",
    "update_us_per_token": "Time appending tokens per token, microseconds.",
    "shared_cache_tokens": "Tokens in the shared cache.",
    "shared_cache_bytes": "Bytes held by the shared cache.",
    "request_cache_bytes": "Bytes held by active requests' automata.",
    "tracked_requests": "Requests the proposer tracks.",
}
PREFIX = "policies:spec_"
GAUGES_EVERY_STEPS = 32
"""Gauges are refreshed every this many steps (percentiles cost tens of microseconds); counters
advance every step, so they agree with vLLM's own counters whenever the engine is idle."""
_DEFAULT: list[SpecPrometheus] = []


@attrs.define(eq=False, kw_only=True)
class SpecPrometheus:
    """Counters advance by exact deltas every step; gauges are a recent snapshot."""

    counters: dict[str, Any]
    gauges: dict[str, Any]
    _published: dict[str, int] = attrs.field(init=False, factory=dict)
    _calls: int = attrs.field(init=False, default=0)

    @classmethod
    def create(cls, registry: Any = None) -> SpecPrometheus | None:
        """Metrics in ``registry`` (default: the process registry, created once); None without
        prometheus_client."""
        try:
            import prometheus_client as prom
        except ImportError:
            return None
        if registry is None and _DEFAULT:
            return _DEFAULT[0]
        target = registry if registry is not None else prom.REGISTRY
        counters = {name: prom.Counter(PREFIX + name, doc, registry=target)
                    for name, doc in COUNTERS.items()}
        gauges = {name: prom.Gauge(PREFIX + name, doc, registry=target,
                                   multiprocess_mode="mostrecent")
                  for name, doc in GAUGES.items()}
        exporter = cls(counters=counters, gauges=gauges)
        if registry is None:
            _DEFAULT.append(exporter)
        return exporter

    def count(self, verification: Any) -> None:
        """Advance the counters to ``verification`` (a `SpecMetricsStats`); cheap, every step."""
        for name in COUNTERS:
            value = getattr(verification, name)
            delta = value - self._published.get(name, 0)
            if delta > 0:
                self.counters[name].inc(delta)
            self._published[name] = value

    def gauges_due(self) -> bool:
        """Count a step; true every `GAUGES_EVERY_STEPS` steps."""
        self._calls += 1
        return self._calls % GAUGES_EVERY_STEPS == 0

    def publish(self, stats: Any) -> None:
        """Advance counters and set gauges to ``stats`` (a `SpecProposerStats`)."""
        v = stats.verification
        self.count(v)
        shared = stats.drafter.shared
        values = {"tau": v.tau, "acceptance_rate": v.acceptance_rate, "coverage": v.coverage,
                  "propose_p50_us": stats.propose_p50_us, "propose_p99_us": stats.propose_p99_us,
                  "update_us_per_token": stats.update_us_per_token,
                  "shared_cache_tokens": shared.tokens if shared else 0,
                  "shared_cache_bytes": shared.bytes if shared else 0,
                  "request_cache_bytes": stats.drafter.request_bytes,
                  "tracked_requests": stats.tracked_requests}
        for name, value in values.items():
            self.gauges[name].set(value)
