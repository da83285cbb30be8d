"""TierPlacement: LRU demotion through tiers, the high-priority floor, prefetch, and a
stateful machine checking capacities, single residence and the floor against an oracle."""

from collections import OrderedDict

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from policies import Tier, TierMove, TierPlacement


def three_tiers(**kwargs):
    return TierPlacement(tiers=[Tier(name="gpu", capacity_blocks=2),
                                Tier(name="cpu", capacity_blocks=2),
                                Tier(name="disk", capacity_blocks=3)], **kwargs)


@pytest.mark.parametrize(("tiers", "floor", "message"), [
    ([], None, "tiers must not be empty"),
    ([Tier(name="cpu", capacity_blocks=1)] * 2, None, "tier names must be distinct"),
    ([Tier(name="cpu", capacity_blocks=1)], "ssd", "high_priority_floor 'ssd' is not a tier"),
])
def test_rejects_bad_configuration(tiers, floor, message):
    with pytest.raises(ValueError, match=message):
        TierPlacement(tiers=tiers, high_priority_floor=floor)


def test_rejects_an_empty_tier():
    with pytest.raises(ValueError, match="capacity_blocks"):
        Tier(name="cpu", capacity_blocks=0)


def test_misuse_raises_key_errors():
    placement = three_tiers()
    for call in (placement.use, placement.promote, placement.discard):
        with pytest.raises(KeyError, match="'x' is not stored in any tier"):
            call("x")


def test_full_tiers_demote_least_recently_used_down_and_drop_off_the_last():
    placement = three_tiers()
    assert placement.store("a") == [] and placement.store("b") == []
    assert placement.store("c") == [TierMove("a", "gpu", "cpu")]
    placement.use("b")  # b becomes most recent: c is the next victim
    assert placement.store("d") == [TierMove("c", "gpu", "cpu")]
    assert placement.store("e") == [TierMove("b", "gpu", "cpu"), TierMove("a", "cpu", "disk")]
    for key in "fg":
        placement.store(key)
    assert placement.keys_in("disk") == ("a", "c", "b")
    assert placement.store("h")[-1] == TierMove("a", "disk", None)
    assert placement.tier_of("a") is None and "a" not in placement
    assert placement.stats().dropped == 1
    placement.check_invariants()


def test_high_priority_blocks_never_go_below_their_floor():
    placement = three_tiers(high_priority_floor="cpu")
    placement.store("vip", high_priority=True)
    placement.store("low")
    placement.store("x")  # vip: gpu -> cpu
    placement.store("y")  # low: gpu -> cpu
    moves = placement.store("z")  # x: gpu -> cpu pushes vip out of cpu: dropped, not on disk
    assert moves == [TierMove("x", "gpu", "cpu"), TierMove("vip", "cpu", None)]
    placement.store("w")  # y: gpu -> cpu pushes low to disk
    assert placement.tier_of("low") == "disk"
    placement.check_invariants()


def test_storing_a_present_key_only_refreshes_it():
    placement = three_tiers()
    placement.store("a")
    placement.store("b")
    assert placement.store("a") == []
    assert placement.store("c") == [TierMove("b", "gpu", "cpu")]
    assert placement.stats().stored == 3


def test_prefetch_follows_chains_up_to_their_first_missing_block():
    placement = TierPlacement(tiers=[Tier(name="cpu", capacity_blocks=2),
                                     Tier(name="disk", capacity_blocks=10)])
    for key in ["a1", "a2", "a3", "b1", "b2"]:
        placement.store(key)  # cpu keeps b1, b2; the rest is on disk
    chains = [["a1", "a2", "missing", "a3"], ["b1", "b2"], ["a3"]]
    assert placement.prefetch_candidates(chains, max_blocks=10) == ["a1", "a2", "a3"]
    assert placement.prefetch_candidates(chains, max_blocks=1) == ["a1"]
    assert placement.promote("a1", prefetch=True) == [TierMove("a1", "disk", "cpu"),
                                                      TierMove("b1", "cpu", "disk")]
    assert placement.use("a1") == "cpu"
    placement.promote("a2", prefetch=True)  # evicts b2 from cpu
    placement.promote("a3", prefetch=True)  # evicts a1 (read) then nothing prefetched left
    placement.promote("b1", prefetch=True)  # pushes a2 (prefetched, never read) down: wasted
    stats = placement.stats()
    assert (stats.prefetched, stats.prefetch_hits, stats.prefetch_wasted) == (4, 1, 1)
    assert stats.prefetch_accuracy == 0.5
    placement.check_invariants()


