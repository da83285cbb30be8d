"""`KVTierConnector`: a vLLM V1 KV connector that keeps full KV blocks in CPU and disk tiers.

Enable it with `KVTierConfig(...).engine_kwargs()` (``kv_transfer_config`` with
``kv_connector_module_path`` = this module); it runs on the CPU build and on GPU.

How it works, keyed by vLLM's block hashes (the prefix-cache keys):

* **Write-through.** Every block that becomes full during a step is copied
  from the paged cache to the CPU tier right after that step's forward
  (``wait_for_save``), so a preempted request's blocks are already stored when
  vLLM frees them: it resumes by loading them instead of recomputing.
* **Placement.** The scheduler side owns a `policies.TierPlacement` (CPU tier,
  then an optional disk tier, LRU within each; high-priority requests' blocks
  never go to disk) and sends its decisions to the workers, which carry them
  out in order (`KVBlockStore`). Workers decide nothing, so every worker's store
  matches the placement.
* **Load.** When vLLM's GPU prefix cache misses, ``get_num_new_matched_tokens``
  counts the following blocks the tiers hold; they are copied into the blocks
  vLLM allocated before the step's forward (a synchronous load).
* **Prefetch** (optional). Each step, disk blocks of the oldest waiting requests
  are promoted to the CPU tier.

Guarantees: outputs are those of recomputation (loaded blocks are bytes the
engine itself wrote under the same hash); a block missing from a worker's store
is reported as a load error and vLLM recomputes it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import attrs

from integrations.vllm_v1.cache.tiers import metrics as kv_tier_metrics
from integrations.vllm_v1.cache.tiers.config import KVTierConfig
from integrations.vllm_v1.cache.tiers.store import CPU, DISK, KVBlockStore, PagedKV
from integrations.vllm_v1.vllm_surface.names import (
    CacheHitSource,
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    RequestStatus,
    tensor_parallel_rank,
)
from policies.kv.tiering import Tier, TierMove, TierPlacement, TierStats

if TYPE_CHECKING:
    import torch

    from integrations.vllm_v1.vllm_surface.names import (
        AttentionMetadata,
        ForwardContext,
        KVCacheBlocks,
        KVCacheConfig,
        Request,
        SchedulerOutput,
        VllmConfig,
    )

_HIT_SOURCE = {CPU: CacheHitSource.HOST, DISK: CacheHitSource.DISK}


@dataclass(frozen=True)
class SaveBlock:
    """Copy paged block ``block_id`` into the CPU tier under ``key``."""

    key: bytes
    block_id: int


@dataclass
class KVTierMetadata(KVConnectorMetadata):
    """One step's work for the workers: ``loads`` before the forward, ``ops`` after it, in order."""

    loads: list[tuple[bytes, int]] = field(default_factory=list)
    ops: list[SaveBlock | TierMove] = field(default_factory=list)


@attrs.frozen(kw_only=True)
class KVTierStats:
    """Scheduler-side counters of a `KVTierConnector`.

    Attributes:
        placement: the tier placement's snapshot (occupancy, demotions, prefetch accuracy).
        loaded_tokens_by_tier: ``(tier, tokens)`` loaded from each tier, all requests.
        resumed_requests: preempted requests scheduled again.
        restored_tokens: tokens those resumed requests loaded from the tiers.
        recomputed_tokens: tokens those resumed requests had to compute again (neither in
            the GPU prefix cache nor in a tier).
        saved_blocks: blocks copied to the CPU tier.
    """

    placement: TierStats
    loaded_tokens_by_tier: tuple[tuple[str, int], ...]
    resumed_requests: int
    restored_tokens: int
    recomputed_tokens: int
    saved_blocks: int


