"""Adaptive eviction orders tried against `SegmentedLRU` (benchmark candidates, not shipped).

Issue 16 asked for an order that adapts to the workload. These are the three adaptive
families it names, each with vLLM's prefix-chain rules (a block whose parent is evicted
is an orphan and goes next; blocks without content go first), runnable by name in
``python -m benchmarks.cache_replay --policies ...``:

- ``arc``: `AdaptiveSegmentedLRU`, `SegmentedLRU` whose PROBATION target adapts as in
  ARC (Megiddo & Modha, FAST'03): a returning key recently evicted from PROBATION grows
  it, one recently evicted from PROTECTED shrinks it.
- ``lecar`` / ``lecar-crlfu``: `LeCaR` (Vietri et al., HotStorage'18), a learned mixture
  of an LRU and an LFU expert whose weights fall when the key an expert evicted comes
  back (regret); ``crlfu`` breaks LFU ties most-recent-first, CACHEUS' churn-resistant
  LFU (Rodriguez et al., FAST'21).
- ``density``: `ReuseDensity`, LHD-style (Beckmann et al., NSDI'18) reuse-distance
  estimates: per class of use count, how soon evicted or cached keys came back, learned
  online (ghost returns count, so the estimate is not censored by the order's own
  evictions), and the sampled key with the least expected hits per cached step goes.

None beats `SegmentedLRU` on the Mooncake traces (docs/kv_cache.md, "Adaptive orders");
they are kept so that the comparison can be re-run. O(1) amortised per call except
`ReuseDensity.evict` (``samples`` candidates) and its periodic re-estimation.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import OrderedDict
from collections.abc import Hashable, Iterator

import attrs

from policies.kv.eviction import EvictionStats, Segment, SegmentedLRU


@attrs.define(eq=False, kw_only=True)
class AdaptiveSegmentedLRU(SegmentedLRU):
    """`SegmentedLRU` with ARC's adaptive split between PROBATION and PROTECTED."""

    window: float = 1.0
    """Recent evictions (per key of the cache) that count as ARC's ghost lists B1 / B2."""
    _b1: OrderedDict = attrs.field(init=False, repr=False, factory=OrderedDict)
    _b2: OrderedDict = attrs.field(init=False, repr=False, factory=OrderedDict)
    _target: float = attrs.field(init=False, repr=False, default=0.0)

    @property
    def probation_target(self) -> float:
        """PROBATION's target size (ARC's ``p``), between 0 and the evictable keys."""
        return self._target

    def _remembered_uses(self, key: Hashable) -> int:
        if key in self._b1:
            del self._b1[key]
            self._target += max(1.0, len(self._b2) / max(1, len(self._b1)))
        elif key in self._b2:
            del self._b2[key]
            self._target -= max(1.0, len(self._b1) / max(1, len(self._b2)))
        self._target = min(max(self._target, 0.0), float(max(1, len(self))))
        return super()._remembered_uses(key)

    def evict(self) -> Hashable:
        segment = next((s for s, keys in zip(Segment, self._segments, strict=True) if keys),
                       None)
        key = super().evict()
        ghosts = {Segment.PROBATION: self._b1, Segment.PROTECTED: self._b2}.get(segment)
        if ghosts is not None:
            ghosts[key] = None
            while len(ghosts) > int(self.window * max(self._peak_tracked, 1)):
                ghosts.popitem(last=False)
        return key

    def _protected_limit(self) -> int:
        return max(1, int(len(self) - self._target))


@attrs.define(eq=False, slots=True)
class _Entry:
    uses: int
    released_at: int = 0
    evictable: bool = False


