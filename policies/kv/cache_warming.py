"""Proactive cache warming: learn the prompt prefixes that recur, pre-populate them when quiet.

A prompt's prefix cache is keyed block by block: the hash of block ``i`` stands for the whole
prefix up to and including it. `PrefixWarmer` counts, with exponential decay, how many requests
opened with each block key (the first ``max_prefix_blocks`` of every prompt), and calls a key
*hot* while its decayed count is at least ``min_requests - 1/2`` (so ``min_requests`` requests
close together make it hot, and it cools once it goes about half a half-life without one). The prefixes worth warming are the
deepest hot ones (a hot key none of whose children is hot): warming them warms every shorter
hot prefix too.

When the engine is quiet (`should_warm`: KV usage and queue under their marks) the integration
asks `next_to_warm` for hot prefixes the cache does not hold and runs them as one-token
requests, so the next request that opens with them hits. `snapshot`/`restore` carry the hot set
across a restart, so a fresh engine warms what its predecessor learned before traffic returns.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any, Protocol, runtime_checkable

import attrs

from policies.validators import at_least, finite_positive, fraction
from policies.views import LoadSnapshot


@attrs.frozen(kw_only=True)
class WarmPrefix:
    """A prompt prefix worth keeping in the cache."""

    key: Hashable
    """The key of its last block (stands for the whole prefix)."""
    tokens: tuple[int, ...]
    """Its token ids: whole blocks."""
    score: float
    """Decayed number of requests that opened with it."""


@runtime_checkable
class WarmingPolicy(Protocol):
    """Learns the prompt prefixes that recur and names the ones to warm while the engine is
    quiet (`PrefixWarmer`); the ``warming`` slot of a pipeline."""

    max_prefixes: int
    """The most prefixes it names at once (the integration sizes its probe cache by it)."""

    def observe(self, block_keys: Sequence[Hashable], tokens: Sequence[int], block_size: int,
                now: float) -> bool:
        """An admitted request opened with ``tokens``; whether a prefix turned hot."""
        ...

    def next_to_warm(self, load: LoadSnapshot,
                     is_cached: Callable[[WarmPrefix], bool]) -> list[WarmPrefix]:
        """The prefixes to prefill now with one-token requests."""
        ...

    def snapshot(self, now: float) -> list[dict[str, Any]]:
        """The hot prefixes as JSON-able records (`restore` reads them)."""
        ...

    def restore(self, records: Sequence[dict[str, Any]], block_keys: Callable[
            [Sequence[int]], Sequence[Hashable]], block_size: int, now: float) -> None:
        """Learn the prefixes of a `snapshot`."""
        ...


@attrs.frozen(kw_only=True)
class PrefixWarmerStats:
    """A snapshot of a `PrefixWarmer`."""

    tracked_blocks: int
    hot_prefixes: int
    warmed: int
    """Prefixes handed out by `next_to_warm` since construction."""


@attrs.define(eq=False, kw_only=True)
class _Entry:
    count: float
    stamp: float
    parent: Hashable | None
    tokens: tuple[int, ...] | None = None
    warmed_at: float = float("-inf")


@attrs.define(eq=False, kw_only=True)
class PrefixWarmer:
    """Learns recurring prefixes; names uncached hot ones while the engine is quiet.

    Guarantees: memory is bounded by ``max_tracked_blocks`` entries (the least-requested are
    forgotten first) plus the tokens of hot prefixes; a prefix is handed out at most once per
    ``rewarm_interval_s``; nothing is handed out unless `should_warm` holds. Deterministic
    given its inputs.
    """

    min_requests: float = attrs.field(default=2.0, validator=at_least(1.0))
    """Requests (close together) that make a prefix hot: hot while the decayed count is at
    least ``min_requests - 1/2``."""
    half_life_s: float = attrs.field(default=600.0, validator=finite_positive)
    """Counts halve over this long without new requests."""
    max_prefix_blocks: int = attrs.field(default=64, validator=at_least(1))
    """Only a prompt's first so many blocks are counted."""
    max_prefixes: int = attrs.field(default=32, validator=at_least(1))
    """Most prefixes `next_to_warm` considers (the highest-scoring)."""
    max_tracked_blocks: int = attrs.field(default=8192, validator=at_least(1))
    """Block keys counted at once."""
    max_kv_usage: float = attrs.field(default=0.5, validator=fraction)
    """Warm only while KV usage is below this."""
    max_waiting_requests: int = attrs.field(default=0, validator=at_least(0))
    """Warm only while at most this many requests wait."""
    max_warm_per_step: int = attrs.field(default=1, validator=at_least(1))
    rewarm_interval_s: float = attrs.field(default=60.0, validator=finite_positive)
    """A prefix is warmed again at most this often (an evicted one may come back later)."""
    _entries: dict[Hashable, _Entry] = attrs.field(init=False, factory=dict, repr=False)
    _warmed: int = attrs.field(init=False, default=0)

    def observe(self, block_keys: Sequence[Hashable], tokens: Sequence[int], block_size: int,
                now: float) -> bool:
        """A request opened with ``tokens``, whose full blocks have keys ``block_keys``;
        returns whether a prefix turned hot for the first time."""
        parent, new_hot = None, False
        for depth, key in enumerate(block_keys[:self.max_prefix_blocks], start=1):
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = _Entry(count=0.0, stamp=now, parent=parent)
            entry.count = self._decayed(entry, now) + 1.0
            entry.stamp = now
            if entry.tokens is None and entry.count >= self._threshold:
                entry.tokens = tuple(tokens[:depth * block_size])
                new_hot = True
            parent = key
        if len(self._entries) > 2 * self.max_tracked_blocks:
            self._forget(now)
        return new_hot

    def should_warm(self, load: LoadSnapshot) -> bool:
        """Whether the engine is quiet enough to spend a step on warming."""
        return (load.kv_usage < self.max_kv_usage
                and load.waiting_requests <= self.max_waiting_requests)

    def hot(self, now: float) -> list[WarmPrefix]:
        """The deepest hot prefixes, highest score x length first (at most ``max_prefixes``)."""
        hot = {key: e for key, e in self._entries.items()
               if e.tokens is not None and self._decayed(e, now) >= self._threshold}
        covered = {e.parent for e in hot.values()}
        prefixes = [WarmPrefix(key=key, tokens=e.tokens, score=self._decayed(e, now))
                    for key, e in hot.items() if key not in covered]
        prefixes.sort(key=lambda p: -p.score * len(p.tokens))
        return prefixes[:self.max_prefixes]

    def next_to_warm(self, load: LoadSnapshot,
                     is_cached: Callable[[WarmPrefix], bool]) -> list[WarmPrefix]:
        """Hot prefixes to warm now: quiet engine, not cached, not warmed recently."""
        if not self.should_warm(load):
            return []
        chosen = []
        for prefix in self.hot(load.now):
            entry = self._entries[prefix.key]
            if load.now - entry.warmed_at < self.rewarm_interval_s or is_cached(prefix):
                continue
            entry.warmed_at = load.now
            chosen.append(prefix)
            if len(chosen) == self.max_warm_per_step:
                break
        self._warmed += len(chosen)
        return chosen

    def snapshot(self, now: float) -> list[dict[str, Any]]:
        """The hot prefixes as JSON-able records (`restore` reads them)."""
        return [{"tokens": list(p.tokens), "score": p.score} for p in self.hot(now)]

    def restore(self, records: Sequence[dict[str, Any]], block_keys: Callable[
            [Sequence[int]], Sequence[Hashable]], block_size: int, now: float) -> None:
        """Learn the prefixes of a `snapshot` as if requested ``score`` times just now;
        ``block_keys`` gives a prefix's block keys (the engine's hashes)."""
        for record in records:
            tokens = record["tokens"]
            parent = None
            for depth, key in enumerate(block_keys(tokens), start=1):
                entry = self._entries.get(key)
                if entry is None:
                    entry = self._entries[key] = _Entry(count=0.0, stamp=now, parent=parent)
                entry.count = max(self._decayed(entry, now), float(record["score"]))
                entry.stamp = now
                entry.tokens = entry.tokens or tuple(tokens[:depth * block_size])
                parent = key

    def stats(self, now: float) -> PrefixWarmerStats:
        """Sizes and counters now."""
        return PrefixWarmerStats(tracked_blocks=len(self._entries),
                                 hot_prefixes=len(self.hot(now)), warmed=self._warmed)

    @property
    def _threshold(self) -> float:
        return self.min_requests - 0.5

    def _decayed(self, entry: _Entry, now: float) -> float:
        return entry.count * 0.5 ** (max(0.0, now - entry.stamp) / self.half_life_s)

    def _forget(self, now: float) -> None:
        """Keep the ``max_tracked_blocks`` most-requested keys (amortised O(log n) per key)."""
        ranked = sorted(self._entries.items(), key=lambda kv: -self._decayed(kv[1], now))
        self._entries = dict(ranked[:self.max_tracked_blocks])
