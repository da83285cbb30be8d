"""DuelingSLRU: SegmentedLRU where frequency pays, LRU where it does not."""

from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.cache_replay.simulate import replay_order
from benchmarks.replay.workloads import load_workload
from policies import LRU, EvictionOrder, Segment, SegmentedLRU
from policies.adaptive_eviction import DuelingSLRU
from policies.session_retention import SessionPins
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


def _agent_replay(workload, cache_blocks, pins):
    trace = load_workload(workload, max_requests=1500)
    chains = [request.block_hashes for request in trace.requests]
    turns = [(request.session_id, request.arrival_s) for request in trace.requests]
    order = LRU() if pins is None else DuelingSLRU(session_pins=pins)
    return replay_order(chains, cache_blocks, order, "order", turns=turns).hit_rate, order


def test_pins_that_cost_hits_against_lru_are_paused():
    """On many short sessions with quick, erratic tools, pins cost more hits than they buy;
    judged against the LRU shadow they pause, and give back at least a third of the loss."""
    lru, _ = _agent_replay("agent-swe-busy", 250, None)
    fixed, _ = _agent_replay("agent-swe-busy", 250, SessionPins(judged=False))
    judged, order = _agent_replay("agent-swe-busy", 250, SessionPins())
    assert fixed < lru - 0.01
    assert order.stats().pin_pauses >= 1
    assert judged >= fixed + (lru - fixed) / 3
    order.check_invariants()


def test_pins_that_pay_are_not_paused():
    """Where pins win (long coding sessions, a small cache) the judge leaves them alone."""
    fixed, _ = _agent_replay("agent-swe", 125, SessionPins(judged=False))
    judged, order = _agent_replay("agent-swe", 125, SessionPins())
    lru, _ = _agent_replay("agent-swe", 125, None)
    assert order.stats().pin_pauses == 0
    assert judged == fixed > lru + 0.02
