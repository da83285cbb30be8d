"""Accounting: per-request token caps, tenant quotas during a step, and what each policy
is charged for the tokens a step scheduled.

`Accounting` reads the scheduler through `EngineState` (vLLM's running list, requests and
sizes, and the step's load), so a fake stands in for vLLM in unit tests.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import attrs

from integrations.vllm_v1.metrics import PolicyMetrics
from integrations.vllm_v1.pipeline import Pipeline
from integrations.vllm_v1.scheduling.faults import PolicyFaults
from integrations.vllm_v1.scheduling.ordering import Tracked, ViewOf
from integrations.vllm_v1.vllm_surface.names import KVCacheConfig, Request, RequestStatus
from policies import KVBlockQuota, LoadSnapshot, RequestView, TenantUsage, needs_of

if TYPE_CHECKING:
    from integrations.vllm_v1.vllm_surface.names import KVCacheManager


class EngineState(Protocol):
    """What accounting reads of the scheduler."""

    running: list[Request]
    requests: dict[str, Request]
    block_size: int
    max_num_running_reqs: int
    kv_cache_config: KVCacheConfig
    kv_cache_manager: KVCacheManager

    def step_load(self) -> LoadSnapshot:
        """The load as this step began."""
        ...


def prefill_part(tokens: int, prompt_tokens: int, computed_tokens: int) -> int:
    """How many of ``tokens`` scheduled after ``computed_tokens`` fall inside the prompt."""
    prompt_left = prompt_tokens - computed_tokens
    return 0 if prompt_left <= 0 else tokens if tokens < prompt_left else prompt_left


@attrs.define(eq=False, kw_only=True)
class Accounting:
    """Token caps (rate policy, KV-block quota) on prefill chunks, tenant quotas while a step
    picks, and the charges of a step to the rate, level and fairness policies.

    The fairness policy is charged exactly the tokens scheduled: a request started from the
    waiting queue at the queue's next pick (`charge_dispatched`, so later picks in the step
    see it), everything else at the end of the step (`account_service`); a request vLLM pops
    only to skip it costs nothing.
    """

    pipeline: Pipeline
    tracked: dict[str, Tracked]
    """The admitted requests by id (the scheduler's own dict, shared)."""
    engine: EngineState
    view: ViewOf
    faults: PolicyFaults
    metrics: PolicyMetrics | None = None
    block_quota: KVBlockQuota | None = attrs.field(init=False)
    waiting_grants: dict[str, tuple[int, int]] = attrs.field(init=False, factory=dict)
    """This step's ``(computed, new tokens)`` offer to each waiting request vLLM considered."""
    charged_on_dispatch: set[str] = attrs.field(init=False, factory=set)
    quota_usage: tuple[dict[str, int], dict[str, int]] | None = attrs.field(init=False,
                                                                           default=None)
    """Running requests and KV blocks per tenant while a step picks (quotas only)."""

    def __attrs_post_init__(self) -> None:
        watermarks = self.pipeline.watermarks
        self.block_quota = (watermarks if watermarks is not None and needs_of(watermarks).block_quota
                            else None)

    def begin_step(self) -> None:
        """Forget the last step's offers and quota usage."""
        self.waiting_grants.clear()
        self.quota_usage = None

    def end_picks(self) -> None:
        """The step's picks are over: quotas are counted afresh at the next one."""
        self.quota_usage = None

    # -- quotas while a step picks ---------------------------------------------

    def tenants_under_quota(self, backlogged: list[str]) -> list[str]:
        """The pipeline's quotas over the running requests as they stand (during a step too).

        A request's KV blocks are counted as its computed tokens over the block size, so
        prefix blocks shared by several requests count once per request. The running list
        is scanned once per step; requests started since are added as they are dispatched.
        """
        engine = self.engine
        if self.quota_usage is None:
            self.quota_usage = {}, {}
            for request in engine.running:
                self._add_quota_usage(request)
        running, blocks = self.quota_usage
        usage = TenantUsage(running_requests=running, kv_blocks=blocks,
                            max_running_requests=engine.max_num_running_reqs,
                            total_kv_blocks=engine.kv_cache_config.num_blocks)
        return self.pipeline.quotas.eligible(backlogged, usage)

    def _add_quota_usage(self, request: Request) -> None:
        running, blocks = self.quota_usage
        tenant = self.tracked[request.request_id].metadata.tenant
        running[tenant] = running.get(tenant, 0) + 1
        blocks[tenant] = blocks.get(tenant, 0) - (-request.num_computed_tokens
                                                  // self.engine.block_size)

    # -- token caps --------------------------------------------------------------

    def token_cap(self, request: Request, num_computed_tokens: int, num_new_tokens: int) -> int:
        """vLLM's offer of ``num_new_tokens`` to ``request`` under the caps (decodes are never
        capped); a raising cap is contained (seam ``token_cap``: uncapped). Remembers what a
        waiting request was offered, for `charge_dispatched`."""
        if num_computed_tokens < request.num_prompt_tokens:  # decodes are never capped
            try:
                num_new_tokens = self._capped_tokens(request, num_computed_tokens,
                                                     num_new_tokens)
            except Exception as error:  # noqa: BLE001 - contained: uncapped
                self.faults.record("token_cap", error)
        if request.status is not RequestStatus.RUNNING:  # what it gets if vLLM now pops it
            self.waiting_grants[request.request_id] = (num_computed_tokens, num_new_tokens)
        return num_new_tokens

    def _capped_tokens(self, request: Request, num_computed_tokens: int,
                       num_new_tokens: int) -> int:
        """A prefill chunk of ``num_new_tokens`` under the rate cap and the KV-block quota."""
        caps = [cap for cap in (self._rate_cap(request),
                                self._kv_quota_cap(request, num_computed_tokens))
                if cap is not None]
        if not caps:
            return num_new_tokens
        # A running request may be skipped this step (0); a waiting one would end vLLM's
        # waiting pass for everyone behind it, so it keeps at least one token.
        floor = 0 if request.status == RequestStatus.RUNNING else 1
        capped = min(num_new_tokens, max(min(caps), floor))
        if self.metrics is not None and capped < num_new_tokens:
            self.metrics.throttled(self.tracked[request.request_id].metadata.tenant,
                                   num_new_tokens - capped)
        return capped

    def _rate_cap(self, request: Request) -> int | None:
        if self.pipeline.rate is None:
            return None
        return self.pipeline.rate.token_cap(self.view(request), self.engine.step_load())

    def _kv_quota_cap(self, request: Request, num_computed_tokens: int) -> int | None:
        """Prefill tokens left under the request's KV-block quota (`KVBlockQuota.block_quota`).

        The head of the running list is exempt (as is a request when nothing runs), so one
        request always progresses, finishes and frees blocks: quotas cannot stall the engine.
        With nothing waiting as the step began there is no one to leave blocks for, and no
        quota applies (a long prompt is not held back on a cache full of running work).
        """
        engine = self.engine
        if (self.block_quota is None or not engine.running or engine.running[0] is request
                or not engine.step_load().waiting_requests):
            return None
        quota_blocks = self.block_quota.block_quota(self.view(request),
                                                    engine.kv_cache_manager.usage)
        if quota_blocks is None:
            return None
        return max(0, quota_blocks * engine.block_size - num_computed_tokens)

    # -- charges -------------------------------------------------------------------

    def charge_dispatched(self, tenant: str, request: Request) -> None:
        """Charge ``tenant`` for a request popped from the waiting queue, if vLLM started it."""
        grant = self.waiting_grants.get(request.request_id)
        if grant is None or request.status is not RequestStatus.RUNNING:
            return  # popped only to be skipped this step
        computed, tokens = grant
        prefill = prefill_part(tokens, request.num_prompt_tokens, computed)
        self.pipeline.fairness.charge(tenant, input_tokens=prefill, output_tokens=tokens - prefill)
        self.charged_on_dispatch.add(request.request_id)
        if self.quota_usage is not None:  # it runs now: the next pick's quotas count it
            self._add_quota_usage(request)

    def account_service(self, num_scheduled_tokens: dict[str, int],
                        step_views: dict[str, RequestView], now: float) -> None:
        """Tell rate, levels and fairness what each request got this step (one pass, no view
        built for a plain decode: the hot path of a step with hundreds decoding).

        ``step_views`` holds the views built this step (a request's progress before it).
        """
        rate, levels, fairness = self.pipeline.rate, self.pipeline.levels, self.pipeline.fairness
        requests, tracked = self.engine.requests, self.tracked
        charged = self.charged_on_dispatch
        served: dict[str, list[int]] = {}  # tenant -> [prefill, decoded] not yet charged
        for req_id, tokens in num_scheduled_tokens.items():
            request, entry = requests[req_id], tracked[req_id]
            view = step_views.get(req_id)
            prefill = prefill_part(tokens, request.num_prompt_tokens,
                                   view.computed_tokens if view else request.num_computed_tokens)
            if rate is not None and prefill:  # only prefills are rate-limited
                rate.on_scheduled(self.view(request), tokens, now)
            if levels is not None:
                levels.on_scheduled(entry.admitted, tokens, now)
            if fairness is not None and req_id not in charged:
                tenant_served = served.get(entry.metadata.tenant)
                if tenant_served is None:
                    tenant_served = served[entry.metadata.tenant] = [0, 0]
                tenant_served[0] += prefill
                tenant_served[1] += tokens - prefill
        for tenant, (prefill, decoded) in served.items():
            fairness.charge(tenant, input_tokens=prefill, output_tokens=decoded)
        charged.clear()
