"""Rate control: a load-adaptive token bucket that caps low-priority prefills.

A `TokenBucket` keeps one bucket of *credits* per capped request and one per
tenant. One credit pays for one prefill token scheduled. Each step a capped
request may be scheduled at most ``min(request credits, tenant credits)``
prefill tokens, so low-priority prefills yield the step's token budget to
urgent requests, which are never capped.

Refill is continuous. Its rate is set from each step's `LoadSnapshot` and is in
force until the next one:

    kv_pressure    = clamp((kv_usage - kv_pressure_start) / (kv_pressure_full - kv_pressure_start))
    queue_pressure = waiting_requests / (waiting_requests + running_requests)   (0 when both are 0)
    pressure       = max(kv_pressure, queue_pressure) while requests wait, else 0   in [0, 1]
    refill_per_s   = max_refill_per_s - pressure * (max_refill_per_s - min_refill_per_s)

so an idle engine refills at ``max_refill_per_s`` and a loaded one at
``min_refill_per_s``. Whatever the load, a bucket holds at most
``capacity_tokens`` credits and gains at most ``max_refill_per_s`` per second.
"""

from __future__ import annotations

import math
from typing import ClassVar

import attrs

from policies.needs import Needs
from policies.validators import finite_non_negative, fraction
from policies.views import LoadSnapshot, RequestView


@attrs.frozen(kw_only=True)
class TokenBucketStats:
    """A snapshot of a `TokenBucket`'s state and counters since construction."""

    requests_tracked: int
    """Capped requests that hold a bucket (dropped when they finish)."""
    tenants_tracked: int
    """Tenants that hold a bucket (dropped once idle and full again)."""
    tokens_granted: int
    """Prefill tokens scheduled to capped requests (credits spent)."""
    tokens_throttled: int
    """Sum over ``token_cap`` calls of the request's demand minus its cap, when positive.

    Demand is the request's remaining prefill, at most the step's token budget.
    """
    throttle_events: int
    """``token_cap`` calls whose cap was below the request's demand."""
    tokens_overdrawn: int
    """Prefill tokens scheduled beyond the cap in force (0 if the caller obeys caps)."""
    pressure: float
    """Load pressure in [0, 1] from the latest `LoadSnapshot` (0 before the first)."""
    refill_per_s: float
    """Refill rate in force, credits per second."""


@attrs.define(kw_only=True)
class _Bucket:
    level_tokens: float
    stamp: float
    """The policy's cumulative credit integral when ``level_tokens`` was last brought up to date."""


@attrs.define(kw_only=True)
class _RequestState:
    tenant: str
    bucket: _Bucket


@attrs.define(kw_only=True)
class _TenantState:
    bucket: _Bucket
    requests: int = 0
    reserved_tokens: int = 0


