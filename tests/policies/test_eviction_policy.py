"""LRU and SegmentedLRU: segment rules, leaf-first chains, and a stateful oracle."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from policies import LRU, EvictionOrder, EvictionStats, Segment, SegmentedLRU
from tests.helpers.eviction import assert_misuse_raises_precise_errors


def release_chain(order, chain):
    """Release a request's chain tail first, as vLLM frees it."""
    for i in range(len(chain) - 1, -1, -1):
        order.release(chain[i], chain[i - 1] if i else None)


@pytest.mark.parametrize("cls", [LRU, SegmentedLRU])
def test_implements_the_eviction_protocol(cls):
    assert isinstance(cls(), EvictionOrder)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"protected_fraction": 1.0}, "protected_fraction must be in [0, 1), got 1.0"),
    ({"protected_fraction": float("nan")}, "protected_fraction must be in [0, 1)"),
    ({"promote_after_uses": 1}, "promote_after_uses"),
    ({"history_factor": -1.0}, "history_factor"),
])
def test_rejects_bad_configuration(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")
                       .replace(")", r"\)")):
        SegmentedLRU(**kwargs)


@pytest.mark.parametrize("cls", [LRU, SegmentedLRU])
def test_misuse_raises_precise_errors(cls):
    order = cls()
    assert_misuse_raises_precise_errors(order)


def test_lru_evicts_in_release_order_with_uncached_blocks_first():
    order = LRU()
    release_chain(order, ["a", "b", "c"])  # c, b, a
    order.release_uncached(1)
    order.release_uncached(2)  # newest uncached first, as vLLM's prepend
    assert list(order) == [2, 1, "c", "b", "a"]
    assert [order.evict() for _ in range(5)] == [2, 1, "c", "b", "a"]
    order.check_invariants()


def test_reused_blocks_outlive_one_shot_blocks():
    order = SegmentedLRU()
    release_chain(order, ["sys", "q1"])
    order.acquire("sys")
    order.release("sys")  # second use: promoted
    release_chain(order, ["x", "y"])
    assert order.segment_of("sys") is Segment.PROTECTED
    assert [order.evict() for _ in range(4)][-1] == "sys"
    assert order.stats().promotions == 1


def test_evicting_a_parent_orphans_its_children_and_they_go_next():
    order = SegmentedLRU()
    release_chain(order, ["a", "b", "c"])  # probation: c, b, a
    release_chain(order, ["z"])
    order.discard("a")  # a's content dropped behind the order's back
    assert order.segment_of("b") is Segment.ORPHAN
    assert order.evict() == "b"  # orphans before anything that still has its prefix
    assert order.segment_of("c") is Segment.ORPHAN
    assert order.evict() == "c"
    assert order.evict() == "z"
    order.check_invariants()
    assert order.stats().orphaned == 2


def test_ghost_history_promotes_returning_content():
    order = SegmentedLRU(history_factor=4.0)
    release_chain(order, ["keep", "a"])
    assert order.evict() == "a" and order.evict() == "keep"
    order.release("filler")
    order.release("keep")  # seen before its eviction: second use
    assert order.uses("keep") == 2
    assert order.segment_of("keep") is Segment.PROTECTED


def test_the_preemption_shield_protects_a_preempted_chain():
    order = SegmentedLRU()
    release_chain(order, ["other"])
    for key, parent in [("tail", "head"), ("head", None)]:
        order.release(key, parent, protect=True)
    assert order.segment_of("head") is order.segment_of("tail") is Segment.PROTECTED
    assert order.evict() == "other"
    assert order.stats().shielded == 2
    unshielded = SegmentedLRU(shield_preempted=False)
    unshielded.release("x", protect=True)
    assert unshielded.segment_of("x") is Segment.PROBATION


def test_stats_is_a_frozen_snapshot():
    order = SegmentedLRU()
    release_chain(order, ["a", "b"])
    order.release_uncached(7)
    stats = order.stats()
    assert isinstance(stats, EvictionStats)
    assert (stats.evictable_blocks, stats.uncached_blocks, stats.probation_blocks) == (3, 1, 2)
    order.evict()
    assert stats.evictable_blocks == 3


chains = st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=5, unique=True),
                  min_size=1, max_size=30)


@settings(max_examples=200, deadline=None)
@given(chains=chains, fraction=st.sampled_from([0.0, 0.5, 0.9, 0.98]),
       capacity=st.integers(3, 12))
