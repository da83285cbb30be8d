"""Replay a prefix-hash trace through a block cache with vLLM's prefix semantics.

Requests are served one at a time, in arrival order, by a cache of
``cache_blocks`` blocks that behaves like vLLM's block pool with prefix caching:

1. A request hits the longest prefix of its block chain that is cached (a block
   hits only if every block before it hits); those blocks are referenced
   (`EvictionOrder.acquire`).
2. Every other block of the chain is computed into a block taken from the
   cache; when the cache is full the eviction order picks the victim among
   unreferenced blocks. A block cached past the first miss is recomputed (not
   a hit) and referenced like a hit.
3. When the request finishes its blocks are released tail first, each with its
   parent (vLLM frees a request's blocks in reverse).

With ``turns`` (each request's ``session_id`` and arrival time), an order that takes
`SessionHints` hears each request's arrival (``turn_started``) and, once its blocks are
released, its end (``turn_finished``, at the same time: the replay has no service time).

With ``waiting`` = N, the next N requests are in a waiting queue while a request is
served, and an order that takes `WaitingHints` (with ``keep_waiting``) hears each one's
blocks when it joins the queue (``expect``) and once it has taken its hits
(``unexpect``), as `EvictionHook` tells it in vLLM: a model of a loaded server whose
queue is N deep (the replay has no service time of its own).

``hit_rate`` is hit blocks over prompt blocks. A chain longer than the cache
keeps only its first ``cache_blocks`` blocks cached; the rest count as misses.
`replay_opt` runs the same loop with Belady's choice: evict the unreferenced
block whose next use is farthest away (deepest first on ties); as an upper
bound it may also drop a block of the running request as soon as it is
computed (bypass), which no online policy in vLLM can.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Hashable, Sequence

import attrs

from policies.kv.eviction import EvictionOrder, SessionHints, WaitingHints

Chain = Sequence[Hashable]
Turn = tuple[str | None, float] | tuple[str | None, float, str | None]
"""A request's ``session_id`` (or None), arrival time in seconds and, optionally, tenant."""


@attrs.frozen(kw_only=True)
class ReplayResult:
    """Hit statistics of one policy at one cache size."""

    policy: str
    cache_blocks: int
    hit_rate: float
    """Hit blocks / prompt blocks."""
    hit_blocks: int
    prompt_blocks: int
    evictions: int
    tenant_hit_rates: dict[str | None, float] = attrs.field(factory=dict)
    """Hit rate by tenant, when ``turns`` name tenants."""


class _OptOrder:
    """Belady's choice among unreferenced blocks, from the future of the trace (lazy heap)."""

    def __init__(self, chains: Sequence[Chain]) -> None:
        self._uses: dict[Hashable, list[int]] = {}
        for index, chain in enumerate(chains):
            for key in chain:
                self._uses.setdefault(key, []).append(index)
        self._cursor: dict[Hashable, int] = {}
        self._depth: dict[Hashable, int] = {}
        self._heap: list[tuple[float, int, int, Hashable]] = []
        self._version: dict[Hashable, int] = {}
        self._evictable: set[Hashable] = set()
        self.now = 0
        self._seq = 0

    def _next_use(self, key: Hashable) -> float:
        uses = self._uses[key]
        i = self._cursor.get(key, 0)
        while i < len(uses) and uses[i] <= self.now:
            i += 1
        self._cursor[key] = i
        return uses[i] if i < len(uses) else math.inf

    def release(self, key: Hashable, parent: Hashable | None = None) -> None:
        self._depth[key] = self._depth.get(parent, -1) + 1 if parent is not None else 0
        self._seq += 1
        self._version[key] = self._seq
        self._evictable.add(key)
        heapq.heappush(self._heap, (-self._next_use(key), -self._depth[key], self._seq, key))

    def acquire(self, key: Hashable) -> None:
        self._evictable.remove(key)

    def evict(self) -> Hashable:
        while True:
            _, _, seq, key = heapq.heappop(self._heap)
            if key in self._evictable and self._version[key] == seq:
                self._evictable.remove(key)
                return key


