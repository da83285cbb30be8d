"""AdmissionController: gates and reasons, RED early drop, drain-rate Retry-After, class counts."""

import math
import pickle
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from policies import AdmissionPolicy, LifecycleObserver, LoadSnapshot, RequestView
from policies.admission.controller import AdmissionController, AdmissionStats


class FixedRandom(random.Random):
    """An rng whose every draw is ``value``; counts the draws."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value
        self.draws = 0

    def random(self) -> float:
        self.draws += 1
        return self.value


def view(request_id="r", priority=0, slo_class=None, prompt_tokens=100):
    return RequestView(request_id=request_id, arrival_s=0.0, prompt_tokens=prompt_tokens,
                       priority=priority, slo_class=slo_class)


def load(waiting=0, kv_usage=0.0, now=0.0):
    return LoadSnapshot(now=now, waiting_requests=waiting, running_requests=0,
                        kv_usage=kv_usage, token_budget=8192)


def controller(seed=0, **kwargs):
    return AdmissionController(rng=random.Random(seed), **kwargs)


# -- construction -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"max_waiting": 0}, ValueError, "max_waiting must be >= 1 or None"),
        ({"max_kv_usage": 0.0}, ValueError, r"max_kv_usage must be in \(0, 1\] or None"),
        ({"max_kv_usage": 1.5}, ValueError, r"max_kv_usage must be in \(0, 1\] or None"),
        ({"red_min_waiting": 5}, ValueError, "must be set together"),
        ({"red_min_waiting": 5, "red_max_waiting": 5}, ValueError,
         "red_min_waiting must be below red_max_waiting"),
        ({"red_min_waiting": 1, "red_max_waiting": 5, "red_max_drop_probability": 1.5},
         ValueError, r"red_max_drop_probability must be in \[0, 1\]"),
        ({"urgent_priority_at_most": 1}, ValueError,
         "urgent_priority_at_most must be below full_drop_priority_from"),
        ({"max_waiting_per_class": {"gold": -1}}, ValueError,
         r"max_waiting_per_class\['gold'\] must be an integer >= 0"),
        ({"max_waiting_per_class": {"": 1}}, ValueError, "keys must be non-empty strings"),
        ({"drain_window_s": 0.0}, ValueError, "drain_window_s must be finite and > 0"),
        ({"min_retry_after_s": -1.0}, ValueError, "min_retry_after_s must be finite and >= 0"),
        ({"min_retry_after_s": 5.0, "max_retry_after_s": 2.0}, ValueError,
         "min_retry_after_s must be <= max_retry_after_s"),
    ],
)
def test_constructor_rejects_bad_configs(kwargs, error, message):
    with pytest.raises(error, match=message):
        controller(**kwargs)


def test_rng_is_required_and_must_be_a_random():
    with pytest.raises(TypeError, match="rng"):
        AdmissionController()
    with pytest.raises(TypeError, match="rng must be a random.Random, got int"):
        AdmissionController(rng=3)


def test_implements_admission_and_lifecycle_protocols_and_pickles():
    policy = controller(max_waiting=4, max_waiting_per_class={"gold": 2})
    assert isinstance(policy, AdmissionPolicy)
    assert isinstance(policy, LifecycleObserver)
    copy = pickle.loads(pickle.dumps(policy))
    assert copy.max_waiting_per_class == {"gold": 2}


# -- gates ------------------------------------------------------------------------


def test_no_gates_admits_everything():
    policy = AdmissionController(rng=FixedRandom(0.0))
    assert policy.admit(view(priority=20, slo_class="x"), load(10_000, 1.0)).admitted
    assert policy.rng.draws == 0


def test_queue_full_exactly_at_max_waiting():
    policy = controller(max_waiting=3)
    assert policy.admit(view(), load(waiting=2)).admitted
    decision = policy.admit(view(), load(waiting=3))
    assert (decision.admitted, decision.reason) == (False, "queue_full")
    assert decision.retry_after_s == 60.0  # nothing drained yet: the upper bound


def test_kv_full_exactly_at_max_kv_usage():
    policy = controller(max_kv_usage=0.9)
    assert policy.admit(view(priority=-20), load(kv_usage=0.8999)).admitted
    decision = policy.admit(view(priority=-20), load(kv_usage=0.9))
    assert (decision.admitted, decision.reason) == (False, "kv_full")
    assert decision.retry_after_s == 1.0  # an empty queue: the lower bound


def test_class_full_counts_admitted_not_started_requests():
    policy = controller(max_waiting_per_class={"gold": 2, "closed": 0})
    for i in range(2):
        request = view(f"g{i}", slo_class="gold")
        assert policy.admit(request, load()).admitted
        policy.on_admitted(request, 0.0)
    decision = policy.admit(view("g2", slo_class="gold"), load())
    assert (decision.admitted, decision.reason) == (False, "class_full:gold")
    assert policy.admit(view("s", slo_class="silver"), load()).admitted  # unlimited class
    assert policy.admit(view("n"), load()).admitted  # no class
    assert policy.admit(view("c", slo_class="closed"), load()).reason == "class_full:closed"
    policy.on_first_scheduled(view("g0", slo_class="gold"), 1.0)  # one leaves the queue
    assert policy.admit(view("g2", slo_class="gold"), load()).admitted
    policy.on_admitted(view("g2", slo_class="gold"), 1.0)
    policy.on_finished(view("g1", slo_class="gold"), 2.0)  # dropped before starting
    assert policy.waiting_in_class("gold") == 1
    policy.check_invariants()


def test_gates_are_checked_in_order():
    policy = AdmissionController(
        rng=FixedRandom(0.0), max_waiting=10, max_kv_usage=0.9,
        max_waiting_per_class={"gold": 0}, red_min_waiting=0, red_max_waiting=5,
    )
    gold = view(priority=5, slo_class="gold")
    assert policy.admit(gold, load(waiting=10, kv_usage=0.95)).reason == "queue_full"
    assert policy.admit(gold, load(waiting=9, kv_usage=0.95)).reason == "kv_full"
    assert policy.admit(gold, load(waiting=9)).reason == "class_full:gold"
    assert policy.rng.draws == 0  # deterministic gates never consume random numbers
    assert policy.admit(view(priority=5), load(waiting=9)).reason == "early_drop"
    assert policy.rng.draws == 1
    assert policy.stats().rejected == {"queue_full": 1, "kv_full": 1, "class_full:gold": 1,
                                       "early_drop": 1}
    assert policy.stats().rejected_total == 4


# -- RED early drop -----------------------------------------------------------------


def test_drop_probability_follows_the_line():
    policy = controller(red_min_waiting=10, red_max_waiting=30, red_max_drop_probability=0.4)
    assert policy.drop_probability(0, 5) == 0.0
    assert policy.drop_probability(10, 5) == 0.0
    assert policy.drop_probability(15, 5) == pytest.approx(0.1)
    assert policy.drop_probability(20, 5) == pytest.approx(0.2)
    assert policy.drop_probability(30, 5) == pytest.approx(0.4)
    assert policy.drop_probability(1000, 5) == pytest.approx(0.4)  # max_waiting is the wall
    # Scaled by priority: urgent never, 0 at half, >= 1 in full (defaults -1 and 1).
    assert policy.drop_probability(30, -1) == 0.0
    assert policy.drop_probability(30, -20) == 0.0
    assert policy.drop_probability(30, 0) == pytest.approx(0.2)
    assert policy.drop_probability(30, 1) == pytest.approx(0.4)
    assert controller().drop_probability(1000, 20) == 0.0  # early drop off


@given(w1=st.integers(0, 200), w2=st.integers(0, 200), p=st.integers(-20, 20),
       q=st.integers(-20, 20))
def test_drop_probability_is_monotone_and_a_probability(w1, w2, p, q):
    policy = controller(red_min_waiting=20, red_max_waiting=100, red_max_drop_probability=0.7)
    few, many = sorted((w1, w2))
    urgent, relaxed = sorted((p, q))
    assert 0.0 <= policy.drop_probability(few, relaxed) <= policy.drop_probability(many, relaxed)
    assert policy.drop_probability(many, urgent) <= policy.drop_probability(many, relaxed)
    assert policy.drop_probability(many, relaxed) <= 0.7


@pytest.mark.parametrize(("coin", "dropped"), [(0.0, True), (0.0999, True), (0.1, False),
                                               (0.9, False)])
def test_the_rng_decides_an_early_drop(coin, dropped):
    policy = AdmissionController(rng=FixedRandom(coin), red_min_waiting=0, red_max_waiting=10,
                                 red_max_drop_probability=0.2)
    decision = policy.admit(view(priority=3), load(waiting=5))  # probability 0.1
    assert policy.rng.draws == 1
    assert decision.admitted is not dropped
    if dropped:
        assert decision.reason == "early_drop"


def test_urgent_requests_are_never_early_dropped():
    policy = AdmissionController(rng=FixedRandom(0.0), red_min_waiting=0, red_max_waiting=1,
                                 red_max_drop_probability=1.0)
    assert policy.admit(view(priority=-1), load(waiting=50)).admitted
    assert policy.rng.draws == 0
    assert policy.admit(view(priority=1), load(waiting=50)).reason == "early_drop"


@pytest.mark.parametrize(("priority", "expected"), [(2, 0.2), (0, 0.1)])
def test_early_drop_rate_matches_the_probability(priority, expected):
    policy = controller(seed=1234, red_min_waiting=10, red_max_waiting=30,
                        red_max_drop_probability=0.4)
    trials = 4000
    drops = sum(not policy.admit(view(priority=priority), load(waiting=20)).admitted
                for _ in range(trials))
    tolerance = 4 * math.sqrt(expected * (1 - expected) / trials)
    assert abs(drops / trials - expected) < tolerance
    assert policy.stats().rejected == {"early_drop": drops}
    assert policy.stats().admitted == trials - drops


def test_same_seed_same_decisions():
    def run(seed):
        policy = controller(seed=seed, red_min_waiting=0, red_max_waiting=20,
                            red_max_drop_probability=0.5)
        return [policy.admit(view(priority=i % 4), load(waiting=i % 25)).admitted
                for i in range(500)]

    assert run(7) == run(7)
    assert run(7) != run(8)


# -- drain rate and Retry-After ---------------------------------------------------


def start_at(policy, times, prefix="d"):
    for i, t in enumerate(times):
        request = view(f"{prefix}{i}")
        policy.on_admitted(request, t)
        policy.on_first_scheduled(request, t)


def test_drain_rate_is_an_exponential_moving_average():
    policy = controller(drain_window_s=10.0)
    assert policy.drain_rate_rps(0.0) == 0.0
    start_at(policy, [5.0])
    assert policy.drain_rate_rps(5.0) == pytest.approx(0.1)
    assert policy.drain_rate_rps(15.0) == pytest.approx(0.1 * math.exp(-1))
    assert policy.drain_rate_rps(4.0) == pytest.approx(0.1)  # reading never goes back in time


def test_steady_drain_reads_its_rate_and_sets_retry_after():
    policy = controller(drain_window_s=10.0, max_waiting=20)
    start_at(policy, [i * 0.5 for i in range(400)])  # 2 requests/s for 200 s
    assert policy.drain_rate_rps(199.75) == pytest.approx(2.0, rel=0.02)
    decision = policy.admit(view("late"), load(waiting=20, now=199.75))
    assert decision.reason == "queue_full"
    assert decision.retry_after_s == pytest.approx(20 / 2.0, rel=0.02)
    faster = controller(drain_window_s=10.0)
    start_at(faster, [i * 0.1 for i in range(2000)])  # 10 requests/s
    assert faster.retry_after_s(20, 199.95) == pytest.approx(2.0, rel=0.02)
    # The queue stops draining: the estimate decays and Retry-After grows to its bound.
    assert policy.retry_after_s(20, 210.0) > policy.retry_after_s(20, 200.0)
    assert policy.retry_after_s(20, 1000.0) == 60.0


def test_requests_dropped_before_starting_do_not_count_as_drain():
    policy = controller()
    request = view("x")
    policy.on_admitted(request, 0.0)
    policy.on_finished(request, 1.0)
    policy.on_first_scheduled(request, 1.0)  # too late: no longer pending
    policy.on_first_scheduled(view("unknown"), 1.0)
    assert policy.drain_rate_rps(1.0) == 0.0
    assert policy.stats().started == 0


@settings(max_examples=50)
@given(gaps=st.lists(st.floats(min_value=0.0, max_value=30.0), max_size=40),
       waiting=st.integers(0, 100_000), later_s=st.floats(min_value=-5.0, max_value=1e4),
       bounds=st.tuples(st.floats(0.0, 10.0), st.floats(0.0, 100.0)))
def test_retry_after_stays_within_bounds(gaps, waiting, later_s, bounds):
    low, high = min(bounds), max(bounds)
    policy = controller(min_retry_after_s=low, max_retry_after_s=high, max_waiting=1)
    now = 0.0
    for i, gap in enumerate(gaps):
        now += gap
        start_at(policy, [now], prefix=f"g{i}-")
    retry = policy.retry_after_s(waiting, now + later_s)
    assert low <= retry <= high
    decision = policy.admit(view(), load(waiting=max(waiting, 1), now=now + later_s))
    assert low <= decision.retry_after_s <= high


# -- stats ------------------------------------------------------------------------


def test_stats_is_a_frozen_snapshot():
    policy = controller(max_waiting_per_class={"gold": 5})
    policy.on_admitted(view("a", slo_class="gold"), 0.0)
    policy.on_admitted(view("b"), 0.0)
    policy.admit(view(), load())
    snapshot = policy.stats()
    assert isinstance(snapshot, AdmissionStats)
    assert (snapshot.admitted, snapshot.pending_requests, snapshot.waiting_per_class) == (
        1, 2, {"gold": 1})
    policy.on_first_scheduled(view("a", slo_class="gold"), 1.0)
    assert snapshot.waiting_per_class == {"gold": 1}
    assert policy.stats().waiting_per_class == {}
    assert policy.stats().drain_rate_rps == pytest.approx(0.1)
    assert policy.stats(now=11.0).drain_rate_rps == pytest.approx(0.1 * math.exp(-1))
    with pytest.raises(AttributeError):
        snapshot.admitted = 3


# -- any order of lifecycle events: an oracle for the per-class counts --------------


CLASSES = ("gold", "silver", "bronze")
LIMITS = {"gold": 2, "silver": 3}


class ClassCountMachine(RuleBasedStateMachine):
    """Admit / start / finish in any order, repeats and unknown requests included."""

    requests = Bundle("requests")

    @initialize()
    def setup(self):
        self.policy = controller(max_waiting_per_class=LIMITS)
        self.pending: dict[str, str | None] = {}  # the oracle
        self.now = 0.0
        self.next_id = 0
        self.breached = False

    def _view(self, request_id, cls):
        return view(request_id, slo_class=cls)

    @rule(target=requests, cls=st.sampled_from((*CLASSES, None)))
    def arrive(self, cls):
        request_id = f"r{self.next_id}"
        self.next_id += 1
        count = sum(1 for c in self.pending.values() if c == cls)
        decision = self.policy.admit(self._view(request_id, cls), load(now=self.now))
        expect = cls not in LIMITS or count < LIMITS[cls]
        assert decision.admitted == expect
        if decision.admitted:
            self.policy.on_admitted(self._view(request_id, cls), self.now)
            self.pending[request_id] = cls
        else:
            assert decision.reason == f"class_full:{cls}"
        return request_id, cls

    @rule(request=requests, dt=st.floats(0.0, 5.0))
    def start(self, request, dt):
        self.now += dt
        self.policy.on_first_scheduled(self._view(*request), self.now)
        self.pending.pop(request[0], None)

    @rule(request=requests)
    def finish(self, request):
        self.policy.on_finished(self._view(*request), self.now)
        self.pending.pop(request[0], None)

    @rule(request=requests)
    def readmit_out_of_order(self, request):
        """A late or repeated on_admitted: counts again until it starts or finishes."""
        request_id, cls = request
        self.policy.on_admitted(self._view(request_id, cls), self.now)
        if request_id not in self.pending and cls in LIMITS:
            self.breached = True
        self.pending.setdefault(request_id, cls)

    @rule(cls=st.sampled_from(CLASSES))
    def unknown_request_events(self, cls):
        stranger = self._view("stranger", cls)
        self.policy.on_first_scheduled(stranger, self.now)
        self.policy.on_finished(stranger, self.now)

    @invariant()
    def counts_match_the_oracle(self):
        self.policy.check_invariants()
        for cls in CLASSES:
            expected = sum(1 for c in self.pending.values() if c == cls)
            assert self.policy.waiting_in_class(cls) == expected >= 0
        assert self.policy.stats().pending_requests == len(self.pending)

    @invariant()
    def limits_hold_while_admission_follows_the_protocol(self):
        # Only readmit_out_of_order (a protocol breach) can push a class over its limit.
        if not self.breached:
            for cls, limit in LIMITS.items():
                assert self.policy.waiting_in_class(cls) <= limit


ClassCountMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40,
                                               deadline=None)
test_class_counts_follow_the_oracle = ClassCountMachine.TestCase
