"""`TighterArrivals`: the prefill later arrivals of tighter classes will put ahead.

Under earliest-deadline-first a request of a loose class is served after every request of a
tighter class that arrives before its place in the order less that class's target: requests
not yet admitted, so not in the plan, when it is judged. While tighter classes keep arriving, a
plan of the admitted work alone predicts the loose request's first token too early, by up to
the gap between the two targets (a 2 s class behind a stream of 0.5 s requests is served about
1.5 s after it arrived on a saturated engine, however idle the plan looked).
`TighterArrivals` records the prefill admitted in each class over the last ``memory_s``
seconds and expects it to go on at that rate: the work ahead of a place ``p`` at ``now`` is,
over the classes with target ``t``, ``rate(class) * max(0, p - t - now)`` (a request's own
class and looser ones add nothing, since their later arrivals rank after it; with a fairness
lead its own class's do not), or what of it arrives within a wait, for `edf_lateness`: on an
engine with room a request is served before anything arrives, on a saturated one after every
arrival up to its turn. The requests themselves are counted the same way (`arriving`):
each takes a running slot before the request, so on an engine whose slots are the limit, not
its prefill rate, the loose request still waits for its turn.

Guarantees: the expected work and requests are never negative, are 0 with nothing admitted in
the last ``memory_s``, and never fall as the place or the wait grows. Reads (`arriving`, `rate`,
`request_rate`) do not change the state. Time is a parameter
(``now``, seconds).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping

import attrs

from policies.validators import finite_positive


@attrs.define(eq=False, kw_only=True)
class TighterArrivals:
    """Prefill work admitted per class over ``memory_s``, as the rate later arrivals keep."""

    ttft_s: Mapping[str, float] = attrs.field(converter=dict)
    """Class -> its first-token target (seconds)."""
    memory_s: float = attrs.field(validator=finite_positive)
    """The window the rate is measured over."""

    _admitted: dict[str, deque[tuple[float, float]]] = attrs.field(init=False, factory=dict,
                                                                   repr=False)
    """Class -> ``(when, prefill work)`` of its admissions in the window, oldest first."""
    _sums: dict[str, float] = attrs.field(init=False, factory=dict, repr=False)
    """Class -> the work in its window."""

    def __attrs_post_init__(self) -> None:
        for name, target in self.ttft_s.items():
            if isinstance(target, bool) or not isinstance(target, int | float) or not (
                    0 < target < math.inf):
                raise ValueError(f"ttft_s[{name!r}] must be a finite number > 0, "
                                 f"got {target!r}")

    def observe(self, slo_class: str, work: float, now: float) -> None:
        """A request of ``slo_class`` carrying ``work`` prefill tokens was admitted at ``now``
        (a class without a target is ignored)."""
        if slo_class not in self.ttft_s:
            return
        window = self._admitted.setdefault(slo_class, deque())
        window.append((now, max(0.0, work)))
        self._sums[slo_class] = self._sums.get(slo_class, 0.0) + max(0.0, work)
        while window and window[0][0] <= now - self.memory_s:
            self._sums[slo_class] -= window.popleft()[1]
        if not window:
            del self._admitted[slo_class], self._sums[slo_class]

    def rate(self, slo_class: str, now: float) -> float:
        """Prefill tokens per second admitted in ``slo_class`` over the last ``memory_s``."""
        return self._rates(slo_class, now)[0]

    def request_rate(self, slo_class: str, now: float) -> float:
        """Requests per second admitted in ``slo_class`` over the last ``memory_s``."""
        return self._rates(slo_class, now)[1]

    def _rates(self, slo_class: str, now: float) -> tuple[float, float]:
        window = self._admitted.get(slo_class)
        if not window:
            return 0.0, 0.0
        cutoff = now - self.memory_s
        total, count = self._sums[slo_class], len(window)
        for when, work in window:
            if when > cutoff:
                break
            total -= work
            count -= 1
        return max(0.0, total) / self.memory_s, count / self.memory_s

    def arriving(self, place: float, now: float) -> Callable[[float], tuple[float, float]]:
        """``within_s -> (prefill tokens, requests)`` expected to be admitted in the next
        ``within_s`` seconds and ranked ahead of a request at ``place`` in the order at
        ``now`` (each request wants a running slot before it), as `edf_lateness` asks it
        while it settles a wait: the rates are read once."""
        rates = [(place - target - now, *self._rates(cls, now))
                 for cls, target in self.ttft_s.items() if place - target - now > 0]

        def within(within_s: float) -> tuple[float, float]:
            tokens = requests = 0.0
            for span_s, token_rate, request_rate in rates:
                tokens += token_rate * min(span_s, within_s)
                requests += request_rate * min(span_s, within_s)
            return tokens, requests

        return within

    def check_invariants(self) -> None:
        """Each window's sum matches its entries, and entries are in time order."""
        assert set(self._admitted) == set(self._sums)
        for cls, window in self._admitted.items():
            assert window and cls in self.ttft_s
            assert math.isclose(self._sums[cls], sum(w for _, w in window), rel_tol=1e-9,
                                abs_tol=1e-6)
            times = [when for when, _ in window]
            assert times == sorted(times)
