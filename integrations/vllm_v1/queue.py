"""A vLLM waiting queue ordered by a policy's rank key.

Entries are ``(rank_key, seq, request)``: a lower key is served first and ties
break on a sequence number, never on ``id()``. Added requests take increasing
sequence numbers, re-queued (prepended) ones decreasing negative numbers, so
with a constant key the queue behaves exactly like vLLM's FCFS deque.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator

from vllm.v1.core.sched.request_queue import RequestQueue
from vllm.v1.request import Request


class PolicyRequestQueue(RequestQueue):
    """Heap of waiting requests by ``(rank_key(request), seq)``; O(log n) add and pop."""

    def __init__(self, rank_key: Callable[[Request], float]) -> None:
        self._rank_key = rank_key
        self._heap: list[tuple[float, int, Request]] = []
        self._appended = itertools.count(1)
        self._prepended = itertools.count(-1, -1)

    def add_request(self, request: Request) -> None:
        """Queue behind every equal-key request already queued."""
        heapq.heappush(self._heap, (self._rank_key(request), next(self._appended), request))

    def prepend_request(self, request: Request) -> None:
        """Queue ahead of every equal-key request already queued."""
        heapq.heappush(self._heap, (self._rank_key(request), next(self._prepended), request))

    def prepend_requests(self, requests: Iterable[Request]) -> None:
        """Prepend one by one, so the last one given ends up first (as ``deque.extendleft``)."""
        for request in requests:
            self.prepend_request(request)

    def pop_request(self) -> Request:
        """Remove and return the most urgent request."""
        if not self._heap:
            raise IndexError("pop from an empty queue")
        return heapq.heappop(self._heap)[2]

    def peek_request(self) -> Request:
        """The most urgent request, left in place."""
        if not self._heap:
            raise IndexError("peek from an empty queue")
        return self._heap[0][2]

    def remove_request(self, request: Request) -> None:
        """Remove one queued request; ``ValueError`` if it is not queued."""
        for index, entry in enumerate(self._heap):
            if entry[2] is request:
                last = self._heap.pop()
                if index < len(self._heap):
                    self._heap[index] = last
                    heapq.heapify(self._heap)
                return
        raise ValueError(f"request {request.request_id} is not in the queue")

    def remove_requests(self, requests: Iterable[Request]) -> None:
        """Remove every given request that is queued; others are ignored."""
        doomed = {request.request_id for request in requests}
        if doomed:
            self._heap = [entry for entry in self._heap if entry[2].request_id not in doomed]
            heapq.heapify(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        """Requests in service order (most urgent first)."""
        return (entry[2] for entry in sorted(self._heap, key=lambda e: (e[0], e[1])))
