"""A cross-request suffix cache bounded by tokens, with generation (epoch) eviction.

Automata cannot delete, so the cache keeps up to ``generations`` automata. New outputs go into
the youngest; when it would pass ``max_tokens // generations`` tokens a new generation starts
and, if there are already ``generations``, the oldest is dropped whole. The cache therefore
always holds at most ``max_tokens`` tokens (separators included) and, once warm, at least the
most recent ``(generations - 1) / generations`` of that budget.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs
import numpy as np

from policies.speculative.automaton import EMPTY_CURSOR, Cursor, SuffixAutomaton
from policies.validators import at_least

SEPARATOR = -1
"""Token appended after every cached output; drafts stop at it."""



@attrs.frozen(kw_only=True)
class SharedCacheStats:
    """A snapshot of a `SharedSuffixCache`."""

    tokens: int
    """Tokens held over all live generations (separators included); never above ``max_tokens``."""
    bytes: int
    """Bytes held by the live automata's arrays."""
    generations: int
    """Live generations."""
    epoch: int
    """Epoch of the youngest generation (generations started since construction, minus one)."""
    outputs_added: int
    """Outputs added since construction."""
    tokens_evicted: int
    """Tokens dropped with evicted generations."""
    tokens_truncated: int
    """Tokens cut from outputs longer than one generation."""

    @property
    def bytes_per_token(self) -> float:
        """``bytes / tokens`` (0 when empty)."""
        return self.bytes / self.tokens if self.tokens else 0.0


@attrs.define(eq=False, kw_only=True)
class SharedCursors:
    """One request's match position in each live generation of a `SharedSuffixCache`."""

    by_epoch: dict[int, Cursor] = attrs.field(factory=dict)
    outputs_seen: int = -1
    """The cache's ``outputs_added`` when these cursors were last advanced."""


@attrs.define(eq=False, kw_only=True, on_setattr=attrs.setters.NO_OP)
class SharedSuffixCache:
    """A generalized suffix automaton over previous outputs that never exceeds ``max_tokens``."""

    max_tokens: int = attrs.field(validator=at_least(2))
    """Token budget over all generations (separators included)."""
    generations: int = attrs.field(default=2, validator=at_least(1))
    """Automata kept; eviction drops the oldest, ``1/generations`` of the budget."""
    max_count_walk_states: int = 1024
    """Passed to each `SuffixAutomaton`."""
    _live: list[tuple[int, SuffixAutomaton]] = attrs.field(init=False, factory=list, repr=False)
    _epoch: int = attrs.field(init=False, default=-1)
    _outputs_added: int = attrs.field(init=False, default=0)
    _tokens_evicted: int = attrs.field(init=False, default=0)
    _tokens_truncated: int = attrs.field(init=False, default=0)

    def __attrs_post_init__(self) -> None:
        if self.max_tokens < 2 * self.generations:
            raise ValueError(f"max_tokens must be >= 2 * generations, got {self.max_tokens!r}")
        self._rotate()

    @property
    def tokens_per_generation(self) -> int:
        """Capacity of one generation: ``max_tokens // generations``."""
        return self.max_tokens // self.generations

    def add(self, output_tokens: Iterable[int] | np.ndarray) -> None:
        """Cache one finished output (plus a separator); may evict the oldest generation."""
        arr = np.asarray(output_tokens, dtype=np.int32)
        cap = self.tokens_per_generation
        if arr.shape[0] + 1 > cap:
            self._tokens_truncated += arr.shape[0] + 1 - cap
            arr = arr[: cap - 1]
        if len(self._live[-1][1]) + arr.shape[0] + 1 > cap:
            self._rotate()
        automaton = self._live[-1][1]
        automaton.extend(arr)
        automaton.extend((SEPARATOR,))
        self._outputs_added += 1

    def advance(self, cursors: SharedCursors, new_tokens: np.ndarray,
                history: SuffixAutomaton, rematch_tokens: int) -> None:
        """Move ``cursors`` over ``new_tokens``, the latest tokens of ``history``'s text.

        Afterwards each cursor is the longest suffix of ``history`` found in its generation,
        exactly when that suffix is at most ``rematch_tokens`` long: if outputs were added since
        the last call (they may contain a longer match than the cursor could have seen), the
        last ``rematch_tokens`` of ``history`` are matched afresh and the longer match kept.
        Cursors of evicted generations are dropped.
        """
        by_epoch = cursors.by_epoch
        if cursors.outputs_seen == self._outputs_added:
            for epoch, automaton in self._live:
                by_epoch[epoch] = automaton.match(new_tokens, by_epoch[epoch])
            return
        oldest = self._live[0][0]
        for epoch in [e for e in by_epoch if e < oldest]:
            del by_epoch[epoch]
        recent = history.text[-rematch_tokens:]
        for epoch, automaton in self._live:
            fresh = automaton.match(recent)
            cursor = by_epoch.get(epoch)
            if cursor is not None:
                cursor = automaton.match(new_tokens, cursor)
                fresh = cursor if cursor[1] >= fresh[1] else fresh
            by_epoch[epoch] = fresh
        cursors.outputs_seen = self._outputs_added

    def live(self, cursors: SharedCursors) -> list[tuple[SuffixAutomaton, Cursor]]:
        """Each live generation with this request's cursor in it (empty if not yet matched)."""
        return [(a, cursors.by_epoch.get(epoch, EMPTY_CURSOR)) for epoch, a in self._live]

    def stats(self) -> SharedCacheStats:
        """Sizes and counters now."""
        sizes = [a.stats() for _, a in self._live]
        return SharedCacheStats(
            tokens=sum(s.tokens for s in sizes), bytes=sum(s.bytes for s in sizes),
            generations=len(sizes), epoch=self._epoch, outputs_added=self._outputs_added,
            tokens_evicted=self._tokens_evicted, tokens_truncated=self._tokens_truncated)

    def check_invariants(self) -> None:
        """Assert the token bound, epoch order and each automaton's invariants."""
        assert 1 <= len(self._live) <= self.generations
        epochs = [epoch for epoch, _ in self._live]
        assert epochs == sorted(epochs) and epochs[-1] == self._epoch
        assert all(len(a) <= self.tokens_per_generation for _, a in self._live)
        assert self.stats().tokens <= self.max_tokens
        for _, automaton in self._live:
            automaton.check_invariants()

    def _rotate(self) -> None:
        if len(self._live) == self.generations:
            _, oldest = self._live.pop(0)
            self._tokens_evicted += len(oldest)
        self._epoch += 1
        self._live.append((self._epoch, SuffixAutomaton(
            initial_tokens=min(self.tokens_per_generation, 4096),
            max_count_walk_states=self.max_count_walk_states)))
