"""`LRU`, the base eviction order: vLLM's own, and the extension points its layers use.

An eviction order holds the *evictable* blocks of a prefix cache: blocks whose
content is cached but that no running request references. vLLM keeps exactly
this set in its free-block queue; `integrations.vllm_v1.cache.eviction` lets one of
these objects choose the victims. Keys are opaque hashables (a block id in
vLLM, a content hash in `benchmarks.cache_replay`).

Life of a key::

    release(key, parent)  a cached block stops being referenced: it becomes evictable
    acquire(key)          a prefix hit references it again: it stops being evictable
    evict()               the policy picks a victim; its content (and metadata) is gone
    release_uncached(key) a block with no cached content is freed: it is evicted first

A block's *parent* is the block before it in its prefix chain. With vLLM's
prefix semantics a block only hits if every block before it hits, so a cached
child whose parent was evicted is useless.

The base knows segments, entries and chains, nothing of pins or waiting requests. A layer
(a subclass: `SegmentedLRU`'s frequency, then cancellation retention, prompt versions,
waiting-queue awareness, `DuelingSLRU`'s duel and session pins) places keys through the
hooks below (``_segment_for``, ``_after_release``, ``_remember``, ``_put``), moves them with
`LRU.move`, and names its counters in ``COUNTERS``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterator
from typing import ClassVar

import attrs

from policies.kv.eviction.segments import EvictionStats, Segment

UNCACHED, ORPHAN, PROBATION = Segment.UNCACHED, Segment.ORPHAN, Segment.PROBATION
"""Members as module names for the hot paths: ``Segment.X`` costs more than most of an
O(1) call around it."""


@attrs.define(eq=False, slots=True)
class _Entry:
    uses: int = 1
    segment: Segment | None = None
    """None while the key is referenced (not evictable)."""
    parent: Hashable | None = None
    children: dict[Hashable, None] = attrs.field(factory=dict)
    """In link order, so orphans are queued deterministically."""



@attrs.define(eq=False, kw_only=True)
class LRU:
    """vLLM's order: every release goes to the back, `evict` takes the front; O(1) each.

    Release a finished request's blocks tail first (as vLLM does) and a
    chain's tail is evicted before its head. ``parent`` is ignored, so a child
    may outlive its parent (as in vLLM).
    """

    _entries: dict[Hashable, _Entry] = attrs.field(init=False, repr=False, factory=dict)
    _segments: tuple[OrderedDict, ...] = attrs.field(
        init=False, repr=False, factory=lambda: tuple(OrderedDict() for _ in Segment))
    COUNTERS: ClassVar[tuple[str, ...]] = (
        "releases", "acquires", "evictions", "orphaned", "evicted_with_children")
    """The `EvictionStats` counters this order keeps: a layer adds its own."""

    _counts: dict[str, int] = attrs.field(init=False, repr=False, default=attrs.Factory(
        lambda self: dict.fromkeys(self.COUNTERS, 0), takes_self=True))
    _evicted_from: list[int] = attrs.field(init=False, repr=False,
                                           factory=lambda: [0] * len(Segment))

    # -- the protocol ---------------------------------------------------------

    def release(self, key: Hashable, parent: Hashable | None = None, *,
                protect: bool = False) -> None:
        """``key`` became evictable; a key released before keeps its use count.

        ``protect`` is ignored by plain LRU (see `SegmentedLRU.shield_preempted`).

        Raises:
            ValueError: if ``key`` is already evictable.
        """
        self._release(key, parent, protect=protect)

    def release_cancelled(self, key: Hashable, parent: Hashable | None = None) -> None:
        """``key`` of a request its client cancelled became evictable (plain LRU: a `release`).

        Raises:
            ValueError: if ``key`` is already evictable.
        """
        self._release(key, parent, cancelled=True)

    def observe_prompt(self, tenant: str, root: Hashable, version: str | None = None) -> int:
        """A request of ``tenant`` opens with ``root``; plain LRU ignores it (returns 0)."""
        return 0

    def _release(self, key: Hashable, parent: Hashable | None, *, protect: bool = False,
                 cancelled: bool = False) -> None:
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry(uses=1 + self._remembered_uses(key))
        elif entry.segment is not None:
            raise ValueError(f"key {key!r} is already evictable")
        self._counts["releases"] += 1
        self._link(key, entry, parent)
        self._put(key, entry, self._segment_for(entry, protect, cancelled))
        self._after_release()

    def release_uncached(self, key: Hashable) -> None:
        """``key`` holds no cached content: it goes to the very front (newest first).

        Raises:
            ValueError: if ``key`` is already evictable.
        """
        entry = self._entries.get(key)
        if entry is not None:
            if entry.segment is not None:
                raise ValueError(f"key {key!r} is already evictable")
            self._forget(key, entry)
        entry = self._entries[key] = _Entry(uses=0)
        self._put(key, entry, UNCACHED, front=True)

    def acquire(self, key: Hashable) -> None:
        """The evictable ``key`` is referenced again; its use count grows by one.

        Raises:
            KeyError: if ``key`` is not evictable.
        """
        entry = self._take(key)
        entry.segment = None
        entry.uses += 1
        self._counts["acquires"] += 1

    def evict(self) -> Hashable:
        """Remove and return the front key of the first non-empty segment; forget its metadata.

        Raises:
            IndexError: if nothing is evictable.
        """
        for index, segment in enumerate(self._segments):
            if segment:
                key, _ = segment.popitem(last=False)
                self._evicted_from[index] += 1
                break
        else:
            raise IndexError("evict from an empty eviction order")
        entry = self._entries[key]
        entry.segment = None
        self._counts["evictions"] += 1
        self._forget(key, entry)
        if entry.uses:
            self._remember(key, entry.uses)
        return key

    def discard(self, key: Hashable) -> None:
        """Forget ``key`` (evictable or referenced) without counting an eviction; no-op if unknown.

        For a block whose content the cache dropped behind the order's back.
        """
        entry = self._entries.get(key)
        if entry is None:
            return
        if entry.segment is not None:
            del self._segments[entry.segment][key]
            entry.segment = None
        self._forget(key, entry)

    def __len__(self) -> int:
        return sum(map(len, self._segments))

    def __contains__(self, key: object) -> bool:
        entry = self._entries.get(key)
        return entry is not None and entry.segment is not None

    def __iter__(self) -> Iterator[Hashable]:
        """Evictable keys in eviction order (what repeated `evict` calls would return now)."""
        for segment in self._segments:
            yield from segment

    # -- introspection --------------------------------------------------------

    def segment_of(self, key: Hashable) -> Segment | None:
        """The segment ``key`` waits in, or None if it is not evictable."""
        entry = self._entries.get(key)
        return None if entry is None else entry.segment

    def uses(self, key: Hashable) -> int:
        """How often ``key`` was used while cached (1 on its first release; 0 if unknown)."""
        entry = self._entries.get(key)
        return 0 if entry is None else entry.uses

    def keys_in(self, segment: Segment) -> Iterator[Hashable]:
        """The keys waiting in ``segment``, front (evicted first) to back."""
        return iter(self._segments[segment])

    def move(self, key: Hashable, segment: Segment, *, front: bool = False) -> None:
        """Move the evictable ``key`` to the back of ``segment`` (its front if ``front``),
        subject to the order's placement rules (`_put`); for layers.

        Raises:
            KeyError: if ``key`` is not evictable.
        """
        self._put(key, self._take(key), segment, front)

    def _take(self, key: Hashable) -> _Entry:
        """The evictable ``key``'s entry, taken out of its segment (KeyError if not
        evictable)."""
        entry = self._entries.get(key)
        if entry is None or entry.segment is None:
            raise KeyError(f"key {key!r} is not evictable")
        del self._segments[entry.segment][key]
        return entry

    def tracks(self, key: Hashable) -> bool:
        """Whether the order holds metadata of ``key`` (evictable, or referenced since)."""
        return key in self._entries

    @property
    def tracked(self) -> int:
        """Keys with metadata, uncached ones included (O(1))."""
        return len(self._entries)

    def stats(self) -> EvictionStats:
        """Segment sizes and counters since construction."""
        sizes = [len(segment) for segment in self._segments]
        return EvictionStats(
            evictable_blocks=sum(sizes),
            tracked_blocks=len(self._entries) - sizes[Segment.UNCACHED],
            uncached_blocks=sizes[Segment.UNCACHED], orphan_blocks=sizes[Segment.ORPHAN],
            probation_blocks=sizes[Segment.PROBATION],
            protected_blocks=sizes[Segment.PROTECTED], pinned_blocks=sizes[Segment.PINNED],
            wanted_blocks=sizes[Segment.WANTED],
            evictions_by_segment=tuple((s.name.lower(), n)
                                       for s, n in zip(Segment, self._evicted_from, strict=True)),
            **self._counts)

    def check_invariants(self) -> None:
        """Assert that segments, entries and parent links agree."""
        for segment, keys in zip(Segment, self._segments, strict=True):
            for key in keys:
                assert self._entries[key].segment is segment, (key, segment)
        evictable = sum(1 for e in self._entries.values() if e.segment is not None)
        assert evictable == len(self), (evictable, len(self))
        for key, entry in self._entries.items():
            if entry.parent is not None:
                assert key in self._entries[entry.parent].children, key
            for child in entry.children:
                assert self._entries[child].parent == key, (key, child)
            if entry.segment is Segment.UNCACHED:
                assert not entry.children and entry.parent is None, key

    # -- hooks and helpers ----------------------------------------------------

    def _segment_for(self, entry: _Entry, protect: bool = False,
                     cancelled: bool = False) -> Segment:
        return PROBATION

    def _remembered_uses(self, key: Hashable) -> int:
        """Uses of ``key``'s content before it was last evicted (plain LRU forgets them)."""
        return 0

    def _remember(self, key: Hashable, uses: int) -> None:
        """``key`` was evicted after ``uses`` uses (plain LRU forgets them)."""

    def _after_release(self) -> None:
        """Rebalance segments after a release (nothing for plain LRU)."""

    def _link(self, key: Hashable, entry: _Entry, parent: Hashable | None) -> None:
        """Record ``parent`` (plain LRU does not track chains)."""

    def _put(self, key: Hashable, entry: _Entry, segment: Segment, front: bool = False) -> None:
        entry.segment = segment
        keys = self._segments[segment]
        keys[key] = None
        if front:
            keys.move_to_end(key, last=False)

    def _forget(self, key: Hashable, entry: _Entry) -> None:
        """Drop ``key``'s metadata; its evictable children become orphans."""
        del self._entries[key]
        if entry.parent is not None:
            self._entries[entry.parent].children.pop(key, None)
        if entry.children:
            if any(self._entries[c].segment is not None for c in entry.children):
                self._counts["evicted_with_children"] += 1
            for child in entry.children:
                self._orphan(child)

    def _orphan(self, key: Hashable) -> None:
        entry = self._entries[key]
        entry.parent = None
        if entry.segment is not None and entry.segment is not ORPHAN:
            del self._segments[entry.segment][key]
            self._put(key, entry, ORPHAN)
            self._counts["orphaned"] += 1


