"""An online suffix automaton over token ids, stored in flat ``int32`` arrays.

A suffix automaton of a text has one state per class of substrings that end at the same set of
positions (at most ``2n - 1`` states and ``3n - 4`` transitions for ``n >= 3`` tokens). Appending
a token costs amortised O(1); finding the longest suffix of a stream that occurs in the text
costs amortised O(1) per streamed token, whatever the text length — unlike an n-gram scan, which
re-reads the whole context every step.

Each state also keeps an occurrence count and its latest end position, so a draft can follow the
most frequent continuation of a match, SuffixDecoding-style. Counts are exact unless one append
walks more than ``max_count_walk_states`` suffix links (long runs of one repeated token); then the
shortest suffixes of that run are under-counted.

Storage is 28 bytes per state, 16 per transition and 4 per hash slot plus the text itself:
about 120-140 bytes per token on natural text, spare capacity included (`SuffixAutomaton.stats`), versus several hundred for a
pointer-based suffix tree. The hot loops are numba kernels (`policies.speculative._kernels`).
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs
import numpy as np

from policies.validators import at_least

Cursor = tuple[int, int]
"""A match position: ``(state, length_tokens)``; ``(0, 0)`` is the empty match."""

EMPTY_CURSOR: Cursor = (0, 0)


class _LazyKernels:
    """`policies.speculative._kernels`, imported on first use: importing numba (llvmlite)
    before vLLM's workers scan ``sys.modules`` for kernel overrides crashes them in vLLM 0.32,
    and a script's top-level ``import policies`` is re-imported by every spawned worker."""

    def __getattr__(self, name: str):
        from policies.speculative import _kernels

        value = getattr(_kernels, name)
        setattr(self, name, value)
        return value


k = _LazyKernels()


@attrs.frozen(kw_only=True)
class AutomatonStats:
    """A snapshot of a `SuffixAutomaton`'s size."""

    tokens: int
    """Tokens appended (the text length)."""
    states: int
    """States, the root included."""
    transitions: int
    """Transitions (edges)."""
    bytes: int
    """Bytes held by the arrays, spare capacity included."""

    @property
    def bytes_per_token(self) -> float:
        """``bytes / tokens`` (0 for an empty automaton)."""
        return self.bytes / self.tokens if self.tokens else 0.0


def _as_tokens(tokens: Iterable[int] | np.ndarray) -> np.ndarray:
    """Arrays pass through (numba compiles one variant per integer dtype); iterables -> int32."""
    arr = tokens if isinstance(tokens, np.ndarray) else np.asarray(list(tokens), dtype=np.int32)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise ValueError(f"tokens must be a 1-D integer sequence, got {arr.dtype} {arr.shape}")
    return arr


