"""What the pipeline decides, on the OpenAI server's Prometheus ``/metrics``.

The scheduler runs in vLLM's engine-core process, the ``/metrics`` endpoint in
the API-server process. vLLM's endpoint aggregates every process's metrics
when ``PROMETHEUS_MULTIPROC_DIR`` is set (`server_metrics_dir` sets it for the
servers this package starts), so the scheduler writes its metrics there with
`prometheus_client`'s multiprocess mode. Without that directory nothing is
exported and nothing is measured.

Metrics (tenant labels beyond ``MAX_TENANT_LABELS`` distinct tenants read ``other``):

* ``policies:waiting_requests{tenant,level}`` and ``policies:running_requests{tenant}``
* ``policies:rejections_total{reason}`` (reason up to its first ``:`` or space)
* ``policies:prefill_tokens_throttled_total{tenant}``: prefill tokens a token cap withheld
* ``policies:fairness_lag_tokens{tenant}``: a waiting or running tenant's fairness counter
  minus the lowest such counter (how far ahead of the least-served tenant it is)
* ``policies:kv_watermark_level``: 0 green, 1 yellow, 2 red
* ``policies:prefix_cache_prompt_tokens_total{tenant}`` and
  ``policies:prefix_cache_hit_tokens_total{tenant}``: prompt tokens of requests scheduled for
  the first time, and those served from the prefix cache (hit rate by tenant = their ratio)
Features that plug in as hooks declare their own series next to their hook and set them
through the generic verbs here (`Series`, `PolicyMetrics.set`, ``show``, ``count``,
``count_to``), from their policy's ``stats()`` in `SchedulerHook.refresh_metrics`:
``policies:step_model_*`` (`integrations.vllm_v1.slo.step_timing`), ``policies:slo_*``
(`integrations.vllm_v1.slo.admission_metrics`), ``policies:decode_step_bound_seconds`` and
``policies:start_gate_held_by_step_total`` (`integrations.vllm_v1.scheduling.start_gate`),
``policies:spec_draft_tokens_withheld_total`` (`integrations.vllm_v1.speculative.budget`),
``policies:kv_*`` of the eviction order (`integrations.vllm_v1.cache.eviction_metrics`),
``policies:cache_warm_*_total`` (`integrations.vllm_v1.cache.warming`).

Gauges are refreshed at most once per ``refresh_interval_s`` of the scheduler's clock;
counters as events happen.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Mapping

import attrs
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client import Counter as PromCounter

from policies import FairnessPolicy, KVBlockQuota

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
MAX_TENANT_LABELS = 64


@attrs.frozen
class Series:
    """One Prometheus series a feature reports, declared in the feature's own module.

    ``name`` is the full name without a counter's ``_total`` suffix (``policies:...``);
    gauges keep the most recent value any process wrote.
    """

    name: str
    documentation: str
    labels: tuple[str, ...] = ()
    counter: bool = False
    """A counter (only increases; exported as ``<name>_total``), else a gauge."""


class PolicyMetrics:
    """Prometheus metrics of one scheduler; label sets that disappear are set back to 0."""

    def __init__(self, refresh_interval_s: float = 1.0,
                 registry: CollectorRegistry | None = None) -> None:
        """``registry=None`` (the server's case): values go to the multiprocess directory
        only, so a second scheduler in one process registers nothing twice."""
        self.refresh_interval_s = refresh_interval_s
        self._next_refresh = float("-inf")
        self._tenants: set[str] = set()
        self._waiting = Gauge("policies:waiting_requests", "Requests waiting, by tenant and level",
                              ["tenant", "level"], registry=registry, multiprocess_mode="mostrecent")
        self._running = Gauge("policies:running_requests", "Requests running, by tenant",
                              ["tenant"], registry=registry, multiprocess_mode="mostrecent")
        self._lag = Gauge("policies:fairness_lag_tokens",
                          "Fairness counter minus the lowest present tenant's, by tenant",
                          ["tenant"], registry=registry, multiprocess_mode="mostrecent")
        self._watermark = Gauge("policies:kv_watermark_level",
                                "KV watermark level: 0 green, 1 yellow, 2 red",
                                registry=registry, multiprocess_mode="mostrecent")
        self._rejections = PromCounter("policies:rejections", "Requests rejected, by reason",
                                       ["reason"], registry=registry)
        self._throttled = PromCounter("policies:prefill_tokens_throttled",
                                      "Prefill tokens withheld by a token cap, by tenant",
                                      ["tenant"], registry=registry)
        self._slot_preemptions = PromCounter(
            "policies:slot_preemptions", "Running requests preempted for a more important "
            "waiting one with every slot taken, by the preempted request's tenant", ["tenant"],
            registry=registry)
        self._prompt_tokens = PromCounter("policies:prefix_cache_prompt_tokens",
                                          "Prompt tokens of newly scheduled requests, by tenant",
                                          ["tenant"], registry=registry)
        self._hit_tokens = PromCounter("policies:prefix_cache_hit_tokens",
                                       "Prompt tokens served from the prefix cache, by tenant",
                                       ["tenant"], registry=registry)
        self._faults = PromCounter("policies:policy_faults",
                                   "Exceptions a policy raised, contained (stock fallback), "
                                   "by policy, seam and exception type",
                                   ["policy", "seam", "exception"], registry=registry)
        self._shown: dict[Gauge, set[tuple[str, ...]]] = {}
        self._series: dict[str, Gauge | PromCounter] = {}
        """A feature's series by name, created on first use (`declare`)."""
        self._registry = registry
        self._counted: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        """(series, labels) -> the policy's total already counted (`count_to`)."""

    @classmethod
    def from_environment(cls) -> PolicyMetrics | None:
        """Metrics when a multiprocess directory is configured, else ``None``."""
        return cls() if os.environ.get(MULTIPROC_ENV) else None

    def tenant_label(self, tenant: str) -> str:
        """``tenant``, or ``other`` once ``MAX_TENANT_LABELS`` tenants have labels."""
        if tenant in self._tenants or len(self._tenants) < MAX_TENANT_LABELS:
            self._tenants.add(tenant)
            return tenant
        return "other"

    def rejected(self, reason: str) -> None:
        """A request was rejected; ``reason`` is a `Rejection` reason label."""
        self._rejections.labels(reason=reason).inc()

    def policy_fault(self, policy: str, seam: str, exception: str) -> None:
        """``policy`` raised ``exception`` (a type name) at ``seam`` and the scheduler fell
        back to stock behaviour."""
        self._faults.labels(policy=policy, seam=seam, exception=exception).inc()

    def throttled(self, tenant: str, tokens: int) -> None:
        self._throttled.labels(tenant=self.tenant_label(tenant)).inc(tokens)

    def slot_preempted(self, tenant: str) -> None:
        self._slot_preemptions.labels(tenant=self.tenant_label(tenant)).inc()

    def prefix_hits(self, tenant: str, prompt_tokens: int, hit_tokens: int) -> None:
        """A request of ``tenant`` was scheduled for the first time with ``hit_tokens`` cached."""
        label = self.tenant_label(tenant)
        self._prompt_tokens.labels(tenant=label).inc(prompt_tokens)
        self._hit_tokens.labels(tenant=label).inc(min(hit_tokens, prompt_tokens))

    def declare(self, *series: Series) -> None:
        """Create ``series`` now, so that those without labels read 0 until first set."""
        for one in series:
            self._metric(one)

    def set(self, series: Series, value: float, **labels: str) -> None:
        """Set the gauge ``series`` (with ``labels``) to ``value``."""
        self._labelled(series, labels).set(value)

    def show(self, series: Series, values: Mapping[tuple[str, ...], float]) -> None:
        """Set the gauge ``series`` to ``values`` (label values, in ``series.labels`` order,
        -> value); label sets shown before and missing now are set back to 0."""
        self._show(self._metric(series), Counter(values))

    def count(self, series: Series, amount: float = 1, **labels: str) -> None:
        """Add ``amount`` to the counter ``series`` (with ``labels``)."""
        self._labelled(series, labels).inc(amount)

    def count_to(self, series: Series, total: float, **labels: str) -> None:
        """Advance the counter ``series`` (with ``labels``) to a policy's running ``total``
        (what a ``stats()`` snapshot reports): each event is counted once, however often
        the snapshot is read."""
        key = (series.name, tuple(sorted(labels.items())))
        delta = total - self._counted.get(key, 0)
        if delta > 0:
            self._labelled(series, labels).inc(delta)
            self._counted[key] = total

    def _metric(self, series: Series) -> Gauge | PromCounter:
        metric = self._series.get(series.name)
        if metric is None:
            if series.counter:
                metric = PromCounter(series.name, series.documentation, series.labels,
                                     registry=self._registry)
            else:
                metric = Gauge(series.name, series.documentation, series.labels,
                               registry=self._registry, multiprocess_mode="mostrecent")
            self._series[series.name] = metric
        return metric

    def _labelled(self, series: Series, labels: Mapping[str, str]) -> Gauge | PromCounter:
        metric = self._metric(series)
        return metric.labels(**labels) if labels else metric

    def due(self, now: float) -> bool:
        """Whether the gauges should be refreshed at ``now`` (then not again for an interval)."""
        if now < self._next_refresh:
            return False
        self._next_refresh = now + self.refresh_interval_s
        return True

    def refresh(self, *, waiting: Iterable[tuple[str, int]], running: Iterable[str],
                fairness: FairnessPolicy | None, watermarks: KVBlockQuota | None,
                kv_usage: float) -> None:
        """Set the gauges: ``waiting`` as ``(tenant, level)`` pairs, ``running`` as tenants."""
        waiting = list(waiting)
        running = list(running)
        self._show(self._waiting,
                   Counter((self.tenant_label(t), str(level)) for t, level in waiting))
        self._show(self._running, Counter((self.tenant_label(t),) for t in running))
        if fairness is not None:
            counters = {t: fairness.counter(t) for t in {t for t, _ in waiting} | set(running)}
            floor = min(counters.values(), default=0.0)
            lags: Counter[tuple[str, ...]] = Counter()
            for tenant, counter in counters.items():
                label = (self.tenant_label(tenant),)
                lags[label] = max(lags[label], counter - floor)
            self._show(self._lag, lags)
        if watermarks is not None:
            self._watermark.set(int(watermarks.level(kv_usage)))

    def _show(self, gauge: Gauge, values: Counter[tuple[str, ...]]) -> None:
        for labels in self._shown.get(gauge, set()) - values.keys():
            gauge.labels(*labels).set(0)
        for labels, value in values.items():
            gauge.labels(*labels).set(value)
        self._shown[gauge] = set(values)
