"""DuelingSLRU: SegmentedLRU where frequency pays, LRU where it does not."""

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.cache_replay.simulate import replay_order
from benchmarks.replay.agent_sessions import PROFILES, AgentProfile, LogNormal, agent_trace
from benchmarks.replay.workloads import load_workload
from policies import LRU, EvictionOrder, Segment, SegmentedLRU
from policies.kv.eviction import DuelingSLRU, SessionPins
from policies.kv.eviction.pin_shadows import _PinnedLRUShadow
from tests.helpers.eviction import assert_misuse_raises_precise_errors


def test_implements_the_eviction_protocol_and_its_misuse_errors():
    assert isinstance(DuelingSLRU(), EvictionOrder)
    assert_misuse_raises_precise_errors(DuelingSLRU())


def agent_sessions(concurrent=4, turns=8, new_blocks=4, total=60):
    """Agent sessions, ``concurrent`` at a time in turn: each turn is the last one's context
    plus new blocks, used once more at the next turn; an ended session's blocks, used
    ``turns`` times, are never used again (frequency misleads: SegmentedLRU loses)."""
    chains, active, started = [], [], 0
    while started < total or active:
        while len(active) < concurrent and started < total:
            active.append({"name": f"s{started}", "turn": 0, "context": [f"s{started}-task"]})
            started += 1
        for session in list(active):
            session["context"].extend(f"{session['name']}-t{session['turn']}-{b}"
                                      for b in range(new_blocks))
            session["turn"] += 1
            chains.append(list(session["context"]))
            if session["turn"] == turns:
                active.remove(session)
    return chains


def hot_prefix_and_scan(requests=600):
    """A hot 20-block prefix every third request, two one-shot 15-block scans between."""
    hot = [f"hot{i}" for i in range(20)]
    return [list(hot) if i % 3 == 0 else [f"scan{i}-{b}" for b in range(15)]
            for i in range(requests)]


def as_ints(chains):
    """The same chains with int keys, whose hashes (and so the shadows' sample) are stable."""
    ids = {}
    return [[ids.setdefault(key, len(ids)) for key in chain] for chain in chains]


def rates(chains, cache_blocks):
    return {name: replay_order(chains, cache_blocks, order, name).hit_rate
            for name, order in (("lru", LRU()), ("slru", SegmentedLRU()),
                                ("dueling", DuelingSLRU(window_accesses=2000)))}


def test_turns_into_lru_where_segmented_lru_loses():
    chains = as_ints(agent_sessions())
    order = DuelingSLRU(window_accesses=2000)
    replay_order(chains, 120, order, "dueling")
    assert order.mode == "lru"
    order.check_invariants()
    order.release(-1)
    assert order.stats().protected_blocks == 0  # LRU mode: PROTECTED emptied on a release
    assert all(order.segment_of(k) is not Segment.PROTECTED for k in order)
    got = rates(chains, 120)
    assert got["slru"] < got["lru"] - 0.1  # the workload is one where SLRU loses
    assert got["dueling"] >= got["lru"] - 0.005  # 480 requests: learning costs 0.2 points


def test_stays_segmented_where_frequency_pays():
    chains = as_ints(hot_prefix_and_scan())
    order = DuelingSLRU(window_accesses=2000)
    replay_order(chains, 40, order, "dueling")
    assert order.mode == "slru"
    got = rates(chains, 40)
    assert got["slru"] > got["lru"] + 0.1
    assert got["dueling"] >= got["slru"] - 0.02


chains = st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=5, unique=True),
                  min_size=1, max_size=30)


@settings(max_examples=150, deadline=None)
@given(chains=chains, capacity=st.integers(3, 12), window=st.sampled_from([1.0, 5.0, 100.0]),
       sample=st.sampled_from([1, 2, 8]))
def test_invariants_hold_in_a_cache(chains, capacity, window, sample):
    """Replayed as a cache, the real order and both shadows stay consistent."""
    order = DuelingSLRU(window_accesses=window, shadow_sample=sample, sample_from_blocks=1)
    chains = [[tuple(c[: i + 1]) for i in range(len(c))] for c in chains]  # keys = prefixes
    replay_order(chains, capacity, order, "dueling")
    order.check_invariants()
    if order.mode == "lru":
        order.release(("new",))
        assert order.stats().protected_blocks == 0


def test_sampled_shadows_go_on_with_the_sampled_keys_they_held():
    """Sampling fixed at the first eviction keeps the shadows' sampled keys (in their order,
    PROTECTED kept), so the duel does not wait a whole cache turnover for evidence again."""
    order = DuelingSLRU(shadow_sample=2, sample_from_blocks=8)
    for key in range(16):
        order.release(key)
    order.acquire(4)
    order.release(4)  # used twice: PROTECTED in the SLRU shadow
    order.evict()  # the cache is full: one key in 2 from now on
    sampled = [key for key in range(16) if not hash(key) % 2]
    assert all(order._lru.holds(key) for key in sampled)
    assert all(order._slru.holds(key) for key in sampled)
    assert not any(order._lru.holds(key) for key in range(16) if key not in sampled)
    assert order._slru.order.segment_of(4) is Segment.PROTECTED
    order.check_invariants()


ERRATIC_TOOLS = attrs.evolve(PROFILES["swe-busy"], tool_s=LogNormal(
    median=1.0, sigma=2.0, low=0.02, high=120.0))
"""Many short sessions whose tool times spread over four orders of magnitude."""


