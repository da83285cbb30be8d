"""`SchedulerHook`: how an optional feature plugs into `PolicyScheduler`.

A feature (an eviction order, cache warming, a draft budget, a start gate, a step
log, ...) is one hook object. The scheduler calls every hook at fixed points of a
request's life and of each step; a hook overrides only the points it needs, and
the scheduler calls a point only on the hooks that override it (a dispatch table
built once), so an unused point costs nothing per step. A `Pipeline` slot names its hook in
its own field metadata (`integrations.vllm_v1.pipeline.HOOK`), a config key in the
composition root (`integrations.vllm_v1.composition`), both by import path; further hooks
can be named in the configuration (``llm_serving_policies.hooks``:
``package.module:factory``, each called with the scheduler).

A feature reports its own metrics: its module declares its series
(`integrations.vllm_v1.metrics.Series`) and its hook's `SchedulerHook.refresh_metrics` sets
them from its policy's ``stats()`` through `PolicyMetrics`'s generic verbs, so the central
metrics module knows no feature.

This module sits below every feature package and the scheduler (it imports neither at run
time; its annotations name the scheduler's queue and fault record for type checkers only),
so a feature package depends on this interface, never on `scheduling`.

Order of calls in one step: `before_schedule` (after the core has expired late
requests and ordered the running list), vLLM's own ``schedule``, `after_schedule`;
then `before_update` at the start of ``update_from_output``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from integrations.vllm_v1.metrics import PolicyMetrics
    from integrations.vllm_v1.pipeline import Pipeline
    from integrations.vllm_v1.rejection import Rejection
    from integrations.vllm_v1.scheduling.faults import PolicyFaults
    from integrations.vllm_v1.scheduling.queue import PolicyRequestQueue
    from integrations.vllm_v1.vllm_surface.names import (
        CacheConfig,
        KVCacheConfig,
        KVCacheManager,
        ModelRunnerOutput,
        Request,
        SchedulerConfig,
        SchedulerOutput,
        VllmConfig,
    )
    from policies import LoadSnapshot, RequestMetadata


@runtime_checkable
class SchedulerAccess(Protocol):
    """What a hook may read and change on the scheduler that built it (`PolicyScheduler`).

    A hook is built as ``factory(scheduler)`` or ``factory(scheduler, policy)`` and keeps
    the scheduler; it uses only these members (``tests/vllm_v1/scheduling/test_hook_access.py``
    reads every hook's source to check). It may change three things: how many waiting
    requests start this step (`limit_starts`, lower only), requests it adds itself
    (`add_request`, e.g. warm-up requests) and the drafts of running requests
    (``request.spec_token_ids``, the draft budget). Everything else is read only: vLLM's own
    objects (``requests``, ``running``, ``waiting.head(n)``, ``kv_holding_waiting``, the KV
    cache manager, the configs) through `integrations.vllm_v1.vllm_surface` where a vLLM
    internal is involved.
    """

    pipeline: Pipeline
    """The policies this scheduler runs (a hook reads its own slot's policy from here)."""
    metrics: PolicyMetrics | None
    """The pipeline's Prometheus metrics, if the engine exports them."""
    faults: PolicyFaults
    """A hook that contains a fault of its own policy records it here."""
    clock: Callable[[], float]
    """The scheduler's clock (the replay's virtual one in replays)."""
    vllm_config: VllmConfig
    scheduler_config: SchedulerConfig
    cache_config: CacheConfig
    kv_cache_config: KVCacheConfig
    max_model_len: int
    block_size: int
    hash_block_size: int
    kv_cache_manager: KVCacheManager
    """vLLM's KV cache manager (block pool, prefix lookups)."""
    requests: dict[str, Request]
    """vLLM's requests by id."""
    running: list[Request]
    """The running requests, in service order."""
    waiting: PolicyRequestQueue
    """The waiting queue: read its first requests with ``head(n)``."""
    kv_holding_waiting: PolicyRequestQueue
    """Waiting requests that already hold KV blocks (remote KV loaded)."""

    def step_load(self) -> LoadSnapshot:
        """The load as this step began."""
        ...

    def tracked_metadata(self, request: Request) -> RequestMetadata:
        """The scheduling metadata of an admitted request."""
        ...

    def limit_starts(self, startable: int) -> None:
        """Let at most ``startable`` waiting requests start this step (lower only)."""
        ...

    def add_request(self, request: Request) -> None:
        """Add a request of the hook's own (e.g. a warm-up request)."""
        ...


class SchedulerHook:
    """One optional feature of `PolicyScheduler`; every method is a no-op until overridden."""

    observes_decode_steps: bool = True
    """False when the hook's per-step points do nothing on a step in which no request
    starts, resumes, finishes or is preempted (a pure-decode step), so that a replay may
    skip such steps without calling them (`benchmarks.replay.fast_forward`)."""

    def on_arrival(self, request: Request) -> None:
        """A new request reached the scheduler (before admission; also rejected ones)."""

    def on_admitted(self, request: Request, tenant: str) -> None:
        """``request`` of ``tenant`` passed admission and is queued."""

    def on_rejected(self, request: Request, rejection: Rejection) -> None:
        """``request`` was refused; its empty output leaves with the next update."""

    def before_schedule(self, now: float) -> None:
        """A step is about to be scheduled at ``now`` (the step's one clock reading)."""

    def after_schedule(self, scheduler_output: SchedulerOutput) -> None:
        """vLLM scheduled the step: ``scheduler_output`` is what it will run."""

    def before_update(self, scheduler_output: SchedulerOutput,
                      model_runner_output: ModelRunnerOutput) -> None:
        """The step ran; its outputs are about to update the requests."""

    @contextlib.contextmanager
    def releasing(self, request: Request, *, preempted: bool) -> Iterator[None]:
        """Around vLLM freeing ``request``'s blocks: preempted, or finished (maybe aborted)."""
        yield

    def pending(self) -> bool:
        """Whether this hook has work although no request is queued (keeps the engine stepping)."""
        return False

    def refresh_metrics(self, metrics: PolicyMetrics) -> None:
        """Set this feature's series from its policy's ``stats()`` (``metrics.set``, ``show``,
        ``count_to``; called when the scheduler refreshes its gauges)."""

    def shutdown(self, now: float) -> None:
        """The engine is shutting down."""


POINTS = ("on_arrival", "on_admitted", "on_rejected", "before_schedule", "after_schedule", "before_update",
          "releasing", "pending", "refresh_metrics", "shutdown")
"""The calls a hook may override."""


class HookTable:
    """For each point, the hooks (in order) that override it."""

    def __init__(self, hooks: list[SchedulerHook]) -> None:
        self.hooks = tuple(hooks)
        for point in POINTS:
            base = getattr(SchedulerHook, point)
            setattr(self, point, tuple(
                getattr(h, point) for h in hooks if getattr(type(h), point) is not base))
