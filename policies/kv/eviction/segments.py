"""The eviction family's vocabulary: segments, protocols and the stats snapshot.

Every order evicts in segment order, front to back within a segment::

    UNCACHED   blocks with no content, newest first (vLLM prepends them)
    ORPHAN     blocks whose parent was evicted (`SegmentedLRU` and above)
    PROBATION  blocks not reused yet, least recently released first
    PROTECTED  reused blocks, least recently released first (`SegmentedLRU` and above)
    PINNED     pinned blocks held past the front of their segment for a session's next
               turn (`DuelingSLRU` with session pins only)
    WANTED     blocks a waiting request will hit, least recently wanted first
               (`SegmentedLRU` with ``keep_waiting``, told by `WaitingHints`)
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Iterator, Sequence
from typing import Protocol, runtime_checkable

import attrs


class Segment(enum.IntEnum):
    """Where an evictable key waits; lower segments are evicted first."""

    UNCACHED = 0
    ORPHAN = 1
    PROBATION = 2
    PROTECTED = 3
    PINNED = 4
    WANTED = 5



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
    """A snapshot of an eviction order's segments and counters since construction.

    Each layer of the family counts its own events; an order without a layer reports 0
    for that layer's counters (plain `LRU` has no promotions, pins or wanted hits)."""

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
    orphaned: int
    """Keys moved to ORPHAN because their parent was evicted."""
    evicted_with_children: int
    """Evictions of a key that still had evictable children (0 when leaves always go first)."""
    promotions: int = 0
    """Releases that put a key into PROTECTED (`SegmentedLRU`)."""
    demotions: int = 0
    """Keys moved from PROTECTED to PROBATION because PROTECTED was over its share."""
    shielded: int = 0
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

