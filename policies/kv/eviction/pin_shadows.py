"""Session pins' bookkeeping: each tenant's share of the pinned budget, and the duel's
shadow that pins as the real order would (`DuelingSLRU` with judged `SessionPins`)."""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence

import attrs

from policies.kv.eviction.shadows import _LRUShadow


def _push_farthest(heap: list, entry: tuple, pins: dict) -> None:
    """Push ``entry`` (``(-until, -sequence, key)``) onto a farthest-return heap whose live
    entries are those ``pins`` (key -> ``(until, sequence)``) still holds; once stale entries
    (pins hit or expired since) make up more than half the heap it is rebuilt, so its size
    stays within twice the pins held plus a constant, O(1) amortised per push."""
    heapq.heappush(heap, entry)
    if len(heap) > 2 * len(pins) + 64:
        heap[:] = [(until, seq, key) for until, seq, key in heap
                   if pins.get(key) == (-until, -seq)]
        heapq.heapify(heap)


@attrs.define(eq=False, kw_only=True)
class _TenantPins:
    """Who made each pin, and each tenant's share of the pinned budget: ``weights`` of the
    tenants that hold or ask for pins now (others 1), so a tenant alone may use all of it."""

    weights: dict = attrs.field(factory=dict)
    _owner: dict = attrs.field(factory=dict)
    """Pinned key -> the tenant charged for it (the one that pinned it first)."""
    _keys: dict = attrs.field(factory=dict)
    """Tenant -> its pinned keys, oldest pin first."""

    def add(self, key: Hashable, tenant: str | None) -> None:
        """Charge a new pin of ``key`` to ``tenant`` (a renewed one stays with its maker)."""
        if key not in self._owner:
            self._owner[key] = tenant
            self._keys.setdefault(tenant, OrderedDict())[key] = None

    def drop(self, key: Hashable) -> None:
        """``key``'s pin ended (nothing if it had none)."""
        if key in self._owner:
            tenant = self._owner.pop(key)
            keys = self._keys[tenant]
            del keys[key]
            if not keys:
                del self._keys[tenant]

    def owner(self, key: Hashable) -> str | None:
        return self._owner[key]

    def counts(self) -> dict[str | None, int]:
        """Pinned keys by tenant (tenants holding none left out)."""
        return {tenant: len(keys) for tenant, keys in self._keys.items()}

    def admit(self, tenant: str | None, limit: int) -> tuple[bool, Hashable | None]:
        """Whether ``tenant`` may make one more pin with ``limit`` pins in all, and the pin
        to end first to make room (the oldest of the tenant most over its share), if any."""
        held = len(self._owner)
        keys = self._keys
        if len(keys) <= 1 and (tenant in keys or not keys):  # one tenant: the whole budget
            return held < limit, None
        weight = self.weights.get
        active = keys.keys() | {tenant}
        total = sum(weight(t, 1.0) for t in active)
        if len(keys.get(tenant, ())) >= limit * weight(tenant, 1.0) / total:
            return False, None  # at its share (every tenant is, with no budget)
        if held < limit:
            return True, None
        over, victim = 0.0, None
        for other, its in keys.items():
            excess = len(its) - limit * weight(other, 1.0) / total
            if other != tenant and excess > over:
                over, victim = excess, next(iter(its))
        return victim is not None, victim

    def check_invariants(self, pinned: dict) -> None:
        """Assert that exactly the keys of ``pinned`` are charged, each to one tenant."""
        assert self._owner.keys() == pinned.keys(), (len(self._owner), len(pinned))
        assert sum(len(keys) for keys in self._keys.values()) == len(self._owner)
        assert all(keys for keys in self._keys.values())



