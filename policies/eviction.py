"""Prefix-cache eviction orders: `LRU` (vLLM's own) and `SegmentedLRU`.

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

Orders that also implement `RetentionHints` (both shipped ones) hear two more
things: ``release_cancelled`` (a block of a request its client cancelled) and
``observe_prompt`` (which prompt root a tenant's request opens with, and its
version), from which `PromptVersions` tells when an old prompt went stale.

A block's *parent* is the block before it in its prefix chain. With vLLM's
prefix semantics a block only hits if every block before it hits, so a cached
child whose parent was evicted is useless.

Every order evicts in segment order, front to back within a segment::

    UNCACHED   blocks with no content, newest first (vLLM prepends them)
    ORPHAN     blocks whose parent was evicted (SegmentedLRU only)
    PROBATION  blocks not reused yet, least recently released first
    PROTECTED  reused blocks, least recently released first (SegmentedLRU only)
    PINNED     pinned blocks held past the front of their segment for a session's next
               turn (DuelingSLRU with session pins only)
    WANTED     blocks a waiting request will hit, least recently wanted first
               (SegmentedLRU with ``keep_waiting``, told by `WaitingHints`)
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Hashable, Iterator, Sequence
from typing import Protocol, runtime_checkable

import attrs

from policies.prompt_versions import PromptVersions


class Segment(enum.IntEnum):
    """Where an evictable key waits; lower segments are evicted first."""

    UNCACHED = 0
    ORPHAN = 1
    PROBATION = 2
    PROTECTED = 3
    PINNED = 4
    WANTED = 5


_UNCACHED, _ORPHAN, _PROBATION, _PROTECTED, _PINNED, _WANTED = Segment
"""The members as module names for the hot paths: looking up ``Segment.X`` costs more than
most of an O(1) call around it."""


@runtime_checkable
class EvictionOrder(Protocol):
    """Chooses which unreferenced prefix-cache block is evicted next."""

    def release(self, key: Hashable, parent: Hashable | None = None, *,
                protect: bool = False) -> None:
        """``key`` (a cached block) became evictable.

        ``parent``, if known, is the cached block before ``key`` in its prefix chain;
        ``protect`` asks to keep it longer (its request was preempted and will resume).
        """
        ...

    def release_uncached(self, key: Hashable) -> None:
        """``key`` (a block with no cached content) became free; it is evicted before any other."""
        ...

    def acquire(self, key: Hashable) -> None:
        """The evictable ``key`` is referenced again (a prefix hit)."""
        ...

    def evict(self) -> Hashable:
        """Remove and return the next victim."""
        ...

    def discard(self, key: Hashable) -> None:
        """Forget ``key`` (its content is gone) without counting an eviction."""
        ...

    def __len__(self) -> int: ...

    def __contains__(self, key: object) -> bool: ...

    def __iter__(self) -> Iterator[Hashable]: ...


@runtime_checkable
class RetentionHints(Protocol):
    """Optional hints for an `EvictionOrder` beyond block releases (`SegmentedLRU` uses them)."""

    def release_cancelled(self, key: Hashable, parent: Hashable | None = None) -> None:
        """Like ``release``, for a block of a request its client cancelled (likely retried)."""
        ...

    def observe_prompt(self, tenant: str, root: Hashable, version: str | None = None) -> int:
        """A request of ``tenant`` opens with the cached block ``root`` (of prompt ``version``,
        if the client said); returns how many blocks of stale prompts were demoted."""
        ...


@runtime_checkable
class WaitingHints(Protocol):
    """Optional hints for an `EvictionOrder`: the blocks the waiting requests' prompts open
    with, so that the order keeps them (`SegmentedLRU.keep_waiting`)."""

    keep_waiting: bool
    """Whether the order uses the hints (the caller skips them when not)."""

    def expect(self, keys: Sequence[Hashable]) -> None:
        """A request whose prompt's blocks are ``keys`` started waiting."""
        ...

    def unexpect(self, keys: Sequence[Hashable]) -> None:
        """The request `expect` was told ``keys`` of stopped waiting (it started, or left)."""
        ...