def _agent_replay(workload, cache_blocks, pins):
    trace = (agent_trace(workload, num_requests=1500) if isinstance(workload, AgentProfile)
             else load_workload(workload, max_requests=1500))
    chains = [request.block_hashes for request in trace.requests]
    turns = [(request.session_id, request.arrival_s) for request in trace.requests]
    order = LRU() if pins is None else DuelingSLRU(session_pins=pins)
    return replay_order(chains, cache_blocks, order, "order", turns=turns).hit_rate, order


def test_pins_that_cost_hits_against_lru_are_not_made():
    """On many short sessions with quick tools of very erratic times, pins cost more hits
    than they buy: judged by the shadow LRU that pins, they are (almost) never made and the
    order keeps LRU's hits within 0.2 points."""
    lru, _ = _agent_replay(ERRATIC_TOOLS, 250, None)
    fixed, fixed_order = _agent_replay(ERRATIC_TOOLS, 250, SessionPins(judged=False))
    judged, order = _agent_replay(ERRATIC_TOOLS, 250, SessionPins())
    assert fixed < lru - 0.005
    assert judged >= lru - 0.002
    assert order.stats().pins < fixed_order.stats().pins / 10
    assert order.duel_stats()["pins_on"] == 0
    order.check_invariants()


def test_pins_that_pay_are_made():
    """Where pins win (long coding sessions, a small cache) the pinning shadow leads soon
    and the order keeps nearly all the pins' gain over LRU."""
    fixed, _ = _agent_replay("agent-swe", 125, SessionPins(judged=False))
    judged, order = _agent_replay("agent-swe", 125, SessionPins())
    lru, _ = _agent_replay("agent-swe", 125, None)
    assert fixed > lru + 0.02
    assert judged >= lru + 0.9 * (fixed - lru)
    assert order.stats().pin_pauses == 0 and order.duel_stats()["pins_on"] == 1


def test_judged_pins_wait_for_the_pinning_shadow_to_lead():
    """LRU is the floor: a judged order pins nothing before its pinning shadow has out-hit
    the plain LRU shadow by ``switch_margin_hits``; an unjudged one pins at once."""
    def finish(order, session_id, keys, now):
        session = order.turn_started(session_id, keys, now)
        for key in reversed(keys):
            order.release(key)
        return order.turn_finished(session, keys, now)

    unjudged = DuelingSLRU(session_pins=SessionPins(max_pinned_fraction=1.0, judged=False))
    assert finish(unjudged, "a", ["a1"], 0.0) == 1
    order = DuelingSLRU(session_pins=SessionPins(max_pinned_fraction=1.0),
                        switch_margin_hits=2.0)
    assert finish(order, "a", ["a1", "a2"], 0.0) == 0
    assert order.duel_stats()["pins_on"] == 0
    order.check_invariants()


def test_the_pinning_shadow_keeps_pins_until_they_expire_or_are_hit():
    shadow = _PinnedLRUShadow()
    for key in ["a1", "a2", "x1", "x2"]:
        shadow.release(key, None, 4)
    shadow.pin(["a1", "a2", "zz"], until=10.0, limit=2)  # zz is not held: not pinned
    assert set(shadow._pinned) == {"a1", "a2"} and not shadow._parked  # still in place
    shadow.release("y1", None, 4)  # a new key: the oldest unpinned one goes, pins parked
    shadow.release("y2", None, 4)
    assert not shadow.holds("x1") and not shadow.holds("x2") and shadow.holds("a1")
    assert shadow._parked == {"a1", "a2"}
    shadow.access("a1", None, 4)  # a hit on a pin
    assert (shadow.hits, "a1" in shadow._pinned) == (1, False)
    shadow.expire(10.0)  # a2's pin ran out: back to the front, where LRU would have it
    assert list(shadow._queue) == ["a2", "y1", "y2"] and not shadow._parked
    shadow.check_invariants()


def test_the_pinning_shadow_evicts_pins_last_farthest_return_first():
    shadow = _PinnedLRUShadow()
    for key in ["s", "l", "x"]:
        shadow.release(key, None, 3)
    shadow.pin(["s"], until=5.0, limit=3)
    shadow.pin(["l"], until=9.0, limit=3)
    shadow.trim(1)  # x, then the farthest return
    assert shadow.holds("s") and not shadow.holds("l") and not shadow.holds("x")
    restricted = shadow.restricted(lambda key: key == "s")
    assert (restricted._pinned, restricted.hits) == ({"s": shadow._pinned["s"]}, 0)
    restricted.check_invariants()


def test_farthest_return_heaps_stay_bounded_while_pins_are_renewed():
    """Each pin pushes onto a farthest-return heap; renewed or hit pins leave stale entries,
    which are dropped once they are the majority (no growth over a long-running engine)."""
    shadow = _PinnedLRUShadow()
    order = DuelingSLRU(session_pins=SessionPins(max_pinned_fraction=1.0, judged=False))
    keys = [f"k{i}" for i in range(10)]
    for key in keys:
        shadow.release(key, None, 10)
    for turn in range(1000):
        shadow.pin(keys, until=float(turn), limit=10)
        session = order.turn_started("a", keys, float(turn))
        for key in reversed(keys):
            if key in order:
                order.acquire(key)
            order.release(key)
        order.turn_finished(session, keys, float(turn))
    assert len(shadow._farthest) <= 2 * len(shadow._pinned) + 64
    assert len(order._far_heap) <= 2 * len(order._pinned_until) + 64
    shadow.check_invariants()
    order.check_invariants()
    assert [order.evict() for _ in range(10)] == keys[::-1]  # the deepest pin first
