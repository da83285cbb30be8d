"""Tier placement for KV-cache blocks: fast tiers first, LRU within a tier.

`TierPlacement` decides where each stored block lives in an ordered list of
tiers (fastest first, e.g. GPU → CPU DRAM → disk, or CPU → disk behind vLLM's own
GPU prefix cache), each holding at most ``capacity_blocks`` blocks. It stores no
data: it returns `TierMove` decisions that the caller carries out in order.
Keys are opaque hashables (vLLM block hashes in `integrations.vllm_v1`).

Life of a key::

    store(key, high_priority)  new content: enters the first tier as most recent
    use(key)                   the content was read (a load): most recent in its tier
    promote(key)               move one tier up (a prefetch brings it closer)
    discard(key)               the caller lost the content: forget it

A full tier demotes its least recently used block one tier down; a block that
would fall below its *floor* or off the last tier is dropped. High-priority
blocks have ``high_priority_floor`` as floor (e.g. never on disk: reloading
from disk may be slower than recomputing), the others the last tier.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence

import attrs


@attrs.frozen(kw_only=True)
class Tier:
    """One storage tier: a name and how many blocks it holds."""

    name: str = attrs.field(validator=attrs.validators.min_len(1))
    capacity_blocks: int = attrs.field(validator=attrs.validators.ge(1))


@attrs.frozen
class TierMove:
    """Move ``key``'s content from tier ``source`` to tier ``target`` (``None``: drop it)."""

    key: Hashable
    source: str
    target: str | None


@attrs.frozen(kw_only=True)
class TierStats:
    """Snapshot of a `TierPlacement`.

    Attributes:
        blocks_by_tier: ``(tier, blocks held)`` per tier, fastest first.
        stored: keys stored (first tier admissions).
        demoted_by_tier: ``(tier, blocks demoted out of it)`` per tier.
        dropped: keys dropped by demotion (below their floor or off the last tier).
        loads_by_tier: ``(tier, keys read from it)`` per tier.
        prefetched: keys promoted by a prefetch.
        prefetch_hits: prefetched keys read before leaving their new tier.
        prefetch_wasted: prefetched keys demoted or discarded before being read.
    """

    blocks_by_tier: tuple[tuple[str, int], ...]
    stored: int
    demoted_by_tier: tuple[tuple[str, int], ...]
    dropped: int
    loads_by_tier: tuple[tuple[str, int], ...]
    prefetched: int
    prefetch_hits: int
    prefetch_wasted: int

    @property
    def prefetch_accuracy(self) -> float:
        """Share of settled prefetches that were read (0.0 when none settled)."""
        settled = self.prefetch_hits + self.prefetch_wasted
        return self.prefetch_hits / settled if settled else 0.0


def _distinct_names(_instance: object, _attribute: attrs.Attribute,
                    tiers: tuple[Tier, ...]) -> None:
    names = [tier.name for tier in tiers]
    if not names:
        raise ValueError("tiers must not be empty")
    if len(set(names)) != len(names):
        raise ValueError(f"tier names must be distinct, got {names}")


