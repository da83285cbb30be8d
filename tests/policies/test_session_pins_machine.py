"""`SessionPins` specified by a state machine: `SessionGaps` (configured by it) against an
oracle model that keeps every session's and the fleet's running mean gap, and the session
a request continues, with no bound on memory.

While no more than ``max_sessions`` sessions were ever seen, the real object agrees with the
oracle on every predicted gap, on every pin's end (``now + gap_slack * gap``) and on every
request's session; past that, its memory stays bounded. `check_invariants` after each rule.
"""

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from policies import SessionGaps, SessionPins

sessions = st.sampled_from([None, "a", "b", "c"])
tenants = st.sampled_from([None, "t0", "t1"])
prompts = st.lists(st.integers(0, 5), max_size=4)


class _Oracle:
    """Running means of the gaps, the last turn's end and its tail, per session."""

    def __init__(self, config):
        self.config = config
        self.last_end, self.gap, self.fleet, self.tail_of = {}, {}, None, {}

    def session_of(self, session_id, keys, tenant):
        if session_id is not None:
            return ("id", tenant, session_id)
        if not self.config.prefix_sessions:
            return None
        for key in reversed(keys):
            if (tenant, key) in self.tail_of:
                return self.tail_of[tenant, key]
        return ("prefix", tenant, keys[-1] if keys else None)

    def started(self, session, now):
        if session not in self.last_end:
            return
        gap = max(0.0, now - self.last_end.pop(session))
        w = self.config.smoothing
        old = self.gap.get(session)
        self.gap[session] = gap if old is None else (1 - w) * old + w * gap
        self.fleet = gap if self.fleet is None else (1 - w) * self.fleet + w * gap

    def predicted(self, session):
        gap = self.gap.get(session, self.fleet)
        return self.config.default_gap_s if gap is None else gap

    def finished(self, session, tail, now):
        self.last_end[session] = now
        if tail is not None:
            self.tail_of[session[1], tail] = session
        return now + self.config.gap_slack * self.predicted(session)


class SessionPinsMachine(RuleBasedStateMachine):
    """Turns of a few sessions of two tenants, started and finished as time passes."""

    @initialize(config=st.builds(
        SessionPins, gap_slack=st.sampled_from([1.0, 1.5, 3.0]),
        default_gap_s=st.sampled_from([0.5, 10.0]), smoothing=st.sampled_from([0.25, 1.0]),
        max_sessions=st.sampled_from([2, 100]), prefix_sessions=st.booleans()))
    def build(self, config):
        self.config = config
        self.gaps, self.oracle = SessionGaps(config=config), _Oracle(config)
        self.seen = set()
        self.running = []
        self.now = 0.0

    def exact(self):
        """Whether the oracle's unbounded memory still matches the real one's."""
        limit = self.config.max_sessions
        return len(self.seen) <= limit and len(self.oracle.tail_of) <= limit

    @rule(session_id=sessions, keys=prompts, tenant=tenants)
    def start(self, session_id, keys, tenant):
        session = self.gaps.session_of(session_id, keys, tenant)
        if self.exact():
            assert session == self.oracle.session_of(session_id, keys, tenant)
        if session is None:
            assert session_id is None and not self.config.prefix_sessions
            return
        assert session[1] == tenant  # sessions of different tenants never meet
        self.seen.add(session)
        self.gaps.started(session, self.now)
        self.oracle.started(session, self.now)
        self.running.append((session, keys))

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def finish(self, data):
        session, keys = self.running.pop(data.draw(st.integers(0, len(self.running) - 1)))
        tail = keys[-1] if keys else None
        until = self.gaps.finished(session, tail, self.now)
        expected = self.oracle.finished(session, tail, self.now)
        assert until >= self.now
        if self.exact():
            assert until == expected

    @rule(seconds=st.sampled_from([0.0, 0.5, 2.0, 7.0]))
    def advance(self, seconds):
        self.now += seconds

    @invariant()
    def predictions_agree(self):
        for session in self.seen:
            predicted = self.gaps.predicted_gap_s(session)
            assert predicted >= 0
            if self.exact():
                assert predicted == self.oracle.predicted(session), session

    @invariant()
    def memory_is_bounded(self):
        self.gaps.check_invariants()


TestSessionPinsMachine = SessionPinsMachine.TestCase
TestSessionPinsMachine.settings = settings(max_examples=150, stateful_step_count=40,
                                           deadline=None)
