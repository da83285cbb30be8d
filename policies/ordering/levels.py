"""Multi-level feedback queue levels: demotion by service, promotion on preemption.

`MLFQ` assigns each request a level, 0 being the most urgent. With the default
quanta ``(128, 512, 2048, inf)`` the levels are interactive, standard, batch
and background. A request's level is a pure function of its prompt length,
the tokens it has been scheduled (its *service*, prefill and decode) and the
number of times it was preempted:

    start    = first level whose quantum holds the whole prompt   (0 without skip-join)
    by_usage = first level i with service < quanta[0] + ... + quanta[i]
    level    = max(0, max(start, by_usage) - preemptions)

Levels beyond the last are clamped to the last. Ordering requests within a
level (FCFS, or any ranking) is the integration's job: it keys its queues by
``(level, rank_key, sequence)``.
"""

from __future__ import annotations

import bisect
import itertools
import math
from typing import ClassVar

import attrs

from policies.needs import Needs
from policies.views import RequestView

DEFAULT_QUANTA_TOKENS: tuple[float, ...] = (128, 512, 2048, math.inf)
LEVEL_NAMES: tuple[str, ...] = ("interactive", "standard", "batch", "background")
"""Names of the default levels, most urgent first."""


def _quanta(_instance: object, attribute: attrs.Attribute, value: tuple[float, ...]) -> None:
    name = attribute.name
    if not value:
        raise ValueError(f"{name} must not be empty")
    if any(math.isnan(q) for q in value):
        raise ValueError(f"{name} must not contain NaN, got {value!r}")
    if any(q <= 0 for q in value):
        raise ValueError(f"{name} must be positive, got {value!r}")
    if any(b <= a for a, b in itertools.pairwise(value)):
        raise ValueError(
            f"{name} must be strictly increasing (only the last may be inf), got {value!r}"
        )


@attrs.frozen(kw_only=True)
class MLFQStats:
    """A snapshot of an `MLFQ`'s tracked requests and level changes since construction."""

    requests_per_level: tuple[int, ...]
    """Tracked requests at each level, most urgent first."""
    demotions: int
    """Level steps lost to service (a jump over two levels counts 2)."""
    promotions: int
    """Level steps gained by preemptions (a preemption at level 0 gains none)."""


@attrs.define(kw_only=True)
class _Service:
    prompt_tokens: int
    service_tokens: int = 0
    preemptions: int = 0
    level: int = 0
    relevel_at_tokens: float = 0.0
    """Service at which the level by usage next changes (0: not computed yet)."""


