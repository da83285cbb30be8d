"""A vLLM waiting queue ordered by the pipeline: tenant fairness, then level and rank key.

Entries are ``(key, seq, request)``: a lower key is served first and ties break
on a sequence number, never on ``id()``. Added requests take increasing
sequence numbers, re-queued (prepended) ones decreasing negative numbers, so
with a constant key and no fairness policy the queue behaves exactly like vLLM's
FCFS deque. With a fairness policy each tenant has its own heap and the policy
picks which tenant's head comes next; it is told when a tenant's heap becomes
non-empty (backlogged) and when it stays empty through a step (idle).

vLLM pops a request both to schedule it and to skip it for a step (then
prepends it back), so a pop is not service: each popped request is handed to
``on_dispatched`` at the next pick or `settle`, by which time vLLM has either
started it or set it aside, and a tenant emptied by a pop turns idle only if its
heap is still empty at `settle` (the end of the step).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from integrations.vllm_v1.vllm_surface.names import Request, RequestQueue
from policies import FairnessPolicy

_Entry = tuple[Any, int, Request]


class PolicyRequestQueue(RequestQueue):
    """Per-tenant heaps by ``(key(request), seq)``; O(log n) add/pop plus O(tenants) selection."""

    def __init__(self, key: Callable[[Request], Any],
                 tenant_of: Callable[[Request], str] | None = None,
                 fairness: FairnessPolicy | None = None,
                 eligible: Callable[[list[str]], list[str]] | None = None,
                 on_dispatched: Callable[[str, Request], None] | None = None,
                 on_fault: Callable[[str, BaseException], None] | None = None) -> None:
        """``eligible`` narrows the backlogged tenants the fairness policy may pick from;
        ``on_dispatched(tenant, request)`` charges a popped request if vLLM scheduled it;
        with ``on_fault(seam, error)``, a fairness policy that raises is contained (the
        oldest-queued tenant is served, charges and notices are skipped) instead of
        propagating into vLLM's scheduling pass."""
        if fairness is not None and tenant_of is None:
            raise ValueError("a fairness policy needs tenant_of")
        self._key = key
        self._eligible = eligible
        self._tenant_of = tenant_of if fairness is not None else None
        self._fairness = fairness
        self._on_dispatched = on_dispatched if fairness is not None else None
        self._on_fault = on_fault
        self._chosen: str | None = None
        """The tenant the last pick chose, until the queue changes: a pop returns exactly
        the request the peek before it showed (vLLM peeks, then pops)."""
        self._popped: list[tuple[str, Request]] = []
        self._heaps: dict[str, list[_Entry]] = {}
        self._size = 0
        self._appended = itertools.count(1)
        self._prepended = itertools.count(-1, -1)

    def key(self, request: Request) -> Any:
        """The order key of ``request`` (queued or not)."""
        return self._key(request)

    def _push(self, request: Request, seq: int) -> None:
        self._chosen = None
        tenant = self._tenant_of(request) if self._tenant_of else ""
        heap = self._heaps.get(tenant)
        if heap is None:  # a new tenant (one a pop emptied this step keeps its heap till `settle`)
            heap = self._heaps[tenant] = []
            if self._fairness is not None:
                self._guarded(self._fairness.on_backlogged, tenant)
        heapq.heappush(heap, (self._key(request), seq, request))
        self._size += 1

    def _front(self) -> tuple[str, list[_Entry]]:
        if not self._size:
            raise IndexError("the queue is empty")
        if self._fairness is None:
            return "", self._heaps[""]
        if self._chosen is not None:
            return self._chosen, self._heaps[self._chosen]
        self._dispatch_popped()  # picks see the service given earlier in the step
        backlogged = [t for t, heap in self._heaps.items() if heap]
        try:
            tenant = self._fairness.select(self._eligible(backlogged) if self._eligible
                                           else backlogged)
        except Exception as error:
            if self._on_fault is None:
                raise
            self._on_fault("fairness", error)  # contained: the longest-queued tenant
            tenant = min(backlogged, key=lambda t: self._heaps[t][0][2].arrival_time)
        self._chosen = tenant
        return tenant, self._heaps[tenant]

    def _guarded(self, call: Callable[..., Any], *args: Any) -> None:
        try:
            call(*args)
        except Exception as error:
            if self._on_fault is None:
                raise
            self._on_fault("fairness", error)

    def _emptied(self, tenant: str) -> None:
        self._chosen = None
        del self._heaps[tenant]
        if self._fairness is not None:
            self._guarded(self._fairness.on_idle, tenant)

    def add_request(self, request: Request) -> None:
        """Queue behind every equal-key request of its tenant already queued."""
        self._push(request, next(self._appended))

    def prepend_request(self, request: Request) -> None:
        """Queue ahead of every equal-key request of its tenant already queued."""
        self._push(request, next(self._prepended))

    def prepend_requests(self, requests: Iterable[Request]) -> None:
        """Prepend one by one, so the last one given ends up first (as ``deque.extendleft``)."""
        for request in requests:
            self.prepend_request(request)

    def pop_request(self) -> Request:
        """Remove and return the head of the tenant the fairness policy picks.

        Nothing is charged here: the request goes to ``on_dispatched`` at the next
        pick or `settle`, once vLLM has started it or skipped it (as VTC charges on
        dispatch, later picks in the same step see the service it was given).
        """
        tenant, heap = self._front()
        request = heapq.heappop(heap)[2]
        self._size -= 1
        self._chosen = None
        if self._fairness is not None:
            self._popped.append((tenant, request))
        elif not heap:
            self._emptied(tenant)
        return request

    def _dispatch_popped(self) -> None:
        popped, self._popped = self._popped, []
        if self._on_dispatched is not None:
            for tenant, request in popped:
                self._guarded(self._on_dispatched, tenant, request)

    def settle(self) -> None:
        """End of a step: dispatch what was popped, and idle the tenants left with nothing
        queued (a request popped only to be skipped has been prepended back by now)."""
        self._dispatch_popped()
        self._chosen = None
        for tenant in [t for t, heap in self._heaps.items() if not heap]:
            self._emptied(tenant)

    def peek_request(self) -> Request:
        """The request `pop_request` would return, left in place."""
        return self._front()[1][0][2]

    def heads(self) -> list[Request]:
        """The most urgent request of every tenant (one request without a fairness policy)."""
        return [heap[0][2] for heap in self._heaps.values() if heap]

    def remove_request(self, request: Request) -> None:
        """Remove one queued request; ``ValueError`` if it is not queued."""
        self._chosen = None
        for tenant, heap in self._heaps.items():
            for index, entry in enumerate(heap):
                if entry[2] is request:
                    heap[index] = heap[-1]
                    heap.pop()
                    heapq.heapify(heap)
                    self._size -= 1
                    if not heap:
                        self._emptied(tenant)
                    return
        raise ValueError(f"request {request.request_id} is not in the queue")

    def remove_requests(self, requests: Iterable[Request]) -> None:
        """Remove every given request that is queued; others are ignored."""
        doomed = {request.request_id for request in requests}
        if not doomed:
            return
        self._chosen = None
        for tenant in list(self._heaps):
            heap = self._heaps[tenant]
            kept = [entry for entry in heap if entry[2].request_id not in doomed]
            if len(kept) != len(heap):
                self._size -= len(heap) - len(kept)
                heapq.heapify(kept)
                self._heaps[tenant] = kept
                if not kept:
                    self._emptied(tenant)

    def __bool__(self) -> bool:
        return self._size > 0

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[Request]:
        """Requests by (key, seq) across tenants (the fairness interleaving is not simulated)."""
        entries = (entry for heap in self._heaps.values() for entry in heap)
        return (entry[2] for entry in sorted(entries, key=lambda e: (e[0], e[1])))

    def head(self, count: int) -> list[Request]:
        """The first ``count`` requests of `__iter__`'s order, in O(count log(tenants + count)):
        a walk of every tenant's heap from its root, smallest (key, seq) first."""
        heaps = list(self._heaps.values())
        frontier = [(heap[0][0], heap[0][1], index, 0)
                    for index, heap in enumerate(heaps) if heap]
        heapq.heapify(frontier)
        found: list[Request] = []
        while frontier and len(found) < count:
            _, _, index, position = heapq.heappop(frontier)
            heap = heaps[index]
            found.append(heap[position][2])
            for child in (2 * position + 1, 2 * position + 2):
                if child < len(heap):
                    heapq.heappush(frontier, (heap[child][0], heap[child][1], index, child))
        return found
