"""The duel's shadow caches: key-only caches fed the real order's accesses, counting the
hits they would have had (`DuelingSLRU`)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable

import attrs

from policies.kv.eviction.layers import SegmentedLRU
from policies.kv.eviction.lru import LRU
from policies.kv.eviction.segments import Segment


@attrs.define(eq=False, kw_only=True)
class _Shadow:
    """A key-only cache fed the real order's accesses; counts the ones it would have hit.

    Subclasses hold the keys: `_OrderShadow` in an eviction order, `_LRUShadow` in a queue
    (plain LRU needs no per-key metadata).
    """

    score: float = 0.0
    """Decayed hits."""
    hits: int = 0
    accesses: int = 0

    def holds(self, key: Hashable) -> bool:
        """Whether ``key`` is cached (referenced or evictable)."""
        raise NotImplementedError

    def _count(self, held: bool, parent: Hashable | None) -> None:
        """One access, a hit if the key was ``held`` and so is its ``parent`` (if any)."""
        self.accesses += 1
        if held and (parent is None or self.holds(parent)):
            self.score += 1.0
            self.hits += 1

    def check_invariants(self) -> None:
        """Assert that no more accesses hit than were counted."""
        assert self.hits <= self.accesses, (self.hits, self.accesses)


@attrs.define(eq=False, kw_only=True)
class _OrderShadow(_Shadow):
    """A `_Shadow` whose keys wait in an eviction order (a `SegmentedLRU` in the duel)."""

    order: LRU = attrs.field(factory=SegmentedLRU)
    _in_use: set = attrs.field(factory=set)
    """Keys computed by the shadow and referenced, not released yet."""

    def holds(self, key: Hashable) -> bool:
        return key in self._in_use or self.order.tracks(key)

    def access(self, key: Hashable, parent: Hashable | None, capacity: float) -> None:
        """``key`` (below ``parent``) is used by a request; it becomes referenced."""
        entry = self.order._entries.get(key)  # the order's own table: its methods cost more
        held = entry is not None or key in self._in_use
        self._count(held, parent)
        if entry is not None and entry.segment is not None:
            self.order.acquire(key)
        elif not held:
            self.trim(capacity - 1)
            self._in_use.add(key)

    def release(self, key: Hashable, parent: Hashable | None, capacity: float) -> None:
        """The real order released ``key``: an access first unless the shadow had it in use."""
        order, in_use = self.order, self._in_use
        entries = order._entries
        entry = entries.get(key)
        if entry is None and key not in in_use or entry is not None and entry.segment is not None:
            self.access(key, parent, capacity)
        in_use.discard(key)
        held = parent is not None and (parent in in_use or parent in entries)
        order.release(key, parent if held else None)
        if parent in in_use and parent in entries:  # SegmentedLRU linked it
            in_use.discard(parent)

    def restricted(self, keep: Callable[[Hashable], bool]) -> _OrderShadow:
        """A new shadow holding the kept keys of this one, evictable ones released in this
        one's eviction order, PROTECTED ones protected again (as roots; no counts)."""
        shadow = _OrderShadow(in_use={key for key in self._in_use if keep(key)})
        for key in self.order:
            if keep(key):
                shadow.order.release(
                    key, protect=self.order.segment_of(key) is Segment.PROTECTED)
        return shadow

    def trim(self, capacity: float) -> None:
        """Evict until at most ``capacity`` keys are cached or none is evictable."""
        order, in_use = self.order, self._in_use
        entries, segments = order._entries, order._segments
        while len(entries) + len(in_use) > capacity and any(segments):
            order.evict()

    def check_invariants(self) -> None:
        """Assert the order's invariants and the counts'."""
        super().check_invariants()
        self.order.check_invariants()


@attrs.define(eq=False, kw_only=True)
class _LRUShadow(_Shadow):
    """A `_Shadow` that evicts as `LRU`: counts the hits an `_OrderShadow` over `LRU` would,
    with a set and a queue instead of an order's metadata."""

    _held: set = attrs.field(factory=set)
    """Cached keys, referenced or evictable."""
    _queue: OrderedDict = attrs.field(factory=OrderedDict)
    """Evictable keys, least recently released first."""

    def holds(self, key: Hashable) -> bool:
        return key in self._held

    def access(self, key: Hashable, parent: Hashable | None, capacity: float) -> None:
        """``key`` (below ``parent``) is used by a request; it becomes referenced."""
        held = key in self._held
        self._count(held, parent)
        if held:
            self._queue.pop(key, None)
        else:
            self.trim(capacity - 1)
            self._held.add(key)

    def release(self, key: Hashable, parent: Hashable | None, capacity: float) -> None:
        """The real order released ``key``: an access first unless the shadow had it in use."""
        if key in self._queue or key not in self._held:
            self.access(key, parent, capacity)
        self._queue[key] = None

    def trim(self, capacity: float) -> None:
        """Evict until at most ``capacity`` keys are cached or none is evictable."""
        held, queue = self._held, self._queue
        while len(held) > capacity and queue:
            held.remove(queue.popitem(last=False)[0])

    def restricted(self, keep: Callable[[Hashable], bool]) -> _LRUShadow:
        """A new shadow holding the kept keys of this one, in the same order (no counts)."""
        return _LRUShadow(held={key for key in self._held if keep(key)},
                          queue=OrderedDict((key, None) for key in self._queue if keep(key)))

    def check_invariants(self) -> None:
        """Assert that every evictable key is cached, and the counts'."""
        super().check_invariants()
        assert all(key in self._held for key in self._queue)

