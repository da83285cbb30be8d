"""The router's approximate prefix caches: which instance holds which chained block keys.

`PrefixIndex` does its per-block work in C (``dict.update``, ``map``, ``itertools``)
rather than in Python loops, and touches per-instance state only for blocks an
instance already held: a prompt of new blocks costs a few C passes over its keys,
shared by the instances it is sent to.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Collection, Hashable, Iterable, Sequence
from itertools import chain, compress, islice, repeat
from operator import not_

import attrs

from policies.validators import int_at_least


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


_minus_one = (-1).__add__


def _drain(iterator: Iterable[object]) -> None:
    deque(iterator, maxlen=0)


@attrs.define(eq=False)
class _Log:
    """One instance's LRU order: the keys of its inserts, least recent first.

    A held key's newest position in ``entries`` is its place in the LRU order; its
    older positions are stale, and so are all positions of a key dropped while
    logged. Stale positions are counted per key, so that no per-key write is needed
    for keys new to the instance; they are skipped when evicting and removed by
    compaction.
    """

    bit: int
    held: int = 0
    """Keys the instance holds."""
    entries: deque[tuple[Hashable, ...]] = attrs.field(factory=deque)
    front: int = 0
    """Positions of ``entries[0]`` already taken."""
    logged: int = 0
    """Positions in ``entries`` after ``front``."""
    stale: Counter[Hashable] = attrs.field(factory=Counter)
    """Held key -> its logged positions other than the newest (absent: none)."""
    ghosts: dict[Hashable, int] = attrs.field(factory=dict)
    """Key dropped while logged (not held) -> its logged positions."""

    def positions(self) -> list[Hashable]:
        """The logged keys, oldest position first."""
        if not self.entries:
            return []
        return list(chain(islice(self.entries[0], self.front, None),
                          *islice(self.entries, 1, None)))

    def take(self, count: int) -> list[Hashable]:
        """Remove the ``count`` oldest positions (there must be as many); return their keys."""
        taken: list[Hashable] = []
        while len(taken) < count:
            entry = self.entries[0]
            end = self.front + count - len(taken)
            taken.extend(entry[self.front:end])
            if end >= len(entry):
                self.entries.popleft()
                self.front = 0
            else:
                self.front = end
        self.logged -= count
        return taken


@attrs.define(eq=False, kw_only=True)
class PrefixIndex:
    """Approximate prefix caches: which instance holds which chained block keys.

    Each instance remembers at most ``capacity_blocks`` keys and forgets the least
    recently inserted or touched first: after every call it holds exactly the keys
    an LRU would (keys inserted in order, a held key moved to the most recent end,
    the least recent dropped while over capacity). The holders of a key are a bit
    mask over instances (one bit each, given on first use), so `match` costs one
    integer AND per matched block, whatever the instance count. `insert` costs a
    few C passes over its keys plus, per instance, Python work for the keys it
    already held; evicting costs the same per evicted key. Each instance logs its
    inserts, at most ``2 * capacity_blocks`` positions: past that, one pass compacts
    the log (amortised constant time per inserted key).
    """

    capacity_blocks: int = attrs.field(validator=int_at_least(1))
    _holders: dict[Hashable, int] = attrs.field(init=False, repr=False, factory=dict)
    """Key -> bit mask of the instances holding it (never 0)."""
    _logs: dict[str, _Log] = attrs.field(init=False, repr=False, factory=dict)
    _names: dict[int, str] = attrs.field(init=False, repr=False, factory=dict)
    evictions: int = attrs.field(init=False, default=0)
    """Keys forgotten to stay within capacity."""

    def match(self, keys: Sequence[Hashable]) -> dict[str, int]:
        """Leading keys of ``keys`` each instance holds (instances holding none are absent)."""
        index = self._holders
        alive = index.get(keys[0], 0) if keys else 0
        if not alive:
            return {}
        matched: dict[str, int] = {}
        depth = 1
        for key in islice(keys, 1, None):
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

    def insert(self, names: Collection[str], keys: Sequence[Hashable]) -> None:
        """Each of ``names`` now holds ``keys`` (the last most recent); its oldest over capacity go.

        ``names`` are inserted together: the holder masks are updated once for all.
        """
        keys = tuple(keys)  # the logs keep it
        logs = [self._log(name) for name in dict.fromkeys(names)]
        if not keys:
            return
        bits = 0
        for log in logs:
            bits |= log.bit
        holders = self._holders
        old = list(map(holders.get, keys, repeat(0)))
        known = len(keys) - old.count(0)  # positions of keys someone holds
        if any(old[known:]):  # a known key after a new one
            known_keys, known_masks = list(compress(keys, old)), list(filter(None, old))
            new_keys = list(compress(keys, map(not_, old)))
        else:  # the usual prompt: a known prefix, then new blocks
            known_keys, known_masks, new_keys = keys[:known], old[:known], keys[known:]
        mine = [list(map(log.bit.__and__, known_masks)) for log in logs]  # held by each
        if not all(map(all, mine)):
            holders.update(zip(known_keys, map(bits.__or__, known_masks), strict=True))
        before = len(holders)
        holders.update(zip(new_keys, repeat(bits), strict=False))
        fresh = len(holders) - before  # distinct keys nobody held
        repeated = {} if fresh == len(new_keys) else {  # new keys given more than once
            key: n - 1 for key, n in Counter(new_keys).items() if n > 1}
        for log, held in zip(logs, mine, strict=True):
            self._log_insert(log, keys, known_keys, held, fresh, repeated)
            excess = log.held - self.capacity_blocks
            if excess > 0:
                self._unlink(self._oldest(log, excess), log.bit)
                log.held -= excess
                self.evictions += excess
            if log.logged > 2 * self.capacity_blocks:
                self._compact(log)

    def _log_insert(self, log: _Log, keys: tuple[Hashable, ...], known_keys: Sequence[Hashable],
                    held: list[int], fresh: int, repeated: dict[Hashable, int]) -> None:
        """Append ``keys`` to the log; ``held[i]`` is nonzero iff it held ``known_keys[i]``."""
        stale = log.stale
        if known_keys:
            stale.update(compress(known_keys, held))  # each now has a newer position
        joined = 0
        if not all(held):
            joining = list(compress(known_keys, map(not_, held)))  # held elsewhere, new here
            joined = len(set(joining))
            if joined < len(joining):  # some more than once
                stale.update({key: n - 1 for key, n in Counter(joining).items() if n > 1})
        if repeated:
            stale.update(repeated)
        if log.ghosts:  # keys dropped while logged, given again
            stale.update({key: log.ghosts.pop(key) for key in log.ghosts.keys() & set(keys)})
        log.held += fresh + joined
        log.entries.append(keys)
        log.logged += len(keys)

    def _oldest(self, log: _Log, count: int) -> list[Hashable]:
        """Consume the log up to its ``count`` least recently used held keys; return them."""
        holders, bit, stale, ghosts = self._holders, log.bit, log.stale, log.ghosts
        victims: list[Hashable] = []
        while len(victims) < count:
            need = count - len(victims)
            keys = log.take(need)  # the oldest positions; at most ``need`` of them live
            live = list(map(bit.__and__, map(holders.get, keys, repeat(0))))  # held, maybe stale
            spots = list(compress(range(len(keys)), map(stale.__contains__, keys)))
            if spots:
                self._consume_stale(stale, keys, spots)
                for i in spots:
                    live[i] = 0
            victims.extend(compress(keys, live))
            if ghosts:
                for key in filter(ghosts.__contains__, keys):
                    self._forget_one(ghosts, key)
        return victims

    def _consume_stale(self, stale: Counter[Hashable], keys: list[Hashable],
                       spots: list[int]) -> None:
        """Count off the stale positions among ``spots`` (keys in ``stale``); keep only those."""
        older = [keys[i] for i in spots]
        if len(set(older)) < len(older):  # a key's first positions are its stale ones
            first = []
            for i in spots:
                if stale[keys[i]]:
                    self._forget_one(stale, keys[i])
                    first.append(i)
            spots[:] = first
        else:
            counts = list(map(_minus_one, map(stale.__getitem__, older)))
            dict.update(stale, zip(older, counts, strict=True))
            _drain(map(stale.__delitem__, compress(older, map(not_, counts))))

    @staticmethod
    def _forget_one(counts: dict[Hashable, int], key: Hashable) -> None:
        if counts[key] == 1:
            del counts[key]
        else:
            counts[key] -= 1

    def _compact(self, log: _Log) -> None:
        """Keep only each held key's newest position (the LRU order is unchanged)."""
        latest_first = dict.fromkeys(reversed(log.positions()))
        held = list(compress(latest_first, map(log.bit.__and__,
                                               map(self._holders.get, latest_first, repeat(0)))))
        held.reverse()
        log.entries = deque([tuple(held)] if held else [])
        log.front, log.logged = 0, len(held)
        log.stale.clear()
        log.ghosts.clear()

    def drop(self, name: str, keys: Iterable[Hashable]) -> None:
        """``name`` no longer holds ``keys`` (e.g. from vLLM ``BlockRemoved`` KV events)."""
        log = self._logs.get(name)
        if log is None:
            return
        gone = [key for key in dict.fromkeys(keys) if self._holders.get(key, 0) & log.bit]
        self._unlink(gone, log.bit)
        log.held -= len(gone)
        for key in gone:
            log.ghosts[key] = 1 + log.stale.pop(key, 0)

    def clear(self, name: str) -> None:
        """Forget everything ``name`` held (it restarted with an empty cache)."""
        log = self._logs.get(name)
        if log is None:
            return
        logged = dict.fromkeys(log.positions())
        self._unlink(list(compress(logged, map(log.bit.__and__,
                                               map(self._holders.get, logged, repeat(0))))),
                     log.bit)
        self._logs[name] = _Log(log.bit)

    def blocks(self, name: str) -> int:
        """Keys ``name`` is believed to hold."""
        log = self._logs.get(name)
        return log.held if log is not None else 0

    def _log(self, name: str) -> _Log:
        log = self._logs.get(name)
        if log is None:
            bit = 1 << len(self._logs)
            log = self._logs[name] = _Log(bit)
            self._names[bit] = name
        return log

    def _unlink(self, keys: list[Hashable], bit: int) -> None:
        holders = self._holders
        masks = list(map((~bit).__and__, map(holders.__getitem__, keys)))
        holders.update(zip(keys, masks, strict=True))
        _drain(map(holders.__delitem__, compress(keys, map(not_, masks))))

    def check_invariants(self) -> None:
        """Each instance within capacity; its log accounts for every held and stale position."""
        pairs = set()
        for name, log in self._logs.items():
            positions = Counter(log.positions())
            held = {key for key in positions if self._holders.get(key, 0) & log.bit}
            assert log.held == len(held) <= self.capacity_blocks, (name, log.held, len(held))
            assert log.logged == sum(positions.values()) <= 2 * self.capacity_blocks, name
            assert all(positions[key] == 1 + log.stale.get(key, 0) for key in held), name
            assert set(log.stale) <= held and all(log.stale.values()), name
            assert positions.keys() - held == log.ghosts.keys(), name
            assert all(positions[key] == n for key, n in log.ghosts.items()), name
            pairs.update((key, log.bit) for key in held)
        assert pairs == {(key, bit) for key, mask in self._holders.items()
                         for bit in self._names if mask & bit}
        assert all(self._holders.values()), "keys nobody holds must be removed"
