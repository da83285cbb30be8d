"""Session pins: the gap to a session's next turn learned online, pins, expiry, share bound."""

import pytest

from policies.kv.eviction import (
    DuelingSLRU,
    Segment,
    SessionGaps,
    SessionHints,
    SessionPins,
    session_tenant,
)


def release_chain(order, chain):
    for i in range(len(chain) - 1, -1, -1):
        order.release(chain[i], chain[i - 1] if i else None)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"max_pinned_fraction": 0.0}, r"max_pinned_fraction must be in \(0, 1\], got 0.0"),
    ({"gap_slack": 0.5}, "gap_slack"),
    ({"default_gap_s": float("nan")}, "default_gap_s must be a positive finite number"),
    ({"smoothing": 1.5}, "smoothing"),
    ({"tenant_weights": {"acme": 0}}, r"tenant_weights\['acme'\] must be a positive finite "
                                      "number, got 0"),
])
def test_rejects_bad_configuration(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SessionPins(**kwargs)


def test_learns_each_sessions_gap_and_the_fleets_for_new_sessions():
    gaps = SessionGaps(config=SessionPins(default_gap_s=10.0, smoothing=0.5, gap_slack=2.0))
    a = gaps.session_of("a", ["k1"])
    assert gaps.predicted_gap_s(a) == 10.0  # nothing seen yet
    gaps.started(a, 0.0)
    assert gaps.finished(a, "k1", 1.0) == 1.0 + 2.0 * 10.0
    gaps.started(a, 5.0)  # gap 4 s
    assert gaps.predicted_gap_s(a) == 4.0
    gaps.finished(a, "k2", 6.0)
    gaps.started(a, 14.0)  # gap 8 s: mean 0.5 * 4 + 0.5 * 8
    assert gaps.predicted_gap_s(a) == 6.0
    assert gaps.predicted_gap_s(gaps.session_of("b", ["x"])) == 6.0  # the fleet's mean
    gaps.check_invariants()


def test_names_a_session_by_hint_or_by_prefix_continuation():
    assert SessionGaps().session_of(None, ["sys", "t1"]) is None  # hints only by default
    gaps = SessionGaps(config=SessionPins(prefix_sessions=True))
    first = gaps.session_of(None, ["sys", "t1"])
    gaps.finished(first, "t1", 0.0)
    assert gaps.session_of(None, ["sys", "t1", "t2"]) == first  # continues its last turn
    assert gaps.session_of(None, ["sys", "u1"]) != first
    assert gaps.session_of("s-1", ["sys", "t1", "t2"]) == ("id", None, "s-1")  # the hint wins
    # another tenant's session never continues this one, nor shares a session id with it
    assert gaps.session_of(None, ["sys", "t1", "t2"], "acme") != first
    assert gaps.session_of("s-1", [], "acme") != gaps.session_of("s-1", [], "other")
    assert session_tenant(gaps.session_of("s-1", [], "acme")) == "acme"


def test_memory_is_bounded_by_max_sessions():
    gaps = SessionGaps(config=SessionPins(max_sessions=3))
    for i in range(10):
        session = gaps.session_of(f"s{i}", [i])
        gaps.started(session, float(i))
        gaps.finished(session, i, float(i))
        gaps.started(session, i + 0.5)
    gaps.check_invariants()
    assert gaps.session_of(None, [0]) != ("id", None, "s0")  # forgotten


def pinned_order(**kwargs):
    """An order that pins every finished turn (not judged, unless ``judged`` is given)."""
    order = DuelingSLRU(session_pins=SessionPins(**{"judged": False, **kwargs}))
    assert isinstance(order, SessionHints)
    return order


def finish_turn(order, session_id, chain, now):
    session = order.turn_started(session_id, chain, now)
    release_chain(order, chain)
    return order.turn_finished(session, chain, now)


def test_a_finished_turn_is_pinned_and_evicted_after_everything_else():
    order = pinned_order(max_pinned_fraction=1.0)
    release_chain(order, ["x1", "x2"])  # no session: ages normally
    assert finish_turn(order, "a", ["a1", "a2"], now=0.0) == 2
    assert order.pinned("a1") and order.segment_of("a1") is Segment.PROBATION  # in its place
    assert [order.evict() for _ in range(4)] == ["x2", "x1", "a2", "a1"]
    stats = order.stats()
    assert (stats.pins, dict(stats.evictions_by_segment)["pinned"]) == (2, 2)
    order.check_invariants()


def test_blocks_a_waiting_request_wants_go_after_pins_and_return_once_it_starts():
    order = pinned_order(max_pinned_fraction=1.0)
    release_chain(order, ["x1", "x2"])
    release_chain(order, ["w1"])
    finish_turn(order, "a", ["a1", "a2"], now=0.0)
    order.expect(["a1", "w1", "new"])  # a waiting prompt: a pinned block, an aged one, a miss
    assert order.segment_of("a1") is order.segment_of("w1") is Segment.WANTED
    assert order.pinned("a2") and order.segment_of("a2") is Segment.PROBATION
    order.check_invariants()
    assert [order.evict() for _ in range(3)] == ["x2", "x1", "a2"]  # pins before WANTED
    order.unexpect(["a1", "w1", "new"])  # it started without hitting them: they age again
    assert order.segment_of("a1") is order.segment_of("w1") is Segment.PROBATION
    order.turn_started("b", ["b1"], now=100.0)  # a1's pin expires while it is not pinned
    assert (order.evict(), order.stats().wanted_blocks) == ("a1", 0)
    order.check_invariants()


def test_a_hit_on_a_wanted_block_is_counted():
    order = DuelingSLRU()
    release_chain(order, ["s1", "s2"])
    order.expect(["s1", "s2", "q3"])
    order.acquire("s1")
    order.acquire("s2")
    order.unexpect(["s1", "s2", "q3"])
    assert (order.stats().wanted_hits, order.stats().wanted_blocks) == (2, 0)
    assert DuelingSLRU(keep_waiting=False).expect(["s1"]) is None  # off: nothing moves


def test_a_pin_expires_after_slack_times_the_predicted_gap():
    order = pinned_order(max_pinned_fraction=1.0, default_gap_s=10.0, gap_slack=1.5)
    finish_turn(order, "a", ["a1"], now=0.0)
    order.turn_started("b", ["b1"], now=14.9)
    assert order.pinned("a1")
    order.turn_started("b", ["b1"], now=15.0)
    assert not order.pinned("a1") and order.segment_of("a1") is Segment.PROBATION
    assert order.stats().pins_expired == 1


def test_an_expired_pin_held_past_its_place_goes_first():
    """A pinned block the order would have evicted (parked in PINNED) ages from where LRU
    would have it once its pin runs out: the front, before blocks released after it."""
    order = pinned_order(max_pinned_fraction=1.0, default_gap_s=10.0, gap_slack=1.5)
    finish_turn(order, "a", ["a1", "a2"], now=0.0)
    release_chain(order, ["x1", "x2"])
    assert order.evict() == "x2"  # a2, a1 were first in line: held in PINNED instead
    assert order.segment_of("a1") is order.segment_of("a2") is Segment.PINNED
    release_chain(order, ["y1"])
    order.turn_started("b", ["b1"], now=15.0)
    assert order.segment_of("a1") is Segment.PROBATION and not order.pinned("a2")
    assert [order.evict() for _ in range(4)] == ["a2", "a1", "x1", "y1"]
    assert order.stats().pins_expired == 2
    order.check_invariants()


def test_a_hit_on_a_pinned_block_is_counted_if_the_pin_bought_it():
    """A hit on a pinned block the order would have evicted counts in ``pin_hits``; one on
    a pinned block still in its place would have hit without the pin: it does not."""
    order = pinned_order(max_pinned_fraction=1.0)
    finish_turn(order, "a", ["a1", "a2"], now=0.0)
    release_chain(order, ["x1"])
    finish_turn(order, "b", ["b1"], now=0.0)
    assert order.evict() == "x1"  # a2, a1 held past the front; b1 is behind x1
    order.turn_started("a", ["a1", "a2", "a3"], now=3.0)
    order.acquire("a1")
    order.acquire("a2")
    order.acquire("b1")
    stats = order.stats()
    assert (stats.pin_hits, stats.pinned_blocks) == (2, 0)
    assert not any(map(order.pinned, ["a1", "a2", "b1"]))
    order.check_invariants()


def test_the_pinned_share_is_bounded_and_older_pins_stay():
    order = pinned_order(max_pinned_fraction=0.5)
    release_chain(order, [f"x{i}" for i in range(6)])
    finish_turn(order, "a", ["a1", "a2"], now=0.0)
    finish_turn(order, "b", [f"b{i}" for i in range(1, 6)], now=1.0)  # 13 tracked: 6 pins
    assert sum(map(order.pinned, order)) == 6
    assert order.pinned("a1") and order.pinned("b4") and not order.pinned("b5")  # b's prefix
    assert order.stats().pins_refused == 1
    order.check_invariants()


def test_with_only_pins_left_the_farthest_return_goes_first_leaf_first():
    order = pinned_order(max_pinned_fraction=1.0, default_gap_s=10.0)
    finish_turn(order, "soon", ["s1", "s2"], now=0.0)  # returns at about 10 s
    finish_turn(order, "late", ["l1", "l2"], now=5.0)  # at about 15 s
    assert [order.evict() for _ in range(4)] == ["l2", "l1", "s2", "s1"]


def test_pins_are_off_by_default():
    assert pinned_order().wants_turn("a") and not pinned_order().wants_turn(None)
    assert pinned_order(prefix_sessions=True).wants_turn(None)
    order = DuelingSLRU()
    assert not order.wants_turn("a")
    assert order.turn_started("a", ["a1"], 0.0) is None
    release_chain(order, ["a1"])
    assert order.turn_finished(None, ["a1"], 0.0) == 0
    assert order.segment_of("a1") is Segment.PROBATION
