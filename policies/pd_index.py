"""The router's approximate prefix caches: which instance holds which chained block keys."""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence

import attrs


def chain_keys(block_hashes: Iterable[Hashable]) -> list[int]:
    """Keys that identify each block *with its whole prefix*, from per-block content hashes.

    Equal keys at position ``i`` mean equal prompts up to block ``i`` (up to hash
    collisions), which is what a prefix cache can reuse. vLLM's own block hashes
    already chain and need no conversion.
    """
    keys, key = [], 0
    for block_hash in block_hashes:
        key = hash((key, block_hash))
        keys.append(key)
    return keys


def _positive(_instance: object, attribute: attrs.Attribute, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{attribute.name} must be an integer >= 1, got {value!r}")


@attrs.define(eq=False, kw_only=True)
class PrefixIndex:
    """Approximate prefix caches: which instance holds which chained block keys.

    Each instance remembers at most ``capacity_blocks`` keys and forgets the least
    recently inserted or touched first, as an LRU prefix cache would. The holders
    of a key are a bit mask over instances (one bit each, given on first use), so
    `match` costs one integer AND per matched block, whatever the instance count.
    """

    capacity_blocks: int = attrs.field(validator=_positive)
    _holders: dict[Hashable, int] = attrs.field(init=False, repr=False, factory=dict)
    """Key -> bit mask of the instances holding it (never 0)."""
    _lru: dict[str, OrderedDict[Hashable, None]] = attrs.field(init=False, repr=False,
                                                              factory=dict)
    _bits: dict[str, int] = attrs.field(init=False, repr=False, factory=dict)
    _names: dict[int, str] = attrs.field(init=False, repr=False, factory=dict)
    evictions: int = attrs.field(init=False, default=0)

    def match(self, keys: Sequence[Hashable]) -> dict[str, int]:
        """Leading keys of ``keys`` each instance holds (instances holding none are absent)."""
        index = self._holders
        alive = index.get(keys[0], 0) if keys else 0
        if not alive:
            return {}
        matched: dict[str, int] = {}
        depth = 1
        for key in itertools.islice(keys, 1, None):
            holders = index.get(key, 0)
            if alive & ~holders:  # someone's prefix ends here
                self._record(alive & ~holders, depth, matched)
                alive &= holders
                if not alive:
                    break
            depth += 1
        self._record(alive, depth, matched)
        return matched

    def _record(self, mask: int, depth: int, matched: dict[str, int]) -> None:
        names = self._names
        while mask:
            low = mask & -mask
            matched[names[low]] = depth
            mask ^= low

    def insert(self, name: str, keys: Iterable[Hashable]) -> None:
        """``name`` now holds ``keys`` (most recently used); forget its oldest over capacity."""
        lru = self._lru.get(name)
        if lru is None:
            lru = self._lru[name] = OrderedDict()
        bit = self._bit(name)
        holders, touch, get = self._holders, lru.move_to_end, self._holders.get
        room = self.capacity_blocks - len(lru)
        for key in keys:
            if key in lru:
                touch(key)
                continue
            lru[key] = None
            holders[key] = get(key, 0) | bit
            if room:
                room -= 1
            else:  # full: forget the least recently used key
                old, _ = lru.popitem(last=False)
                self._unlink(old, bit)
                self.evictions += 1

    def drop(self, name: str, keys: Iterable[Hashable]) -> None:
        """``name`` no longer holds ``keys`` (e.g. from vLLM ``BlockRemoved`` KV events)."""
        lru = self._lru.get(name, {})
        for key in keys:
            if key in lru:
                del lru[key]
                self._unlink(key, self._bits[name])

    def clear(self, name: str) -> None:
        """Forget everything ``name`` held (it restarted with an empty cache)."""
        for key in self._lru.pop(name, {}):
            self._unlink(key, self._bits[name])

    def blocks(self, name: str) -> int:
        """Keys ``name`` is believed to hold."""
        return len(self._lru.get(name, ()))

    def _bit(self, name: str) -> int:
        bit = self._bits.get(name)
        if bit is None:
            bit = self._bits[name] = 1 << len(self._bits)
            self._names[bit] = name
        return bit

    def _unlink(self, key: Hashable, bit: int) -> None:
        holders = self._holders[key] & ~bit
        if holders:
            self._holders[key] = holders
        else:
            del self._holders[key]

    def check_invariants(self) -> None:
        """Each instance within capacity; the holder masks equal the per-instance sets."""
        pairs = set()
        for name, lru in self._lru.items():
            assert len(lru) <= self.capacity_blocks, (name, len(lru))
            pairs.update((key, self._bits[name]) for key in lru)
        assert pairs == {(key, bit) for key, mask in self._holders.items()
                         for bit in self._names if mask & bit}
        assert all(self._holders.values()), "keys nobody holds must be removed"
