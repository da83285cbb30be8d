"""`SetDueling`: `SegmentedLRU` that turns itself into LRU where frequency does not pay.

Set dueling (Qureshi et al., ISCA'07) between two shadow caches: a plain `LRU` and a
`SegmentedLRU`, each holding keys only (no data), both as large as the real cache and
both fed the access stream the real order sees (a prefix hit is an ``acquire``; a block
computed anew is ``release``d without one). Each shadow counts the accesses it would
have hit (a key it holds whose parent it holds too, vLLM's prefix rule), with
exponential decay. The real order is a `SegmentedLRU` whose PROTECTED segment has its
usual share while the SLRU shadow leads and none while the LRU shadow leads (by more than
``switch_margin_hits`` to turn into LRU, since that empties PROTECTED): then every release
goes to PROBATION in release order, which is LRU (orphans still go first, which loses no
hit).

So on a workload where frequency pays the real order is `SegmentedLRU`, and where it
does not (agent sessions whose growing context is used once per turn), it is LRU, and it
follows the better one within the decay window. Cost: per sampled call, a shadow
`SegmentedLRU`'s bookkeeping and an LRU queue's besides the real order's, still O(1)
amortised; memory at most three times `SegmentedLRU`'s. `DuelingSLRU` adds session pins.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable

import attrs

from policies.kv.eviction.layers import SegmentedLRU
from policies.kv.eviction.shadows import _LRUShadow, _OrderShadow


@attrs.define(eq=False, kw_only=True)
class SetDueling(SegmentedLRU):
    """Never far below LRU: evicts as `SegmentedLRU` while a shadow SLRU out-hits a shadow
    LRU over the last ``window_accesses`` (decayed), else as LRU; O(1) amortised per call.

    The hot paths call `SegmentedLRU`'s methods by name: ``super()`` costs as much as the
    call itself in Python 3.11.

    Guarantees (besides `SegmentedLRU`'s segment rules): a release while `mode` is ``"lru"``
    leaves PROTECTED empty (a release that turns the mode to LRU leaves that to the next one), so
    keys are evicted uncached, orphans, then in release
    order. `mode` is ``"slru"`` until the shadows have seen an eviction and whenever the SLRU
    shadow's decayed hits are at least the LRU shadow's; it turns ``"lru"`` only once the LRU
    shadow leads by more than ``switch_margin_hits``.
    """

    window_accesses: float = attrs.field(default=20_000.0, validator=attrs.validators.gt(0))
    """Decay horizon of the shadows' hit counts, in accesses (acquires and new blocks)."""
    shadow_sample: int = attrs.field(default=4, validator=attrs.validators.ge(1))
    """At most, the shadows see one key in ``shadow_sample`` (by hash) and are that much
    smaller: set dueling on sampled sets, at 1 / ``shadow_sample`` of the cost. One in 8
    switched to LRU later on the held-out ``agent-swe-busy`` trace (0.39 points below LRU at
    3,000 blocks, against 0.10 with one in 4)."""
    switch_margin_hits: float = attrs.field(default=20.0, validator=attrs.validators.ge(0))
    """The LRU shadow must lead by more than this many decayed (sampled) hits for the order
    to turn into LRU, which empties PROTECTED; it turns back as soon as the SLRU shadow
    leads again (that costs nothing). Hysteresis against flips on a tie: on the Mooncake
    conversation trace they cost 0.5-0.7 points at 4,000-8,000 blocks."""
    sample_from_blocks: int = attrs.field(default=2048, validator=attrs.validators.ge(1))
    """The sample rate is fixed at the first eviction: ``shadow_sample`` for a cache of at
    least this many blocks, else 1 (sampled shadows of smaller caches ran the order up to 2.6
    points below LRU on ``agent-bfcl``, and 0.45 on ``mooncake-synthetic`` at 2,000)."""
    _sample: int = attrs.field(init=False, repr=False, default=1)

    _lru: _LRUShadow = attrs.field(init=False, repr=False, factory=_LRUShadow)
    _slru: _OrderShadow = attrs.field(init=False, repr=False, factory=_OrderShadow)
    _capacity: float = attrs.field(init=False, repr=False, default=math.inf)
    """Cached keys the shadows may hold: the most the real order tracked at an eviction."""
    _switches: int = attrs.field(init=False, repr=False, default=0)
    _lru_mode: bool = attrs.field(init=False, repr=False, default=False)

    @property
    def mode(self) -> str:
        """``"slru"`` or ``"lru"``: how the real order evicts now."""
        return "lru" if self._lru_mode else "slru"

    def acquire(self, key: Hashable) -> None:
        """As `SegmentedLRU.acquire`; both shadows see an access of ``key``."""
        SegmentedLRU.acquire(self, key)
        if not hash(key) % self._sample:
            self._observe(key, self._entries[key].parent, release=False)

    def release(self, key: Hashable, parent: Hashable | None = None, *,
                protect: bool = False) -> None:
        """As `SegmentedLRU.release`; a sampled key is an access of both shadows (unless
        they had it in use)."""
        SegmentedLRU._release(self, key, parent, protect=protect)  # without `_release`'s frame
        if not hash(key) % self._sample:
            self._observe(key, parent, release=True)

    def _release(self, key: Hashable, parent: Hashable | None, *, protect: bool = False,
                 cancelled: bool = False) -> None:
        SegmentedLRU._release(self, key, parent, protect=protect, cancelled=cancelled)
        if not hash(key) % self._sample:
            self._observe(key, parent, release=True)

    def evict(self) -> Hashable:
        """As `SegmentedLRU.evict`; the shadows' capacity follows the real cache's."""
        if self._capacity == math.inf:  # the cache is full: fix the sample rate
            self._capacity = float(len(self._entries))
            self._sample = (self.shadow_sample if len(self._entries) >= self.sample_from_blocks
                            else 1)
            if self._sample > 1:  # go on with the sampled keys of what the shadows hold
                sample = self._sample
                self._restrict_shadows(lambda key: not hash(key) % sample)
        elif len(self._entries) > self._capacity:
            self._capacity = float(len(self._entries))
        return SegmentedLRU.evict(self)

    def _restrict_shadows(self, keep: Callable[[Hashable], bool]) -> None:
        """The shadows go on with the keys ``keep`` accepts (the sampled ones)."""
        self._lru = self._lru.restricted(keep)
        self._slru = self._slru.restricted(keep)

    def _observe(self, key: Hashable, parent: Hashable | None, *, release: bool) -> None:
        """A sampled ``key`` was accessed: feed both shadows, follow the leader."""
        sample = self._sample
        if parent is not None and hash(parent) % sample:
            parent = None  # not in the shadows: the prefix rule is checked on sampled keys
        decay = 1.0 - sample / self.window_accesses
        capacity = self._capacity / sample
        lru, slru = self._lru, self._slru  # unrolled: a loop over the two costs a tuple
        lru_hits = lru.hits
        lru.score *= decay
        slru.score *= decay
        if release:
            lru.release(key, parent, capacity)
            slru.release(key, parent, capacity)
        else:
            lru.access(key, parent, capacity)
            slru.access(key, parent, capacity)
        if self._lru_mode:
            lru_mode = lru.score > slru.score
        else:
            lru_mode = lru.score > slru.score + self.switch_margin_hits
        if lru_mode != self._lru_mode:
            self._lru_mode = lru_mode
            self._switches += 1
        self._observed(key, parent, release, decay, capacity, lru.hits - lru_hits)

    def _observed(self, key: Hashable, parent: Hashable | None, release: bool, decay: float,
                  capacity: float, lru_hit: int) -> None:
        """After `_observe`: a layer's own shadows see the access (``lru_hit``: whether the
        LRU shadow hit it)."""

    def _protected_limit(self) -> int:
        return 0 if self._lru_mode else SegmentedLRU._protected_limit(self)

    def duel_stats(self) -> dict[str, float]:
        """The shadows' hits (total and decayed) and how often the mode switched."""
        return {"shadow_accesses": self._lru.accesses,
                "lru_shadow_hits": self._lru.hits, "slru_shadow_hits": self._slru.hits,
                "lru_shadow_score": self._lru.score, "slru_shadow_score": self._slru.score,
                "mode_switches": self._switches, "lru_mode": int(self._lru_mode)}

    def check_invariants(self) -> None:
        """Assert the real order's and both shadows' invariants."""
        super().check_invariants()
        self._lru.check_invariants()
        self._slru.check_invariants()
