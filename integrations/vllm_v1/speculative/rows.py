"""Which request is in which row of vLLM's input batch, from the token ids alone.

vLLM's ``custom_class`` proposer gets, per step, the batch's token matrix and lengths but no
request ids; rows are reassigned as requests finish and the batch is condensed. `BatchRows`
recognises a request by a signature of its context (its first tokens, its length so far and the
tokens just before that length), follows it across rows, and reports requests that have left
the batch after a grace period (a request skipped for a step leaves the batch and comes back).

A row whose signature matches two requests can only happen when both contexts agree on every
checked token; then either drafter is a valid one to use (drafts are verified by the target
model, so a wrong guess costs speed, never correctness).
"""

from __future__ import annotations

import attrs
import numpy as np

HEAD_TOKENS = 16
"""Tokens at the start of a context that identify a request."""
TAIL_TOKENS = 8
"""Tokens before the last known position that must still be there."""


@attrs.define(eq=False, kw_only=True)
class TrackedRequest:
    """A request the proposer is drafting for."""

    key: int
    """The drafter's request id."""
    seen_tokens: int
    """Context tokens already given to the drafter."""
    head: bytes
    """The first (up to `HEAD_TOKENS`) tokens of the context when the request was first seen."""
    tail: bytes
    """The `TAIL_TOKENS` tokens before ``seen_tokens``."""
    drafted_tokens: int = 0
    """Length of the draft returned at the last step (0: none)."""
    idle_steps: int = 0
    """Steps since the request was last in the batch."""

    def matches(self, context: np.ndarray) -> bool:
        """Whether ``context`` continues this request's context."""
        n = self.seen_tokens
        return (context.shape[0] >= n
                and context[:len(self.head) // context.itemsize].tobytes() == self.head
                and context[max(0, n - TAIL_TOKENS):n].tobytes() == self.tail)

    def advance(self, context: np.ndarray) -> np.ndarray:
        """The tokens of ``context`` not seen yet; afterwards all of it counts as seen."""
        new = context[self.seen_tokens:]
        self.seen_tokens = context.shape[0]
        self.tail = context[max(0, context.shape[0] - TAIL_TOKENS):].tobytes()
        return new


@attrs.define(eq=False, kw_only=True)
class BatchRows:
    """Maps batch rows to `TrackedRequest` objects step after step."""

    grace_steps: int = 8
    """Steps a request may be absent from the batch before it counts as finished."""
    _by_row: dict[int, TrackedRequest] = attrs.field(init=False, factory=dict)
    _unclaimed: dict[int, TrackedRequest] = attrs.field(init=False, factory=dict)
    _detached: list[TrackedRequest] = attrs.field(init=False, factory=list)
    _next_key: int = attrs.field(init=False, default=0)

    def begin_step(self) -> None:
        """Start a step: every request is unclaimed until `claim` finds it again."""
        self._unclaimed, self._by_row = self._by_row, {}

    def claim(self, row: int, context: np.ndarray) -> tuple[TrackedRequest, bool]:
        """The request in ``row`` given its ``context``, and whether it is new.

        O(1) when the row holds the same request as last step; otherwise a scan of the
        unclaimed and detached requests.
        """
        tracked = self._unclaimed.get(row)
        if tracked is not None and tracked.matches(context):
            del self._unclaimed[row]
        else:
            tracked = self._take_match(context)
        is_new = tracked is None
        if tracked is None:
            tracked = TrackedRequest(key=self._next_key, seen_tokens=0,
                                     head=context[:HEAD_TOKENS].tobytes(), tail=b"")
            self._next_key += 1
        tracked.idle_steps = 0
        self._by_row[row] = tracked
        return tracked, is_new

    def end_step(self) -> list[TrackedRequest]:
        """Finish a step; returns the requests absent for more than ``grace_steps`` steps."""
        self._detached.extend(self._unclaimed.values())
        self._unclaimed = {}
        for tracked in self._detached:
            tracked.idle_steps += 1
            tracked.drafted_tokens = 0
        gone = [t for t in self._detached if t.idle_steps > self.grace_steps]
        self._detached = [t for t in self._detached if t.idle_steps <= self.grace_steps]
        return gone

    def _take_match(self, context: np.ndarray) -> TrackedRequest | None:
        for row, tracked in self._unclaimed.items():
            if tracked.matches(context):
                del self._unclaimed[row]
                return tracked
        for i, tracked in enumerate(self._detached):
            if tracked.matches(context):
                del self._detached[i]
                return tracked
        return None

    @property
    def tracked(self) -> int:
        """Requests held, in the batch or within their grace period."""
        return len(self._by_row) + len(self._unclaimed) + len(self._detached)
