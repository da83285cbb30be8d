"""`CacheWarmingHook`: a `PrefixWarmer` driving warm-up requests inside a vLLM V1 engine.

The scheduler shows it every admitted request (`observe`) and calls `before_step` before each
step (through the `SchedulerHook` points). When the warmer names a hot prefix the prefix cache does not hold, it adds a one-token
request for it (id ``warm-<n>``, tenant ``warming``, lowest priority) through the scheduler's
own ``add_request``; its prefill fills the cache, and its output goes to no client (vLLM's
output processor drops outputs of request ids it does not know).

With ``state_path``, the hot set is saved there (JSON, when a prefix turns hot, at most every
``save_interval_s``, and at shutdown) and read back when the engine starts: the scheduler then reports work
(`pending`), so the engine steps and warms those prefixes before the first request arrives.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from integrations.vllm_v1.hooks import SchedulerAccess, SchedulerHook
from integrations.vllm_v1.metrics import Series
from integrations.vllm_v1.vllm_surface.names import (
    Request,
    SamplingParams,
    cached_prefix_tokens,
    get_hash_fn_by_name,
    get_request_block_hasher,
)
from policies import LoadSnapshot
from policies.kv.cache_warming import WarmingPolicy, WarmPrefix

WARM_ID_PREFIX = "warm-"
WARM_TENANT = "warming"
WARM_PRIORITY = 20
"""vLLM's lowest-urgency priority value: warming yields to every real request."""
WARM_REQUESTS = Series("policies:cache_warm_requests", "Warm-up requests for hot prompt prefixes",
                       counter=True)
WARM_TOKENS = Series("policies:cache_warm_tokens", "Prompt tokens prefilled by warm-up requests",
                     counter=True)


class CacheWarmingHook(SchedulerHook):
    """The pipeline's ``warming`` slot: observes admitted requests and, when the warmer says
    so, adds warm-up requests."""

    def __init__(self, scheduler: SchedulerAccess, warmer: WarmingPolicy, *, save_interval_s: float = 30.0,
                 check_interval_s: float = 1.0) -> None:
        """The hot set is kept at the pipeline's ``warming_state_path``; warm-up requests are
        counted on the scheduler's metrics, if any."""
        self.scheduler = scheduler
        self.metrics = scheduler.metrics
        if self.metrics is not None:
            self.metrics.declare(WARM_REQUESTS, WARM_TOKENS)
        self.warmer = warmer
        state_path = scheduler.pipeline.warming_state_path
        self.state_path = Path(state_path) if state_path else None
        self.save_interval_s = save_interval_s
        self.check_interval_s = check_interval_s
        self._next_check = float("-inf")
        self._probes: dict[Any, Request] = {}
        """Block-hashed probe requests of hot prefixes, by prefix key (hashing is not free)."""
        config = scheduler.vllm_config.cache_config
        self.block_size = scheduler.hash_block_size
        self._hasher = get_request_block_hasher(
            self.block_size, get_hash_fn_by_name(config.prefix_caching_hash_algo))
        self._next_id = 0
        self._next_save = float("-inf")
        self._dirty = False
        self._pending = self.state_path is not None and self.state_path.exists()
        """Restored prefixes wait for their first warm-up (read lazily: vLLM seeds its block
        hashes only after the scheduler is built)."""
        self._restored = not self._pending

    def on_admitted(self, request: Any, tenant: str) -> None:
        self.observe(request)

    def before_schedule(self, now: float) -> None:
        self.before_step(now, self.scheduler.step_load)

    def shutdown(self, now: float) -> None:
        self.save(now)

    def observe(self, request: Request) -> None:
        """Count an admitted request's prompt prefix (warm-up requests are not counted)."""
        if not request.request_id.startswith(WARM_ID_PREFIX):
            turned_hot = self.warmer.observe(request.block_hashes, request.prompt_token_ids,
                                             self.block_size, self.scheduler.clock())
            self._dirty |= turned_hot and self.state_path is not None

    def pending(self) -> bool:
        """Whether prefixes restored from ``state_path`` still wait for their first warm-up."""
        return self._pending

    def before_step(self, now: float, load: Callable[[], LoadSnapshot]) -> None:
        """Save the hot set if it changed; add warm-up requests for uncached hot prefixes if the
        engine is quiet (looked at most every ``check_interval_s``, each step while restored
        prefixes are pending; ``load`` is only called then)."""
        if self._dirty and now >= self._next_save:
            self.save(now)
        if now < self._next_check and not self._pending:
            return
        if not self._restored:
            self._restored = True
            self.warmer.restore(json.loads(self.state_path.read_text()), self._block_keys,
                                self.block_size, now)
        self._next_check = now + self.check_interval_s
        chosen = self.warmer.next_to_warm(load(), self._is_cached)
        for prefix in chosen:
            self.scheduler.add_request(self._warm_request(prefix, now))
            if self.metrics is not None:
                self.metrics.count(WARM_REQUESTS)
                self.metrics.count(WARM_TOKENS, len(prefix.tokens))
        if not chosen:
            self._pending = False

    def save(self, now: float) -> None:
        """Write the hot set to ``state_path`` atomically (done when a prefix turns hot, at
        most every ``save_interval_s``, and at shutdown)."""
        if self.state_path is None:
            return
        self._next_save = now + self.save_interval_s
        self._dirty = False
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.warmer.snapshot(now)))
        os.replace(tmp, self.state_path)

    def _is_cached(self, prefix: WarmPrefix) -> bool:
        probe = self._probes.get(prefix.key)
        if probe is None:
            if len(self._probes) >= 4 * self.warmer.max_prefixes:
                self._probes.clear()
            probe = self._probes[prefix.key] = self._request(prefix.tokens, "probe")
        return cached_prefix_tokens(self.scheduler.kv_cache_manager, probe) >= (
            len(prefix.tokens) - self.block_size)

    def _block_keys(self, tokens: list[int]) -> list[Any]:
        return self._request(tokens, "probe").block_hashes

    def _warm_request(self, prefix: WarmPrefix, now: float) -> Request:
        self._next_id += 1
        return self._request(prefix.tokens, str(self._next_id), arrival_time=now)

    def _request(self, tokens: Any, suffix: str, arrival_time: float | None = None) -> Request:
        params = SamplingParams(max_tokens=1, extra_args={"tenant": WARM_TENANT})
        return Request(request_id=WARM_ID_PREFIX + suffix, prompt_token_ids=list(tokens),
                       sampling_params=params, pooling_params=None,
                       arrival_time=arrival_time, priority=WARM_PRIORITY,
                       block_hasher=self._hasher)
