"""TokenBucket: prefill caps, load-adaptive refill and the capacity + rate * dt bound."""

import math
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from policies.protocols import LifecycleObserver, TokenCapPolicy
from policies.rate.token_bucket import TokenBucket, TokenBucketStats
from policies.views import LoadSnapshot, RequestView

EPS = 1e-6


def view(request_id="r", prompt_tokens=10**6, priority=0, tenant="t", computed_tokens=0):
    return RequestView(request_id=request_id, arrival_s=0.0, prompt_tokens=prompt_tokens,
                       priority=priority, tenant=tenant, computed_tokens=computed_tokens)


def load(now, kv_usage=0.0, waiting=0, running=1, token_budget=8192):
    return LoadSnapshot(now=now, waiting_requests=waiting, running_requests=running,
                        kv_usage=kv_usage, token_budget=token_budget)


def test_implements_the_token_cap_and_lifecycle_protocols():
    bucket = TokenBucket()
    assert isinstance(bucket, TokenCapPolicy)
    assert isinstance(bucket, LifecycleObserver)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"capacity_tokens": 0}, "capacity_tokens"),
        ({"min_refill_per_s": -1.0}, "min_refill_per_s must be finite and >= 0"),
        ({"max_refill_per_s": math.inf}, "max_refill_per_s must be finite and >= 0"),
        ({"min_refill_per_s": 10.0, "max_refill_per_s": 5.0},
         "min_refill_per_s must be <= max_refill_per_s"),
        ({"kv_pressure_start": 1.5}, r"kv_pressure_start must be in \[0, 1\]"),
        ({"kv_pressure_start": 0.9, "kv_pressure_full": 0.5},
         "kv_pressure_start must be < kv_pressure_full"),
    ],
)
def test_invalid_configuration_is_rejected_with_a_precise_message(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TokenBucket(**kwargs)


@given(priority=st.integers(-20, -1), tokens=st.integers(0, 10**6))
def test_urgent_requests_are_never_capped_and_spend_nothing(priority, tokens):
    bucket = TokenBucket(capacity_tokens=10)
    request = view(priority=priority)
    assert bucket.token_cap(request, load(0.0, kv_usage=1.0)) is None
    bucket.on_scheduled(request, tokens, 0.0)
    stats = bucket.stats()
    assert (stats.requests_tracked, stats.tokens_granted, stats.throttle_events) == (0, 0, 0)


def test_decode_steps_are_never_capped_or_debited():
    bucket = TokenBucket(capacity_tokens=10, min_refill_per_s=0.0, max_refill_per_s=0.0)
    decoding = view(prompt_tokens=100, computed_tokens=100)
    assert bucket.token_cap(decoding, load(0.0)) is None
    bucket.on_scheduled(decoding, 5, 0.0)
    assert bucket.stats().tokens_granted == 0


def test_cap_starts_at_capacity_drains_and_refills_at_the_rate():
    bucket = TokenBucket(capacity_tokens=100, min_refill_per_s=10.0, max_refill_per_s=10.0)
    request = view()
    assert bucket.token_cap(request, load(0.0)) == 100
    bucket.on_scheduled(request, 100, 0.0)
    assert bucket.token_cap(request, load(0.0)) == 0
    assert bucket.token_cap(request, load(2.5)) == 25
    bucket.on_scheduled(request, 20, 2.5)
    assert bucket.token_cap(request, load(3.0)) == 10
    assert bucket.token_cap(request, load(1000.0)) == 100  # never above capacity
    bucket.check_invariants()


def test_requests_of_one_tenant_share_its_bucket_within_a_step():
    bucket = TokenBucket(capacity_tokens=100, min_refill_per_s=0.0, max_refill_per_s=0.0)
    a, b, other = view("a"), view("b"), view("c", tenant="other")
    step = load(0.0)  # one snapshot per scheduler step
    assert bucket.token_cap(a, step) == 100
    assert bucket.token_cap(b, step) == 0  # a's cap is reserved
    assert bucket.token_cap(a, step) == 100  # asking again replaces a's reservation
    assert bucket.token_cap(other, step) == 100
    bucket.on_scheduled(a, 60, 0.0)  # ends the step: b may have what a left
    assert bucket.token_cap(b, load(1.0)) == 40
    bucket.check_invariants()


def test_a_tenant_keeps_its_debt_when_its_requests_finish():
    bucket = TokenBucket(capacity_tokens=100, min_refill_per_s=1.0, max_refill_per_s=1.0)
    first, second = view("first"), view("second")
    bucket.token_cap(first, load(0.0))
    bucket.on_scheduled(first, 100, 0.0)
    bucket.on_finished(first, 0.0)
    assert bucket.token_cap(second, load(10.0)) == 10
    assert bucket.stats().requests_tracked == 1
    bucket.on_finished(second, 10.0)
    bucket.token_cap(view("x", tenant="other"), load(50.0))
    assert bucket.stats().tenants_tracked == 2  # "t" is idle but not yet full
    bucket.token_cap(view("x", tenant="other"), load(200.0))
    assert bucket.stats().tenants_tracked == 1  # full again: nothing lost by dropping it
    bucket.check_invariants()


@pytest.mark.parametrize(
    ("kv_usage", "waiting", "running", "pressure"),
    [
        (0.0, 0, 0, 0.0),
        (0.5, 0, 4, 0.0),
        (0.7, 0, 4, 0.0),  # KV pressure counts only while requests wait
        (0.7, 1, 4, 0.5),
        (0.95, 1, 4, 1.0),
        (0.0, 1, 3, 0.25),
        (0.7, 3, 1, 0.75),
    ],
)
def test_pressure_is_the_larger_of_kv_and_queue_pressure(kv_usage, waiting, running, pressure):
    bucket = TokenBucket(min_refill_per_s=100.0, max_refill_per_s=500.0)
    snapshot = load(0.0, kv_usage=kv_usage, waiting=waiting, running=running)
    assert bucket.pressure(snapshot) == pytest.approx(pressure)
    assert bucket.refill_per_s_for(snapshot) == pytest.approx(500.0 - 400.0 * pressure)


@given(kv_usage=st.floats(0, 1), waiting=st.integers(0, 1000), running=st.integers(0, 1000),
       rates=st.tuples(st.floats(0, 1e5), st.floats(0, 1e5)))
def test_refill_rate_stays_between_min_and_max(kv_usage, waiting, running, rates):
    low, high = sorted(rates)
    bucket = TokenBucket(min_refill_per_s=low, max_refill_per_s=high)
    snapshot = load(0.0, kv_usage=kv_usage, waiting=waiting, running=running)
    assert 0.0 <= bucket.pressure(snapshot) <= 1.0
    assert low <= bucket.refill_per_s_for(snapshot) <= high


def test_higher_pressure_never_refills_faster():
    bucket = TokenBucket()
    rates = [bucket.refill_per_s_for(load(0.0, kv_usage=u / 10, waiting=1, running=10**9))
             for u in range(11)]
    assert rates == sorted(rates, reverse=True)
    assert rates[0] == pytest.approx(bucket.max_refill_per_s)
    assert rates[-1] == bucket.min_refill_per_s


def test_throttling_is_counted():
    bucket = TokenBucket(capacity_tokens=100, min_refill_per_s=0.0, max_refill_per_s=0.0)
    request = view(prompt_tokens=300)
    assert bucket.token_cap(request, load(0.0, token_budget=250)) == 100
    stats = bucket.stats()
    assert (stats.throttle_events, stats.tokens_throttled) == (1, 150)
    assert isinstance(stats, TokenBucketStats)


def test_scheduling_beyond_the_cap_goes_into_debt_and_is_counted():
    bucket = TokenBucket(capacity_tokens=10, min_refill_per_s=1.0, max_refill_per_s=1.0)
    request = view()
    bucket.token_cap(request, load(0.0))
    bucket.on_scheduled(request, 15, 0.0)
    assert bucket.stats().tokens_overdrawn == 5
    assert bucket.token_cap(request, load(4.0)) == 0
    assert bucket.token_cap(request, load(6.0)) == 1


def test_misuse_raises():
    bucket = TokenBucket()
    bucket.token_cap(view(), load(5.0))
    with pytest.raises(ValueError, match="now went back from 5.0 to 4.0"):
        bucket.token_cap(view(), load(4.0))
    with pytest.raises(ValueError, match="tokens must be >= 0"):
        bucket.on_scheduled(view(), -1, 5.0)


def test_finishing_drops_request_state_and_unknown_requests_are_ignored():
    bucket = TokenBucket()
    bucket.on_finished(view("never-seen"), 0.0)
    bucket.token_cap(view("a"), load(0.0))
    bucket.on_finished(view("a"), 0.0)
    assert bucket.stats().requests_tracked == 0
    bucket.check_invariants()


# -- the defining bound ------------------------------------------------------------

def assert_within_bound(history, capacity, max_rate):
    """``history``: (time, granted) per step; every window respects capacity + rate * dt."""
    for i, (t0, _) in enumerate(history):
        granted = 0
        for t1, tokens in history[i:]:
            granted += tokens
            assert granted <= capacity + max_rate * (t1 - t0) + EPS, (t0, t1, granted)


steps = st.lists(
    st.tuples(
        st.floats(0, 2),  # dt
        st.floats(0, 1),  # kv usage
        st.integers(0, 8),  # waiting
        st.integers(0, 8),  # running
        st.lists(st.floats(0, 1), min_size=4, max_size=4),  # share of each cap scheduled
    ),
    min_size=1, max_size=25,
)
requests = st.lists(st.tuples(st.sampled_from("ab"), st.sampled_from([-1, 0, 3])),
                    min_size=4, max_size=4)


@settings(max_examples=150)
@given(capacity=st.integers(1, 500), rates=st.tuples(st.floats(0, 3000), st.floats(0, 3000)),
       requests=requests, steps=steps)
def test_grants_never_exceed_capacity_plus_max_rate_times_dt(capacity, rates, requests, steps):
    low, high = sorted(rates)
    bucket = TokenBucket(capacity_tokens=capacity, min_refill_per_s=low, max_refill_per_s=high)
    views = [view(f"r{i}", tenant=tenant, priority=priority)
             for i, (tenant, priority) in enumerate(requests)]
    per_request = {v.request_id: [] for v in views}
    per_tenant = {"a": [], "b": []}
    now = 0.0
    for dt, kv_usage, waiting, running, shares in steps:
        now += dt
        snapshot = load(now, kv_usage, waiting, running)
        caps = [bucket.token_cap(v, snapshot) for v in views]
        tenant_granted = {"a": 0, "b": 0}
        for v, cap, share in zip(views, caps, shares, strict=True):
            tokens = 10**5 if cap is None else math.floor(share * cap)
            bucket.on_scheduled(v, tokens, now)
            if cap is not None:
                per_request[v.request_id].append((now, tokens))
                tenant_granted[v.tenant] += tokens
        for tenant, tokens in tenant_granted.items():
            per_tenant[tenant].append((now, tokens))
        bucket.check_invariants()
    for history in (*per_request.values(), *per_tenant.values()):
        assert_within_bound(history, capacity, high)
    assert bucket.stats().tokens_overdrawn == 0


# -- stateful machine against an exact oracle ----------------------------------------

class TokenBucketMachine(RuleBasedStateMachine):
    """Drives a real TokenBucket and an eager, exact (Fraction) model side by side."""

    CAPACITY = 64
    MIN_RATE, MAX_RATE = 8, 128

    requests = Bundle("requests")

    def __init__(self):
        super().__init__()
        self.bucket = TokenBucket(capacity_tokens=self.CAPACITY, min_refill_per_s=self.MIN_RATE,
                                  max_refill_per_s=self.MAX_RATE)
        self.now = 0.0
        self.rate = Fraction(self.MAX_RATE)
        self.counter = 0
        self.live = {}  # request id -> view (computed_tokens kept current)
        self.request_level = {}  # oracle buckets, refilled eagerly
        self.tenant_level = {}
        self.tenant_requests = {}
        self.granted = 0
        self.history = {}  # bucket key -> [(time, tokens)]
        self.tenants_seen = set()

    def refill_all(self, dt):
        gain = self.rate * Fraction(dt)
        for levels in (self.request_level, self.tenant_level):
            for key, level in levels.items():
                levels[key] = min(Fraction(self.CAPACITY), level + gain)

    @rule(target=requests, tenant=st.sampled_from("xyz"), priority=st.sampled_from([-2, 0, 1]),
          prompt=st.integers(1, 400))
    def admit(self, tenant, priority, prompt):
        self.counter += 1
        request = view(f"q{self.counter}", prompt_tokens=prompt, priority=priority, tenant=tenant)
        self.live[request.request_id] = request
        self.tenants_seen.add(tenant)
        self.bucket.on_admitted(request, self.now)
        return request.request_id

    @rule(request_id=requests)
    def finish(self, request_id):
        request = self.live.pop(request_id, None)
        if request is None:
            return
        self.bucket.on_finished(request, self.now)
        if self.request_level.pop(request_id, None) is not None:
            self.tenant_requests[request.tenant] -= 1

    @rule(dt=st.floats(0, 1), kv_usage=st.floats(0, 1), waiting=st.integers(0, 5),
          running=st.integers(0, 5), data=st.data())
    def step(self, dt, kv_usage, waiting, running, data):
        self.refill_all(dt)
        self.now += dt
        snapshot = load(self.now, kv_usage, waiting, running)
        if self.live:  # the policy sees the load through token_cap calls only
            self.rate = Fraction(self.bucket.refill_per_s_for(snapshot))
        for tenant in [t for t, n in self.tenant_requests.items()
                       if n == 0 and self.tenant_level[t] >= self.CAPACITY]:
            del self.tenant_level[tenant], self.tenant_requests[tenant]
        reserved = {}
        scheduled = []
        for request in list(self.live.values()):
            cap = self.bucket.token_cap(request, snapshot)
            capped = request.priority > -1 and request.computed_tokens < request.prompt_tokens
            if not capped:
                assert cap is None
            else:
                if request.request_id not in self.request_level:
                    self.request_level[request.request_id] = Fraction(self.CAPACITY)
                    self.tenant_level.setdefault(request.tenant, Fraction(self.CAPACITY))
                    self.tenant_requests[request.tenant] = (
                        self.tenant_requests.get(request.tenant, 0) + 1)
                available = min(self.request_level[request.request_id],
                                self.tenant_level[request.tenant]
                                - reserved.get(request.tenant, 0))
                expected = {max(0, math.floor(available - Fraction(EPS))),
                            max(0, math.floor(available + Fraction(EPS)))}
                assert cap in expected, (cap, float(available))
                demand = min(request.prompt_tokens - request.computed_tokens,
                             snapshot.token_budget)
                reserved[request.tenant] = reserved.get(request.tenant, 0) + min(cap, demand)
            remaining = request.prompt_tokens - request.computed_tokens
            limit = remaining if cap is None else min(cap, remaining)
            tokens = data.draw(st.integers(0, max(0, limit)))
            if tokens or data.draw(st.booleans()):
                scheduled.append((request, capped, tokens))
        for request, capped, tokens in scheduled:
            self.bucket.on_scheduled(request, tokens, self.now)
            if capped:
                self.request_level[request.request_id] -= tokens
                self.tenant_level[request.tenant] -= tokens
                self.granted += tokens
                for key in (request.request_id, "tenant:" + request.tenant):
                    self.history.setdefault(key, []).append((self.now, tokens))
            self.live[request.request_id] = view(
                request.request_id, request.prompt_tokens, request.priority, request.tenant,
                request.computed_tokens + tokens)
        for key in {r.request_id for r, _, _ in scheduled} | {
                "tenant:" + r.tenant for r, _, _ in scheduled}:
            self.check_windows_ending_now(self.history.get(key, []))

    def check_windows_ending_now(self, history):
        granted = 0
        for t0, tokens in reversed(history):
            granted += tokens
            assert granted <= self.CAPACITY + self.MAX_RATE * (self.now - t0) + EPS

    @invariant()
    def consistent(self):
        self.bucket.check_invariants()
        stats = self.bucket.stats()
        assert stats.requests_tracked == len(self.request_level)
        assert stats.tokens_granted == self.granted
        assert stats.tokens_overdrawn == 0
        live_tenants = {t for t, n in self.tenant_requests.items() if n}
        assert len(live_tenants) <= stats.tenants_tracked <= len(self.tenants_seen)


TokenBucketMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30,
                                                deadline=None)
test_token_bucket_machine = TokenBucketMachine.TestCase


def test_a_request_reserves_only_what_it_can_use_of_its_tenants_bucket():
    bucket = TokenBucket(capacity_tokens=2048, min_refill_per_s=0.0, max_refill_per_s=0.0)
    small = RequestView(request_id="small", arrival_s=0.0, prompt_tokens=300, tenant="t")
    other = RequestView(request_id="other", arrival_s=0.0, prompt_tokens=300, tenant="t")
    step = load(0.0)
    assert bucket.token_cap(small, step) == 2048
    assert bucket.token_cap(other, step) == 2048 - 300
