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

The seams' logic lives in three plain objects the mixin delegates to: `Ordering`
(queue keys, running order, slot preemption's queue moves), `Arrivals` (admission,
rank keys, expiry, rejections) and `Accounting` (token caps, quotas, charges).

Optional features (eviction order, cache warming, draft budget, start gate, step
log) are `SchedulerHook`\ s (`integrations.vllm_v1.hooks`), built from
the pipeline's slots by `integrations.vllm_v1.scheduling.features`. The pipeline is
named in ``additional_config`` (`integrations.vllm_v1.config.spec`).

The clock is read once per step; every policy sees that same ``now``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import attrs

from integrations.vllm_v1.config.spec import pipeline_from_additional_config
from integrations.vllm_v1.hooks import HookTable
from integrations.vllm_v1.metrics import PolicyMetrics
from integrations.vllm_v1.pipeline import Pipeline
from integrations.vllm_v1.rejection import Rejection
from integrations.vllm_v1.scheduling.accounting import Accounting
from integrations.vllm_v1.scheduling.arrivals import Arrivals
from integrations.vllm_v1.scheduling.faults import PolicyFaults
from integrations.vllm_v1.scheduling.features import feature_hooks
from integrations.vllm_v1.scheduling.ordering import Ordering, Tracked, stock_priority_key
from integrations.vllm_v1.scheduling.queue import PolicyRequestQueue
from integrations.vllm_v1.scheduling.views import request_metadata, request_view
from integrations.vllm_v1.vllm_surface.names import (
    AsyncScheduler,
    EngineCoreOutput,
    EngineCoreOutputs,
    FinishReason,
    ModelRunnerOutput,
    Request,
    RequestStatus,
    Scheduler,
    SchedulerOutput,
    cached_prefix_tokens,
)
from policies import (
    InvalidRequestMetadata,
    LoadSnapshot,
    RequestMetadata,
    RequestView,
    needs_of,
)