@attrs.define(eq=False, kw_only=True)
class _ChainedOrder:
    """Prefix-chain bookkeeping shared by the candidates; subclasses choose the victim
    among the evictable keys that still have their parent (`_admit`, `_drop`, `_victim`)."""

    history_factor: float = 4.0
    """Evicted keys whose use counts are remembered, per key of the most ever tracked."""
    _entries: dict = attrs.field(init=False, repr=False, factory=dict)
    _uncached: OrderedDict = attrs.field(init=False, repr=False, factory=OrderedDict)
    _orphans: OrderedDict = attrs.field(init=False, repr=False, factory=OrderedDict)
    _parent: dict = attrs.field(init=False, repr=False, factory=dict)
    _children: dict = attrs.field(init=False, repr=False, factory=dict)
    _ghosts: OrderedDict = attrs.field(init=False, repr=False, factory=OrderedDict)
    _peak: int = attrs.field(init=False, repr=False, default=1)
    _clock: int = attrs.field(init=False, repr=False, default=0)
    _admitted: int = attrs.field(init=False, repr=False, default=0)
    _counts: dict = attrs.field(init=False, repr=False, factory=lambda: dict.fromkeys(
        ("releases", "acquires", "evictions", "orphaned", "evicted_with_children"), 0))

    # -- hooks -------------------------------------------------------------------

    def _admit(self, key: Hashable, entry: _Entry) -> None:
        raise NotImplementedError

    def _drop(self, key: Hashable, entry: _Entry, hit: bool) -> None:
        """``key`` stops being a candidate: a prefix hit (``hit``), an eviction or an orphan."""
        raise NotImplementedError

    def _victim(self) -> Hashable:
        raise NotImplementedError

    def _returned(self, key: Hashable, ghost: tuple) -> None:
        """``key`` is released again after an eviction that left ``ghost``."""

    def _ghost(self, key: Hashable, entry: _Entry) -> tuple:
        return (entry.uses,)

    def _forgotten(self, key: Hashable, ghost: tuple) -> None:
        """``ghost`` of ``key`` falls out of the history."""

    def _ordered(self) -> Iterator[Hashable]:
        raise NotImplementedError

    # -- the protocol ---------------------------------------------------------------

    def release(self, key: Hashable, parent: Hashable | None = None, *,
                protect: bool = False) -> None:
        """``key`` became evictable (``protect`` is ignored).

        Raises:
            ValueError: if ``key`` is already evictable.
        """
        if key in self:
            raise ValueError(f"key {key!r} is already evictable")
        self._clock += 1
        self._counts["releases"] += 1
        entry = self._entries.get(key) or self._new_entry(key)
        entry.released_at, entry.evictable = self._clock, True
        old = self._parent.get(key)
        if old is not None and old != parent:
            del self._parent[key], self._children[old][key]
        if parent is not None and parent != key and old != parent:
            if parent not in self._entries:
                self._new_entry(parent)  # cached and referenced, not released yet
            self._parent[key] = parent
            self._children.setdefault(parent, {})[key] = None
        self._admitted += 1
        self._admit(key, entry)

    def release_uncached(self, key: Hashable) -> None:
        """``key`` holds no content: it is evicted first, newest first.

        Raises:
            ValueError: if ``key`` is already evictable.
        """
        if key in self:
            raise ValueError(f"key {key!r} is already evictable")
        if key in self._entries:
            self._forget(key)
        self._uncached[key] = None
        self._uncached.move_to_end(key, last=False)

    def acquire(self, key: Hashable) -> None:
        """The evictable ``key`` is referenced again; its use count grows by one.

        Raises:
            KeyError: if ``key`` is not evictable.
        """
        entry = self._entries.get(key)
        if entry is None or not entry.evictable:
            raise KeyError(f"key {key!r} is not evictable")
        self._unqueue(key, entry, hit=True)
        entry.uses += 1
        self._counts["acquires"] += 1

    def evict(self) -> Hashable:
        """Remove and return the next victim.

        Raises:
            IndexError: if nothing is evictable.
        """
        if self._uncached:
            key, _ = self._uncached.popitem(last=False)
            self._counts["evictions"] += 1
            return key
        if self._orphans:
            key = next(iter(self._orphans))
        elif self._admitted:
            key = self._victim()
        else:
            raise IndexError("evict from an empty eviction order")
        entry = self._entries[key]
        self._unqueue(key, entry)
        self._counts["evictions"] += 1
        self._peak = max(self._peak, len(self._entries))
        self._ghosts[key] = self._ghost(key, entry)
        while len(self._ghosts) > self.history_factor * self._peak:
            self._forgotten(*self._ghosts.popitem(last=False))
        self._forget(key)
        return key

    def discard(self, key: Hashable) -> None:
        """Forget ``key`` without counting an eviction; no-op if unknown."""
        if key in self._uncached:
            del self._uncached[key]
        elif key in self._entries:
            entry = self._entries[key]
            if entry.evictable:
                self._unqueue(key, entry)
            self._forget(key)

    def __len__(self) -> int:
        return len(self._uncached) + len(self._orphans) + self._admitted

    def __contains__(self, key: object) -> bool:
        if key in self._uncached:
            return True
        entry = self._entries.get(key)
        return entry is not None and entry.evictable

    def __iter__(self) -> Iterator[Hashable]:
        """Uncached keys, orphans, then the rest in the subclass's order (approximate
        for a randomised order)."""
        yield from self._uncached
        yield from self._orphans
        yield from self._ordered()

    def stats(self) -> EvictionStats:
        """Sizes and counters (the admitted keys count as PROBATION)."""
        return EvictionStats(
            evictable_blocks=len(self), tracked_blocks=len(self._entries),
            uncached_blocks=len(self._uncached), orphan_blocks=len(self._orphans),
            probation_blocks=self._admitted, protected_blocks=0, promotions=0, demotions=0,
            shielded=0, **self._counts)

    def check_invariants(self) -> None:
        """Assert that counts, entries and parent links agree."""
        evictable = sum(e.evictable for e in self._entries.values())
        assert evictable == len(self._orphans) + self._admitted, (evictable, len(self))
        for key in self._orphans:
            assert key not in self._parent and self._entries[key].evictable, key
        for child, parent in self._parent.items():
            assert child in self._children[parent], (child, parent)

    # -- helpers --------------------------------------------------------------------

    def _new_entry(self, key: Hashable) -> _Entry:
        ghost = self._ghosts.pop(key, None)
        entry = self._entries[key] = _Entry(uses=1 + (ghost[0] if ghost else 0))
        if ghost is not None:
            self._returned(key, ghost)
        return entry

    def _unqueue(self, key: Hashable, entry: _Entry, hit: bool = False) -> None:
        entry.evictable = False
        if key in self._orphans:
            del self._orphans[key]
            return
        self._admitted -= 1
        self._drop(key, entry, hit)

    def _forget(self, key: Hashable) -> None:
        del self._entries[key]
        parent = self._parent.pop(key, None)
        if parent is not None:
            self._children[parent].pop(key, None)
        children = self._children.pop(key, {})
        if any(self._entries[c].evictable for c in children):
            self._counts["evicted_with_children"] += 1
        for child in children:
            del self._parent[child]
            entry = self._entries[child]
            if entry.evictable and child not in self._orphans:
                self._admitted -= 1
                self._drop(child, entry, False)
                self._orphans[child] = None
                self._counts["orphaned"] += 1