@runtime_checkable
class ReportsEvictionStats(Protocol):
    """An `EvictionOrder` that reports its segments and counters (`LRU`, `SegmentedLRU`)."""

    def stats(self) -> EvictionStats:
        """A snapshot of the order's state."""
        ...


@attrs.frozen(kw_only=True)
class EvictionStats:
    """A snapshot of an eviction order's segments and counters since construction."""

    evictable_blocks: int
    """Keys that `evict` may return (the sum of the segment sizes)."""
    tracked_blocks: int
    """Cached keys with metadata: evictable ones plus referenced ones released before."""
    uncached_blocks: int
    orphan_blocks: int
    probation_blocks: int
    protected_blocks: int
    releases: int
    """``release`` calls (``release_uncached`` not included)."""
    acquires: int
    """``acquire`` calls (prefix hits on evictable blocks)."""
    evictions: int
    """Keys returned by `evict`, uncached ones included."""
    promotions: int
    """Releases that put a key into PROTECTED."""
    demotions: int
    """Keys moved from PROTECTED to PROBATION because PROTECTED was over its share."""
    orphaned: int
    """Keys moved to ORPHAN because their parent was evicted."""
    evicted_with_children: int
    """Evictions of a key that still had evictable children (0 when leaves always go first)."""
    shielded: int
    """Releases put into PROTECTED by the preemption shield (``protect=True``)."""
    retained_cancelled: int = 0
    """Releases of cancelled requests' blocks put into PROTECTED (`SegmentedLRU.retain_cancelled`)."""
    demoted_stale: int = 0
    """Blocks demoted because their prompt went stale (`SegmentedLRU.prompt_versions`)."""
    pinned_blocks: int = 0
    """Blocks in PINNED: pinned blocks the order would have evicted, held for a session's
    next turn (pinned blocks still in their place are in PROBATION or PROTECTED)."""
    pins: int = 0
    """Blocks pinned at the end of a session's turn (`DuelingSLRU.session_pins`)."""
    pin_hits: int = 0
    """Prefix hits on blocks held in PINNED: hits the pins bought (a hit on a pinned block
    still in its place would have hit without its pin)."""
    pins_expired: int = 0
    """Pins that ran out (the session's predicted gap passed) before a hit."""
    pins_refused: int = 0
    """Blocks of a finished turn not pinned because pinned blocks held their share of the
    cache, or judged pins were off (pins released early under pressure are the evictions
    from PINNED in ``evictions_by_segment``)."""
    pin_pauses: int = 0
    """Times pins stopped because the shadow LRU out-hit its pinning twin
    (`SessionPins.judged`)."""
    wanted_blocks: int = 0
    """Blocks in WANTED (a waiting request will hit them)."""
    wanted_hits: int = 0
    """Prefix hits on blocks in WANTED: hits of waiting requests on blocks kept for them."""
    evictions_by_segment: tuple[tuple[str, int], ...] = ()
    """``(segment name, evictions from it)`` for each segment, in eviction order."""


@attrs.define(eq=False, slots=True)
class _Entry:
    uses: int = 1
    segment: Segment | None = None
    """None while the key is referenced (not evictable)."""
    parent: Hashable | None = None
    children: dict[Hashable, None] = attrs.field(factory=dict)
    """In link order, so orphans are queued deterministically."""