@attrs.define(eq=False, kw_only=True)
class MLFQ:
    """A request's level only worsens with service and improves by one per preemption.

    See the module docstring for the level formula. Untracked requests (not
    yet admitted) are at their start level; ``on_scheduled`` and
    ``on_preempted`` start tracking a request they have not seen.
    """

    needs: ClassVar[Needs] = Needs(lifecycle=True)

    quanta_tokens: tuple[float, ...] = attrs.field(
        default=DEFAULT_QUANTA_TOKENS, converter=tuple, validator=_quanta
    )
    """Service each level grants before demotion, most urgent first; the last may be inf."""
    skip_join: bool = True
    """Start a request at the first level whose quantum holds its prompt (else at level 0)."""

    _bounds_tokens: tuple[float, ...] = attrs.field(init=False, repr=False)
    _requests: dict[str, _Service] = attrs.field(init=False, repr=False, factory=dict)
    _per_level: list[int] = attrs.field(init=False, repr=False)
    _demotions: int = attrs.field(init=False, repr=False, default=0)
    _promotions: int = attrs.field(init=False, repr=False, default=0)

    def __attrs_post_init__(self) -> None:
        self._bounds_tokens = tuple(itertools.accumulate(self.quanta_tokens))
        self._per_level = [0] * len(self.quanta_tokens)

    @property
    def num_levels(self) -> int:
        """How many levels there are."""
        return len(self.quanta_tokens)

    # -- pure level arithmetic -------------------------------------------------

    def start_level(self, prompt_tokens: int) -> int:
        """Skip-join level: the first whose quantum holds ``prompt_tokens`` (0 without skip-join)."""
        if not self.skip_join:
            return 0
        return min(bisect.bisect_left(self.quanta_tokens, prompt_tokens), self.num_levels - 1)

    def level_for(self, prompt_tokens: int, service_tokens: int, preemptions: int) -> int:
        """The level of a request with this prompt, service and preemption count."""
        by_usage = self._level_by_usage(service_tokens)
        return max(0, max(self.start_level(prompt_tokens), by_usage) - preemptions)

    def _level_by_usage(self, service_tokens: float) -> int:
        return min(bisect.bisect_right(self._bounds_tokens, service_tokens), self.num_levels - 1)

    def level(self, request: RequestView) -> int:
        """``request``'s current level, 0 being the most urgent."""
        state = self._requests.get(request.request_id)
        return state.level if state is not None else self.start_level(request.prompt_tokens)

    # -- events ----------------------------------------------------------------

    def on_scheduled(self, request: RequestView, tokens: int, now: float) -> None:
        """Add ``tokens`` (prefill or decode) to the request's service; it may be demoted.

        O(1) until the service crosses the next level bound (the level is only
        recomputed then). Only ``request_id`` and ``prompt_tokens`` of the view are read.

        Raises:
            ValueError: ``tokens`` is negative.
        """
        if tokens < 0:
            raise ValueError(f"tokens must be >= 0, got {tokens!r}")
        state = self._requests.get(request.request_id) or self._track(request)
        state.service_tokens += tokens
        if state.service_tokens >= state.relevel_at_tokens:
            self._relevel(state)

    def on_preempted(self, request: RequestView) -> None:
        """Promote the request by one level (none at level 0)."""
        state = self._track(request)
        state.preemptions += 1
        self._relevel(state)

    def on_admitted(self, request: RequestView, now: float) -> None:
        """Start tracking ``request`` at its start level."""
        self._track(request)

    def on_first_scheduled(self, request: RequestView, now: float) -> None:
        """Nothing to do: service is counted by ``on_scheduled``."""

    def on_finished(self, request: RequestView, now: float) -> None:
        """Forget ``request``."""
        state = self._requests.pop(request.request_id, None)
        if state is not None:
            self._per_level[state.level] -= 1

    # -- inspection ------------------------------------------------------------

    def stats(self) -> MLFQStats:
        """A frozen snapshot of per-level counts and level changes."""
        return MLFQStats(
            requests_per_level=tuple(self._per_level),
            demotions=self._demotions,
            promotions=self._promotions,
        )

    def check_invariants(self) -> None:
        """Assert internal consistency (cheap; for tests and notebooks)."""
        counts = [0] * self.num_levels
        for state in self._requests.values():
            assert state.level == self.level_for(
                state.prompt_tokens, state.service_tokens, state.preemptions
            )
            by_usage = self._level_by_usage(state.service_tokens)
            assert state.relevel_at_tokens <= (
                self._bounds_tokens[by_usage] if by_usage < self.num_levels - 1 else math.inf
            ), "a level bound would be crossed without re-levelling"
            counts[state.level] += 1
        assert counts == self._per_level, (counts, self._per_level)
        assert self._demotions >= 0 and self._promotions >= 0

    # -- internals -------------------------------------------------------------

    def _track(self, request: RequestView) -> _Service:
        state = self._requests.get(request.request_id)
        if state is None:
            state = _Service(
                prompt_tokens=request.prompt_tokens, level=self.start_level(request.prompt_tokens)
            )
            self._requests[request.request_id] = state
            self._per_level[state.level] += 1
        return state

    def _relevel(self, state: _Service) -> None:
        by_usage = self._level_by_usage(state.service_tokens)
        state.relevel_at_tokens = (
            self._bounds_tokens[by_usage] if by_usage < self.num_levels - 1 else math.inf)
        new = self.level_for(state.prompt_tokens, state.service_tokens, state.preemptions)
        if new > state.level:
            self._demotions += new - state.level
        else:
            self._promotions += state.level - new
        self._per_level[state.level] -= 1
        self._per_level[new] += 1
        state.level = new
