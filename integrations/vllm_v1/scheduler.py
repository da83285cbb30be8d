"""`PolicyScheduler`: vLLM's own scheduler, steered by a `Pipeline`.

Seams (see DESIGN.md), all on our own instance, none patching vLLM:

* waiting order: ``self.waiting`` / ``self.kv_holding_waiting`` are
  `PolicyRequestQueue`s keyed by the pipeline's ranking;
* service order and preemption victim: ``self.running`` is sorted by the same
  key before each step (vLLM serves front to back, preempts from the tail);
* admission: ``add_request`` asks the admission policy; a rejection finishes the
  request with ``finish_reason="abort"`` and a ``stop_reason`` naming the reason;
* per-request token cap: ``_reserve_prefill_lookahead`` clamps prefill chunks.

The clock is read once per step; every policy sees that same ``now``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import attrs
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason
from vllm.v1.request import Request

from integrations.vllm_v1.pipeline import Pipeline
from integrations.vllm_v1.queue import PolicyRequestQueue
from integrations.vllm_v1.views import request_metadata, request_view
from policies import (
    AdmissionDecision,
    InvalidRequestMetadata,
    LifecycleObserver,
    LoadSnapshot,
    RequestMetadata,
)


@attrs.frozen
class _Tracked:
    metadata: RequestMetadata
    rank_key: float


@attrs.frozen
class _Rejection:
    request: Request
    decision: AdmissionDecision


def rejection_stop_reason(decision: AdmissionDecision) -> str:
    """The ``stop_reason`` a rejected request finishes with, e.g. ``rejected:queue_full;retry_after_s=1``."""
    return f"rejected:{decision.reason};retry_after_s={decision.retry_after_s:g}"


class PolicySchedulerMixin:
    """The pipeline seams; mixed into `Scheduler` and `AsyncScheduler`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pipeline = Pipeline.from_additional_config(self.vllm_config.additional_config)
        self.clock: Callable[[], float] = time.time
        """Same clock as ``Request.arrival_time``; the replay swaps in a virtual one."""
        self._tracked: dict[str, _Tracked] = {}
        self._rejections: list[_Rejection] = []
        self._load: LoadSnapshot | None = None
        self._now = 0.0
        slots = (self.pipeline.ranking, self.pipeline.admission, self.pipeline.token_cap)
        self._observers = [p for p in slots if isinstance(p, LifecycleObserver)]
        self.waiting = PolicyRequestQueue(self._rank_key)
        self.kv_holding_waiting = PolicyRequestQueue(self._rank_key)

    # -- views and load -----------------------------------------------------

    def _rank_key(self, request: Request) -> float:
        return self._tracked[request.request_id].rank_key

    def load_snapshot(self, now: float) -> LoadSnapshot:
        """The engine's load as policies see it."""
        num_running, num_waiting = self.get_request_counts()
        return LoadSnapshot(
            now=now,
            waiting_requests=num_waiting,
            running_requests=num_running,
            kv_usage=self.kv_cache_manager.usage,
            token_budget=self.max_num_scheduled_tokens,
        )

    # -- admission ------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:  # a streaming-input continuation
            super().add_request(request)
            return
        try:
            metadata = request_metadata(request)
        except InvalidRequestMetadata as error:
            self._reject(request, AdmissionDecision.reject(f"invalid_metadata: {error}", 0.0))
            return
        view = request_view(request, metadata)
        admission = self.pipeline.admission
        if admission is not None:
            decision = admission.admit(view, self.load_snapshot(self.clock()))
            if not decision.admitted:
                self._reject(request, decision)
                return
        self._tracked[request.request_id] = _Tracked(metadata, self.pipeline.ranking.rank_key(view))
        super().add_request(request)
        for observer in self._observers:
            observer.on_admitted(view, self.clock())

    def _reject(self, request: Request, decision: AdmissionDecision) -> None:
        self._rejections.append(_Rejection(request, decision))

    def has_requests(self) -> bool:
        return bool(self._rejections) or super().has_requests()

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any
                           ) -> dict[int, EngineCoreOutputs]:
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        rejections, self._rejections = self._rejections, []
        for rejection in rejections:
            client = rejection.request.client_index
            batch = outputs.setdefault(client, EngineCoreOutputs())
            batch.outputs.append(
                EngineCoreOutput(
                    request_id=rejection.request.request_id,
                    new_token_ids=[],
                    finish_reason=FinishReason.ABORT,
                    stop_reason=rejection_stop_reason(rejection.decision),
                )
            )
        return outputs

    # -- ordering and token caps ---------------------------------------------

    def schedule(self, throttle_prefills: bool = False) -> Any:
        now = self._now = self.clock()
        if self.pipeline.reorders_requests:
            self.running.sort(key=self._rank_key)
        self._load = self.load_snapshot(now) if self.pipeline.token_cap is not None else None
        return super().schedule(throttle_prefills)

    def _reserve_prefill_lookahead(self, request: Request, num_computed_tokens: int,
                                   num_new_tokens: int) -> int:
        num_new_tokens = super()._reserve_prefill_lookahead(
            request, num_computed_tokens, num_new_tokens
        )
        cap_policy = self.pipeline.token_cap
        if cap_policy is None or num_computed_tokens >= request.num_prompt_tokens:
            return num_new_tokens  # decodes are never capped
        assert self._load is not None
        cap = cap_policy.token_cap(self._view(request), self._load)
        return num_new_tokens if cap is None else min(num_new_tokens, max(cap, 1))

    def _view(self, request: Request) -> Any:
        return request_view(request, self._tracked[request.request_id].metadata)

    def _update_after_schedule(self, scheduler_output: Any) -> None:
        cap_policy = self.pipeline.token_cap
        if cap_policy is not None:
            for req_id, tokens in scheduler_output.num_scheduled_tokens.items():
                cap_policy.on_scheduled(self._view(self.requests[req_id]), tokens, self._now)
        for new in scheduler_output.scheduled_new_reqs if self._observers else ():
            view = self._view(self.requests[new.req_id])
            for observer in self._observers:
                observer.on_first_scheduled(view, self._now)
        super()._update_after_schedule(scheduler_output)

    def _free_request(self, request: Request, delay_free_blocks: bool = False) -> Any:
        tracked = self._tracked.pop(request.request_id, None)
        if tracked is not None and self._observers:
            view = request_view(request, tracked.metadata)
            for observer in self._observers:
                observer.on_finished(view, self.clock())
        return super()._free_request(request, delay_free_blocks)


class PolicyScheduler(PolicySchedulerMixin, Scheduler):
    """vLLM's synchronous `Scheduler` running a `Pipeline` (CPU, or GPU without async)."""


class AsyncPolicyScheduler(PolicySchedulerMixin, AsyncScheduler):
    """vLLM's `AsyncScheduler` running a `Pipeline` (GPU default)."""