def test_segment_sizes_and_prefix_property_hold_in_a_cache(chains, fraction, capacity):
    """Replayed as a cache, PROTECTED keeps its bound and no kept child lacks its parent."""
    order = SegmentedLRU(protected_fraction=fraction)
    cached: set = set()
    for chain in chains:
        chain = [tuple(chain[: i + 1]) for i in range(len(chain))][:capacity]  # keys = prefixes
        for key in chain:
            if key in cached:
                order.acquire(key)
                continue
            if len(cached) >= capacity:
                cached.remove(order.evict())
            cached.add(key)
        release_chain(order, chain)
        assert order.stats().protected_blocks <= max(1, int(fraction * len(order)))
        order.check_invariants()
        for key in order:
            if order.segment_of(key) is not Segment.ORPHAN and len(key) > 1:
                assert key[:-1] in cached, "a kept child must still have its parent"


class _Oracle:
    """SegmentedLRU's documented rules on plain lists (O(n) everything)."""

    def __init__(self, fraction, promote, history_factor):
        self.fraction, self.promote, self.history_factor = fraction, promote, history_factor
        self.entries = {}  # key -> dict(uses, segment, parent)
        self.lists = {s: [] for s in Segment}
        self.ghost = []  # [key, uses], oldest first
        self.peak = 0
        self.links = {}  # parent -> children in link order
        self.wanted = {}  # key -> waiting requests that expect it

    def _ghost_uses(self, key):
        for i, (k, uses) in enumerate(self.ghost):
            if k == key:
                del self.ghost[i]
                return uses
        return 0

    def _new(self, key):
        self.entries[key] = {"uses": 1 + self._ghost_uses(key), "segment": None, "parent": None}

    def _place(self, key, segment, front=False):
        if self.wanted.get(key) and segment > Segment.ORPHAN:
            segment, front = Segment.WANTED, False
        self.entries[key]["segment"] = segment
        self.lists[segment].insert(0, key) if front else self.lists[segment].append(key)

    def _children(self, key):
        return list(self.links.get(key, []))

    def _unlink(self, key):
        for children in self.links.values():
            if key in children:
                children.remove(key)

    def _forget(self, key):
        children = self._children(key)
        del self.entries[key]
        self.links.pop(key, None)
        self._unlink(key)
        for child in children:
            entry = self.entries[child]
            entry["parent"] = None
            if entry["segment"] not in (None, Segment.ORPHAN):
                self.lists[entry["segment"]].remove(child)
                self._place(child, Segment.ORPHAN)

    def release(self, key, parent, protect=False):
        if key not in self.entries:
            self._new(key)
        entry = self.entries[key]
        if parent != entry["parent"]:
            entry["parent"] = None
            self._unlink(key)
            if parent is not None and parent != key:
                if parent not in self.entries:
                    self._new(parent)
                if self.entries[parent]["segment"] is not Segment.UNCACHED:
                    entry["parent"] = parent
                    self.links.setdefault(parent, []).append(key)
        self._place(key, Segment.PROTECTED if protect or entry["uses"] >= self.promote
                    else Segment.PROBATION)
        self._rebalance()

    def expect(self, keys):
        for key in keys:
            self.wanted[key] = self.wanted.get(key, 0) + 1
            entry = self.entries.get(key)
            if entry and entry["segment"] in (Segment.PROBATION, Segment.PROTECTED):
                self.lists[entry["segment"]].remove(key)
                self._place(key, Segment.WANTED)

    def unexpect(self, keys):
        for key in keys:
            self.wanted[key] -= 1
            if self.wanted[key]:
                continue
            del self.wanted[key]
            entry = self.entries.get(key)
            if entry and entry["segment"] is Segment.WANTED:
                self.lists[Segment.WANTED].remove(key)
                self._place(key, Segment.PROTECTED if entry["uses"] >= self.promote
                            else Segment.PROBATION)
                self._rebalance()

    def _rebalance(self):
        limit = max(1, int(self.fraction * len(self)))
        while len(self.lists[Segment.PROTECTED]) > limit:
            demoted = self.lists[Segment.PROTECTED].pop(0)
            self.entries[demoted]["uses"] //= 2
            self._place(demoted, Segment.PROBATION)

    def demote_chain(self, root):
        if root not in self.entries or self.entries[root]["segment"] is Segment.UNCACHED:
            self._ghost_uses(root)
            return 0
        chain, seen, stack = [], {root}, [root]
        while stack:  # the same walk as the real one: parents before their children
            key = stack.pop()
            chain.append(key)
            children = [c for c in self._children(key) if c not in seen]
            seen.update(children)
            stack.extend(children)
        for key in chain:
            entry = self.entries[key]
            entry["uses"] = 0
            self._ghost_uses(key)  # its history goes too
            if entry["segment"] in (Segment.PROBATION, Segment.PROTECTED):
                self.lists[entry["segment"]].remove(key)
                self._place(key, Segment.PROBATION, front=True)
        return len(chain)

    def release_uncached(self, key):
        if key in self.entries:
            self._forget(key)
        self.entries[key] = {"uses": 0, "segment": None, "parent": None}
        self._place(key, Segment.UNCACHED, front=True)

    def acquire(self, key):
        entry = self.entries[key]
        self.lists[entry["segment"]].remove(key)
        entry["segment"] = None
        entry["uses"] += 1

    def evict(self):
        segment = next(s for s in Segment if self.lists[s])
        key = self.lists[segment].pop(0)
        uses = self.entries[key]["uses"]
        self._forget(key)
        if uses:
            self.peak = max(self.peak, len(self.entries) + 1)
            self.ghost.append([key, uses])
            limit = int(self.history_factor * self.peak)
            del self.ghost[:max(0, len(self.ghost) - limit)]
        return key

    def discard(self, key):
        if key in self.entries:
            segment = self.entries[key]["segment"]
            if segment is not None:
                self.lists[segment].remove(key)
            self._forget(key)

    def __len__(self):
        return sum(len(keys) for keys in self.lists.values())

    def order(self):
        return [k for s in Segment for k in self.lists[s]]