def _replay(chains: Sequence[Chain], cache_blocks: int, order, name: str,
            on_request: Callable[[int], None] | None = None,
            bypass: bool = False, turns: Sequence[Turn] | None = None,
            waiting: int = 0) -> ReplayResult:
    cached: set[Hashable] = set()
    hits = total = evictions = 0
    hints = order if turns is not None and isinstance(order, SessionHints) else None
    queue = order if waiting and isinstance(order, WaitingHints) and order.keep_waiting else None
    queued = 0  # requests told to ``queue`` so far
    tenant_hits: dict[str | None, list[int]] = {}
    for index, full_chain in enumerate(chains):
        if on_request is not None:
            on_request(index)
        while queue is not None and queued < min(len(chains), index + waiting + 1):
            queue.expect(chains[queued][:cache_blocks])
            queued += 1
        total += len(full_chain)
        chain = full_chain[:cache_blocks]
        tenant = turns[index][2] if turns is not None and len(turns[index]) > 2 else None
        if hints is not None:
            session_id, now = turns[index][:2]
            session = hints.turn_started(session_id, chain, now, tenant)
        hit = 0
        while hit < len(chain) and chain[hit] in cached:
            hit += 1
        hits += hit
        if tenant is not None:
            counts = tenant_hits.setdefault(tenant, [0, 0])
            counts[0] += hit
            counts[1] += len(full_chain)
        early: set[Hashable] = set()
        for i, key in enumerate(chain):
            if key in cached:
                order.acquire(key)
                continue
            if bypass:  # OPT may drop a new block at once: it competes before it is cached
                cached.add(key)
                order.release(key, chain[i - 1] if i else None)
                early.add(key)
            if len(cached) > cache_blocks or (not bypass and len(cached) == cache_blocks):
                cached.remove(order.evict())
                evictions += 1
            if not bypass:
                cached.add(key)
        if queue is not None:
            queue.unexpect(chain)
        for i in range(len(chain) - 1, -1, -1):
            if chain[i] not in early:
                order.release(chain[i], chain[i - 1] if i else None)
        if hints is not None:
            hints.turn_finished(session, chain, now)
    return ReplayResult(policy=name, cache_blocks=cache_blocks,
                        hit_rate=hits / total if total else 0.0, hit_blocks=hits,
                        prompt_blocks=total, evictions=evictions,
                        tenant_hit_rates={t: h / n if n else 0.0
                                          for t, (h, n) in tenant_hits.items()})


def replay_order(chains: Sequence[Chain], cache_blocks: int, order: EvictionOrder,
                 name: str, turns: Sequence[Turn] | None = None,
                 waiting: int = 0) -> ReplayResult:
    """Replay ``chains`` through a cache of ``cache_blocks`` evicting in ``order``
    (told each request's session and arrival, ``turns``, if it takes `SessionHints`, and
    the ``waiting`` requests queued behind each one if it takes `WaitingHints`).

    Raises:
        ValueError: if ``cache_blocks`` < 1, ``waiting`` < 0, or ``turns`` is not one
            per chain.
    """
    if cache_blocks < 1:
        raise ValueError(f"cache_blocks must be >= 1, got {cache_blocks!r}")
    if waiting < 0:
        raise ValueError(f"waiting must be >= 0, got {waiting!r}")
    if turns is not None and len(turns) != len(chains):
        raise ValueError(f"turns must have one entry per chain: {len(turns)} for {len(chains)}")
    return _replay(chains, cache_blocks, order, name, turns=turns, waiting=waiting)


def replay_opt(chains: Sequence[Chain], cache_blocks: int) -> ReplayResult:
    """Replay ``chains`` with Belady's offline choice (the ``opt`` policy)."""
    if cache_blocks < 1:
        raise ValueError(f"cache_blocks must be >= 1, got {cache_blocks!r}")
    order = _OptOrder(chains)

    def tick(index: int) -> None:
        order.now = index

    return _replay(chains, cache_blocks, order, "opt", on_request=tick, bypass=True)
