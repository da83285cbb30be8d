"""`FrequencyLRU`: segmented LRU, the frequency layer under `SegmentedLRU`."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import ClassVar

import attrs

from policies.kv.eviction.lru import LRU, UNCACHED, _Entry
from policies.kv.eviction.segments import Segment

PROBATION, PROTECTED = Segment.PROBATION, Segment.PROTECTED


def _fraction(_instance: object, attribute: attrs.Attribute, value: float) -> None:
    if not 0.0 <= value < 1.0:  # also rejects NaN
        raise ValueError(f"{attribute.name} must be in [0, 1), got {value!r}")


@attrs.define(eq=False, kw_only=True)
class FrequencyLRU(LRU):
    """Reused blocks outlive one-shot blocks; a chain is evicted leaf first; O(1) amortised.

    Guarantees:
        * Blocks used fewer than ``promote_after_uses`` times (PROBATION) are
          evicted before reused ones (PROTECTED); orphans before both.
        * After each `release`, PROTECTED holds at most
          ``max(1, floor(protected_fraction * len(self)))`` keys: the least
          recently released overflow is demoted to the back of PROBATION.
        * Never keeps a child whose parent is gone: evicting a key moves its
          evictable children to ORPHAN, which is evicted next. Children are
          released no later than their parent and are used no more often, so
          within a segment the leaves of a chain come first; `EvictionStats`
          counts the exceptions (``evicted_with_children``).
        * Each call is O(1), amortised over the links it forgets.

    Frequency: each key counts its uses (first release, then one per
    `acquire`); a key demoted from PROTECTED keeps ``uses // 2``. Evicted keys
    leave their use count in a bounded ghost list (``history_factor`` times
    the most keys ever tracked at an eviction), so content that comes back after an
    eviction (the next turn of a conversation, minutes later) is promoted on its next
    release. Keys must therefore name content (a block hash), not a reusable slot.

    Defaults were tuned on the Mooncake conversation trace
    (`benchmarks.cache_replay`): a small PROBATION (2 %) filters one-shot
    blocks, and the ghost list recognises returning prefixes.
    """

    COUNTERS: ClassVar[tuple[str, ...]] = (*LRU.COUNTERS, "promotions", "demotions", "shielded")


    protected_fraction: float = attrs.field(default=0.98, validator=_fraction)
    """Share of the evictable blocks PROTECTED may hold."""
    promote_after_uses: int = attrs.field(default=2, validator=attrs.validators.ge(2))
    """A key released with at least this many uses goes to PROTECTED (2: on its first reuse)."""

    history_factor: float = attrs.field(default=4.0, validator=attrs.validators.ge(0))
    """Evicted keys whose use counts are remembered, per key of the most ever tracked at an
    eviction (a ghost list, oldest dropped first): with 2,000 cached blocks and the default,
    the last 8,000 evictions."""

    shield_preempted: bool = True
    """Preemption cache shield: a ``release(..., protect=True)`` (the blocks of a preempted
    request, which will resume) goes to PROTECTED, so resuming hits instead of recomputing."""

    _history: OrderedDict = attrs.field(init=False, repr=False, factory=OrderedDict)
    _peak_tracked: int = attrs.field(init=False, repr=False, default=0)
    """Most keys tracked at any eviction (the cache's size, once it has filled)."""
    _history_limit: int = attrs.field(init=False, repr=False, default=0)
    """``int(history_factor * _peak_tracked)``, the ghosts kept: set as the peak grows."""

    def _remembered_uses(self, key: Hashable) -> int:
        return self._history.pop(key, 0)

    def _remember(self, key: Hashable, uses: int) -> None:
        tracked = len(self._entries) + 1
        if tracked > self._peak_tracked:  # only when it grows: attrs validates every setattr
            self._peak_tracked = tracked
            self._history_limit = int(self.history_factor * tracked)
        history = self._history
        history[key] = uses
        limit = self._history_limit
        while len(history) > limit:
            history.popitem(last=False)

    def forget_history(self, key: Hashable) -> None:
        """Drop the use count ``key``'s content left when it was last evicted, if any."""
        self._history.pop(key, None)

    def _segment_for(self, entry: _Entry, protect: bool = False,
                     cancelled: bool = False) -> Segment:
        if protect and self.shield_preempted:
            self._counts["shielded"] += 1
            return PROTECTED
        if entry.uses >= self.promote_after_uses:
            self._counts["promotions"] += 1
            return PROTECTED
        return PROBATION

    def _protected_limit(self) -> int:
        """The most keys the protected segment may hold; the rest are demoted."""
        return max(1, int(self.protected_fraction * len(self)))

    def _after_release(self) -> None:
        protected = self._segments[PROTECTED]
        if not protected:  # nothing to demote, whatever the limit
            return
        limit = self._protected_limit()
        while len(protected) > limit:
            key, _ = protected.popitem(last=False)
            entry = self._entries[key]
            entry.uses //= 2
            self._put(key, entry, PROBATION)
            self._counts["demotions"] += 1

    def _link(self, key: Hashable, entry: _Entry, parent: Hashable | None) -> None:
        if parent == entry.parent:
            return
        if entry.parent is not None:
            self._entries[entry.parent].children.pop(key, None)
            entry.parent = None
        if parent is None or parent == key:
            return
        parent_entry = self._entries.get(parent)
        if parent_entry is None:  # cached and referenced, not released yet
            parent_entry = self._entries[parent] = _Entry(uses=1 + self._remembered_uses(parent))
        if parent_entry.segment is not UNCACHED:
            entry.parent = parent
            parent_entry.children[key] = None

    def check_invariants(self) -> None:
        """Assert the base invariants and that orphans have no parent left."""
        super().check_invariants()
        for key in self.keys_in(Segment.ORPHAN):
            assert self._entries[key].parent is None, key