def _fraction(_instance: object, attribute: attrs.Attribute, value: float) -> None:
    if not 0.0 <= value < 1.0:  # also rejects NaN
        raise ValueError(f"{attribute.name} must be in [0, 1), got {value!r}")


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
    _counts: dict[str, int] = attrs.field(init=False, repr=False, factory=lambda: dict.fromkeys(
        ("releases", "acquires", "evictions", "promotions", "demotions", "orphaned",
         "evicted_with_children", "shielded", "retained_cancelled", "demoted_stale", "pins",
        "pin_hits", "pins_expired", "pins_refused", "pin_pauses", "wanted_hits"), 0))
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
        self._put(key, entry, _UNCACHED, front=True)

    def acquire(self, key: Hashable) -> None:
        """The evictable ``key`` is referenced again; its use count grows by one.

        Raises:
            KeyError: if ``key`` is not evictable.
        """
        entry = self._entries.get(key)
        if entry is None or entry.segment is None:
            raise KeyError(f"key {key!r} is not evictable")
        if entry.segment is _WANTED:
            self._counts["wanted_hits"] += 1
        del self._segments[entry.segment][key]
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
        return _PROBATION

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
        if entry.segment is not None and entry.segment is not _ORPHAN:
            del self._segments[entry.segment][key]
            self._put(key, entry, _ORPHAN)
            self._counts["orphaned"] += 1


