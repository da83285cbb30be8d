"""The hint layers over `FrequencyLRU`, and `SegmentedLRU`, the order they make together.

Each layer is a subclass with its own switch, counters and invariants, stacked in this
order: cancellation retention (`RetentionHints.release_cancelled`), prompt versions
(`RetentionHints.observe_prompt`), waiting-queue awareness (`WaitingHints`).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import ClassVar

import attrs

from policies.kv.eviction.lru import ORPHAN, _Entry
from policies.kv.eviction.segmented import FrequencyLRU
from policies.kv.eviction.segments import Segment
from policies.kv.prompt_versions import PromptVersions

PROBATION, PROTECTED, WANTED = Segment.PROBATION, Segment.PROTECTED, Segment.WANTED


@attrs.define(eq=False, kw_only=True)
class CancellationRetention(FrequencyLRU):
    """`FrequencyLRU` that keeps a cancelled request's blocks like reused ones."""

    COUNTERS: ClassVar[tuple[str, ...]] = (*FrequencyLRU.COUNTERS, "retained_cancelled")

    retain_cancelled: bool = True
    """Cancellation-aware retention: the blocks of a request its client cancelled (released
    with `release_cancelled`) go to PROTECTED like reused ones, since the client usually
    retries with the same prefix (a code completion the user kept typing over)."""

    def _segment_for(self, entry: _Entry, protect: bool = False,
                     cancelled: bool = False) -> Segment:
        if cancelled and self.retain_cancelled:
            self._counts["retained_cancelled"] += 1
            return PROTECTED
        return FrequencyLRU._segment_for(self, entry, protect)


@attrs.define(eq=False, kw_only=True)
class PromptVersioning(CancellationRetention):
    """`CancellationRetention` that demotes the chains of prompts a tenant replaced."""

    COUNTERS: ClassVar[tuple[str, ...]] = (*CancellationRetention.COUNTERS, "demoted_stale")

    prompt_versions: PromptVersions | None = None
    """Cache versioning: told which prompt root each tenant's request opens with
    (`observe_prompt`), it names roots that went stale, and their chains are demoted
    (`demote_chain`). ``None``: off."""

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
            self.forget_history(root)
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
            self.forget_history(key)
            if entry.segment in (PROBATION, PROTECTED):
                self.move(key, PROBATION, front=True)
        self._counts["demoted_stale"] += len(chain)
        return len(chain)


@attrs.define(eq=False, kw_only=True)
class WaitingQueueAwareness(PromptVersioning):
    """`PromptVersioning` that keeps the blocks waiting requests will hit: a block of a
    waiting request's prompt waits in WANTED, evicted after every other segment, until no
    waiting request wants it; O(1) per key told."""

    COUNTERS: ClassVar[tuple[str, ...]] = (*PromptVersioning.COUNTERS, "wanted_hits")

    keep_waiting: bool = True
    """Waiting-queue awareness: blocks that a waiting request's prompt opens with
    (`expect`) are the last to be evicted."""

    _wanted: dict = attrs.field(init=False, repr=False, factory=dict)
    """Key -> how many waiting requests' prompts hold it (cached or not)."""

    def acquire(self, key: Hashable) -> None:
        """As `LRU.acquire`; a hit on a key in WANTED counts in ``wanted_hits``."""
        entry = self._entries.get(key)
        if entry is not None and entry.segment is WANTED:
            self._counts["wanted_hits"] += 1
        FrequencyLRU.acquire(self, key)

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
            if entry is not None and entry.segment is not None and entry.segment > ORPHAN:
                del segments[entry.segment][key]
                self._put(key, entry, WANTED)

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
            if entry is not None and entry.segment is WANTED:
                del self._segments[WANTED][key]
                self._replace(key, entry)

    def _replace(self, key: Hashable, entry: _Entry) -> None:
        """Put an evictable key that left WANTED or PINNED where a release would: PROTECTED
        if reused, else PROBATION; rebalance."""
        reused = entry.uses >= self.promote_after_uses
        self._put(key, entry, PROTECTED if reused else PROBATION)
        self._after_release()

    def _put(self, key: Hashable, entry: _Entry, segment: Segment, front: bool = False) -> None:
        if self._wanted and key in self._wanted and segment > ORPHAN:
            segment, front = WANTED, False
        entry.segment = segment  # `LRU._put`, inlined: the call costs as much as its body
        keys = self._segments[segment]
        keys[key] = None
        if front:
            keys.move_to_end(key, last=False)

    def check_invariants(self) -> None:
        """Assert the lower layers' invariants and that WANTED holds exactly the evictable
        keys a waiting request may hit."""
        super().check_invariants()
        for key in self.keys_in(WANTED):
            assert self._wanted.get(key, 0) > 0, key
        for key, count in self._wanted.items():
            assert count > 0, (key, count)
            segment = self.segment_of(key)
            assert segment is None or segment <= Segment.ORPHAN or segment is Segment.WANTED, key


@attrs.define(eq=False, kw_only=True)
class SegmentedLRU(WaitingQueueAwareness):
    """Segmented LRU with every hint layer: `FrequencyLRU`'s guarantees; a cancelled
    request's blocks go to PROTECTED when ``retain_cancelled``; with ``prompt_versions``,
    `observe_prompt` demotes the chains of prompts a tenant replaced (`demote_chain`); with
    ``keep_waiting``, blocks a waiting request will hit are evicted last (`expect`)."""
