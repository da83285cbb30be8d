"""Per-request drafting from suffix automata: the request's own context plus a shared cache.

Each active request owns a `SuffixAutomaton` over its prompt and output so far; its longest
repeated suffix is read off the automaton in O(1) after every append. With a
`SharedSuffixCache`, each request also keeps a streaming cursor into every live generation.
`SuffixDrafter.propose` drafts from every source and returns the best-scoring draft (equal
scores: the longer match, then the request's own context):

    max length = min(k, budget(class), floor(match_scale * match_tokens + match_offset_tokens))
    token i    = most frequent continuation at the walk's state (ties: most recent)
    prob_i     = prob_{i-1} * count(chosen) / count(all continuations); stop below min_token_prob
    score      = sum(prob_i) = the draft's expected number of accepted tokens

A match shorter than ``min_match_tokens`` drafts nothing (the minimum-match gate).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Hashable, Iterable

import attrs
import numpy as np

from policies.speculative.automaton import AutomatonStats, Cursor, SuffixAutomaton
from policies.speculative.budget import SpeculationBudget
from policies.speculative.shared import SharedCacheStats, SharedCursors, SharedSuffixCache
from policies.validators import at_least, fraction


class DraftSource(enum.Enum):
    """Where a draft came from."""

    NONE = "none"
    REQUEST = "request"
    SHARED = "shared"


@attrs.frozen(kw_only=True)
class DraftConfig:
    """How long a draft may be and when to stop it."""

    max_draft_tokens: int = attrs.field(default=32, validator=at_least(1))
    """Hard cap on draft length (vLLM's ``num_speculative_tokens``)."""
    match_scale: float = attrs.field(default=4.0, validator=at_least(0.0))
    """A draft has at most ``match_scale * match_tokens + match_offset_tokens`` tokens."""
    match_offset_tokens: float = attrs.field(default=1.0, validator=at_least(0.0))
    """See ``match_scale``."""
    min_token_prob: float = attrs.field(default=0.1, validator=fraction)
    """Stop before the draft's cumulative probability falls below this floor."""
    min_match_tokens: int = attrs.field(default=1, validator=at_least(1))
    """Draft nothing from a match shorter than this (the minimum-match gate)."""
    rematch_tokens: int = attrs.field(default=64, validator=at_least(1))
    """Recent tokens re-matched against the shared cache after outputs were added to it."""

    def length_cap(self, match_tokens: int, limit_tokens: int) -> int:
        """Most tokens a draft from a ``match_tokens``-long match may have."""
        if match_tokens < self.min_match_tokens:
            return 0
        adaptive = math.floor(self.match_scale * match_tokens + self.match_offset_tokens)
        return max(0, min(limit_tokens, self.max_draft_tokens, adaptive))


@attrs.frozen(kw_only=True)
class Draft:
    """A proposed continuation; ``probs[i]`` is the estimated chance the first ``i + 1`` match."""

    tokens: tuple[int, ...] = ()
    probs: tuple[float, ...] = ()
    match_tokens: int = 0
    """Length of the context suffix the draft continues."""
    source: DraftSource = DraftSource.NONE

    @property
    def score(self) -> float:
        """Expected accepted tokens: the sum of ``probs``."""
        return math.fsum(self.probs)


EMPTY_DRAFT = Draft()


@attrs.frozen(kw_only=True)
class DrafterStats:
    """A snapshot of a `SuffixDrafter`."""

    active_requests: int
    proposals: int
    """`SuffixDrafter.propose` calls."""
    drafts_from_request: int
    """Non-empty drafts taken from the request's own context."""
    drafts_from_shared: int
    """Non-empty drafts taken from the shared cache."""
    drafted_tokens: int
    request_tokens: int
    """Tokens held by the active requests' automata."""
    request_bytes: int
    """Bytes held by the active requests' automata."""
    shared: SharedCacheStats | None
    """The shared cache's stats (None without one)."""


@attrs.define(eq=False, kw_only=True)
class _Session:
    automaton: SuffixAutomaton
    prompt_tokens: int
    slo_class: str
    cursors: SharedCursors


@attrs.define(eq=False, kw_only=True)
class SuffixDrafter:
    """Drafts for many concurrent requests; each draft is the best-scoring of all sources.

    Lifecycle per request: `start` (prompt) → repeatedly `propose` then `extend` (the tokens the
    engine emitted) → `finish`, which moves the request's output into the shared cache.
    """

    config: DraftConfig = attrs.field(factory=DraftConfig)
    """Draft-length and stopping rules."""
    shared: SharedSuffixCache | None = None
    """Cross-request cache (None: drafts come from the request's own context only)."""
    budget: SpeculationBudget | None = None
    """Per-class draft-token caps (None: only ``config.max_draft_tokens``)."""
    _sessions: dict[Hashable, _Session] = attrs.field(init=False, factory=dict, repr=False)
    _buffers: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] = attrs.field(
        init=False, repr=False)
    _proposals: int = attrs.field(init=False, default=0)
    _from_request: int = attrs.field(init=False, default=0)
    _from_shared: int = attrs.field(init=False, default=0)
    _drafted_tokens: int = attrs.field(init=False, default=0)

    def __attrs_post_init__(self) -> None:
        k = self.config.max_draft_tokens
        self._buffers = (np.zeros(k, dtype=np.int32), np.zeros(k, dtype=np.float64),
                         np.zeros(k, dtype=np.int32), np.zeros(k, dtype=np.float64))

    def __contains__(self, request_id: Hashable) -> bool:
        return request_id in self._sessions

    def start(self, request_id: Hashable, prompt_tokens: Iterable[int] | np.ndarray,
              slo_class: str = "") -> None:
        """Begin a request: build its automaton over the prompt (O(prompt) once)."""
        if request_id in self._sessions:
            raise KeyError(f"request {request_id!r} is already active")
        prompt = np.asarray(prompt_tokens, dtype=np.int32)
        session = _Session(automaton=SuffixAutomaton(initial_tokens=max(64, 2 * len(prompt))),
                           prompt_tokens=len(prompt), slo_class=slo_class,
                           cursors=SharedCursors())
        self._sessions[request_id] = session
        self._append(session, prompt)

    def extend(self, request_id: Hashable, tokens: Iterable[int] | np.ndarray) -> None:
        """Append tokens the engine emitted for the request (amortised O(1) per token)."""
        self._append(self._session(request_id), np.asarray(tokens, dtype=np.int32))

    def propose(self, request_id: Hashable, max_tokens: int | None = None) -> Draft:
        """The best-scoring draft over all sources, at most ``max_tokens`` long (may be empty)."""
        session = self._session(request_id)
        limit = self.config.max_draft_tokens if max_tokens is None else max_tokens
        if self.budget is not None:
            limit = min(limit, self.budget.limit(session.slo_class))
        self._proposals += 1
        config = self.config
        best_n, best_score, best_match, best_source = 0, 0.0, 0, DraftSource.NONE
        tokens, probs, spare_tokens, spare_probs = self._buffers
        for automaton, cursor, source in self._sources(session):
            cap = config.length_cap(cursor[1], limit)
            if not cap:
                continue
            n, score = automaton.draft(cursor, cap, config.min_token_prob, spare_tokens,
                                       spare_probs)
            if n and (score > best_score or (score == best_score and cursor[1] > best_match)):
                best_n, best_score, best_match, best_source = n, score, cursor[1], source
                tokens, probs, spare_tokens, spare_probs = (spare_tokens, spare_probs, tokens,
                                                            probs)
        if not best_n:
            return EMPTY_DRAFT
        if best_source is DraftSource.REQUEST:
            self._from_request += 1
        else:
            self._from_shared += 1
        self._drafted_tokens += best_n
        return Draft(tokens=tuple(tokens[:best_n].tolist()), probs=tuple(probs[:best_n].tolist()),
                     match_tokens=best_match, source=best_source)

    def finish(self, request_id: Hashable) -> None:
        """End a request; its output (the tokens after the prompt) enters the shared cache."""
        session = self._sessions.pop(request_id)
        if self.shared is not None and len(session.automaton) > session.prompt_tokens:
            self.shared.add(session.automaton.text[session.prompt_tokens:])

    def abort(self, request_id: Hashable) -> None:
        """Forget a request without caching its output."""
        del self._sessions[request_id]

    def stats(self) -> DrafterStats:
        """Counters since construction and sizes now."""
        sizes: list[AutomatonStats] = [s.automaton.stats() for s in self._sessions.values()]
        return DrafterStats(
            active_requests=len(self._sessions), proposals=self._proposals,
            drafts_from_request=self._from_request, drafts_from_shared=self._from_shared,
            drafted_tokens=self._drafted_tokens,
            request_tokens=sum(s.tokens for s in sizes), request_bytes=sum(s.bytes for s in sizes),
            shared=None if self.shared is None else self.shared.stats())

    def check_invariants(self) -> None:
        """Assert every automaton's invariants and the counters' consistency."""
        assert self._from_request + self._from_shared <= self._proposals
        for session in self._sessions.values():
            assert len(session.automaton) >= session.prompt_tokens
            session.automaton.check_invariants()
        if self.shared is not None:
            self.shared.check_invariants()

    def _session(self, request_id: Hashable) -> _Session:
        try:
            return self._sessions[request_id]
        except KeyError:
            raise KeyError(f"request {request_id!r} is not active") from None

    def _append(self, session: _Session, tokens: np.ndarray) -> None:
        session.automaton.extend(tokens)
        if self.shared is not None and tokens.shape[0]:
            self.shared.advance(session.cursors, tokens, session.automaton,
                                self.config.rematch_tokens)

    def _sources(self, session: _Session) -> list[tuple[SuffixAutomaton, Cursor, DraftSource]]:
        sources = [(session.automaton, session.automaton.repeated_suffix(), DraftSource.REQUEST)]
        if self.shared is not None:
            sources += [(a, c, DraftSource.SHARED) for a, c in self.shared.live(session.cursors)]
        return sources
