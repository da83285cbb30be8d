"""`ConcurrencyLimit`: how many requests a server takes at once, learned from their lateness.

Past its capacity a server serves every request late, and the part of the delay that is late is
often outside anything a model of the engine sees (an API server that parses, tokenizes and
streams for every request on shared cores). The limit learns from outcomes instead: each
finished request's first token (or stream) is reported on time or late against its own target,
and the limit moves by AIMD, as TCP's congestion window does:

- **late**, beyond the late budget: the limit falls to ``backoff`` times the requests in flight
  then (or the limit, if lower): multiplicative decrease. A late report counts only while the
  share of late reports among recent ones (an exponentially weighted mean over about
  ``late_memory`` reports) is above ``late_budget``: a server that promises 95 % of requests
  in SLO may be late now and then without refusing anyone for it. One decrease per round, as
  TCP decreases once per round trip: a late report counts only once a request's mean time in
  flight has passed since the last decrease and if it entered after it, since until then
  lateness still shows the load the last decrease answered;
- **on time** while the limit binds (at least half of it in flight): the limit grows by
  ``1 / limit``, about one per limit's worth of on-time reports: additive increase.

Until the first late report nothing is refused (the limit starts at ``max_limit``), so an
engine that is never late never sees the limit. Time is a parameter (``now``, seconds).

With ``weights`` (tenant -> weight, an unlisted tenant weighs 1), teams share the limit: a
tenant below its weighted share of the limit among the tenants with requests in flight (itself
included) is admitted even when the limit is reached, so a noisy tenant holding the places
cannot lock a quiet one out; the noisy tenant's own requests are refused until the total falls
below the limit. Work-conserving: a tenant alone may take every place.

Guarantees: the limit stays within ``[min_limit, max_limit]``; `acquire` admits when fewer
than ``floor(limit)`` requests are in flight (without ``weights``: exactly then; with them,
also when the tenant is below its share), and an admitted request stays counted until its
`release`; a refusal carries the reason ``concurrency_limit`` and a Retry-After of the mean
time a request holds its place over the limit (when a place frees up, on average).

`ClassConcurrencyLimits` keeps one such limit per SLO class, nested by first-token target, for
a server that serves the earliest first-token deadline first: a class's limit counts the
requests in flight of its own class and of every class with a target no longer than its own
(the ones served ahead of it), falls on its own class's lateness only, and grows on the
on-time reports of every request it counts. A tight class's lateness then lowers its own
limit, not a loose class's, and a loose class's requests may fill the places the tight class
leaves. Growing on the tighter classes' reports keeps a loose class from starving: once its
limit fell below what the tight classes keep in flight, it would otherwise admit none of its
own requests, hear no report, and never grow back.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import attrs

from policies.admission.controller import AdmissionDecision
from policies.validators import int_at_least

REASON = "concurrency_limit"
"""The rejection reason of a request refused by the limit."""


def _weights(_instance: object, attribute: attrs.Attribute,
             value: Mapping[str, float] | None) -> None:
    if value is None:
        return
    for tenant, weight in value.items():
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not (
                0 < weight < math.inf):
            raise ValueError(f"{attribute.name}[{tenant!r}] must be a finite number > 0, "
                             f"got {weight!r}")


def _backoff(_instance: object, attribute: attrs.Attribute, value: float) -> None:
    if not 0 < value < 1:
        raise ValueError(f"{attribute.name} must be in (0, 1), got {value!r}")


def _share(_instance: object, attribute: attrs.Attribute, value: float) -> None:
    if not 0 <= value < 1:
        raise ValueError(f"{attribute.name} must be in [0, 1), got {value!r}")


@attrs.frozen(kw_only=True)
class ConcurrencyLimitStats:
    """A snapshot of a `ConcurrencyLimit`."""

    limit: int
    """Requests that may be in flight at once now (``max_limit`` until the first decrease)."""
    in_flight: int
    """Requests admitted and not yet released."""
    admitted: int
    rejected: int
    on_time: int
    """On-time reports."""
    late: int
    """Late reports (counted whether or not they lowered the limit)."""
    decreases: int
    """Times the limit fell."""
    late_share: float
    """The share of late reports among recent ones (weighted over ``late_memory``)."""


@attrs.define(eq=False, kw_only=True)
class ConcurrencyLimit:
    """An AIMD limit on requests in flight, driven by on-time / late reports."""

    min_limit: int = attrs.field(default=1, validator=int_at_least(1))
    """The limit never falls below this."""
    max_limit: int = attrs.field(default=4096, validator=int_at_least(1))
    """The limit before the first late report, and its ceiling."""
    backoff: float = attrs.field(default=0.9, validator=_backoff)
    """The share of the load in flight kept after a late report."""
    weights: Mapping[str, float] | None = attrs.field(default=None, validator=_weights)
    """Tenant -> weight in sharing the limit (unlisted: 1); None: tenants are not told apart."""
    late_budget: float = attrs.field(default=0.05, validator=_share)
    """The share of late reports tolerated without a decrease (0: every late report counts)."""
    late_memory: int = attrs.field(default=20, validator=int_at_least(1))
    """About how many recent reports the late share weighs."""

    _limit: float = attrs.field(init=False, default=0.0, repr=False)
    _in_flight: int = attrs.field(init=False, default=0, repr=False)
    _tenants: dict[str, int] = attrs.field(init=False, factory=dict, repr=False)
    """Tenant -> its requests in flight (with ``weights``; none at 0)."""
    _decreased_s: float = attrs.field(init=False, default=-math.inf, repr=False)
    _hold_s: float | None = attrs.field(init=False, default=None, repr=False)
    """Exponentially weighted mean of how long admitted requests stayed in flight."""
    _admitted: int = attrs.field(init=False, default=0, repr=False)
    _rejected: int = attrs.field(init=False, default=0, repr=False)
    _on_time: int = attrs.field(init=False, default=0, repr=False)
    _late: int = attrs.field(init=False, default=0, repr=False)
    _decreases: int = attrs.field(init=False, default=0, repr=False)
    _late_share: float = attrs.field(init=False, default=0.0, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.min_limit > self.max_limit:
            raise ValueError(f"min_limit ({self.min_limit}) must be <= max_limit "
                             f"({self.max_limit})")
        self._limit = float(self.max_limit)

    @property
    def limit(self) -> int:
        """Requests that may be in flight at once now."""
        return int(self._limit)

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def share(self, tenant: str) -> float:
        """``tenant``'s weighted share of the limit among the tenants in flight and itself
        (the whole limit without ``weights``)."""
        if self.weights is None:
            return float(self.limit)
        active = {*self._tenants, tenant}
        total = sum(self.weights.get(name, 1.0) for name in active)
        return self.limit * self.weights.get(tenant, 1.0) / total

    def acquire(self, tenant: str = "") -> AdmissionDecision:
        """Admit (and count in flight) while fewer than `limit` are in flight, or while
        ``tenant`` is below its `share`; else refuse."""
        if self._in_flight >= self.limit and (
                self.weights is None or self._tenants.get(tenant, 0) >= self.share(tenant)):
            self._rejected += 1
            return AdmissionDecision.reject(REASON, self.retry_after_s())
        self._admitted += 1
        self.hold(tenant)
        return AdmissionDecision.accept()

    def hold(self, tenant: str = "") -> None:
        """Count a request of ``tenant`` in flight without judging it (one another limit
        admitted, served ahead of this limit's requests); `release` it as any other."""
        self._in_flight += 1
        if self.weights is not None:
            self._tenants[tenant] = self._tenants.get(tenant, 0) + 1

    def release(self, held_s: float, tenant: str = "") -> None:
        """An admitted request of ``tenant`` left after ``held_s`` seconds in flight.

        Raises:
            ValueError: nothing (of ``tenant``, with ``weights``) is in flight, or ``held_s``
                is negative or not finite.
        """
        if self._in_flight == 0 or (self.weights is not None and tenant not in self._tenants):
            raise ValueError(f"release() without a request in flight (tenant {tenant!r})")
        if not 0 <= held_s < math.inf:
            raise ValueError(f"held_s must be finite and >= 0, got {held_s!r}")
        self._in_flight -= 1
        if self.weights is not None:
            self._tenants[tenant] -= 1
            if not self._tenants[tenant]:
                del self._tenants[tenant]
        self._hold_s = held_s if self._hold_s is None else 0.9 * self._hold_s + 0.1 * held_s

    def report(self, *, late: bool, entered_s: float, now: float) -> None:
        """A request that entered at ``entered_s`` was on time or ``late`` (at ``now``)."""
        self._late_share += (float(late) - self._late_share) / self.late_memory
        if late:
            self._late += 1
            if self._late_share > self.late_budget and entered_s >= self._decreased_s and (
                    now >= self._decreased_s + (self._hold_s or 0.0)):
                load = min(self._limit, max(self._in_flight, self.min_limit))
                self._limit = max(float(self.min_limit), load * self.backoff)
                self._decreased_s = now
                self._decreases += 1
            return
        self._on_time += 1
        self.grow()

    def grow(self) -> None:
        """Additive increase: ``1 / limit`` while the limit binds (at least half of it in
        flight). `report` calls it for each on-time report; a nesting calls it for an on-time
        request the limit counts but does not learn lateness from."""
        if self._in_flight >= self._limit / 2:
            self._limit = min(float(self.max_limit), self._limit + 1 / self._limit)

    def retry_after_s(self) -> float:
        """When a place frees up, on average: the mean time in flight over the limit (0
        before any request was released)."""
        return (self._hold_s or 0.0) / max(self.limit, 1)

    def stats(self) -> ConcurrencyLimitStats:
        """A frozen snapshot (see `ConcurrencyLimitStats`)."""
        return ConcurrencyLimitStats(limit=self.limit, in_flight=self._in_flight,
                                     admitted=self._admitted, rejected=self._rejected,
                                     on_time=self._on_time, late=self._late,
                                     decreases=self._decreases, late_share=self._late_share)

    def check_invariants(self) -> None:
        """The limit within its bounds; counts non-negative; the tenants' counts add up to
        the requests in flight."""
        assert self.min_limit <= self._limit <= self.max_limit
        assert self._in_flight >= 0
        assert all(count > 0 for count in self._tenants.values())
        assert self.weights is None or sum(self._tenants.values()) == self._in_flight
        assert min(self._rejected, self._on_time, self._late, self._decreases) >= 0
        assert self._decreases <= self._late
        assert 0 <= self._late_share <= 1


@attrs.define(eq=False, kw_only=True)
class ClassConcurrencyLimits:
    """A `ConcurrencyLimit` per first-token target, nested (see the module); classes with
    the same target share one."""

    ttft_s: Mapping[str, float]
    """Class -> its first-token target (seconds): the nesting order."""
    limit: Callable[[], ConcurrencyLimit] = ConcurrencyLimit
    """Makes each target's limit (all alike)."""

    _limits: dict[float, ConcurrencyLimit] = attrs.field(init=False, repr=False)
    """Target -> its limit, shortest first."""
    _by_class: dict[str, ConcurrencyLimit] = attrs.field(init=False, repr=False)
    _counting: dict[float, tuple[ConcurrencyLimit, ...]] = attrs.field(init=False, repr=False)
    """Target -> the limits that count its requests: its own first, then the longer ones."""

    def __attrs_post_init__(self) -> None:
        if not self.ttft_s:
            raise ValueError("ttft_s must name at least one class")
        for name, target in self.ttft_s.items():
            if isinstance(target, bool) or not isinstance(target, int | float) or not (
                    0 < target < math.inf):
                raise ValueError(f"ttft_s[{name!r}] must be a finite number > 0, "
                                 f"got {target!r}")
        self._limits = {target: self.limit() for target in sorted(set(self.ttft_s.values()))}
        self._by_class = {name: self._limits[target] for name, target in self.ttft_s.items()}
        self._counting = {target: tuple(limit for other, limit in self._limits.items()
                                        if other >= target) for target in self._limits}

    @property
    def limits(self) -> Mapping[str, ConcurrencyLimit]:
        """Class -> its limit (one object for classes with the same target)."""
        return self._by_class

    @property
    def in_flight(self) -> int:
        """Requests admitted and not yet released, every class."""
        return next(reversed(self._limits.values())).in_flight

    def acquire(self, slo_class: str, tenant: str = "") -> AdmissionDecision:
        """Admit by ``slo_class``'s limit; an admitted request is then counted in flight by
        the limit of every longer target too."""
        target = self.ttft_s[slo_class]
        decision = self._limits[target].acquire(tenant)
        if decision.admitted:
            for other in self._counting[target][1:]:
                other.hold(tenant)
        return decision

    def release(self, slo_class: str, held_s: float, tenant: str = "") -> None:
        """An admitted request of ``slo_class`` left after ``held_s`` seconds in flight."""
        for limit in self._counting[self.ttft_s[slo_class]]:
            limit.release(held_s, tenant)

    def report(self, slo_class: str, *, late: bool, entered_s: float, now: float) -> None:
        """A request of ``slo_class`` was on time or ``late``: its target's limit learns; on
        time, every longer target's limit, which counts it, grows as well."""
        own, *longer = self._counting[self.ttft_s[slo_class]]
        own.report(late=late, entered_s=entered_s, now=now)
        if not late:
            for limit in longer:
                limit.grow()

    def stats(self) -> dict[str, ConcurrencyLimitStats]:
        """Class -> a snapshot of its limit."""
        return {name: limit.stats() for name, limit in self.limits.items()}

    def check_invariants(self) -> None:
        """Each limit's own invariants; a longer target's limit counts at least the requests
        a shorter one counts."""
        counts = [limit.in_flight for limit in self._limits.values()]
        assert counts == sorted(counts)
        for limit in self._limits.values():
            limit.check_invariants()
