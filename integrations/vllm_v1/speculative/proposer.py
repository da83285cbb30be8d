"""`SuffixAutomatonProposer`: suffix-automaton drafts inside an unmodified vLLM V1 engine.

Enable it with::

    LLM(model=..., speculative_config={
        "method": "custom_class",
        "model": "integrations.vllm_v1.speculative.proposer.SuffixAutomatonProposer",
        "num_speculative_tokens": 32})

vLLM builds the proposer in the worker process with only the `VllmConfig`; to change the draft
rules or the shared-cache size, subclass it in an importable module, override the class
attributes, and name the subclass in ``"model"``.

Each step the proposer maps batch rows to requests (`BatchRows`, no request ids are passed),
appends each request's new tokens to its automaton and to its shared-cache cursors, drafts,
and hands finished requests' outputs to the shared cache. It records acceptance from the next
step's sampled tokens, times every call, and exports both through `stats` and, when
``prometheus_client`` is present, Prometheus metrics (`SpecPrometheus`).

Drafts the proposer makes may be trimmed by the scheduler (``Pipeline(speculation=...)``); its
own ``drafted_tokens`` counts what it proposed, vLLM's ``spec_decode_num_draft_tokens`` what was
verified. Accepted tokens agree between the two.
"""

from __future__ import annotations

import collections
import time
from typing import Any, ClassVar

import attrs
import numpy as np

from integrations.vllm_v1.speculative.metrics import SpecPrometheus
from integrations.vllm_v1.speculative.rows import BatchRows
from policies.percentile import percentile
from policies.speculative import (
    DraftConfig,
    DrafterStats,
    SharedSuffixCache,
    SpecMetrics,
    SpecMetricsStats,
    SuffixDrafter,
)

LATENCY_WINDOW = 4096
"""Recent per-request propose calls kept for the latency percentiles."""


@attrs.frozen(kw_only=True)
class SpecProposerStats:
    """A snapshot of a `SuffixAutomatonProposer`."""

    drafter: DrafterStats
    verification: SpecMetricsStats
    """tau, acceptance, coverage, per-position acceptance, from the tokens vLLM accepted."""
    tracked_requests: int
    """Requests in the batch or within their grace period."""
    propose_p50_us: float
    """Median time of one request's draft over the last `LATENCY_WINDOW` calls."""
    propose_p99_us: float
    update_us_per_token: float
    """Time appending tokens (automaton + shared cursors + cache inserts) per token appended."""


def warm_up_kernels(config: DraftConfig) -> None:
    """Run every numba kernel once on a throwaway drafter (loads or compiles them)."""
    drafter = SuffixDrafter(config=config, shared=SharedSuffixCache(max_tokens=1024))
    loop = np.tile(np.arange(1, 9, dtype=np.int32), 4)
    for request in range(2):
        drafter.start(request, loop)
        drafter.propose(request)
        drafter.extend(request, loop[:4])
        drafter.propose(request)
        drafter.finish(request)


class SuffixAutomatonProposer:
    """vLLM ``custom_class`` proposer; drafts never change outputs, only how many steps they take.

    Class attributes (override in a subclass):
        draft_config: Draft rules; ``None`` = `DraftConfig` with ``num_speculative_tokens``.
        shared_cache_tokens: Token bound of the cross-request cache (0 disables it).
        shared_generations: Generations of the cache (eviction drops the oldest).
    """

    draft_config: ClassVar[DraftConfig | None] = None
    shared_cache_tokens: ClassVar[int] = 4_000_000
    shared_generations: ClassVar[int] = 2

    def __init__(self, vllm_config: Any) -> None:
        spec = vllm_config.speculative_config
        self.k = int(spec.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        config = self.draft_config or DraftConfig(max_draft_tokens=self.k)
        shared = (SharedSuffixCache(max_tokens=self.shared_cache_tokens,
                                    generations=self.shared_generations)
                  if self.shared_cache_tokens else None)
        self.drafter = SuffixDrafter(config=config, shared=shared)
        self.rows = BatchRows()
        self.metrics = SpecMetrics()
        self.prometheus = SpecPrometheus.create()
        self._propose_ns: collections.deque[int] = collections.deque(maxlen=LATENCY_WINDOW)
        self._update_ns = 0
        self._update_tokens = 0

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to load; compiles the numba kernels now (vLLM calls this before serving), so
        the first requests' latency and the latency stats exclude compilation."""
        warm_up_kernels(self.drafter.config)

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings: Any = None) -> list[list[int]]:
        """One draft per batch row (``[]`` = none), for the rows that just sampled."""
        self.rows.begin_step()
        drafts = [self._propose_row(i, sampled, int(num_tokens_no_spec[i]), token_ids_cpu)
                  for i, sampled in enumerate(sampled_token_ids)]
        t0 = time.perf_counter_ns()
        for gone in self.rows.end_step():
            self.drafter.finish(gone.key)
        self._update_ns += time.perf_counter_ns() - t0
        if self.prometheus is not None:
            if self.prometheus.gauges_due():
                self.prometheus.publish(self.stats())
            else:
                self.prometheus.count(self.metrics.stats())
        return drafts

    def stats(self) -> SpecProposerStats:
        """Drafter, verification and latency figures now."""
        latency_us = np.asarray(self._propose_ns, dtype=np.float64) / 1e3
        return SpecProposerStats(
            drafter=self.drafter.stats(), verification=self.metrics.stats(),
            tracked_requests=self.rows.tracked,
            propose_p50_us=percentile(latency_us, 50) if latency_us.size else 0.0,
            propose_p99_us=percentile(latency_us, 99) if latency_us.size else 0.0,
            update_us_per_token=self._update_ns / 1e3 / max(self._update_tokens, 1))

    def _propose_row(self, row: int, sampled: list[int], n: int,
                     token_ids_cpu: np.ndarray) -> list[int]:
        if not sampled or n >= self.max_model_len:
            return []
        context = token_ids_cpu[row, :n]
        tracked, is_new = self.rows.claim(row, context)
        t0 = time.perf_counter_ns()
        if is_new:
            self.drafter.start(tracked.key, tracked.advance(context[:n - len(sampled)]))
        else:
            self.metrics.record(tracked.drafted_tokens,
                                min(len(sampled) - 1, tracked.drafted_tokens))
        new = tracked.advance(context)
        self.drafter.extend(tracked.key, new)
        t1 = time.perf_counter_ns()
        self._update_ns += t1 - t0
        self._update_tokens += new.shape[0]
        draft = self.drafter.propose(tracked.key, min(self.k, self.max_model_len - n - 1))
        self._propose_ns.append(time.perf_counter_ns() - t1)
        tracked.drafted_tokens = len(draft.tokens)
        return list(draft.tokens)
