"""Numba kernels over the flat arrays of a suffix automaton (internal).

Layout, all ``int32``:

- ``states[s]`` = ``(LEN, LINK, OCC, LAST, HEAD, BEST, BEST_AT)``: longest string length, suffix
  link (-1 at the root, state 0), occurrence count, latest end position, first outgoing edge
  (-1: none), and a cache of the most frequent outgoing edge (-1: not computed) with the
  occurrence count it was computed at.
- ``edges[e]`` = ``(SRC, TOK, DST, NEXT)``: a transition ``SRC --TOK--> DST``; ``NEXT`` chains
  the edges leaving ``SRC``.
- ``slots``: an open-addressing hash table (power-of-two size, linear probing) of edge indices
  keyed by ``(SRC, TOK)``; -1 = empty.
- ``text``: the tokens appended so far.
- ``meta`` (``int64``) = ``(N_STATES, N_EDGES, N_TOKENS, LAST_STATE, PENDING_EDGES)``; the
  last is the edge count the token `extend` stopped before would have needed.

Kernels never allocate: `extend` stops before a token whose insertion could overflow an array
and returns how many tokens it consumed, so the caller grows the arrays and calls again.
"""

from __future__ import annotations

import numpy as np
from numba import njit

LEN, LINK, OCC, LAST, HEAD, BEST, BEST_AT = 0, 1, 2, 3, 4, 5, 6
SRC, TOK, DST, NEXT = 0, 1, 2, 3
N_STATES, N_EDGES, N_TOKENS, LAST_STATE, PENDING_EDGES = 0, 1, 2, 3, 4
STATE_FIELDS = 7
EDGE_FIELDS = 4
META_FIELDS = 5
MAX_LOAD_NUM, MAX_LOAD_DEN = 3, 4
"""The hash table holds at most 3/4 as many edges as slots."""


@njit(cache=True, inline="always")
def _slot(src, tok, mask):
    h = (np.uint64(np.uint32(src)) * np.uint64(0x9E3779B97F4A7C15)) ^ (
        np.uint64(np.uint32(tok)) * np.uint64(0xC2B2AE3D27D4EB4F))
    h ^= h >> np.uint64(29)
    return np.int64(h & np.uint64(mask))


@njit(cache=True)
def find_edge(edges, slots, src, tok):
    """Index of the edge ``src --tok-->``, or -1."""
    mask = slots.shape[0] - 1
    h = _slot(src, tok, mask)
    while True:
        e = slots[h]
        if e < 0:
            return -1
        if edges[e, SRC] == src and edges[e, TOK] == tok:
            return e
        h = (h + 1) & mask


@njit(cache=True)
def _insert_slot(edges, slots, e):
    mask = slots.shape[0] - 1
    h = _slot(edges[e, SRC], edges[e, TOK], mask)
    while slots[h] >= 0:
        h = (h + 1) & mask
    slots[h] = e


@njit(cache=True)
def rehash(edges, n_edges, slots):
    """Fill the empty table ``slots`` with edges ``0 .. n_edges - 1``."""
    for e in range(n_edges):
        _insert_slot(edges, slots, e)


@njit(cache=True)
def _add_edge(states, edges, slots, meta, src, tok, dst):
    e = meta[N_EDGES]
    meta[N_EDGES] = e + 1
    edges[e, SRC] = src
    edges[e, TOK] = tok
    edges[e, DST] = dst
    edges[e, NEXT] = states[src, HEAD]
    states[src, HEAD] = e
    _insert_slot(edges, slots, e)


@njit(cache=True)
def _new_state(states, meta, length, link, occ, last):
    s = meta[N_STATES]
    meta[N_STATES] = s + 1
    states[s, LEN] = length
    states[s, LINK] = link
    states[s, OCC] = occ
    states[s, LAST] = last
    states[s, HEAD] = -1
    states[s, BEST] = -1
    states[s, BEST_AT] = 0
    return s


@njit(cache=True)
def _out_degree(states, edges, s):
    n = 0
    e = states[s, HEAD]
    while e >= 0:
        n += 1
        e = edges[e, NEXT]
    return n


@njit(cache=True)
def _edges_needed(states, edges, slots, last, tok):
    """An upper bound (exact or one over) on the edges appending ``tok`` creates."""
    needed = 0
    p = last
    while p != -1:
        e = find_edge(edges, slots, p, tok)
        if e >= 0:
            q = edges[e, DST]
            if states[p, LEN] + 1 != states[q, LEN]:
                # The clone copies q's edges, one of which q may gain on this path.
                needed += _out_degree(states, edges, q) + 1
            return needed
        needed += 1
        p = states[p, LINK]
    return needed


