"""Ordering: the waiting queue's keys, the running list's service order, and the queue
moves of a slot preemption.

`Ordering` reads only the admitted requests' `Tracked` entries and the pipeline's
ordering policies (levels, fairness, deadlines); the scheduler hands it the running list,
a view function and ``now``, so it runs without a vLLM scheduler.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable

import attrs

from integrations.vllm_v1.pipeline import Pipeline
from integrations.vllm_v1.scheduling.faults import PolicyFaults
from integrations.vllm_v1.scheduling.queue import PolicyRequestQueue
from integrations.vllm_v1.vllm_surface.names import Request
from policies import DeadlinePolicy, RequestMetadata, RequestView

ViewOf = Callable[[Request], RequestView]
"""A request's view as of the start of this step."""


@attrs.frozen
class Tracked:
    """What the scheduler keeps of an admitted request."""

    metadata: RequestMetadata
    rank_key: float
    admitted: RequestView
    """The view on admission, with the prefix-cache hit then (looked up for a
    `LoadAwareRanking` only); what level policies see (they read identity, not progress)."""
    requeue_key: tuple[int, float] | None = None
    """Set when the request was preempted for another: its queue key from then on (just
    behind that request's)."""


def stock_priority_key(request: Request) -> tuple[int, float, str]:
    """vLLM's priority order (`Request.__lt__`): priority, then arrival, then request id."""
    return request.priority, request.arrival_time, request.request_id


def sort_number(value: object, what: str) -> float:
    """``value`` if it is a number a queue can sort by (an int or float, not NaN).

    Raises:
        TypeError: for anything else (None, a bool, a string, NaN), so that a policy's
            invalid answer is contained like its exception.
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or (
            isinstance(value, float) and math.isnan(value)):
        raise TypeError(f"{what} must be a number (not NaN), got {value!r}")
    return value


@attrs.define(eq=False, kw_only=True)
class Ordering:
    """Queue keys ``(level, rank key)``, the service order of running requests (front
    first; vLLM preempts from the tail) and where a slot preemption re-queues its pair.

    A raising or invalid level is contained (seam ``levels``): level 0.
    """

    pipeline: Pipeline
    tracked: dict[str, Tracked]
    """The admitted requests by id (the scheduler's own dict, shared)."""
    faults: PolicyFaults
    own_queue_order: bool
    """False under vLLM's ``priority`` policy: the queue then keeps vLLM's order."""
    deadlines: DeadlinePolicy | None = attrs.field(init=False)
    static_service_keys: bool = attrs.field(init=False)
    """Whether `service_key` is the rank key alone (`sort_running` is incremental)."""

    def __attrs_post_init__(self) -> None:
        self.deadlines = self.pipeline.deadline_policy
        self.static_service_keys = (self.pipeline.fairness is None
                                    and self.pipeline.levels is None and self.deadlines is None)

    def tenant_of(self, request: Request) -> str:
        return self.tracked[request.request_id].metadata.tenant

    def queue_key(self, request: Request) -> tuple[int, float]:
        """The waiting queue's key: the re-queue key of a preempted pair, else
        ``(level, rank key)``."""
        levels = self.pipeline.levels
        tracked = self.tracked[request.request_id]
        if tracked.requeue_key is not None:
            return tracked.requeue_key
        if levels is None:
            return 0, tracked.rank_key
        try:
            return sort_number(levels.level(tracked.admitted), "level"), tracked.rank_key
        except Exception as error:  # noqa: BLE001 - contained: level 0
            self.faults.record("levels", error, levels)
            return 0, tracked.rank_key

    def sort_running(self, running: list[Request], view: ViewOf, now: float) -> None:
        """Sort ``running`` in place by `service_key`.

        Incremental where that key is the rank key alone (no fairness, levels or deadlines:
        fixed on admission): the list is re-sorted only when it is out of order, i.e. when
        a request started or resumed behind one it ranks before (or vLLM reordered it); a
        stable sort would leave a sorted list as it is, so the order is the same.
        """
        tracked = self.tracked
        if self.static_service_keys:
            keys = [tracked[r.request_id].rank_key for r in running]
            if not all(map(operator.le, keys, keys[1:])):
                running.sort(key=lambda request: tracked[request.request_id].rank_key)
            return
        running.sort(key=self.service_key(view, now))

    def service_key(self, view: ViewOf, now: float) -> Callable[[Request], tuple]:
        """A running request's service key at this step: on time before late, then the
        tenant's fairness counter, the level and the rank key."""
        tracked, deadlines = self.tracked, self.deadlines
        fairness, levels = self.pipeline.fairness, self.pipeline.levels
        counters: dict[str, float] = {}  # one lookup per tenant

        def key(request: Request) -> tuple:
            entry = tracked[request.request_id]
            tenant = entry.metadata.tenant
            counter = counters.get(tenant)
            if counter is None:
                counter = counters[tenant] = fairness.counter(tenant) if fairness else 0.0
            return (deadlines.is_late(view(request), now) if deadlines else False,
                    counter, levels.level(entry.admitted) if levels else 0, entry.rank_key)

        return key

    def queue_preemption_pair(self, waiting: PolicyRequestQueue, victim: Request,
                              beneficiary: Request) -> bool:
        """Move ``beneficiary`` to the head of ``waiting`` and give ``victim`` (still
        running) the key right behind it; False, with nothing changed, when the order is not
        the pipeline's to change (vLLM's ``priority`` policy, or a fairness policy picking
        the tenant served next) and the beneficiary is not at the head already.

        ``waiting`` is a `PolicyRequestQueue` keyed by `queue_key`.
        """
        reorder = self.own_queue_order and self.pipeline.fairness is None
        head = waiting.peek_request()
        if beneficiary is not head:
            if not reorder:
                return False
            level, rank_key = waiting.key(head)
            waiting.remove_request(beneficiary)
            self.requeue(beneficiary, (level, math.nextafter(rank_key, -math.inf)))
            waiting.prepend_request(beneficiary)
        if reorder:
            level, rank_key = waiting.key(beneficiary)
            self.requeue(victim, (level, math.nextafter(rank_key, math.inf)))
        return True

    def requeue(self, request: Request, key: tuple[int, float]) -> None:
        """``request``'s queue key from now on (set before it is queued)."""
        self.tracked[request.request_id] = attrs.evolve(self.tracked[request.request_id],
                                                        requeue_key=key)