@attrs.define(eq=False, kw_only=True)
class TokenBucket:
    """Caps prefills so a request, or a tenant, never gets more than capacity + max rate * dt.

    Over any window ``[t0, t1]`` the prefill tokens granted to one capped
    request, and to all capped requests of one tenant together, are at most
    ``capacity_tokens + max_refill_per_s * (t1 - t0)``. The bound
    holds as long as the caller schedules no more than each ``token_cap`` it
    got; tokens beyond the cap are still debited (the bucket goes into debt)
    and counted in `TokenBucketStats.tokens_overdrawn`.

    Requests with ``priority <= unlimited_priority_at_most`` (vLLM: lower is
    more urgent) are never capped and spend no credits. Decode steps are never
    capped either: only steps that start before the prompt is fully computed
    (``computed_tokens < prompt_tokens``) are capped and debited.

    Within one step (one ``load.now``), the caps handed to requests of the same
    tenant are reserved against the tenant's bucket, so together they never
    exceed it; the first ``on_scheduled`` call, or a later ``load.now``, ends
    the step and releases unspent reservations.

    Buckets start full. A request's bucket is dropped when it finishes; a
    tenant's when it has no capped request left and its bucket has refilled
    (so finishing requests never resets a tenant's debt).
    """

    needs: ClassVar[Needs] = Needs(lifecycle=True)

    capacity_tokens: int = attrs.field(default=512, validator=attrs.validators.ge(1))
    """Burst: the most credits a bucket holds."""
    min_refill_per_s: float = attrs.field(default=256.0, validator=finite_non_negative)
    """Refill rate under full pressure (about 8 tokens per 30 ms step)."""
    max_refill_per_s: float = attrs.field(default=2048.0, validator=finite_non_negative)
    """Refill rate with no pressure (about 64 tokens per 30 ms step)."""
    unlimited_priority_at_most: int = -1
    """Requests this urgent or more are never capped."""
    kv_pressure_start: float = attrs.field(default=0.5, validator=fraction)
    """KV usage at which KV pressure starts rising from 0."""
    kv_pressure_full: float = attrs.field(default=0.9, validator=fraction)
    """KV usage at which KV pressure reaches 1."""

    _requests: dict[str, _RequestState] = attrs.field(init=False, repr=False, factory=dict)
    _tenants: dict[str, _TenantState] = attrs.field(init=False, repr=False, factory=dict)
    _reserved: dict[str, int] = attrs.field(init=False, repr=False, factory=dict)
    """Caps handed out in the current step and not yet settled, by request id."""
    _step_load: LoadSnapshot | None = attrs.field(init=False, repr=False, default=None)
    _now: float | None = attrs.field(init=False, repr=False, default=None)
    _credit: float = attrs.field(init=False, repr=False, default=0.0)
    """Integral of the refill rate from the first ``now`` seen to ``_now``."""
    _refill_per_s: float = attrs.field(init=False, repr=False, default=0.0)
    _pressure: float = attrs.field(init=False, repr=False, default=0.0)
    _tokens_granted: int = attrs.field(init=False, repr=False, default=0)
    _tokens_throttled: int = attrs.field(init=False, repr=False, default=0)
    _throttle_events: int = attrs.field(init=False, repr=False, default=0)
    _tokens_overdrawn: int = attrs.field(init=False, repr=False, default=0)

    def __attrs_post_init__(self) -> None:
        if self.min_refill_per_s > self.max_refill_per_s:
            raise ValueError(
                "min_refill_per_s must be <= max_refill_per_s, got "
                f"{self.min_refill_per_s!r} > {self.max_refill_per_s!r}"
            )
        if self.kv_pressure_start >= self.kv_pressure_full:
            raise ValueError(
                "kv_pressure_start must be < kv_pressure_full, got "
                f"{self.kv_pressure_start!r} >= {self.kv_pressure_full!r}"
            )
        self._refill_per_s = float(self.max_refill_per_s)

    # -- pure helpers ----------------------------------------------------------

    def pressure(self, load: LoadSnapshot) -> float:
        """Load pressure in [0, 1]: the larger of KV pressure and queue pressure (module doc);
        KV pressure counts only while requests wait."""
        if not load.waiting_requests:
            return 0.0
        span = self.kv_pressure_full - self.kv_pressure_start
        kv_pressure = min(1.0, max(0.0, (load.kv_usage - self.kv_pressure_start) / span))
        queued = load.waiting_requests + load.running_requests
        queue_pressure = load.waiting_requests / queued if queued else 0.0
        return max(kv_pressure, queue_pressure)

    def refill_per_s_for(self, load: LoadSnapshot) -> float:
        """The refill rate ``load`` sets, between ``min_refill_per_s`` and ``max_refill_per_s``."""
        span = self.max_refill_per_s - self.min_refill_per_s
        return max(self.min_refill_per_s, self.max_refill_per_s - self.pressure(load) * span)

    def is_capped(self, request: RequestView) -> bool:
        """Whether ``request``'s prefills are capped (its priority is not urgent enough)."""
        return request.priority > self.unlimited_priority_at_most

    # -- TokenCapPolicy --------------------------------------------------------

    def token_cap(self, request: RequestView, load: LoadSnapshot) -> int | None:
        """At most this many prefill tokens this step; ``None`` when uncapped, 0 when throttled.

        Every call sets the refill rate from ``load`` (in force until the next
        call) and a cap is reserved against the request's tenant for this step. A
        step is identified by its `LoadSnapshot` object: callers pass the same
        snapshot to every call of one step and a new one for the next step.

        Raises:
            ValueError: ``load.now`` is earlier than a time already seen.
        """
        self._advance(load.now)
        self._pressure = self.pressure(load)
        self._refill_per_s = self.refill_per_s_for(load)
        if load is not self._step_load:  # the scheduler takes one snapshot per step
            self._end_step()
            self._collect_idle_tenants()
            self._step_load = load
        if not self.is_capped(request) or request.computed_tokens >= request.prompt_tokens:
            return None
        state = self._state(request)
        tenant = self._tenants[state.tenant]
        own_reservation = self._reserved.pop(request.request_id, 0)
        tenant.reserved_tokens -= own_reservation
        available = min(
            self._refilled(state.bucket),
            self._refilled(tenant.bucket) - tenant.reserved_tokens,
        )
        cap = max(0, math.floor(available))
        demand = min(request.prompt_tokens - request.computed_tokens, load.token_budget)
        # Hold back only what this request can use, so its tenant's other requests can
        # still be granted the rest of the bucket in the same step.
        self._reserved[request.request_id] = min(cap, demand)
        tenant.reserved_tokens += min(cap, demand)
        if cap < demand:
            self._throttle_events += 1
            self._tokens_throttled += demand - cap
        return cap

    def on_scheduled(self, request: RequestView, tokens: int, now: float) -> None:
        """Debit ``tokens`` from the request's and its tenant's buckets, if this was a capped prefill.

        ``request`` is the view from before the step (its ``computed_tokens``
        does not yet include ``tokens``). Ends the step's cap phase.

        Raises:
            ValueError: ``tokens`` is negative or ``now`` is earlier than a time already seen.
        """
        if tokens < 0:
            raise ValueError(f"tokens must be >= 0, got {tokens!r}")
        self._end_step()
        if not self.is_capped(request) or request.computed_tokens >= request.prompt_tokens:
            return
        self._advance(now)
        state = self._state(request)
        tenant = self._tenants[state.tenant]
        allowed = min(self._refilled(state.bucket), self._refilled(tenant.bucket))
        self._tokens_overdrawn += max(0, tokens - max(0, math.floor(allowed)))
        state.bucket.level_tokens -= tokens
        tenant.bucket.level_tokens -= tokens
        self._tokens_granted += tokens

    # -- LifecycleObserver -----------------------------------------------------

    def on_admitted(self, request: RequestView, now: float) -> None:
        """Nothing to do: a bucket is created, full, at the request's first capped prefill."""

    def on_first_scheduled(self, request: RequestView, now: float) -> None:
        """Nothing to do: the bucket already tracks the request."""

    def on_finished(self, request: RequestView, now: float) -> None:
        """Drop the request's bucket and reservation; its tenant's bucket keeps its debt."""
        state = self._requests.pop(request.request_id, None)
        if state is None:
            return
        tenant = self._tenants[state.tenant]
        tenant.requests -= 1
        tenant.reserved_tokens -= self._reserved.pop(request.request_id, 0)

    # -- inspection ------------------------------------------------------------

    def stats(self) -> TokenBucketStats:
        """A frozen snapshot of counters and current load response."""
        return TokenBucketStats(
            requests_tracked=len(self._requests),
            tenants_tracked=len(self._tenants),
            tokens_granted=self._tokens_granted,
            tokens_throttled=self._tokens_throttled,
            throttle_events=self._throttle_events,
            tokens_overdrawn=self._tokens_overdrawn,
            pressure=self._pressure,
            refill_per_s=self._refill_per_s,
        )

    def check_invariants(self) -> None:
        """Assert internal consistency (cheap; for tests and notebooks)."""
        eps = 1e-9 * max(1.0, abs(self._credit))
        assert self.min_refill_per_s <= self._refill_per_s <= self.max_refill_per_s
        assert 0.0 <= self._pressure <= 1.0
        counts: dict[str, int] = {}
        for state in self._requests.values():
            counts[state.tenant] = counts.get(state.tenant, 0) + 1
            assert state.bucket.level_tokens <= self.capacity_tokens
            assert state.bucket.stamp <= self._credit + eps
        reserved: dict[str, int] = {}
        for request_id, cap in self._reserved.items():
            assert cap >= 0
            tenant_name = self._requests[request_id].tenant
            reserved[tenant_name] = reserved.get(tenant_name, 0) + cap
        for name, tenant in self._tenants.items():
            assert tenant.requests == counts.get(name, 0), name
            assert tenant.reserved_tokens == reserved.get(name, 0), name
            assert tenant.bucket.level_tokens <= self.capacity_tokens
            assert tenant.bucket.stamp <= self._credit + eps
        assert set(counts) <= set(self._tenants)
        assert self._tokens_granted >= 0 and self._tokens_throttled >= 0

    # -- internals -------------------------------------------------------------

    def _advance(self, now: float) -> None:
        if self._now is not None:
            if now < self._now:
                raise ValueError(f"now went back from {self._now!r} to {now!r}")
            self._credit += self._refill_per_s * (now - self._now)
        self._now = now

    def _refilled(self, bucket: _Bucket) -> float:
        """Bring ``bucket`` up to the current credit integral and return its level."""
        bucket.level_tokens = min(
            float(self.capacity_tokens), bucket.level_tokens + (self._credit - bucket.stamp)
        )
        bucket.stamp = self._credit
        return bucket.level_tokens

    def _new_bucket(self) -> _Bucket:
        return _Bucket(level_tokens=float(self.capacity_tokens), stamp=self._credit)

    def _state(self, request: RequestView) -> _RequestState:
        state = self._requests.get(request.request_id)
        if state is None:
            state = _RequestState(tenant=request.tenant, bucket=self._new_bucket())
            self._requests[request.request_id] = state
            tenant = self._tenants.get(request.tenant)
            if tenant is None:
                tenant = self._tenants[request.tenant] = _TenantState(bucket=self._new_bucket())
            tenant.requests += 1
        return state

    def _end_step(self) -> None:
        for request_id, cap in self._reserved.items():
            self._tenants[self._requests[request_id].tenant].reserved_tokens -= cap
        self._reserved.clear()

    def _collect_idle_tenants(self) -> None:
        idle = [
            name
            for name, tenant in self._tenants.items()
            if tenant.requests == 0 and self._refilled(tenant.bucket) >= self.capacity_tokens
        ]
        for name in idle:
            del self._tenants[name]
