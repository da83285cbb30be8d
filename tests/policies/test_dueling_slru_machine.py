"""`DuelingSLRU` specified by a state machine over the real object: requests hit or compute
prefix chains in a cache of fixed size, finish (plainly, preempted or cancelled), wait, and
start and end session turns of two tenants while time passes; bursts of fresh chains used
again soon after (`recent_reuse`) make recency pay, so the order turns into LRU too.

After every access: the mode follows the leading shadow (it turns LRU exactly when the LRU
shadow leads by more than ``switch_margin_hits``, and stays LRU exactly while it leads).
After every rule: every evictable key sits in exactly one segment, pins are held only
by tracked keys, and `check_invariants` holds. A finished turn never raises the pins held
past ``max_pinned_fraction`` of the tracked blocks; a release in LRU mode leaves PROTECTED
empty; a pinned key (not an orphan) is evicted only once nothing but pinned (or wanted)
keys is left.
"""

from hypothesis import settings, target
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from policies import DuelingSLRU, Segment, SessionPins

CAPACITY = 24
"""Blocks of the simulated cache: referenced plus evictable keys never exceed it."""

chains = st.tuples(st.integers(0, 3), st.integers(0, 2), st.integers(1, 6)).map(
    lambda t: [t[0] * 1000 + (t[1] * 100 + i if i >= 2 else i) for i in range(t[2])])
"""A prompt's block keys: four roots, three branches each after two shared blocks."""

pins = st.builds(
    SessionPins, default_gap_s=st.sampled_from([0.5, 3.0]),
    max_pinned_fraction=st.sampled_from([0.25, 0.5, 1.0]), judged=st.booleans(),
    prefix_sessions=st.booleans(),
    tenant_weights=st.sampled_from([{}, {"t0": 3.0}])) | st.none()