@attrs.define(eq=False, kw_only=True)
class LeCaR(_ChainedOrder):
    """A learned mixture of LRU and LFU: each eviction follows one expert, drawn by weight;
    a key that comes back while in the history of the expert that evicted it moves weight
    to the other expert (``learning_rate``, discounted by how long ago it was evicted)."""

    learning_rate: float = 0.45
    churn_resistant: bool = False
    """Break LFU ties most recently released first (CACHEUS' CR-LFU), not least."""
    rng: random.Random = attrs.field(factory=lambda: random.Random(0))
    _lru: OrderedDict = attrs.field(init=False, repr=False, factory=OrderedDict)
    _heap: list = attrs.field(init=False, repr=False, factory=list)
    _weights: list = attrs.field(init=False, repr=False, factory=lambda: [0.5, 0.5])
    _history: tuple = attrs.field(init=False, repr=False,
                                  factory=lambda: (OrderedDict(), OrderedDict()))

    @property
    def lru_weight(self) -> float:
        """The current weight of the LRU expert (the LFU one has the rest)."""
        return self._weights[0]

    def _admit(self, key: Hashable, entry: _Entry) -> None:
        self._lru[key] = entry
        tie = -entry.released_at if self.churn_resistant else entry.released_at
        heapq.heappush(self._heap, (entry.uses, tie, entry.released_at, key))

    def _drop(self, key: Hashable, entry: _Entry, hit: bool) -> None:
        del self._lru[key]  # the heap entry goes stale (lazy deletion)

    def _victim(self) -> Hashable:
        expert = 0 if self.rng.random() < self._weights[0] else 1
        if expert == 0:
            key = next(iter(self._lru))
        else:
            while True:
                _uses, _tie, released_at, key = heapq.heappop(self._heap)
                entry = self._lru.get(key)
                if entry is not None and entry.released_at == released_at:
                    break
        history = self._history[expert]
        history[key] = self._clock
        while len(history) > max(self._peak, 1):
            history.popitem(last=False)
        return key

    def _returned(self, key: Hashable, ghost: tuple) -> None:
        for expert, history in enumerate(self._history):
            evicted_at = history.pop(key, None)
            if evicted_at is not None:
                discount = 0.005 ** (1 / max(self._peak, 1))
                reward = discount ** (self._clock - evicted_at)
                self._weights[1 - expert] *= math.exp(self.learning_rate * reward)
                total = sum(self._weights)
                self._weights = [w / total for w in self._weights]

    def _ordered(self) -> Iterator[Hashable]:
        yield from self._lru


