"""Speculative-decoding accounting: tau, acceptance, coverage and per-position acceptance."""

from __future__ import annotations

import attrs


@attrs.frozen(kw_only=True)
class SpecMetricsStats:
    """A snapshot of `SpecMetrics`; ratios are 0 when their denominator is 0."""

    steps: int
    """Verification steps (engine decode steps of the requests observed)."""
    draft_steps: int
    """Steps that verified a non-empty draft."""
    drafted_tokens: int
    accepted_tokens: int
    emitted_tokens: int
    """Tokens produced: accepted drafts plus one bonus token per step (less at a sequence end)."""
    accepted_by_position: tuple[float, ...]
    """Entry ``i``: share of drafts with a token at position ``i`` whose first ``i + 1`` were accepted."""

    @property
    def tau(self) -> float:
        """Tokens per step, ``emitted / steps`` (1.0 = no speculation)."""
        return self.emitted_tokens / self.steps if self.steps else 0.0

    @property
    def tau_d(self) -> float:
        """``1 + accepted / draft_steps``: vLLM's "mean acceptance length"."""
        return 1 + self.accepted_tokens / self.draft_steps if self.draft_steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        """``accepted / drafted``."""
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def coverage(self) -> float:
        """``draft_steps / steps``: how often there was a draft at all."""
        return self.draft_steps / self.steps if self.steps else 0.0


@attrs.define(eq=False, kw_only=True)
class SpecMetrics:
    """Counts every recorded verification exactly; per-position shares up to ``max_positions``."""

    max_positions: int = 64
    """Draft positions tracked individually."""
    _steps: int = attrs.field(init=False, default=0)
    _draft_steps: int = attrs.field(init=False, default=0)
    _drafted: int = attrs.field(init=False, default=0)
    _accepted: int = attrs.field(init=False, default=0)
    _emitted: int = attrs.field(init=False, default=0)
    _offered_at: list[int] = attrs.field(init=False, repr=False)
    _accepted_at: list[int] = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.max_positions < 1:
            raise ValueError(f"max_positions must be >= 1, got {self.max_positions!r}")
        self._offered_at = [0] * self.max_positions
        self._accepted_at = [0] * self.max_positions

    def record(self, drafted_tokens: int, accepted_tokens: int,
               emitted_tokens: int | None = None) -> None:
        """Record one verification step; ``emitted_tokens`` defaults to ``accepted + 1``."""
        if not 0 <= accepted_tokens <= drafted_tokens:
            raise ValueError(f"need 0 <= accepted_tokens <= drafted_tokens, got "
                             f"{accepted_tokens!r} > {drafted_tokens!r}")
        emitted = accepted_tokens + 1 if emitted_tokens is None else emitted_tokens
        if not accepted_tokens <= emitted <= accepted_tokens + 1:
            raise ValueError(f"emitted_tokens must be accepted or accepted + 1, got {emitted!r}")
        self._steps += 1
        self._emitted += emitted
        if drafted_tokens:
            self._draft_steps += 1
            self._drafted += drafted_tokens
            self._accepted += accepted_tokens
            for i in range(min(drafted_tokens, self.max_positions)):
                self._offered_at[i] += 1
                self._accepted_at[i] += i < accepted_tokens

    def stats(self) -> SpecMetricsStats:
        """Counters since construction."""
        by_position = tuple(a / o for a, o in zip(self._accepted_at, self._offered_at, strict=True)
                            if o)
        return SpecMetricsStats(steps=self._steps, draft_steps=self._draft_steps,
                                drafted_tokens=self._drafted, accepted_tokens=self._accepted,
                                emitted_tokens=self._emitted, accepted_by_position=by_position)

    def check_invariants(self) -> None:
        """Assert the counters are consistent."""
        assert self._draft_steps <= self._steps
        assert self._accepted <= self._drafted
        assert self._accepted <= self._emitted <= self._accepted + self._steps
        assert all(a <= o for a, o in zip(self._accepted_at, self._offered_at, strict=True))
