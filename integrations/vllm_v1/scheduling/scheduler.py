r"""`PolicyScheduler`: vLLM's own scheduler, steered by a `Pipeline`.

Seams (see docs/concepts.md), all on our own instance, none patching vLLM:

* waiting order: ``self.waiting`` is a `PolicyRequestQueue` keyed by
  ``(level, rank_key)`` with one heap per tenant when a fairness policy picks
  tenants; ``self.kv_holding_waiting`` the same without fairness;
* service order and preemption victim: ``self.running`` is sorted before each
  step by (late?, tenant counter, level, rank key): vLLM serves front to back and
  preempts from the tail;
* slot preemption: with every slot taken, ``schedule`` asks the ``preemption`` policy for
  a running request to preempt for a waiting one (vLLM preempts only for KV blocks); that
  one moves to the head of the queue, the victim right behind it;
* admission: ``add_request`` asks the admission and watermark policies; a
  rejection (or a deadline that expires while waiting) finishes the request with
  ``finish_reason="abort"`` and the `Rejection`'s ``stop_reason``;
* per-request token cap: ``_reserve_prefill_lookahead`` clamps prefill chunks to
  the rate policy's cap and the `KVWatermarks` block quota (a cap of 0 skips a
  running request this step);
* accounting: ``_update_after_schedule`` tells the rate, level and fairness
  policies what each request received; ``_preempt_request`` tells the levels.
  The fairness policy is charged exactly the tokens scheduled: a request started
  from the waiting queue at the queue's next pick (so later picks in the step see
  it), everything else at the end of the step; a request vLLM pops only to skip
  it costs nothing.

Optional features (eviction order, cache warming, draft budget, start gate, step
log) are `SchedulerHook`\ s (`integrations.vllm_v1.hooks`), built from
the pipeline's slots by `integrations.vllm_v1.scheduling.features`. The pipeline is
named in ``additional_config`` (`integrations.vllm_v1.config.spec`).

The clock is read once per step; every policy sees that same ``now``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import operator
import time
from collections.abc import Callable, Iterator
from typing import Any

import attrs

from integrations.vllm_v1.config.spec import pipeline_from_additional_config
from integrations.vllm_v1.hooks import HookTable
from integrations.vllm_v1.metrics import PolicyMetrics
from integrations.vllm_v1.pipeline import Pipeline
from integrations.vllm_v1.rejection import Rejection
from integrations.vllm_v1.scheduling.faults import PolicyFaults
from integrations.vllm_v1.scheduling.features import feature_hooks
from integrations.vllm_v1.scheduling.queue import PolicyRequestQueue
from integrations.vllm_v1.scheduling.views import request_metadata, request_view
from integrations.vllm_v1.vllm_surface.names import (
    AsyncScheduler,
    EngineCoreOutput,
    EngineCoreOutputs,
    FinishReason,
    Request,
    RequestStatus,
    Scheduler,
    cached_prefix_tokens,
)
from policies import (
    InvalidRequestMetadata,
    KVBlockQuota,
    LifecycleObserver,
    LoadSnapshot,
    RequestMetadata,
    RequestView,
    TenantUsage,
)
from policies.cache_aware import LoadAwareRanking

_LOG = logging.getLogger("vllm.llm_serving_policies")
"""Under vLLM's logger, so the engine's own log configuration shows it."""
PREEMPTION_LOOKAHEAD = 16
"""How many waiting requests, in queue order, the ``preemption`` policy sees in a step."""


@attrs.frozen
class _Tracked:
    metadata: RequestMetadata
    rank_key: float
    admitted: RequestView
    """The view on admission, with the prefix-cache hit then (looked up for a
    `LoadAwareRanking` only); what level policies see (they read identity, not progress)."""
    requeue_key: tuple[int, float] | None = None
    """Set when the request was preempted for another: its queue key from then on (just
    behind that request's)."""


def _stock_priority_key(request: Request) -> tuple[int, float, str]:
    """vLLM's priority order (`Request.__lt__`): priority, then arrival, then request id."""
    return request.priority, request.arrival_time, request.request_id


@attrs.frozen
class _Rejected:
    request: Request
    rejection: Rejection


def _sort_number(value: object, what: str) -> float:
    """``value`` if it is a number a queue can sort by (an int or float, not NaN).

    Raises:
        TypeError: for anything else (None, a bool, a string, NaN), so that a policy's
            invalid answer is contained like its exception.
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or (
            isinstance(value, float) and math.isnan(value)):
        raise TypeError(f"{what} must be a number (not NaN), got {value!r}")
    return value


def _prefill_part(tokens: int, prompt_tokens: int, computed_tokens: int) -> int:
    """How many of ``tokens`` scheduled after ``computed_tokens`` fall inside the prompt."""
    prompt_left = prompt_tokens - computed_tokens
    return 0 if prompt_left <= 0 else tokens if tokens < prompt_left else prompt_left


def check_scheduling_policy(pipeline: Pipeline, policy: str) -> None:
    """Refuse vLLM's ``--scheduling-policy priority`` with a pipeline that orders requests.

    Raises:
        ValueError: for ``priority`` with a pipeline that orders requests itself (two
            rules at once: the pipeline's waiting order and vLLM's priority victim).
    """
    if policy == "priority" and (pipeline.reorders_requests
                                 or pipeline.deadline_policy is not None):
        raise ValueError(
            "--scheduling-policy priority cannot be combined with a pipeline that orders "
            f"requests (ranking={type(pipeline.ranking).__name__}, levels="
            f"{type(pipeline.levels).__name__ if pipeline.levels else None}, fairness="
            f"{type(pipeline.fairness).__name__ if pipeline.fairness else None}): vLLM "
            "would still pick preemption victims by priority while the pipeline orders "
            "the queue. Use --scheduling-policy fcfs (the pipeline's ranking reads each "
            "request's priority, e.g. QoSRanker) or the identity pipeline.")


class PolicySchedulerMixin:
    """The pipeline seams; mixed into `Scheduler` and `AsyncScheduler`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pipeline = pipeline = pipeline_from_additional_config(
            self.vllm_config.additional_config)
        self.clock: Callable[[], float] = time.time
        """Same clock as ``Request.arrival_time``; the replay swaps in a virtual one."""
        self.metrics = PolicyMetrics.from_environment()
        """The pipeline's Prometheus metrics, or None when no multiprocess directory is set."""
        self._tracked: dict[str, _Tracked] = {}
        self._rejected: list[_Rejected] = []
        self._load: LoadSnapshot | None = None
        self._now = 0.0
        self._step_views: dict[str, RequestView] = {}
        self._waiting_grants: dict[str, tuple[int, int]] = {}
        """This step's ``(computed, new tokens)`` offer to each waiting request vLLM considered."""
        self._charged_on_dispatch: set[str] = set()
        self._quota_usage: tuple[dict[str, int], dict[str, int]] | None = None
        """Running requests and KV blocks per tenant while a step picks (quotas only)."""
        self._configured_active_limit = self.max_num_active_reqs
        self._observers = [p for p in pipeline.policies if isinstance(p, LifecycleObserver)]
        self._deadlines = pipeline.deadline_policy
        self._block_quota = (pipeline.watermarks if isinstance(pipeline.watermarks, KVBlockQuota)
                             else None)
        self._ranks_under_load = isinstance(pipeline.ranking, LoadAwareRanking)
        self._static_service_keys = (pipeline.fairness is None and pipeline.levels is None
                                     and self._deadlines is None)
        """Whether `_service_key` is the rank key alone (`_sort_running` is incremental)."""
        self._hits_on_arrival = self._ranks_under_load or any(
            getattr(p, "reads_prefix_hits", False) for p in pipeline.policies)
        """Whether a policy reads the arrival's prefix-cache hit (`RequestView.cached_tokens`)."""
        self._own_queue_order = self._honours_pipeline_order()
        queue_key = self._queue_key if self._own_queue_order else _stock_priority_key
        self.faults = PolicyFaults(pipeline.policies, self.metrics)
        """Policy exceptions contained so far (`PolicyFaults`)."""
        self.waiting = PolicyRequestQueue(
            queue_key, self._tenant_of, pipeline.fairness,
            self._tenants_under_quota if pipeline.quotas is not None else None,
            self._charge_dispatched, on_fault=self.faults.record)
        self.kv_holding_waiting = PolicyRequestQueue(queue_key)
        self.hooks = HookTable(feature_hooks(self))
        """The optional features this pipeline turns on (`SchedulerHook`)."""
        self.faults.add(self.hooks.hooks)
        _LOG.info("%s running policies [%s] with hooks [%s]", type(self).__name__,
                  ", ".join(type(p).__name__ for p in pipeline.policies),
                  ", ".join(type(h).__name__ for h in self.hooks.hooks))

    def _honours_pipeline_order(self) -> bool:
        """False under vLLM's ``priority`` policy, which only the identity pipeline accepts:
        it then queues exactly as vLLM's priority queue does.

        Raises:
            ValueError: for ``priority`` with a pipeline that orders requests itself (two
                rules at once: the pipeline's waiting order and vLLM's priority victim).
        """
        check_scheduling_policy(self.pipeline, self.scheduler_config.policy)
        return self.scheduler_config.policy != "priority"

    # -- views, keys and load -------------------------------------------------

    def _view(self, request: Request) -> RequestView:
        """The request's view as of the start of this step (built at most once per step)."""
        view = self._step_views.get(request.request_id)
        if view is None:
            tracked = self._tracked[request.request_id]
            view = request_view(request, tracked.metadata, tracked.admitted.cached_tokens)
            self._step_views[request.request_id] = view
        return view

    def tracked_metadata(self, request: Request) -> RequestMetadata:
        """The scheduling metadata of an admitted request."""
        return self._tracked[request.request_id].metadata

    def _tenant_of(self, request: Request) -> str:
        return self._tracked[request.request_id].metadata.tenant

    def _queue_key(self, request: Request) -> tuple[int, float]:
        levels = self.pipeline.levels
        tracked = self._tracked[request.request_id]
        if tracked.requeue_key is not None:
            return tracked.requeue_key
        if levels is None:
            return 0, tracked.rank_key
        try:
            return _sort_number(levels.level(tracked.admitted), "level"), tracked.rank_key
        except Exception as error:  # noqa: BLE001 - contained: level 0
            self.faults.record("levels", error, levels)
            return 0, tracked.rank_key

    def _sort_running(self) -> None:
        """Service order, front first: `_service_key` (vLLM preempts from the tail).

        Incremental where that key is the rank key alone (no fairness, levels or deadlines:
        fixed on admission): the list is re-sorted only when it is out of order, i.e. when
        a request started or resumed behind one it ranks before (or vLLM reordered it); a
        stable sort would leave a sorted list as it is, so the order is the same.
        """
        tracked = self._tracked
        if self._static_service_keys:
            keys = [tracked[r.request_id].rank_key for r in self.running]
            if not all(map(operator.le, keys, keys[1:])):
                self.running.sort(key=lambda request: tracked[request.request_id].rank_key)
            return
        self.running.sort(key=self._service_key())

    def _service_key(self) -> Callable[[Request], tuple]:
        """A running request's service key at this step: on time before late, then the
        tenant's fairness counter, the level and the rank key."""
        tracked, deadlines, now = self._tracked, self._deadlines, self._now
        fairness, levels = self.pipeline.fairness, self.pipeline.levels
        counters: dict[str, float] = {}  # one lookup per tenant

        def key(request: Request) -> tuple:
            entry = tracked[request.request_id]
            tenant = entry.metadata.tenant
            counter = counters.get(tenant)
            if counter is None:
                counter = counters[tenant] = fairness.counter(tenant) if fairness else 0.0
            return (deadlines.is_late(self._view(request), now) if deadlines else False,
                    counter, levels.level(entry.admitted) if levels else 0, entry.rank_key)

        return key

    def _tenants_under_quota(self, backlogged: list[str]) -> list[str]:
        """The pipeline's quotas over the running requests as they stand (during a step too).

        A request's KV blocks are counted as its computed tokens over the block size, so
        prefix blocks shared by several requests count once per request. The running list
        is scanned once per step; requests started since are added as they are dispatched.
        """
        if self._quota_usage is None:
            self._quota_usage = {}, {}
            for request in self.running:
                self._add_quota_usage(request)
        running, blocks = self._quota_usage
        usage = TenantUsage(running_requests=running, kv_blocks=blocks,
                            max_running_requests=self.max_num_running_reqs,
                            total_kv_blocks=self.kv_cache_config.num_blocks)
        return self.pipeline.quotas.eligible(backlogged, usage)

    def _add_quota_usage(self, request: Request) -> None:
        running, blocks = self._quota_usage
        tenant = self._tenant_of(request)
        running[tenant] = running.get(tenant, 0) + 1
        blocks[tenant] = blocks.get(tenant, 0) - (-request.num_computed_tokens // self.block_size)

    def step_load(self) -> LoadSnapshot:
        """The load as this step began (computed at most once per step)."""
        if self._load is None:
            self._load = self.load_snapshot(self._now)
        return self._load

    def limit_starts(self, startable: int) -> None:
        """Let at most ``startable`` waiting requests start this step (hooks may only lower
        the limit; it is back to vLLM's configured one at the next step)."""
        self.max_num_active_reqs = min(self.max_num_active_reqs, len(self.running) + startable)

    def load_snapshot(self, now: float) -> LoadSnapshot:
        """The engine's load as policies see it."""
        num_running, num_waiting = self.get_request_counts()
        return LoadSnapshot(
            now=now,
            waiting_requests=num_waiting,
            running_requests=num_running,
            kv_usage=self.kv_cache_manager.usage,
            token_budget=self.max_num_scheduled_tokens,
            kv_capacity_tokens=self.kv_cache_config.num_blocks * self.block_size,
            max_running_requests=self.max_num_running_reqs,
        )

    # -- admission ------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:  # a streaming-input continuation
            super().add_request(request)
            return
        self._call("on_arrival", self.hooks.on_arrival, request)
        try:
            metadata = request_metadata(request)
        except InvalidRequestMetadata as error:
            self._reject(request, Rejection(reason="invalid_metadata", detail=str(error)))
            return
        view = request_view(request, metadata)
        if self._hits_on_arrival:  # looked up once, for every policy that reads it
            view = attrs.evolve(view, cached_tokens=cached_prefix_tokens(self.kv_cache_manager,
                                                                         request))
        now = self.clock()
        try:
            rejection = self._admission(view, now)
        except Exception as error:  # noqa: BLE001 - contained: admitted, as stock vLLM would
            self.faults.record("admission", error)
            rejection = None
        if rejection is not None:
            self._reject(request, rejection)
            return
        try:
            rank_key = self._rank(view, now)
            rank_key = _sort_number(rank_key, "rank key")
        except Exception as error:  # noqa: BLE001 - contained: arrival order (stock fcfs)
            self.faults.record("ranking", error, self.pipeline.ranking)
            rank_key = request.arrival_time
        self._tracked[request.request_id] = _Tracked(metadata, rank_key, view)
        super().add_request(request)
        self._call("on_admitted", self.hooks.on_admitted, request, metadata.tenant)
        self._call("observers", [o.on_admitted for o in self._observers], view, now)

    def _admission(self, view: RequestView, now: float) -> Rejection | None:
        gates = [g for g in (self.pipeline.admission, self.pipeline.watermarks) if g is not None]
        load = self.load_snapshot(now) if gates else None
        for gate in gates:
            decision = gate.admit(view, load)
            if not decision.admitted:
                return Rejection.from_decision(decision)
        return None

    def _rank(self, view: RequestView, now: float) -> float:
        ranking = self.pipeline.ranking
        if not self._ranks_under_load:
            return ranking.rank_key(view)
        return ranking.rank_key_under_load(view, self.load_snapshot(now))  # the hit is in view

    def _call(self, seam: str, calls: Any, *args: Any) -> None:
        """Call each of ``calls`` with ``args``; a raise is contained and the others still run."""
        for call in calls:
            try:
                call(*args)
            except Exception as error:  # noqa: BLE001 - contained
                self.faults.record(seam, error)

    def _reject(self, request: Request, rejection: Rejection) -> None:
        self._rejected.append(_Rejected(request, rejection))
        if self.metrics is not None:
            self.metrics.rejected(rejection.reason)
        self._call("on_rejected", self.hooks.on_rejected, request, rejection)

    def _expire_waiting(self) -> None:
        """Drop waiting requests at the head of their queue whose deadline can no longer be met."""
        while expired := [r for r in self.waiting.heads()
                          if self._deadlines.is_expired(self._view(r), self._now)]:
            for request in expired:
                self._reject(request, Rejection(reason="deadline_expired"))
            self.finish_requests([r.request_id for r in expired],
                                 RequestStatus.FINISHED_ABORTED)

    def has_requests(self) -> bool:
        return (bool(self._rejected) or super().has_requests()
                or any(self._pending(pending) for pending in self.hooks.pending))

    def _pending(self, pending: Callable[[], bool]) -> bool:
        try:
            return pending()
        except Exception as error:  # noqa: BLE001 - contained: no pending work
            self.faults.record("pending", error)
            return False

    def shutdown(self) -> None:
        self._call("shutdown", self.hooks.shutdown, self.clock())
        super().shutdown()

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any
                           ) -> dict[int, EngineCoreOutputs]:
        self._call("before_update", self.hooks.before_update, scheduler_output,
                   model_runner_output)
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        rejected, self._rejected = self._rejected, []
        for entry in rejected:
            batch = outputs.setdefault(entry.request.client_index, EngineCoreOutputs())
            batch.outputs.append(
                EngineCoreOutput(
                    request_id=entry.request.request_id,
                    new_token_ids=[],
                    finish_reason=FinishReason.ABORT,
                    stop_reason=entry.rejection.stop_reason,
                )
            )
        try:
            self._refresh_metrics()
        except Exception as error:  # noqa: BLE001 - contained: gauges left as they were
            self.faults.record("metrics", error)
        return outputs

    # -- ordering, token caps and accounting ---------------------------------

    def schedule(self, throttle_prefills: bool = False) -> Any:
        now = self._now = self.clock()
        self._step_views.clear()  # a view shows a request as it stands before the step
        self._waiting_grants.clear()
        self._quota_usage = None
        self.max_num_active_reqs = self._configured_active_limit
        self._load = None
        try:
            if self._deadlines is not None:
                self._expire_waiting()
            if self.pipeline.reorders_requests or self._deadlines is not None:
                self._sort_running()  # a raising key leaves the list as it was (stock order)
            if self.pipeline.rate is not None:
                self._load = self.load_snapshot(now)
        except Exception as error:  # noqa: BLE001 - contained: vLLM's order this step
            self.faults.record("pre_step", error)
        self._preempt_for_waiting()
        self._call("before_schedule", self.hooks.before_schedule, now)
        output = super().schedule(throttle_prefills)
        self._call("after_schedule", self.hooks.after_schedule, output)
        return output

    def _preempt_for_waiting(self) -> None:
        """At most one preemption per step, only with every slot taken: the ``preemption``
        policy's victim leaves the running list before vLLM schedules, and the request it was
        preempted for (the beneficiary) takes its slot in this very step.

        The beneficiary moves to the head of the waiting queue and the victim queues right
        behind it, ahead of the rest (as vLLM re-queues its own victims at the front), by
        queue keys that stay with them. Where the order is not the pipeline's to change
        (vLLM's ``priority`` policy, or a fairness policy picking the tenant served next),
        the queue keeps it, and only a beneficiary at its head is served. Not done with a KV
        connector (a transfer may hold the victim's blocks) or while the victim's blocks
        cannot be freed yet; a raising policy is contained (seam ``preemption``).
        """
        policy = self.pipeline.preemption
        if (policy is None or not self.waiting or self.connector is not None
                or len(self.running) < self.max_num_running_reqs):
            return
        try:
            choice = policy.choose([self._view(r) for r in self.waiting.head(PREEMPTION_LOOKAHEAD)],
                                   [self._view(r) for r in self.running], self._now)
        except Exception as error:  # noqa: BLE001 - contained: no preemption
            self.faults.record("preemption", error, policy)
            return
        victim = self.requests.get(choice.victim) if choice is not None else None
        beneficiary = self.requests.get(choice.beneficiary) if choice is not None else None
        if (victim is None or beneficiary is None or victim.status is not RequestStatus.RUNNING
                or beneficiary.status is RequestStatus.RUNNING
                or not self._request_blocks_can_be_freed(victim)):
            return
        reorder = self._own_queue_order and self.pipeline.fairness is None
        head = self.waiting.peek_request()
        if beneficiary is not head:
            if not reorder:
                return
            level, rank_key = self.waiting.key(head)
            self.waiting.remove_request(beneficiary)
            self._requeue(beneficiary, (level, math.nextafter(rank_key, -math.inf)))
            self.waiting.prepend_request(beneficiary)
        if reorder:
            level, rank_key = self.waiting.key(beneficiary)
            self._requeue(victim, (level, math.nextafter(rank_key, math.inf)))
        self.running.remove(victim)
        # A same-step resume must resend the victim's tokens, as after vLLM's own forced
        # preemption (``reset_prefix_cache``); an in-flight output of it is dropped.
        self.prev_step_scheduled_req_ids.discard(victim.request_id)
        self._preempt_request(victim, self._now, drop_stale_output=True)
        self._call("preemption", [policy.on_preempted], choice)
        if self.metrics is not None:
            self.metrics.slot_preempted(self._tenant_of(victim))

    def _requeue(self, request: Request, key: tuple[int, float]) -> None:
        """``request``'s queue key from now on (set before it is queued)."""
        self._tracked[request.request_id] = attrs.evolve(self._tracked[request.request_id],
                                                         requeue_key=key)

    def _refresh_metrics(self) -> None:
        """Gauges after a step: when due, and always in the step that leaves no request
        unfinished, before its outputs reach a client (no step may follow to correct them)."""
        metrics = self.metrics
        if metrics is None or not (metrics.due(self.clock())
                                   or not self.has_unfinished_requests()):
            return
        metrics.refresh(
            waiting=((self._tenant_of(r), self.waiting.key(r)[0]) for r in self.waiting),
            running=(self._tenant_of(r) for r in self.running),
            fairness=self.pipeline.fairness, watermarks=self._block_quota,
            kv_usage=self.kv_cache_manager.usage)
        self._call("refresh_metrics", self.hooks.refresh_metrics, metrics)

    def _reserve_prefill_lookahead(self, request: Request, num_computed_tokens: int,
                                   num_new_tokens: int) -> int:
        num_new_tokens = super()._reserve_prefill_lookahead(
            request, num_computed_tokens, num_new_tokens)
        if num_computed_tokens < request.num_prompt_tokens:  # decodes are never capped
            try:
                num_new_tokens = self._capped_tokens(request, num_computed_tokens,
                                                     num_new_tokens)
            except Exception as error:  # noqa: BLE001 - contained: uncapped
                self.faults.record("token_cap", error)
        if request.status is not RequestStatus.RUNNING:  # what it gets if vLLM now pops it
            self._waiting_grants[request.request_id] = (num_computed_tokens, num_new_tokens)
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
            self.metrics.throttled(self._tenant_of(request), num_new_tokens - capped)
        return capped

    def _rate_cap(self, request: Request) -> int | None:
        if self.pipeline.rate is None:
            return None
        return self.pipeline.rate.token_cap(self._view(request), self.step_load())

    def _kv_quota_cap(self, request: Request, num_computed_tokens: int) -> int | None:
        """Prefill tokens left under the request's KV-block quota (`KVBlockQuota.block_quota`).

        The head of the running list is exempt (as is a request when nothing runs), so one
        request always progresses, finishes and frees blocks: quotas cannot stall the engine.
        With nothing waiting as the step began there is no one to leave blocks for, and no
        quota applies (a long prompt is not held back on a cache full of running work).
        """
        if (self._block_quota is None or not self.running or self.running[0] is request
                or not self.step_load().waiting_requests):
            return None
        quota_blocks = self._block_quota.block_quota(self._view(request),
                                                     self.kv_cache_manager.usage)
        if quota_blocks is None:
            return None
        return max(0, quota_blocks * self.block_size - num_computed_tokens)

    def _charge_dispatched(self, tenant: str, request: Request) -> None:
        """Charge ``tenant`` for a request popped from the waiting queue, if vLLM started it."""
        grant = self._waiting_grants.get(request.request_id)
        if grant is None or request.status is not RequestStatus.RUNNING:
            return  # popped only to be skipped this step
        computed, tokens = grant
        prefill = _prefill_part(tokens, request.num_prompt_tokens, computed)
        self.pipeline.fairness.charge(tenant, input_tokens=prefill, output_tokens=tokens - prefill)
        self._charged_on_dispatch.add(request.request_id)
        if self._quota_usage is not None:  # it runs now: the next pick's quotas count it
            self._add_quota_usage(request)

    def _update_after_schedule(self, scheduler_output: Any) -> None:
        self.waiting.settle()
        self._quota_usage = None  # the step's picks are over
        try:
            self._after_step(scheduler_output)
        except Exception as error:  # noqa: BLE001 - contained: this step is not accounted
            self.faults.record("accounting", error)
        super()._update_after_schedule(scheduler_output)

    def _after_step(self, scheduler_output: Any) -> None:
        pipeline = self.pipeline
        if pipeline.rate or pipeline.levels or pipeline.fairness:
            self._account_service(scheduler_output.num_scheduled_tokens)
        for new in scheduler_output.scheduled_new_reqs if self._observers else ():
            view = self._view(self.requests[new.req_id])
            self._call("observers", [o.on_first_scheduled for o in self._observers], view,
                       self._now)
        for new in scheduler_output.scheduled_new_reqs if self.metrics is not None else ():
            request = self.requests[new.req_id]  # hit rate by tenant: cached before this step
            self.metrics.prefix_hits(self._tenant_of(request), request.num_prompt_tokens,
                                     new.num_computed_tokens)

    def _account_service(self, num_scheduled_tokens: dict[str, int]) -> None:
        """Tell rate, levels and fairness what each request got this step (one pass, no view
        built for a plain decode: the hot path of a step with hundreds decoding)."""
        rate, levels, fairness = self.pipeline.rate, self.pipeline.levels, self.pipeline.fairness
        requests, tracked, step_views = self.requests, self._tracked, self._step_views
        charged, now = self._charged_on_dispatch, self._now
        served: dict[str, list[int]] = {}  # tenant -> [prefill, decoded] not yet charged
        for req_id, tokens in num_scheduled_tokens.items():
            request, entry = requests[req_id], tracked[req_id]
            view = step_views.get(req_id)
            prefill = _prefill_part(tokens, request.num_prompt_tokens,
                                   view.computed_tokens if view else request.num_computed_tokens)
            if rate is not None and prefill:  # only prefills are rate-limited
                rate.on_scheduled(self._view(request), tokens, now)
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

    def _preempt_request(self, request: Request, timestamp: float,
                         drop_stale_output: bool = False) -> None:
        if self.pipeline.levels is not None:
            self._call("levels", [self.pipeline.levels.on_preempted],
                       self._tracked[request.request_id].admitted)
        with self._releasing(request, preempted=True):
            super()._preempt_request(request, timestamp, drop_stale_output)

    def _free_request(self, request: Request, delay_free_blocks: bool = False) -> Any:
        tracked = self._tracked.pop(request.request_id, None)
        if tracked is not None and self._observers:
            view = request_view(request, tracked.metadata, tracked.admitted.cached_tokens)
            self._call("observers", [o.on_finished for o in self._observers], view,
                       self.clock())
        with self._releasing(request, preempted=False):
            return super()._free_request(request, delay_free_blocks)

    @contextlib.contextmanager
    def _releasing(self, request: Request, *, preempted: bool) -> Iterator[None]:
        """The hooks' `SchedulerHook.releasing` contexts around vLLM freeing ``request``.

        A hook that raises on entering or leaving is contained (seam ``releasing``): its
        context is skipped, the others and vLLM's own freeing still run.
        """
        entered = []
        for enter in self.hooks.releasing:
            try:
                context = enter(request, preempted=preempted)
                context.__enter__()
            except Exception as error:  # noqa: BLE001 - contained: this hook not around
                self.faults.record("releasing", error)
            else:
                entered.append(context)
        try:
            yield
        finally:
            for context in reversed(entered):
                try:
                    context.__exit__(None, None, None)
                except Exception as error:  # noqa: BLE001 - contained
                    self.faults.record("releasing", error)


class PolicyScheduler(PolicySchedulerMixin, Scheduler):
    """vLLM's synchronous `Scheduler` running a `Pipeline` (CPU, or GPU without async)."""


class AsyncPolicyScheduler(PolicySchedulerMixin, AsyncScheduler):
    """vLLM's `AsyncScheduler` running a `Pipeline` (GPU default)."""