class KVTierConnector(KVConnectorBase_V1):
    """CPU and disk KV tiers behind vLLM's prefix cache; see the module docstring."""

    _cache_hit_source = CacheHitSource.HOST

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole,
                 kv_cache_config: KVCacheConfig) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        self.config = KVTierConfig.from_extra_config(dict(extra))
        self._block_size = vllm_config.cache_config.block_size
        # scheduler side
        tiers = [Tier(name=CPU, capacity_blocks=self.config.cpu_blocks)]
        if self.config.disk_blocks:
            tiers.append(Tier(name=DISK, capacity_blocks=self.config.disk_blocks))
        self.placement = TierPlacement(tiers=tiers, high_priority_floor=CPU)
        self._requests: dict[str, Request] = {}
        self._running: set[str] = set()
        self._match_start: dict[str, int] = {}
        self._hit_sources: dict[str, dict[CacheHitSource, int]] = {}
        self._pending_loads: list[tuple[bytes, int]] = []
        self._counts: Counter[str] = Counter()
        self._last_report: dict[str, Any] | None = None
        # worker side
        self._store: KVBlockStore | None = None
        self._paged: PagedKV | None = None
        self._load_errors: set[int] = set()

    @property
    def requires_kv_delivery(self) -> bool:
        """A cache, not a hand-off: a dropped save is only a future miss."""
        return False

    # ---- scheduler side ----

    def on_new_request(self, request: Request) -> None:
        self._requests[request.request_id] = request

    def get_num_new_matched_tokens(self, request: Request,
                                   num_computed_tokens: int) -> tuple[int, bool]:
        """Tokens of the consecutive blocks after ``num_computed_tokens`` held in a tier.

        Leaves at least the last token to compute; loads are synchronous.
        """
        start = num_computed_tokens // self._block_size
        end = min((request.num_tokens - 1) // self._block_size, len(request.block_hashes))
        matched = 0
        while start + matched < end and request.block_hashes[start + matched] in self.placement:
            matched += 1
        self._match_start[request.request_id] = start
        return matched * self._block_size, False

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks,
                                 num_external_tokens: int) -> None:
        start = self._match_start.pop(request.request_id, None)
        if start is None:
            return
        if request.status == RequestStatus.PREEMPTED:
            self._counts["resumed_requests"] += 1
            self._counts["restored_tokens"] += num_external_tokens
            self._counts["recomputed_tokens"] += (
                request.num_tokens - start * self._block_size - num_external_tokens)
        if num_external_tokens == 0:
            return
        end = start + num_external_tokens // self._block_size
        block_ids = blocks.get_block_ids()[0][start:end]
        sources: Counter[CacheHitSource] = Counter()
        for key, block_id in zip(request.block_hashes[start:end], block_ids, strict=True):
            tier = self.placement.use(key)
            self._counts[f"loaded_tokens_{tier}"] += self._block_size
            sources[_HIT_SOURCE[tier]] += self._block_size
            self._pending_loads.append((key, block_id))
        self._hit_sources[request.request_id] = dict(sources)

    def get_external_cache_hit_sources(self, request: Request,
                                       num_external_tokens: int) -> dict[CacheHitSource, int]:
        sources = self._hit_sources.pop(request.request_id, {})
        return sources if sum(sources.values()) == num_external_tokens else (
            super().get_external_cache_hit_sources(request, num_external_tokens))

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVTierMetadata:
        """This step's loads, then saves of the blocks it fills, then prefetches."""
        ops: list[SaveBlock | TierMove] = []
        for new in scheduler_output.scheduled_new_reqs:
            self._plan_saves(new.req_id, new.num_computed_tokens, scheduler_output, ops)
        cached = scheduler_output.scheduled_cached_reqs
        for req_id, computed in zip(cached.req_ids, cached.num_computed_tokens, strict=True):
            self._plan_saves(req_id, computed, scheduler_output, ops)
        self._running.update(scheduler_output.num_scheduled_tokens)
        self._running.difference_update(scheduler_output.preempted_req_ids or ())
        ops += self._plan_prefetch()
        meta = KVTierMetadata(loads=self._pending_loads, ops=ops)
        self._pending_loads = []
        return meta

    def request_finished(self, request: Request,
                         block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        """Forget the request; its blocks were saved as they filled, so nothing is pending."""
        for table in (self._requests, self._match_start, self._hit_sources):
            table.pop(request.request_id, None)
        self._running.discard(request.request_id)
        return False, None

    def tier_stats(self) -> KVTierStats:
        """Counters of the scheduler side (call on the scheduler's connector)."""
        return KVTierStats(
            placement=self.placement.stats(),
            loaded_tokens_by_tier=tuple((tier.name, self._counts[f"loaded_tokens_{tier.name}"])
                                        for tier in self.placement.tiers),
            resumed_requests=self._counts["resumed_requests"],
            restored_tokens=self._counts["restored_tokens"],
            recomputed_tokens=self._counts["recomputed_tokens"],
            saved_blocks=self._counts["saved_blocks"])

    def get_kv_connector_stats(self) -> kv_tier_metrics.KVTierConnectorStats | None:
        """The scheduler side's change since its last report (see `kv_tier_metrics`)."""
        if self.role != KVConnectorRole.SCHEDULER:
            return None
        stats = self.tier_stats()
        counters = {**self._counts, "dropped_blocks": stats.placement.dropped,
                    "prefetched_blocks": stats.placement.prefetched,
                    "prefetch_hits": stats.placement.prefetch_hits,
                    "prefetch_wasted": stats.placement.prefetch_wasted}
        current = kv_tier_metrics.snapshot(counters, dict(stats.placement.blocks_by_tier),
                                           dict(stats.loaded_tokens_by_tier))
        delta = kv_tier_metrics.report(current, self._last_report)
        if delta is None:
            return None
        self._last_report = current
        return kv_tier_metrics.KVTierConnectorStats(data=delta)

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None
                                 ) -> kv_tier_metrics.KVTierConnectorStats:
        return kv_tier_metrics.KVTierConnectorStats(data=data or {})

    @classmethod
    def build_prom_metrics(cls, vllm_config: VllmConfig, metric_types: dict[type, type],
                           labelnames: list[str], per_engine_labelvalues: dict[int, list[object]]
                           ) -> kv_tier_metrics.KVTierPromMetrics:
        return kv_tier_metrics.KVTierPromMetrics(vllm_config, metric_types, labelnames,
                                                 per_engine_labelvalues)

    def _plan_saves(self, req_id: str, computed_before: int,
                    scheduler_output: SchedulerOutput, ops: list[SaveBlock | TierMove]) -> None:
        """Save the blocks of ``req_id`` that this step fills (draft tokens excluded)."""
        request = self._requests.get(req_id)
        if request is None:
            return
        scheduled = scheduler_output.num_scheduled_tokens.get(req_id, 0) - len(
            scheduler_output.scheduled_spec_decode_tokens.get(req_id, ()))
        first = computed_before // self._block_size
        last = min((computed_before + scheduled) // self._block_size, len(request.block_hashes))
        if first >= last:
            return
        assert self._kv_cache_manager is not None
        block_ids = self._kv_cache_manager.get_block_ids(req_id)[0]
        high = self._is_high_priority(request)
        for index in range(first, last):
            key = request.block_hashes[index]
            if key not in self.placement:
                ops.append(SaveBlock(key, block_ids[index]))
                self._counts["saved_blocks"] += 1
            ops += self.placement.store(key, high_priority=high)

    def _plan_prefetch(self) -> list[TierMove]:
        """Promote disk blocks of the first ``prefetch_requests`` waiting requests."""
        if not self.config.prefetch_requests or len(self.placement.tiers) == 1:
            return []
        waiting = [r for r in self._requests.values() if r.request_id not in self._running]
        waiting.sort(key=lambda r: r.priority)  # stable: arrival order within a priority
        chains = [r.block_hashes for r in waiting[:self.config.prefetch_requests]]
        moves: list[TierMove] = []
        for key in self.placement.prefetch_candidates(chains, self.config.prefetch_blocks):
            if key in self.placement:  # an earlier promotion may have dropped it
                moves += self.placement.promote(key, prefetch=True)
        return moves

    def _is_high_priority(self, request: Request) -> bool:
        threshold = self.config.high_priority_at_most
        return threshold is not None and request.priority <= threshold

    # ---- worker side ----

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        import torch

        self._paged = PagedKV(kv_caches, self._kv_cache_config.num_blocks)
        on_gpu = any(t.is_cuda for t in kv_caches.values())
        self._store = KVBlockStore(self._worker_directory(),
                                   pin_memory=on_gpu and torch.cuda.is_available())

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        """Copy this step's loads into the paged cache (before the forward)."""
        meta = self._get_connector_metadata()
        assert isinstance(meta, KVTierMetadata)
        if not meta.loads or self._paged is None or self._store is None:
            return
        block_ids, blocks = [], []
        for key, block_id in meta.loads:
            data = self._store.get(key)
            if data is None:
                self._load_errors.add(block_id)
            else:
                block_ids.append(block_id)
                blocks.append(data)
        self._paged.write(block_ids, blocks)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor,
                      attn_metadata: AttentionMetadata, **kwargs: Any) -> None:
        return  # whole blocks are saved once per step, in wait_for_save

    def wait_for_save(self) -> None:
        """Carry out this step's saves and moves, in the order the placement decided them."""
        meta = self._get_connector_metadata()
        assert isinstance(meta, KVTierMetadata)
        if not meta.ops or self._paged is None or self._store is None:
            return
        saves = [op for op in meta.ops if isinstance(op, SaveBlock)]
        saved = dict(zip((op.key for op in saves),
                         self._paged.read([op.block_id for op in saves]), strict=True))
        for op in meta.ops:
            if isinstance(op, SaveBlock):
                self._store.put(op.key, saved[op.key])
            else:
                self._store.move(op.key, op.source, op.target)

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def shutdown(self) -> None:
        if self._store is not None:
            self._store.close()

    def _worker_directory(self) -> str | None:
        if self.config.disk_path is None:
            return None
        return f"{self.config.disk_path}/rank{tensor_parallel_rank()}"