class DuelingSLRUMachine(RuleBasedStateMachine):
    """Random request lifecycles on a `DuelingSLRU`; its defining guarantees after each."""

    @initialize(window=st.sampled_from([20.0, 200.0]), margin=st.sampled_from([0.0, 0.5, 2.0]),
                sample=st.sampled_from([1, 2]), session_pins=pins)
    def build(self, window, margin, sample, session_pins):
        self.order = DuelingSLRU(window_accesses=window, switch_margin_hits=margin,
                                 shadow_sample=sample, sample_from_blocks=8,
                                 session_pins=session_pins)
        self.margin = margin
        self.refs = {}  # referenced key -> requests holding it
        self.running = []  # (chain, session) of running requests
        self.waiting = []  # chains told to `expect`
        self.uncached = -1
        self.now = 0.0
        self.lead = 0.0  # the LRU shadow's largest lead seen
        self.mode = "slru"  # the mode at the last check
        self.fresh = 100_000  # keys of `recent_reuse`'s chains

    def _evict_one(self):
        order = self.order
        before = {key: order.segment_of(key) for key in order}
        pinned_before = {key for key in before if order.pinned(key)}
        victim = order.evict()
        assert victim in before and victim not in order and not order.pinned(victim)
        if victim in pinned_before and before[victim] is not Segment.ORPHAN:
            # a pin is given up only under pressure (an orphan's pin buys no hit): nothing but
            # pinned or wanted keys is left, bar the pinned or wanted children the eviction
            # orphaned
            assert all(segment >= Segment.PINNED or (
                segment is Segment.ORPHAN and before[key] is not Segment.ORPHAN
                and (before[key] >= Segment.PINNED or key in pinned_before))
                for key in order if (segment := order.segment_of(key)) is not None), victim

    @rule(chain=chains, session=st.sampled_from([None, "a", "b", "c"]),
          tenant=st.sampled_from([None, "t0", "t1"]))
    def start(self, chain, session, tenant):
        self._start(chain, session, tenant)

    def _start(self, chain, session=None, tenant=None):
        order = self.order
        for key in chain:
            if key in order:
                order.acquire(key)
                assert key not in order
                self.mode_follows_the_leading_shadow()
            elif key not in self.refs:
                while len(order) + len(self.refs) >= CAPACITY and len(order):
                    self._evict_one()
            self.refs[key] = self.refs.get(key, 0) + 1
        turn = None
        if order.wants_turn(session):
            turn = order.turn_started(session, chain, self.now, tenant)
        self.running.append((chain, turn))

    @precondition(lambda self: self.running)
    @rule(data=st.data(), how=st.sampled_from(["plain", "plain", "protect", "cancel"]))
    def finish(self, data, how):
        self._finish(data.draw(st.integers(0, len(self.running) - 1)), how)

    def _finish(self, index, how="plain"):
        order = self.order
        chain, turn = self.running.pop(index)
        for i in range(len(chain) - 1, -1, -1):
            key, parent = chain[i], chain[i - 1] if i else None
            self.refs[key] -= 1
            if self.refs[key]:
                continue
            del self.refs[key]
            lru_mode = order.mode == "lru"
            if how == "cancel":
                order.release_cancelled(key, parent)
            else:
                order.release(key, parent, protect=how == "protect")
            self.mode_follows_the_leading_shadow()  # after every access, not only every rule
            if lru_mode:  # (a release that turns the mode leaves that to the next one)
                assert order.stats().protected_blocks == 0
        if turn is not None:
            held = sum(order.pins_by_tenant().values())
            limit = int(order.session_pins.max_pinned_fraction * order.tracked)
            made = order.turn_finished(turn, chain, self.now)
            assert 0 <= made <= len(chain)
            assert sum(order.pins_by_tenant().values()) <= max(held, limit)

    @rule(count=st.integers(2, 16), distance=st.integers(1, 3))
    def recent_reuse(self, count, distance):
        """Fresh chains, each used again ``distance`` chains later: recency pays, frequency
        does not (the workload on which the order should turn into LRU)."""
        fresh = []
        for _ in range(count):
            self.fresh += 3
            fresh.append([self.fresh, self.fresh + 1, self.fresh + 2])
            for chain in (fresh[-1], fresh[-1 - distance] if len(fresh) > distance else None):
                if chain is not None:
                    self._start(chain)
                    self._finish(len(self.running) - 1)

    @rule(seconds=st.sampled_from([0.1, 1.0, 5.0]))
    def advance(self, seconds):
        self.now += seconds

    @rule(chain=chains)
    def expect(self, chain):
        self.order.expect(chain)
        self.waiting.append(chain)

    @precondition(lambda self: self.waiting)
    @rule(data=st.data())
    def unexpect(self, data):
        self.order.unexpect(self.waiting.pop(data.draw(st.integers(0, len(self.waiting) - 1))))

    @rule()
    def release_uncached(self):
        self.order.release_uncached(self.uncached)
        self.uncached -= 1
        assert next(iter(self.order)) == self.uncached + 1  # uncached blocks go first

    @precondition(lambda self: len(self.order))
    @rule(data=st.data())
    def discard(self, data):
        key = data.draw(st.sampled_from(list(self.order)))
        self.order.discard(key)
        assert key not in self.order and not self.order.pinned(key)

    @precondition(lambda self: len(self.order))
    @rule()
    def evict(self):
        self._evict_one()

    @invariant()
    def mode_follows_the_leading_shadow(self):
        duel = self.order.duel_stats()
        lru, slru = duel["lru_shadow_score"], duel["slru_shadow_score"]
        self.lead = max(self.lead, lru - slru)
        mode = self.order.mode
        assert duel["lru_mode"] == (mode == "lru"), duel
        if self.mode == "slru":  # turns LRU exactly when the LRU shadow leads by the margin
            assert (mode == "lru") == (lru > slru + self.margin), duel
        else:  # and stays LRU exactly while the LRU shadow leads
            assert (mode == "lru") == (lru > slru), duel
        self.mode = mode

    @invariant()
    def every_key_sits_in_exactly_one_segment(self):
        order, stats = self.order, self.order.stats()
        keys = list(order)
        assert len(keys) == len(set(keys)) == len(order) == stats.evictable_blocks
        sizes = {segment: 0 for segment in Segment}
        for key in keys:
            sizes[order.segment_of(key)] += 1
        assert sizes == {
            Segment.UNCACHED: stats.uncached_blocks, Segment.ORPHAN: stats.orphan_blocks,
            Segment.PROBATION: stats.probation_blocks,
            Segment.PROTECTED: stats.protected_blocks, Segment.PINNED: stats.pinned_blocks,
            Segment.WANTED: stats.wanted_blocks}
        assert [order.segment_of(key) for key in keys] == sorted(
            order.segment_of(key) for key in keys)  # evicted segment by segment
        assert all(order.segment_of(key) is None for key in self.refs)

    @invariant()
    def pins_are_held_by_tracked_keys(self):
        order = self.order
        held = order.pins_by_tenant()
        assert all(count > 0 for count in held.values())
        if order.session_pins is None:
            assert not held and order.stats().pins == 0
        stats = order.stats()
        assert stats.pin_hits <= stats.acquires
        for key in order:
            if order.segment_of(key) is Segment.PINNED:
                assert order.pinned(key)

    @invariant()
    def internal_invariants_hold(self):
        self.order.check_invariants()

    def teardown(self):
        if hasattr(self, "lead"):
            target(self.lead, label="LRU shadow's lead")  # search towards LRU mode too


def test_a_pin_wanted_while_the_farthest_pin_was_sought_stays_evictable_by_return():
    """Found by the machine: a pinned key in WANTED when eviction looked for the farthest
    pin lost its place in that search; parked again after its waiting request left, the
    next search found no pin and raised."""
    machine = DuelingSLRUMachine()
    machine.build(window=20.0, margin=0.0, sample=1, session_pins=SessionPins(
        default_gap_s=0.5, max_pinned_fraction=0.25, judged=False, prefix_sessions=True))
    machine.recent_reuse(count=2, distance=1)
    machine._start([0])
    for _ in range(6):
        machine._evict_one()
    for chain in ([0], [0, 1, 2, 3, 4, 5], [3000]):
        machine._start(chain)
    machine._finish(3)
    machine._evict_one()
    machine.release_uncached()
    machine.advance(0.1)
    machine._evict_one()
    machine.recent_reuse(count=2, distance=1)
    machine._start([3000])
    machine._finish(3)
    machine.expect([3000])  # the pinned key waits in WANTED
    for _ in range(2):
        machine.recent_reuse(count=2, distance=1)
    for _ in range(17):  # only pins and wanted keys left: the farthest pin is sought
        machine._evict_one()
    machine.order.unexpect(machine.waiting.pop(0))  # back among the pins
    machine._evict_one()
    machine.internal_invariants_hold()
    machine.pins_are_held_by_tracked_keys()


TestDuelingSLRUMachine = DuelingSLRUMachine.TestCase
TestDuelingSLRUMachine.settings = settings(max_examples=120, stateful_step_count=100,
                                           deadline=None)