@attrs.define(eq=False, kw_only=True, on_setattr=attrs.setters.NO_OP)
class SuffixAutomaton:
    """The suffix automaton of every token appended so far, grown online in amortised O(1).

    Negative token ids are allowed and act as separators: `draft` never emits or crosses one,
    so a generalized automaton over many documents is one automaton over their concatenation
    with a separator after each.
    """

    initial_tokens: int = attrs.field(default=64, validator=at_least(1))
    """Capacity reserved up front (arrays double when full)."""
    max_count_walk_states: int = attrs.field(default=1024, validator=at_least(1))
    """Most suffix links one append walks to update occurrence counts."""
    exact_counts_below: int = attrs.field(default=64, validator=at_least(1))
    """`draft` picks the most frequent continuation exactly at states with fewer continued
    occurrences than this; above, from a cached choice refreshed whenever the count has grown
    by 1/8 (bounds the cost at very common contexts)."""
    _states: np.ndarray = attrs.field(init=False, repr=False)
    _edges: np.ndarray = attrs.field(init=False, repr=False)
    _slots: np.ndarray = attrs.field(init=False, repr=False)
    _text: np.ndarray = attrs.field(init=False, repr=False)
    _meta: np.ndarray = attrs.field(init=False, repr=False)
    _repeated: Cursor = attrs.field(init=False, default=EMPTY_CURSOR, repr=False)

    def __attrs_post_init__(self) -> None:
        n = self.initial_tokens
        self._states = np.zeros((2 * n + 2, k.STATE_FIELDS), dtype=np.int32)
        self._states[0] = (0, -1, 0, -1, -1, -1, 0)
        self._edges = np.zeros((2 * n + 4, k.EDGE_FIELDS), dtype=np.int32)
        self._slots = np.full(_table_size(2 * n + 4), -1, dtype=np.int32)
        self._text = np.zeros(n, dtype=np.int32)
        self._meta = np.zeros(k.META_FIELDS, dtype=np.int64)
        self._meta[k.N_STATES] = 1

    def __len__(self) -> int:
        return int(self._meta[k.N_TOKENS])

    @property
    def text(self) -> np.ndarray:
        """The tokens appended so far (a read-only view)."""
        view = self._text[: len(self)]
        view.flags.writeable = False
        return view

    def extend(self, tokens: Iterable[int] | np.ndarray) -> None:
        """Append ``tokens``; afterwards the automaton accepts exactly the new text's substrings."""
        arr = _as_tokens(tokens)
        i, state, length = k.extend(self._states, self._edges, self._slots, self._text,
                                    self._meta, arr, 0, self.max_count_walk_states)
        while i < len(arr):
            self._grow()
            i, state, length = k.extend(self._states, self._edges, self._slots, self._text,
                                        self._meta, arr, i, self.max_count_walk_states)
        self._repeated = (state, length)

    def repeated_suffix(self) -> Cursor:
        """The longest suffix of the text that also ends earlier in it, as a cursor (O(1))."""
        return self._repeated

    def match(self, tokens: Iterable[int] | np.ndarray, cursor: Cursor = EMPTY_CURSOR) -> Cursor:
        """Advance ``cursor`` over ``tokens``: the longest suffix of the stream found in the text."""
        return k.match(self._states, self._edges, self._slots, cursor[0], cursor[1],
                       _as_tokens(tokens))

    def count(self, pattern: Iterable[int]) -> int:
        """How many times ``pattern`` occurs in the text (the empty pattern: ``len + 1`` ends)."""
        pattern = list(pattern)
        if not pattern:
            return len(self) + 1
        state = self._walk(pattern)
        return 0 if state < 0 else int(self._states[state, k.OCC])

    def continuations(self, pattern: Iterable[int]) -> dict[int, int]:
        """For each token that follows ``pattern`` in the text, how many times it does."""
        state = self._walk(list(pattern))
        if state < 0:
            return {}
        out = {}
        e = int(self._states[state, k.HEAD])
        while e >= 0:
            out[int(self._edges[e, k.TOK])] = int(self._states[self._edges[e, k.DST], k.OCC])
            e = int(self._edges[e, k.NEXT])
        return out

    def draft(self, cursor: Cursor, max_tokens: int, min_prob: float,
              out_tokens: np.ndarray, out_probs: np.ndarray) -> tuple[int, float]:
        """Write the most frequent continuation of ``cursor`` (at most ``max_tokens``) into the buffers.

        ``out_probs[i]`` is the empirical probability of the first ``i + 1`` tokens given the
        match; the walk stops before it would drop below ``min_prob``. Returns the count written
        and the sum of their probabilities.
        """
        if cursor[1] == 0 or max_tokens <= 0:
            return 0, 0.0
        return k.draft(self._states, self._edges, self._meta[k.N_TOKENS], cursor[0], max_tokens,
                       min_prob, self.exact_counts_below, out_tokens, out_probs)

    def stats(self) -> AutomatonStats:
        """Sizes now; ``bytes`` counts allocated capacity, not just what is used."""
        return AutomatonStats(
            tokens=len(self), states=int(self._meta[k.N_STATES]),
            transitions=int(self._meta[k.N_EDGES]),
            bytes=sum(a.nbytes for a in (self._states, self._edges, self._slots, self._text,
                                         self._meta)))

    def check_invariants(self) -> None:
        """Assert the structural invariants (vectorised, O(size))."""
        n, ns, ne = len(self), int(self._meta[k.N_STATES]), int(self._meta[k.N_EDGES])
        assert ns <= max(2 * n, 2), (ns, n)
        assert ne <= max(3 * n, 2), (ne, n)
        assert ne * k.MAX_LOAD_DEN <= self._slots.shape[0] * k.MAX_LOAD_NUM
        states, edges = self._states[:ns], self._edges[:ne]
        links = states[1:, k.LINK]
        assert ((links >= 0) & (links < ns)).all()
        assert (states[links, k.LEN] < states[1:, k.LEN]).all(), "links must shorten"
        assert (states[1:, k.OCC] >= 1).all(), "every substring occurs"
        assert (edges[:, k.DST] > 0).all() and (edges[:, k.DST] < ns).all()
        assert (states[edges[:, k.DST], k.LEN] > states[edges[:, k.SRC], k.LEN]).all()
        assert int((self._slots >= 0).sum()) == ne, "every edge is hashed once"

    def _walk(self, pattern: list[int]) -> int:
        state = 0
        for tok in pattern:
            e = k.find_edge(self._edges, self._slots, state, tok)
            if e < 0:
                return -1
            state = int(self._edges[e, k.DST])
        return state

    def _grow(self) -> None:
        n_tokens, ns, ne = len(self), int(self._meta[k.N_STATES]), int(self._meta[k.N_EDGES])
        if n_tokens >= self._text.shape[0]:
            self._text = _resized(self._text, 2 * self._text.shape[0])
        if ns + 2 > self._states.shape[0]:
            self._states = _resized(self._states, 2 * self._states.shape[0])
        needed = max(ne, int(self._meta[k.PENDING_EDGES]))
        if needed > self._edges.shape[0]:
            self._edges = _resized(self._edges, max(2 * self._edges.shape[0], needed))
        size = _table_size(needed)
        if size > self._slots.shape[0]:
            self._slots = np.full(size, -1, dtype=np.int32)
            k.rehash(self._edges, ne, self._slots)


def _resized(arr: np.ndarray, rows: int) -> np.ndarray:
    out = np.zeros((rows,) + arr.shape[1:], dtype=arr.dtype)
    out[: arr.shape[0]] = arr
    return out


def _table_size(edges: int) -> int:
    """The smallest power of two that holds ``edges`` within the load limit."""
    size = 8
    while size * k.MAX_LOAD_NUM < edges * k.MAX_LOAD_DEN:
        size *= 2
    return size