keys = st.integers(0, 7)


class SegmentedLRUMachine(RuleBasedStateMachine):
    """The real SegmentedLRU and the oracle agree on every victim and on the full order."""

    def __init__(self):
        super().__init__()
        self.real = SegmentedLRU(protected_fraction=0.5, history_factor=1.0)
        self.oracle = _Oracle(0.5, 2, 1.0)
        self.waiting = []  # the keys of each waiting request, told to both

    @rule(prompt=st.lists(keys, max_size=4))
    def expect(self, prompt):
        self.real.expect(prompt)
        self.oracle.expect(prompt)
        self.waiting.append(prompt)

    @precondition(lambda self: self.waiting)
    @rule(data=st.data())
    def unexpect(self, data):
        prompt = self.waiting.pop(data.draw(st.integers(0, len(self.waiting) - 1)))
        self.real.unexpect(prompt)
        self.oracle.unexpect(prompt)

    @rule(key=keys)
    def unexpect_unknown(self, key):
        if not any(key in prompt for prompt in self.waiting):
            with pytest.raises(KeyError, match="is not expected by a waiting request"):
                self.real.unexpect([key])

    @rule(key=keys, parent=st.none() | keys, protect=st.booleans())
    def release(self, key, parent, protect):
        if key in self.real:
            with pytest.raises(ValueError):
                self.real.release(key, parent)
            return
        self.real.release(key, parent, protect=protect)
        self.oracle.release(key, parent, protect)

    @rule(key=keys, parent=st.none() | keys)
    def release_cancelled(self, key, parent):
        if key not in self.real:
            self.real.release_cancelled(key, parent)
            self.oracle.release(key, parent, protect=True)  # retain_cancelled: as protected

    @rule(key=keys)
    def demote_chain(self, key):
        assert self.real.demote_chain(key) == self.oracle.demote_chain(key)

    @rule(key=keys)
    def release_uncached(self, key):
        if key not in self.real:
            self.real.release_uncached(key)
            self.oracle.release_uncached(key)

    @rule(key=keys)
    def acquire(self, key):
        if key in self.real:
            self.real.acquire(key)
            self.oracle.acquire(key)
        else:
            with pytest.raises(KeyError):
                self.real.acquire(key)

    @precondition(lambda self: len(self.oracle) > 0)
    @rule()
    def evict(self):
        assert self.real.evict() == self.oracle.evict()

    @rule(key=keys)
    def discard(self, key):
        self.real.discard(key)
        self.oracle.discard(key)

    @invariant()
    def agree(self):
        self.real.check_invariants()
        assert list(self.real) == self.oracle.order()
        assert len(self.real) == len(self.oracle)
        for key in range(8):
            assert self.real.uses(key) == self.oracle.entries.get(key, {"uses": 0})["uses"]


TestSegmentedLRUMachine = SegmentedLRUMachine.TestCase
TestSegmentedLRUMachine.settings = settings(max_examples=150, stateful_step_count=40,
                                            deadline=None)