@attrs.define(eq=False, kw_only=True)
class _PinnedLRUShadow(_LRUShadow):
    """An `_LRUShadow` that pins a finished turn's keys as `DuelingSLRU` does: a pinned key
    keeps its place in the queue; one that reaches the front while pinned is parked beside
    it until its pin runs out (then it goes back to the front, the oldest, where LRU would
    have it) or it is hit; parked keys are evicted, farthest predicted return first, only
    once the queue is empty."""

    _pinned: dict = attrs.field(factory=dict)
    """Pinned key -> ``(until, sequence)`` of its latest pin."""
    _parked: set = attrs.field(factory=set)
    """Pinned keys that reached the front of the queue (held, not queued)."""
    parked_by: dict = attrs.field(factory=dict)
    """Tenant -> how many of the parked keys its pins hold (tenants holding none left out)."""
    _expiry: list = attrs.field(factory=list)
    """``(until, sequence, key)`` of each pin, lazily dropped once stale."""
    _farthest: list = attrs.field(factory=list)
    """``(-until, -sequence, key)`` of each pin: the farthest predicted return on top."""
    _seq: int = 0
    book: _TenantPins = attrs.field(factory=_TenantPins)
    """Who made each pin (each tenant's share of the pinned budget)."""

    @classmethod
    def following(cls, lru: _LRUShadow, weights: dict) -> _PinnedLRUShadow:
        """A pinned shadow holding what ``lru`` holds, in its order, with its decayed hits,
        sharing the pinned budget among tenants by ``weights``."""
        return cls(held=set(lru._held), queue=OrderedDict(lru._queue), score=lru.score,
                   book=_TenantPins(weights=weights))

    def access(self, key: Hashable, parent: Hashable | None, capacity: float) -> None:
        """As `_LRUShadow.access`; a pinned key loses its pin."""
        if key in self._pinned:
            self._unhold(key)
        _LRUShadow.access(self, key, parent, capacity)

    def _unhold(self, key: Hashable) -> None:
        """``key``'s pin ends; a parked key goes back to the front of the queue."""
        del self._pinned[key]
        if key in self._parked:
            self._unpark(key)
            self._queue[key] = None
            self._queue.move_to_end(key, last=False)
        self.book.drop(key)

    def _park(self, key: Hashable) -> None:
        """Hold pinned ``key`` beside the queue, charged to its pin's tenant."""
        self._parked.add(key)
        tenant = self.book.owner(key)
        self.parked_by[tenant] = self.parked_by.get(tenant, 0) + 1

    def _unpark(self, key: Hashable) -> None:
        """``key`` (still charged to its pin's tenant) is no longer parked."""
        self._parked.remove(key)
        tenant = self.book.owner(key)
        if self.parked_by[tenant] == 1:
            del self.parked_by[tenant]
        else:
            self.parked_by[tenant] -= 1

    def release(self, key: Hashable, parent: Hashable | None, capacity: float) -> None:
        """As `_LRUShadow.release`; a parked key is accessed first (losing its pin)."""
        if key in self._parked:
            self.access(key, parent, capacity)
        _LRUShadow.release(self, key, parent, capacity)

    def trim(self, capacity: float) -> None:
        """Evict until at most ``capacity`` keys are cached: queued keys first (a pinned one
        at the front is parked instead), then parked ones, the farthest return first."""
        held, queue, pinned, farthest = self._held, self._queue, self._pinned, self._farthest
        parked = self._parked
        while len(held) > capacity:
            if queue:
                key = queue.popitem(last=False)[0]
                if key in pinned:
                    self._park(key)
                else:
                    held.remove(key)
            elif parked:
                until, seq, key = heapq.heappop(farthest)
                if pinned.get(key) == (-until, -seq) and key in parked:
                    del pinned[key]
                    self._unpark(key)
                    self.book.drop(key)
                    held.remove(key)
            else:
                break

    def pin(self, keys: Sequence[Hashable], until: float, limit: int,
            tenant: str | None = None) -> None:
        """Pin ``tenant``'s evictable ``keys`` until ``until`` (a pinned one again), head
        first, within ``tenant``'s share of ``limit`` pins (`_TenantPins.admit`)."""
        pinned, queue, book = self._pinned, self._queue, self.book
        for key in keys:
            if key not in pinned:
                if key not in queue:
                    continue
                admitted, victim = book.admit(tenant, limit)
                if not admitted:
                    continue
                if victim is not None:
                    self._unhold(victim)
                book.add(key, tenant)
            self._seq += 1
            self._hold(key, until, self._seq)

    def _hold(self, key: Hashable, until: float, seq: int) -> None:
        """Record ``key``'s pin ``(until, seq)`` and push it onto both heaps."""
        self._pinned[key] = (until, seq)
        heapq.heappush(self._expiry, (until, seq, key))
        _push_farthest(self._farthest, (-until, -seq, key), self._pinned)

    def expire(self, now: float) -> None:
        """Pins that ran out by ``now`` end; parked keys go back to the front of the queue."""
        expiry, pinned = self._expiry, self._pinned
        while expiry and expiry[0][0] <= now:
            until, seq, key = heapq.heappop(expiry)
            if pinned.get(key) == (until, seq):
                self._unhold(key)

    def restricted(self, keep: Callable[[Hashable], bool]) -> _PinnedLRUShadow:
        """A new shadow holding the kept keys of this one, in the same order, pins kept
        (no counts)."""
        shadow = _PinnedLRUShadow(
            held={key for key in self._held if keep(key)},
            queue=OrderedDict((key, None) for key in self._queue if keep(key)),
            book=_TenantPins(weights=self.book.weights))
        for key, (until, seq) in self._pinned.items():
            if keep(key):
                shadow._hold(key, until, seq)
                shadow.book.add(key, self.book.owner(key))
        for key in self._parked:
            if keep(key):
                shadow._park(key)
        shadow._seq = self._seq
        return shadow

    def check_invariants(self) -> None:
        """Assert `_LRUShadow`'s invariants, that pinned keys are cached, and that parked
        keys are pinned and not queued."""
        super().check_invariants()
        assert all(key in self._held for key in self._pinned)
        assert all(key in self._pinned and key not in self._queue for key in self._parked)
        parked_by: dict = {}
        for key in self._parked:
            parked_by[self.book.owner(key)] = parked_by.get(self.book.owner(key), 0) + 1
        assert parked_by == self.parked_by, (parked_by, self.parked_by)
        self.book.check_invariants(self._pinned)