@attrs.define(eq=False, kw_only=True)
class TierPlacement:
    """Places blocks in ordered tiers; every operation is O(1) plus the moves it returns.

    Guarantees (checked by `check_invariants`): no tier holds more than its
    ``capacity_blocks``; a key is in at most one tier; a high-priority key is
    never below ``high_priority_floor``. Decisions depend only on the call
    sequence (no clock, no randomness). A key's class is fixed when it is first
    stored; storing a present key only marks it most recent.
    """

    tiers: tuple[Tier, ...] = attrs.field(converter=tuple, validator=_distinct_names)
    high_priority_floor: str | None = None
    """Lowest tier a high-priority key may occupy; ``None``: the last tier."""
    _index: dict[str, int] = attrs.field(init=False, repr=False)
    _lru: list[OrderedDict[Hashable, bool]] = attrs.field(init=False, repr=False)
    """Per tier: key -> high priority, least recently used first."""
    _tier_of: dict[Hashable, int] = attrs.field(init=False, repr=False, factory=dict)
    _prefetched: set[Hashable] = attrs.field(init=False, repr=False, factory=set)
    _stored: int = attrs.field(init=False, repr=False, default=0)
    _dropped: int = attrs.field(init=False, repr=False, default=0)
    _demoted: list[int] = attrs.field(init=False, repr=False)
    _loads: list[int] = attrs.field(init=False, repr=False)
    _prefetches: int = attrs.field(init=False, repr=False, default=0)
    _prefetch_hits: int = attrs.field(init=False, repr=False, default=0)
    _prefetch_wasted: int = attrs.field(init=False, repr=False, default=0)

    def __attrs_post_init__(self) -> None:
        self._index = {tier.name: i for i, tier in enumerate(self.tiers)}
        if self.high_priority_floor is not None and self.high_priority_floor not in self._index:
            raise ValueError(f"high_priority_floor {self.high_priority_floor!r} is not a tier; "
                             f"tiers are {list(self._index)}")
        self._lru = [OrderedDict() for _ in self.tiers]
        self._demoted = [0] * len(self.tiers)
        self._loads = [0] * len(self.tiers)

    @property
    def _high_floor(self) -> int:
        if self.high_priority_floor is None:
            return len(self.tiers) - 1
        return self._index[self.high_priority_floor]

    def tier_of(self, key: Hashable) -> str | None:
        """The tier holding ``key``, or ``None``."""
        index = self._tier_of.get(key)
        return None if index is None else self.tiers[index].name

    def __contains__(self, key: object) -> bool:
        return key in self._tier_of

    def __len__(self) -> int:
        return len(self._tier_of)

    def keys_in(self, tier: str) -> tuple[Hashable, ...]:
        """Keys of ``tier``, least recently used first."""
        return tuple(self._lru[self._index[tier]])

    def store(self, key: Hashable, *, high_priority: bool = False) -> list[TierMove]:
        """Admit ``key`` to the first tier as most recent; return the demotions that makes room.

        A key already present is only marked most recent (no moves).
        """
        if key in self._tier_of:
            self._bump(key)
            return []
        self._lru[0][key] = high_priority
        self._tier_of[key] = 0
        self._stored += 1
        return self._settle(0)

    def use(self, key: Hashable) -> str:
        """Record a read of ``key``: most recent in its tier; return that tier's name."""
        index = self._require(key)
        self._bump(key)
        self._loads[index] += 1
        if key in self._prefetched:
            self._prefetched.discard(key)
            self._prefetch_hits += 1
        return self.tiers[index].name

    def promote(self, key: Hashable, *, prefetch: bool = False) -> list[TierMove]:
        """Move ``key`` one tier up as most recent; return that move first, then demotions.

        A key in the first tier is only marked most recent. ``prefetch`` counts
        the move for prefetch accuracy.
        """
        index = self._require(key)
        if index == 0:
            self._bump(key)
            return []
        high = self._lru[index].pop(key)
        self._lru[index - 1][key] = high
        self._tier_of[key] = index - 1
        if prefetch and key not in self._prefetched:
            self._prefetched.add(key)
            self._prefetches += 1
        move = TierMove(key, self.tiers[index].name, self.tiers[index - 1].name)
        return [move, *self._settle(index - 1)]

    def discard(self, key: Hashable) -> None:
        """Forget ``key`` (its content is gone) without counting a drop."""
        index = self._require(key)
        del self._lru[index][key]
        del self._tier_of[key]
        self._settle_prefetch(key)

    def prefetch_candidates(self, chains: Iterable[Sequence[Hashable]],
                            max_blocks: int) -> list[Hashable]:
        """Keys worth promoting for requests likely to run next, at most ``max_blocks``.

        ``chains`` are the block keys of the next requests, most likely first. A
        block is only useful if every block before it is available, so each
        chain is read up to its first key not held anywhere; keys outside the
        first tier are returned in chain order, without duplicates. Changes nothing.
        """
        picked: dict[Hashable, None] = {}
        for chain in chains:
            for key in chain:
                index = self._tier_of.get(key)
                if index is None or len(picked) >= max_blocks:
                    break
                if index > 0:
                    picked[key] = None
            if len(picked) >= max_blocks:
                break
        return list(picked)

    def stats(self) -> TierStats:
        names = [tier.name for tier in self.tiers]
        return TierStats(
            blocks_by_tier=tuple((name, len(lru)) for name, lru in zip(names, self._lru, strict=True)),
            stored=self._stored,
            demoted_by_tier=tuple(zip(names, self._demoted, strict=True)),
            dropped=self._dropped,
            loads_by_tier=tuple(zip(names, self._loads, strict=True)),
            prefetched=self._prefetches, prefetch_hits=self._prefetch_hits,
            prefetch_wasted=self._prefetch_wasted)

    def check_invariants(self) -> None:
        """Assert the guarantees in the class docstring (and exact bookkeeping)."""
        assert sum(len(lru) for lru in self._lru) == len(self._tier_of)
        for index, (tier, lru) in enumerate(zip(self.tiers, self._lru, strict=True)):
            assert len(lru) <= tier.capacity_blocks, (tier, len(lru))
            for key, high in lru.items():
                assert self._tier_of[key] == index, key
                assert not high or index <= self._high_floor, (key, tier)
        assert self._prefetched <= self._tier_of.keys()

    def _require(self, key: Hashable) -> int:
        index = self._tier_of.get(key)
        if index is None:
            raise KeyError(f"{key!r} is not stored in any tier")
        return index

    def _bump(self, key: Hashable) -> None:
        self._lru[self._tier_of[key]].move_to_end(key)

    def _settle(self, index: int) -> list[TierMove]:
        """Demote least recently used keys from tier ``index`` down until every tier fits."""
        moves: list[TierMove] = []
        while index < len(self.tiers) and len(self._lru[index]) > self.tiers[index].capacity_blocks:
            key, high = self._lru[index].popitem(last=False)
            self._demoted[index] += 1
            floor = self._high_floor if high else len(self.tiers) - 1
            if index + 1 > floor:
                del self._tier_of[key]
                self._dropped += 1
                self._settle_prefetch(key)
                moves.append(TierMove(key, self.tiers[index].name, None))
                break
            self._lru[index + 1][key] = high
            self._tier_of[key] = index + 1
            self._settle_prefetch(key)
            moves.append(TierMove(key, self.tiers[index].name, self.tiers[index + 1].name))
            index += 1
        return moves

    def _settle_prefetch(self, key: Hashable) -> None:
        if key in self._prefetched:
            self._prefetched.discard(key)
            self._prefetch_wasted += 1