def test_stats_count_loads_and_demotions_by_tier():
    placement = three_tiers()
    for key in "abc":
        placement.store(key)
    placement.use("a")
    placement.use("c")
    stats = placement.stats()
    assert stats.blocks_by_tier == (("gpu", 2), ("cpu", 1), ("disk", 0))
    assert stats.loads_by_tier == (("gpu", 1), ("cpu", 1), ("disk", 0))
    assert stats.demoted_by_tier == (("gpu", 1), ("cpu", 0), ("disk", 0))


keys = st.sampled_from([f"k{i}" for i in range(12)])


class TierPlacementMachine(RuleBasedStateMachine):
    """The real placement agrees with a list-of-OrderedDicts oracle on where every key is."""

    CAPACITIES = (2, 3, 4)
    FLOOR = 1

    def __init__(self):
        super().__init__()
        self.real = TierPlacement(
            tiers=[Tier(name=str(i), capacity_blocks=c) for i, c in enumerate(self.CAPACITIES)],
            high_priority_floor=str(self.FLOOR))
        self.tiers = [OrderedDict() for _ in self.CAPACITIES]
        self.high = {}

    def _where(self, key):
        return next((i for i, tier in enumerate(self.tiers) if key in tier), None)

    def _settle(self, index):
        while index < len(self.tiers) and len(self.tiers[index]) > self.CAPACITIES[index]:
            key, _ = self.tiers[index].popitem(last=False)
            floor = self.FLOOR if self.high[key] else len(self.tiers) - 1
            if index + 1 > floor:
                del self.high[key]
                return
            self.tiers[index + 1][key] = None
            index += 1

    @rule(key=keys, high=st.booleans())
    def store(self, key, high):
        self.real.store(key, high_priority=high)
        where = self._where(key)
        if where is not None:
            self.tiers[where].move_to_end(key)
            return
        self.high[key] = high
        self.tiers[0][key] = None
        self._settle(0)

    @rule(key=keys)
    def use(self, key):
        where = self._where(key)
        if where is None:
            with pytest.raises(KeyError):
                self.real.use(key)
            return
        assert self.real.use(key) == str(where)
        self.tiers[where].move_to_end(key)

    @rule(key=keys)
    def promote(self, key):
        where = self._where(key)
        if where is None:
            return
        self.real.promote(key, prefetch=True)
        if where == 0:
            self.tiers[0].move_to_end(key)
            return
        del self.tiers[where][key]
        self.tiers[where - 1][key] = None
        self._settle(where - 1)

    @rule(key=keys)
    def discard(self, key):
        where = self._where(key)
        if where is None:
            return
        self.real.discard(key)
        del self.tiers[where][key]
        del self.high[key]

    @invariant()
    def agrees_with_the_oracle(self):
        self.real.check_invariants()
        for index, tier in enumerate(self.tiers):
            assert self.real.keys_in(str(index)) == tuple(tier)
            assert len(tier) <= self.CAPACITIES[index]
        assert all(self._where(k) <= self.FLOOR for k, high in self.high.items() if high)


TestTierPlacementMachine = TierPlacementMachine.TestCase
TestTierPlacementMachine.settings = settings(max_examples=150, stateful_step_count=40,
                                             deadline=None)