_LOG = logging.getLogger("vllm.llm_serving_policies")
"""Under vLLM's logger, so the engine's own log configuration shows it."""
PREEMPTION_LOOKAHEAD = 16
"""How many waiting requests, in queue order, the ``preemption`` policy sees in a step."""


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
        self._tracked: dict[str, Tracked] = {}
        self._load: LoadSnapshot | None = None
        self._now = 0.0
        self._step_views: dict[str, RequestView] = {}
        self._configured_active_limit = self.max_num_active_reqs
        self._observers = [p for p in pipeline.policies if needs_of(p).lifecycle]
        self.faults = PolicyFaults(pipeline.policies, self.metrics)
        """Policy exceptions contained so far (`PolicyFaults`)."""
        self.ordering = Ordering(pipeline=pipeline, tracked=self._tracked, faults=self.faults,
                                 own_queue_order=self._honours_pipeline_order())
        """Queue keys, the running order and slot preemption's queue moves (`Ordering`)."""
        self.arrivals = Arrivals(pipeline=pipeline, load_snapshot=self.load_snapshot,
                                 faults=self.faults, metrics=self.metrics)
        """Admission, rank keys, expiry and pending rejections (`Arrivals`)."""
        self.accounting = Accounting(pipeline=pipeline, tracked=self._tracked, engine=self,
                                     view=self._view, faults=self.faults, metrics=self.metrics)
        """Token caps, quotas and charges (`Accounting`)."""
        queue_key = (self.ordering.queue_key if self.ordering.own_queue_order
                     else stock_priority_key)
        accounting = self.accounting
        self.waiting = PolicyRequestQueue(
            queue_key, self._tenant_of, pipeline.fairness,
            accounting.tenants_under_quota if pipeline.quotas is not None else None,
            accounting.charge_dispatched, on_fault=self.faults.record)
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

    # -- views and load ---------------------------------------------------------

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
        if self.arrivals.reads_hits:  # looked up once, for every policy that reads it
            view = attrs.evolve(view, cached_tokens=cached_prefix_tokens(self.kv_cache_manager,
                                                                         request))
        now = self.clock()
        rejection = self.arrivals.verdict(view, now)
        if rejection is not None:
            self._reject(request, rejection)
            return
        rank_key = self.arrivals.rank_key(view, request.arrival_time, now)
        self._tracked[request.request_id] = Tracked(metadata, rank_key, view)
        super().add_request(request)
        self._call("on_admitted", self.hooks.on_admitted, request, metadata.tenant)
        self._call("observers", [o.on_admitted for o in self._observers], view, now)

    def _call(self, seam: str, calls: Any, *args: Any) -> None:
        """Call each of ``calls`` with ``args``; a raise is contained and the others still run."""
        for call in calls:
            try:
                call(*args)
            except Exception as error:  # noqa: BLE001 - contained
                self.faults.record(seam, error)

    def _reject(self, request: Request, rejection: Rejection) -> None:
        self.arrivals.reject(request, rejection)
        self._call("on_rejected", self.hooks.on_rejected, request, rejection)

    def _expire_waiting(self) -> None:
        """Drop waiting requests at the head of their queue whose deadline can no longer be met."""
        while expired := self.arrivals.expired(self.waiting.heads(), self._view, self._now):
            for request in expired:
                self._reject(request, Rejection(reason="deadline_expired"))
            self.finish_requests([r.request_id for r in expired],
                                 RequestStatus.FINISHED_ABORTED)

    def has_requests(self) -> bool:
        return (bool(self.arrivals.rejected) or super().has_requests()
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

    def update_from_output(self, scheduler_output: SchedulerOutput,
                           model_runner_output: ModelRunnerOutput
                           ) -> dict[int, EngineCoreOutputs]:
        self._call("before_update", self.hooks.before_update, scheduler_output,
                   model_runner_output)
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        for entry in self.arrivals.take_rejected():
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

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        now = self._now = self.clock()
        self._step_views.clear()  # a view shows a request as it stands before the step
        self.accounting.begin_step()
        self.max_num_active_reqs = self._configured_active_limit
        self._load = None
        try:
            if self.arrivals.deadlines is not None:
                self._expire_waiting()
            if self.pipeline.reorders_requests or self.ordering.deadlines is not None:
                # a raising key leaves the list as it was (stock order)
                self.ordering.sort_running(self.running, self._view, now)
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
        behind it (`Ordering.queue_preemption_pair`). Not done with a KV connector (a
        transfer may hold the victim's blocks) or while the victim's blocks cannot be freed
        yet; a raising policy is contained (seam ``preemption``).
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
        if not self.ordering.queue_preemption_pair(self.waiting, victim, beneficiary):
            return
        self.running.remove(victim)
        # A same-step resume must resend the victim's tokens, as after vLLM's own forced
        # preemption (``reset_prefix_cache``); an in-flight output of it is dropped.
        self.prev_step_scheduled_req_ids.discard(victim.request_id)
        self._preempt_request(victim, self._now, drop_stale_output=True)
        self._call("preemption", [policy.on_preempted], choice)
        if self.metrics is not None:
            self.metrics.slot_preempted(self._tenant_of(victim))

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
            fairness=self.pipeline.fairness, watermarks=self.accounting.block_quota,
            kv_usage=self.kv_cache_manager.usage)
        self._call("refresh_metrics", self.hooks.refresh_metrics, metrics)

    def _reserve_prefill_lookahead(self, request: Request, num_computed_tokens: int,
                                   num_new_tokens: int) -> int:
        num_new_tokens = super()._reserve_prefill_lookahead(
            request, num_computed_tokens, num_new_tokens)
        return self.accounting.token_cap(request, num_computed_tokens, num_new_tokens)

    def _update_after_schedule(self, scheduler_output: SchedulerOutput) -> None:
        self.waiting.settle()
        self.accounting.end_picks()
        try:
            self._after_step(scheduler_output)
        except Exception as error:  # noqa: BLE001 - contained: this step is not accounted
            self.faults.record("accounting", error)
        super()._update_after_schedule(scheduler_output)

    def _after_step(self, scheduler_output: SchedulerOutput) -> None:
        pipeline = self.pipeline
        if pipeline.rate or pipeline.levels or pipeline.fairness:
            self.accounting.account_service(scheduler_output.num_scheduled_tokens,
                                            self._step_views, self._now)
        for new in scheduler_output.scheduled_new_reqs if self._observers else ():
            view = self._view(self.requests[new.req_id])
            self._call("observers", [o.on_first_scheduled for o in self._observers], view,
                       self._now)
        for new in scheduler_output.scheduled_new_reqs if self.metrics is not None else ():
            request = self.requests[new.req_id]  # hit rate by tenant: cached before this step
            self.metrics.prefix_hits(self._tenant_of(request), request.num_prompt_tokens,
                                     new.num_computed_tokens)

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
