"""`OutputLengths`: how many more tokens a request will generate, learned from finished ones.

Output lengths are heavy-tailed (reasoning models' answers run from tens of tokens to tens
of thousands), so the mean alone misjudges a request that has already generated more than
it: it would be due to finish *now*, for ever, while in a heavy tail the longer a request
has run, the longer it is likely to run on. `OutputLengths` keeps the lengths of the last
``memory`` finished requests and answers the mean residual life: given ``g`` tokens
generated, the mean of ``L - g`` over the remembered lengths ``L > g`` (each cut at the
request's own ``max_tokens``). Where no remembered request ran longer, it expects as many
again as it has generated (the Lindy estimate: nothing seen bounds it); before any request
has finished, the rest of ``default_tokens``, and as many again once past them (a request
one token in is not about to finish because nothing has finished yet).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from itertools import accumulate

import attrs

from policies.validators import at_least

DEFAULT_OUTPUT_TOKENS = 256
"""The expected output before any request has finished."""
OUTPUT_MEMORY_REQUESTS = 200
"""How many finished requests' lengths are remembered (the most recent)."""


@attrs.define(eq=False, kw_only=True)
class OutputLengths:
    """The output lengths of the last ``memory`` finished requests.

    Guarantees: `remaining` is never negative, never more than ``limit - generated``, and
    never less than half ``default_tokens`` (within ``limit``) before anything finished.
    `observe` is O(``memory``), `remaining` O(log ``memory``).
    """

    memory: int = attrs.field(default=OUTPUT_MEMORY_REQUESTS, validator=at_least(1))
    default_tokens: int = attrs.field(default=DEFAULT_OUTPUT_TOKENS, validator=at_least(1))

    _recent: deque[int] = attrs.field(init=False, factory=deque, repr=False)
    _sorted: list[int] = attrs.field(init=False, factory=list, repr=False)
    _prefix: list[int] | None = attrs.field(init=False, default=None, repr=False)
    """Prefix sums of ``_sorted`` (``[0, s0, s0 + s1, ...]``), rebuilt when read after a change."""

    def observe(self, tokens: int) -> None:
        """A request finished after generating ``tokens`` (> 0)."""
        if tokens <= 0:
            return
        self._recent.append(tokens)
        bisect.insort(self._sorted, tokens)
        if len(self._recent) > self.memory:
            del self._sorted[bisect.bisect_left(self._sorted, self._recent.popleft())]
        self._prefix = None

    @property
    def observations(self) -> int:
        """How many lengths are remembered."""
        return len(self._recent)

    def mean(self) -> float:
        """The mean remembered length (``default_tokens`` before any)."""
        return self._sums()[-1] / len(self._sorted) if self._sorted else float(self.default_tokens)

    def remaining(self, generated: float, limit: float = math.inf) -> float:
        """Expected tokens still to come from a request that has generated ``generated`` and
        stops at ``limit`` at the latest."""
        generated, first, longer = self._longer(generated)
        room = max(limit - generated, 0.0)
        if not self._sorted:  # the prior, or as many again once past it
            return min(max(self.default_tokens - generated, generated), room)
        if longer == 0:
            return min(max(generated, 1.0), room)
        sums = self._sums()
        total = sums[-1] - sums[first]
        if limit < math.inf:  # each length cut at the limit: min(L, limit)
            cut = bisect.bisect_right(self._sorted, limit, lo=first)
            total = sums[cut] - sums[first] + (len(self._sorted) - cut) * limit
        return min(max(total / longer - generated, 0.0), room)

    def remaining_quantiles(self, generated: float, n: int, limit: float = math.inf
                            ) -> list[float]:
        """``n`` equally likely remaining outputs of a request that has generated
        ``generated``: the midpoint quantiles of ``L - generated`` over the remembered
        lengths ``L > generated``, each cut at ``limit`` (where `remaining` has no longer
        length to go by, ``n`` times its answer)."""
        generated, first, longer = self._longer(generated)
        if longer == 0:
            return [self.remaining(generated, limit)] * n
        room = max(limit - generated, 0.0)
        return [min(self._sorted[first + int((j + 0.5) * longer / n)] - generated, room)
                for j in range(n)]

    def _longer(self, generated: float) -> tuple[float, int, int]:
        """``(generated >= 0, index of the first remembered length above it, how many are)``."""
        generated = max(generated, 0.0)
        first = bisect.bisect_right(self._sorted, generated)
        return generated, first, len(self._sorted) - first

    def _sums(self) -> list[int]:
        if self._prefix is None:
            self._prefix = [0, *accumulate(self._sorted)]
        return self._prefix

    def check_invariants(self) -> None:
        """The sorted copy holds exactly the remembered lengths."""
        assert len(self._recent) <= self.memory
        assert self._sorted == sorted(self._recent)