@njit(cache=True)
def _extend_one(states, edges, slots, text, meta, tok, max_count_walk):
    pos = meta[N_TOKENS]
    text[pos] = tok
    meta[N_TOKENS] = pos + 1
    last = meta[LAST_STATE]
    cur = _new_state(states, meta, states[last, LEN] + 1, -1, 0, pos)
    p = last
    e = -1
    while p != -1:
        e = find_edge(edges, slots, p, tok)
        if e >= 0:
            break
        _add_edge(states, edges, slots, meta, p, tok, cur)
        p = states[p, LINK]
    if p == -1:
        states[cur, LINK] = 0
    else:
        q = edges[e, DST]
        if states[p, LEN] + 1 == states[q, LEN]:
            states[cur, LINK] = q
        else:
            clone = _new_state(states, meta, states[p, LEN] + 1, states[q, LINK],
                               states[q, OCC], states[q, LAST])
            c = states[q, HEAD]
            while c >= 0:
                _add_edge(states, edges, slots, meta, clone, edges[c, TOK], edges[c, DST])
                c = edges[c, NEXT]
            while p != -1:
                e = find_edge(edges, slots, p, tok)
                if e < 0 or edges[e, DST] != q:
                    break
                edges[e, DST] = clone
                p = states[p, LINK]
            states[q, LINK] = clone
            states[cur, LINK] = clone
    meta[LAST_STATE] = cur
    v = cur
    steps = 0
    while v > 0 and steps < max_count_walk:
        states[v, OCC] += 1
        states[v, LAST] = pos
        v = states[v, LINK]
        steps += 1


@njit(cache=True)
def extend(states, edges, slots, text, meta, tokens, start, max_count_walk):
    """Append ``tokens[start:]`` while the arrays have room.

    Returns ``(index reached, state, length)`` where ``(state, length)`` is the longest suffix
    of the text that also ends earlier in it (``(0, 0)`` if none).
    """
    i = start
    n = tokens.shape[0]
    while i < n:
        if meta[N_TOKENS] >= text.shape[0] or meta[N_STATES] + 2 > states.shape[0]:
            break
        needed = meta[N_EDGES] + _edges_needed(states, edges, slots, meta[LAST_STATE], tokens[i])
        if needed > edges.shape[0] or needed * MAX_LOAD_DEN > slots.shape[0] * MAX_LOAD_NUM:
            meta[PENDING_EDGES] = needed
            break
        _extend_one(states, edges, slots, text, meta, tokens[i], max_count_walk)
        i += 1
    link = states[meta[LAST_STATE], LINK]
    if link <= 0:
        return i, 0, 0
    return i, link, states[link, LEN]


@njit(cache=True)
def match(states, edges, slots, state, length, tokens):
    """Advance a matcher ``(state, length)`` over ``tokens``; return the new pair.

    Invariant: the last ``length`` tokens read form the longest suffix of the stream read so
    far that occurs in the automaton's text, and ``state`` is its class.
    """
    for i in range(tokens.shape[0]):
        tok = tokens[i]
        # A later clone may have split the class: move to the one that holds `length`.
        while state > 0 and states[states[state, LINK], LEN] >= length:
            state = states[state, LINK]
        while True:
            e = find_edge(edges, slots, state, tok)
            if e >= 0:
                state = edges[e, DST]
                length += 1
                break
            if state == 0:
                length = 0
                break
            state = states[state, LINK]
            length = states[state, LEN]
    return state, length


@njit(cache=True, inline="always")
def _continued(states, text_len, state):
    """Occurrences of ``state`` followed by a token: all but one ending the text, if any."""
    return states[state, OCC] - (1 if states[state, LAST] == text_len - 1 else 0)


@njit(cache=True)
def _best_edge(states, edges, text_len, state, stale_after):
    """The edge to the most frequent continuation (ties: most recent), cached on the state.

    The cache is exact for states with fewer than ``stale_after`` continued occurrences (any new
    continuation invalidates it); above that it is reused until that count grows by 1/8, so a
    state with thousands of edges (a common token in a large cache) is rescanned O(log n)
    times, not on every draft.
    """
    total = _continued(states, text_len, state)
    best = states[state, BEST]
    at = states[state, BEST_AT]
    if best >= 0 and (total == at or (at >= stale_after and total <= at + at // 8)):
        return best
    best_occ = 0
    best_last = -1
    e = states[state, HEAD]
    while e >= 0:
        d = edges[e, DST]
        o = states[d, OCC]
        if o > best_occ or (o == best_occ and states[d, LAST] > best_last):
            best = e
            best_occ = o
            best_last = states[d, LAST]
        e = edges[e, NEXT]
    states[state, BEST] = best
    states[state, BEST_AT] = total
    return best


@njit(cache=True)
def draft(states, edges, text_len, state, max_tokens, min_prob, stale_after, out_tokens,
          out_probs):
    """Greedy walk from ``state`` along the most frequent continuation.

    Writes up to ``max_tokens`` tokens and their cumulative probabilities; stops at a
    separator (negative token), a leaf, or when the cumulative probability would fall below
    ``min_prob``. A step's probability is the chosen continuation's count over the state's
    occurrences that have a continuation (all but one at the end of the text). Returns
    ``(count, sum of probs)``. ``stale_after``: see `_best_edge`.
    """
    prob = 1.0
    score = 0.0
    n = 0
    while n < max_tokens:
        best = _best_edge(states, edges, text_len, state, stale_after)
        if best < 0 or edges[best, TOK] < 0:
            break
        total = _continued(states, text_len, state)
        p = prob * min(1.0, states[edges[best, DST], OCC] / max(total, 1))
        if p < min_prob:
            break
        prob = p
        score += p
        out_tokens[n] = edges[best, TOK]
        out_probs[n] = prob
        n += 1
        state = edges[best, DST]
    return n, score