@attrs.define(eq=False, kw_only=True)
class SegmentedLRU(LRU):
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
    the most keys ever tracked at an eviction), so content that comes back after an eviction (the next
    turn of a conversation, minutes later) is promoted on its next release.
    Keys must therefore name content (a block hash), not a reusable slot.

    Hints (`RetentionHints`): a cancelled request's blocks (`release_cancelled`) go to
    PROTECTED when ``retain_cancelled``; with ``prompt_versions``, `observe_prompt`
    demotes the chains of prompts a tenant replaced (`demote_chain`). Waiting queue
    (`WaitingHints`, ``keep_waiting``): a block of a waiting request's prompt waits in
    WANTED, evicted after every other segment, until no waiting request wants it; O(1)
    per key told.

    Defaults were tuned on the Mooncake conversation trace
    (`benchmarks.cache_replay`): a small PROBATION (2 %) filters one-shot
    blocks, and the ghost list recognises returning prefixes.
    """

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

    retain_cancelled: bool = True
    """Cancellation-aware retention: the blocks of a request its client cancelled (released
    with `release_cancelled`) go to PROTECTED like reused ones, since the client usually
    retries with the same prefix (a code completion the user kept typing over)."""

    prompt_versions: PromptVersions | None = None
    """Cache versioning: told which prompt root each tenant's request opens with
    (`observe_prompt`), it names roots that went stale, and their chains are demoted
    (`demote_chain`). ``None``: off."""

    keep_waiting: bool = True
    """Waiting-queue awareness: blocks that a waiting request's prompt opens with
    (`expect`) are the last to be evicted."""

    _wanted: dict = attrs.field(init=False, repr=False, factory=dict)
    """Key -> how many waiting requests' prompts hold it (cached or not)."""
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

    def _segment_for(self, entry: _Entry, protect: bool = False,
                     cancelled: bool = False) -> Segment:
        if protect and self.shield_preempted:
            self._counts["shielded"] += 1
            return _PROTECTED
        if cancelled and self.retain_cancelled:
            self._counts["retained_cancelled"] += 1
            return _PROTECTED
        if entry.uses >= self.promote_after_uses:
            self._counts["promotions"] += 1
            return _PROTECTED
        return _PROBATION

    def expect(self, keys: Sequence[Hashable]) -> None:
        """A request whose prompt's blocks are ``keys`` waits: each evictable one that a
        request may hit (not an orphan) moves to WANTED; O(len(keys))."""
        if not self.keep_waiting:
            return
        wanted, entries, segments = self._wanted, self._entries, self._segments
        for key in keys:
            count = wanted.get(key, 0)
            wanted[key] = count + 1
            entry = entries.get(key) if not count else None
            if entry is not None and entry.segment is not None and entry.segment > _ORPHAN:
                del segments[entry.segment][key]
                self._put(key, entry, _WANTED)

    def unexpect(self, keys: Sequence[Hashable]) -> None:
        """The request `expect` was told ``keys`` of no longer waits: a key no other waiting
        request wants leaves WANTED as a release would place it; O(len(keys)).

        Raises:
            KeyError: if a key is not expected (unexpected more often than expected).
        """
        if not self.keep_waiting:
            return
        wanted, entries = self._wanted, self._entries
        for key in keys:
            count = wanted.get(key)
            if count is None:
                raise KeyError(f"key {key!r} is not expected by a waiting request")
            if count > 1:
                wanted[key] = count - 1
                continue
            del wanted[key]
            entry = entries.get(key)
            if entry is not None and entry.segment is _WANTED:
                del self._segments[_WANTED][key]
                self._replace(key, entry)

    def _replace(self, key: Hashable, entry: _Entry) -> None:
        """Put an evictable key that left WANTED or PINNED where a release would: PROTECTED
        if reused, else PROBATION; rebalance."""
        reused = entry.uses >= self.promote_after_uses
        self._put(key, entry, _PROTECTED if reused else _PROBATION)
        self._after_release()

    def _put(self, key: Hashable, entry: _Entry, segment: Segment, front: bool = False) -> None:
        if self._wanted and key in self._wanted and segment > _ORPHAN:
            segment, front = _WANTED, False
        entry.segment = segment  # `LRU._put`, inlined: the call costs as much as its body
        keys = self._segments[segment]
        keys[key] = None
        if front:
            keys.move_to_end(key, last=False)

    def _protected_limit(self) -> int:
        """The most keys the protected segment may hold; the rest are demoted."""
        return max(1, int(self.protected_fraction * len(self)))

    def _after_release(self) -> None:
        protected = self._segments[_PROTECTED]
        if not protected:  # nothing to demote, whatever the limit
            return
        limit = self._protected_limit()
        while len(protected) > limit:
            key, _ = protected.popitem(last=False)
            entry = self._entries[key]
            entry.uses //= 2
            self._put(key, entry, _PROBATION)
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
        if parent_entry.segment is not _UNCACHED:
            entry.parent = parent
            parent_entry.children[key] = None

    def observe_prompt(self, tenant: str, root: Hashable, version: str | None = None) -> int:
        """Tell `prompt_versions` about a request; demote the chains of the roots gone stale.

        Returns:
            How many blocks were demoted (0 when `prompt_versions` is ``None``).
        """
        if self.prompt_versions is None:
            return 0
        return sum(self.demote_chain(stale)
                   for stale in self.prompt_versions.observe(tenant, root, version))

    def demote_chain(self, root: Hashable) -> int:
        """``root`` and every key below it are stale: out of PROTECTED, evicted first.

        Evictable keys of the chain move to the front of PROBATION, leaves in front
        (right after ORPHAN); every key of the chain, evictable or referenced, loses its
        use count and its ghost history, so its next release is a first use. O(chain).

        Returns:
            How many keys of the chain were known (0 if ``root`` holds no content).
        """
        root_entry = self._entries.get(root)
        if root_entry is None or root_entry.segment is Segment.UNCACHED:  # no content left
            self._history.pop(root, None)
            return 0
        chain, seen, stack = [], {root}, [root]
        while stack:  # depth first, parents before children; keys need not form a tree
            key = stack.pop()
            chain.append(key)
            children = [c for c in self._entries[key].children if c not in seen]
            seen.update(children)
            stack.extend(children)
        for key in chain:  # parents first, so the last ones moved (leaves) end in front
            entry = self._entries[key]
            entry.uses = 0
            self._history.pop(key, None)
            if entry.segment in (Segment.PROBATION, Segment.PROTECTED):
                del self._segments[entry.segment][key]
                self._put(key, entry, Segment.PROBATION, front=True)
        self._counts["demoted_stale"] += len(chain)
        return len(chain)

    def check_invariants(self) -> None:
        """Assert the base invariants, that orphans have no parent left and that WANTED
        holds exactly the evictable keys a waiting request may hit."""
        super().check_invariants()
        for key in self._segments[Segment.ORPHAN]:
            assert self._entries[key].parent is None, key
        for key in self._segments[Segment.WANTED]:
            assert self._wanted.get(key, 0) > 0, key
        for key, count in self._wanted.items():
            assert count > 0, (key, count)
            segment = self.segment_of(key)
            assert segment is None or segment <= Segment.ORPHAN or segment is Segment.WANTED, key