def _use_class(uses: int) -> int:
    return min(4, max(0, uses - 1).bit_length())  # 1, 2, 3-4, 5-8, 9+


@attrs.define(eq=False, kw_only=True)
class ReuseDensity(_ChainedOrder):
    """Evict the sampled key with the fewest expected hits per cached step (LHD-style).

    Per class of use count, the ages (in releases, ``age_step`` per bin) at which keys
    were reused (while cached or after an eviction, from the ghost history) and at which
    their history ended unused are counted; every ``refresh_every`` events the counts
    give each (class, age) its hit density (hits still to come over cached steps still
    to spend) and decay by ``decay``. `evict` compares ``samples`` random keys.
    """

    samples: int = 32
    age_step: int = 64
    max_age_bins: int = 2048
    refresh_every: int = 8192
    decay: float = 0.9
    rng: random.Random = attrs.field(factory=lambda: random.Random(0))
    _keys: list = attrs.field(init=False, repr=False, factory=list)
    _slot: dict = attrs.field(init=False, repr=False, factory=dict)
    _hits: list = attrs.field(init=False, repr=False)
    _ends: list = attrs.field(init=False, repr=False)
    _density: list = attrs.field(init=False, repr=False)
    _events: int = attrs.field(init=False, repr=False, default=0)

    def __attrs_post_init__(self) -> None:
        bins = self.max_age_bins
        self._hits = [[0.0] * bins for _ in range(5)]
        self._ends = [[0.0] * bins for _ in range(5)]
        self._density = [[1.0 / (a + 1) for a in range(bins)] for _ in range(5)]

    def _age(self, released_at: int) -> int:
        return min((self._clock - released_at) // self.age_step, self.max_age_bins - 1)

    def _admit(self, key: Hashable, entry: _Entry) -> None:
        self._slot[key] = len(self._keys)
        self._keys.append(key)

    def _drop(self, key: Hashable, entry: _Entry, hit: bool) -> None:
        index = self._slot.pop(key)
        last = self._keys.pop()
        if index < len(self._keys):
            self._keys[index] = last
            self._slot[last] = index
        if hit:
            self._count(self._hits, _use_class(entry.uses), entry.released_at)

    def _victim(self) -> Hashable:
        keys, density, best, lowest = self._keys, self._density, None, math.inf
        for _ in range(min(self.samples, len(keys))):
            key = keys[self.rng.randrange(len(keys))]
            entry = self._entries[key]
            value = density[_use_class(entry.uses)][self._age(entry.released_at)]
            if value < lowest:
                best, lowest = key, value
        return best

    def _ghost(self, key: Hashable, entry: _Entry) -> tuple:
        return entry.uses, entry.released_at

    def _returned(self, key: Hashable, ghost: tuple) -> None:
        self._count(self._hits, _use_class(ghost[0]), ghost[1])

    def _forgotten(self, key: Hashable, ghost: tuple) -> None:
        self._count(self._ends, _use_class(ghost[0]), ghost[1])

    def _count(self, table: list, cls: int, released_at: int) -> None:
        table[cls][self._age(released_at)] += 1.0
        self._events += 1
        if self._events >= self.refresh_every:
            self._events = 0
            self._refresh()

    def _refresh(self) -> None:
        for hits, ends, density in zip(self._hits, self._ends, self._density, strict=True):
            later_hits = later_events = cached_steps = 0.0
            for age in range(self.max_age_bins - 1, -1, -1):
                later_hits += hits[age]
                later_events += hits[age] + ends[age]
                cached_steps += later_events
                density[age] = later_hits / cached_steps if cached_steps else 0.0
                hits[age] *= self.decay
                ends[age] *= self.decay

    def _ordered(self) -> Iterator[Hashable]:
        yield from self._keys
