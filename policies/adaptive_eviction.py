"""`DuelingSLRU`: `SegmentedLRU` that turns itself into LRU where frequency does not pay.

Set dueling (Qureshi et al., ISCA'07) between two shadow caches: a plain `LRU` and a
`SegmentedLRU`, each holding keys only (no data), both as large as the real cache and
both fed the access stream the real order sees (a prefix hit is an ``acquire``; a block
computed anew is ``release``d without one). Each shadow counts the accesses it would
have hit (a key it holds whose parent it holds too, vLLM's prefix rule), with
exponential decay. The real order is a `SegmentedLRU` whose PROTECTED segment has its
usual share while the SLRU shadow leads and none while the LRU shadow leads: then every
release goes to PROBATION in release order, which is LRU (orphans still go first, which
loses no hit).

So on a workload where frequency pays the real order is `SegmentedLRU`, and where it
does not (agent sessions whose growing context is used once per turn), it is LRU, and it
follows the better one within the decay window. Cost: three orders' bookkeeping per
call, still O(1) amortised; memory three times `SegmentedLRU`'s.
"""

from __future__ import annotations

from collections.abc import Hashable

import attrs

from policies.eviction import LRU, EvictionStats, SegmentedLRU


@attrs.define(eq=False, kw_only=True)
class _Shadow:
    """A key-only cache fed the real order's accesses; counts the ones it would have hit."""

    order: LRU
    score: float = 0.0
    """Decayed hits."""
    hits: int = 0
    _in_use: set = attrs.field(factory=set)
    """Keys computed by the shadow and referenced, not released yet."""

    def holds(self, key: Hashable) -> bool:
        return key in self._in_use or self.order.tracks(key)

    def access(self, key: Hashable, parent: Hashable | None, capacity: float) -> None:
        """``key`` (below ``parent``) is used by a request; it becomes referenced."""
        held = self.holds(key)
        if held and (parent is None or self.holds(parent)):
            self.score += 1.0
            self.hits += 1
        if key in self.order:
            self.order.acquire(key)
        elif not held:
            while self.order.tracked + len(self._in_use) >= capacity and len(self.order):
                self.order.evict()
            self._in_use.add(key)

    def release(self, key: Hashable, parent: Hashable | None, capacity: float) -> None:
        """The real order released ``key``: an access first unless the shadow had it in use."""
        if key in self.order or not self.holds(key):
            self.access(key, parent, capacity)
        self._in_use.discard(key)
        self.order.release(key, parent if self.holds(parent) else None)

    def size(self) -> int:
        """Cached keys: tracked by the order or in use."""
        return self.order.tracked + len(self._in_use)


@attrs.define(eq=False, kw_only=True)
class DuelingSLRU(SegmentedLRU):
    """Never far below LRU: evicts as `SegmentedLRU` while a shadow SLRU out-hits a shadow
    LRU over the last ``window_accesses`` (decayed), else as LRU; O(1) amortised per call.

    Guarantees (besides `SegmentedLRU`'s segment rules): while `mode` is ``"lru"`` PROTECTED
    is empty after each release, so keys are evicted uncached, orphans, then in release
    order. `mode` is ``"slru"`` until the shadows have seen an eviction and whenever the SLRU
    shadow's decayed hits are at least the LRU shadow's.
    """

    window_accesses: float = attrs.field(default=20_000.0, validator=attrs.validators.gt(0))
    """Decay horizon of the shadows' hit counts, in accesses (acquires and new blocks)."""

    _lru: _Shadow = attrs.field(init=False, repr=False, factory=lambda: _Shadow(order=LRU()))
    _slru: _Shadow = attrs.field(init=False, repr=False,
                                 factory=lambda: _Shadow(order=SegmentedLRU()))
    _capacity: float = attrs.field(init=False, repr=False, default=float("inf"))
    """Cached keys the shadows may hold: the most the real order tracked at an eviction."""
    _switches: int = attrs.field(init=False, repr=False, default=0)
    _lru_mode: bool = attrs.field(init=False, repr=False, default=False)

    @property
    def mode(self) -> str:
        """``"slru"`` or ``"lru"``: how the real order evicts now."""
        return "lru" if self._lru_mode else "slru"

    def acquire(self, key: Hashable) -> None:
        """As `SegmentedLRU.acquire`; both shadows see an access of ``key``."""
        super().acquire(key)
        self._observe(key, self._entries[key].parent, release=False)

    def _release(self, key: Hashable, parent: Hashable | None, *, protect: bool = False,
                 cancelled: bool = False) -> None:
        super()._release(key, parent, protect=protect, cancelled=cancelled)
        self._observe(key, parent, release=True)

    def evict(self) -> Hashable:
        """As `SegmentedLRU.evict`; the shadows' capacity follows the real cache's."""
        if self._capacity == float("inf") or len(self._entries) > self._capacity:
            self._capacity = float(len(self._entries))
        return super().evict()

    def _observe(self, key: Hashable, parent: Hashable | None, *, release: bool) -> None:
        decay = 1.0 - 1.0 / self.window_accesses
        for shadow in (self._lru, self._slru):
            shadow.score *= decay
            if release:
                shadow.release(key, parent, self._capacity)
            else:
                shadow.access(key, parent, self._capacity)
        lru_mode = self._lru.score > self._slru.score
        if lru_mode != self._lru_mode:
            self._lru_mode = lru_mode
            self._switches += 1

    def _protected_limit(self) -> int:
        return 0 if self._lru_mode else super()._protected_limit()

    def duel_stats(self) -> dict[str, float]:
        """The shadows' hits (total and decayed) and how often the mode switched."""
        return {"lru_shadow_hits": self._lru.hits, "slru_shadow_hits": self._slru.hits,
                "lru_shadow_score": self._lru.score, "slru_shadow_score": self._slru.score,
                "mode_switches": self._switches, "lru_mode": int(self._lru_mode)}

    def stats(self) -> EvictionStats:
        """`SegmentedLRU.stats` of the real order (the shadows are in `duel_stats`)."""
        return super().stats()

    def check_invariants(self) -> None:
        """Assert the real order's and both shadows' invariants, and LRU mode's empty PROTECTED."""
        super().check_invariants()
        self._lru.order.check_invariants()
        self._slru.order.check_invariants()
        for shadow in (self._lru, self._slru):
            assert shadow.size() <= self._capacity or not len(shadow.order), shadow.size()
