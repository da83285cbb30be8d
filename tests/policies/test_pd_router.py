"""PD routers: the guarantees `PDRouter` documents, as properties over random clusters."""

import random

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from policies.pd.router import (
    InstanceLoad,
    LeastLoadedRouter,
    PDRouter,
    PrefixIndex,
    RoundRobinRouter,
    RouteReason,
    chain_keys,
)

PREFILL = ("p0", "p1", "p2")
DECODE = ("d0", "d1", "d2", "d3")
BLOCK = 16

loads_st = st.builds(InstanceLoad, queued_prefill_tokens=st.integers(0, 50_000),
                     running_decodes=st.integers(0, 300), kv_usage=st.floats(0, 1))
cluster_loads = st.fixed_dictionaries({n: loads_st for n in PREFILL + DECODE})
prompt_st = st.lists(st.integers(0, 3), min_size=0, max_size=12)  # block contents
history_st = st.lists(prompt_st, max_size=8)


def make_router(**kwargs) -> PDRouter:
    return PDRouter(prefill=PREFILL, decode=DECODE, block_size_tokens=BLOCK,
                    rng=random.Random(kwargs.pop("seed", 0)), **kwargs)


def warmed(history, loads, **kwargs) -> PDRouter:
    router = make_router(**kwargs)
    for i, blocks in enumerate(history):
        router.route(f"h{i}", BLOCK * len(blocks) + 1, chain_keys(blocks), loads)
    return router


def bound(router: PDRouter, pool, loads) -> float:
    scores = [router.load_score(loads[n]) for n in pool if router.is_up(n)]
    return (1 + router.balance_epsilon) * sum(scores) / len(scores) + router.load_slack_tokens


@given(loads_st, st.sampled_from(["queued_prefill_tokens", "running_decodes", "kv_usage"]),
       st.floats(0, 1000))
def test_load_score_is_monotone_in_every_load_measure(load, field, extra):
    router = make_router()
    value = getattr(load, field)
    raised = attrs.evolve(load, **{field: min(1.0, value + extra / 1000) if field == "kv_usage"
                                   else value + int(extra)})
    assert router.load_score(raised) >= router.load_score(load)


@given(history_st, cluster_loads, prompt_st, st.sampled_from(DECODE), st.integers(1, 100_000))
def test_raising_an_instances_load_never_makes_it_chosen(history, loads, prompt, name, extra):
    before = warmed(history, loads).route("r", BLOCK * len(prompt) + 1, chain_keys(prompt), loads)
    heavier = {**loads, name: attrs.evolve(loads[name], queued_prefill_tokens=(
        loads[name].queued_prefill_tokens + extra))}
    after = warmed(history, loads).route("r", BLOCK * len(prompt) + 1, chain_keys(prompt), heavier)
    if before.decode != name:
        assert after.decode != name


@given(history_st, cluster_loads, prompt_st, st.sets(st.sampled_from(PREFILL + DECODE)),
       st.sampled_from([None, 1, 2]))
def test_choice_is_healthy_within_bound_and_holds_the_longest_eligible_prefix(
        history, loads, prompt, down, choices):
    router = warmed(history, loads, choices=choices)
    for name in down:
        router.mark_down(name)
    keys = chain_keys(prompt)
    matched = router.index.match(keys)
    decision = router.route("r", BLOCK * len(prompt) + 1, keys, loads)
    router.check_invariants()
    if all(n in down for n in DECODE):
        assert decision.decode is None and decision.decode_reason is RouteReason.UNAVAILABLE
        return
    assert decision.decode not in down
    assert router.load_score(loads[decision.decode]) <= bound(router, DECODE, loads)
    if choices is None:
        eligible = [n for n in DECODE if n not in down
                    and router.load_score(loads[n]) <= bound(router, DECODE, loads)]
        assert matched.get(decision.decode, 0) == max(matched.get(n, 0) for n in eligible)
    if decision.prefill is not None:
        assert decision.prefill not in down
    elif decision.prefill_reason is RouteReason.SHORT_SUFFIX:
        assert BLOCK * len(prompt) + 1 - BLOCK * decision.decode_cached_blocks <= 256
    else:
        assert all(n in down for n in PREFILL)


@given(history_st, cluster_loads, prompt_st)
def test_affinity_is_honoured_when_nobody_is_overloaded(history, loads, prompt):
    even = {n: InstanceLoad() for n in loads}
    router = warmed(history, even)
    keys = chain_keys(prompt)
    longest = max(router.index.match(keys).values(), default=0)
    decision = router.route("r", BLOCK * len(prompt) + 1, keys, even)
    assert decision.decode_cached_blocks == longest
    assert decision.decode_reason is (RouteReason.AFFINITY if longest else
                                      RouteReason.LEAST_LOADED)


def test_a_hot_prefix_spills_over_once_its_instance_passes_the_bound():
    router = make_router(load_slack_tokens=0.0)
    keys = chain_keys([1, 2, 3])
    idle = {n: InstanceLoad() for n in PREFILL + DECODE}
    first = router.route("a", 49, keys, idle)
    hot = {**idle, first.decode: InstanceLoad(running_decodes=10)}
    second = router.route("b", 49, keys, hot)
    assert second.decode != first.decode
    assert second.decode_reason is RouteReason.SPILLOVER


def test_failover_avoids_a_down_instance_and_recovers():
    router = make_router()
    idle = {n: InstanceLoad() for n in PREFILL + DECODE}
    keys = chain_keys([5, 6, 7, 8])
    home = router.route("a", 65, keys, idle).decode
    router.mark_down(home)
    moved = router.route("b", 65, keys, idle)
    assert moved.decode != home and moved.decode_reason is RouteReason.SPILLOVER
    router.mark_up(home)
    assert router.route("c", 65, keys, idle).decode == home
    assert router.stats().failovers == 1
    router.mark_up(home, cache_lost=True)
    assert router.index.blocks(home) == 0


@given(history_st, cluster_loads, cluster_loads, prompt_st)
def test_a_session_returns_home_unless_home_is_past_the_bound_plus_the_slack(
        history, first_loads, loads, prompt):
    router = warmed(history, first_loads)
    keys = chain_keys(prompt)
    home = router.route("t1", BLOCK * len(prompt) + 1, keys, first_loads, session_id="s")
    held = router.index.match(keys).get(home.decode, 0) * BLOCK
    again = router.route("t2", BLOCK * len(prompt) + 1, keys, loads, session_id="s")
    router.check_invariants()
    slack = min(router.session_slack_tokens, held)  # what moving would recompute, capped
    within = router.load_score(loads[home.decode]) <= bound(router, DECODE, loads) + slack
    assert (again.decode == home.decode) is within or (
        again.decode == home.decode and again.decode_reason is not RouteReason.SESSION)
    if within:
        assert again.decode_reason is RouteReason.SESSION
    else:  # moved: the plain rule's choice, and the session's new home
        assert router.load_score(loads[again.decode]) <= bound(router, DECODE, loads)
        third = router.route("t3", 1, (), loads, session_id="s")
        assert third.decode == again.decode


def test_session_slack_keeps_a_turn_home_past_the_plain_bound_then_lets_it_go():
    router = make_router(load_slack_tokens=0.0, session_slack_tokens=1000.0)
    idle = {n: InstanceLoad() for n in PREFILL + DECODE}
    turn = chain_keys(range(100))  # 100 blocks: 1,600 tokens held, the slack is its cap
    home = router.route("t1", 1601, turn, idle, session_id="agent-1").decode
    busy = {**idle, home: InstanceLoad(running_decodes=3)}  # 768 > plain bound 211
    assert router.route("t2", 1601, turn, busy, session_id="agent-1").decode == home
    assert router.route("other", 1601, (), busy).decode != home  # no session: plain rule
    hot = {**idle, home: InstanceLoad(running_decodes=6)}  # 1536 > 422 + 1000
    moved = router.route("t3", 1601, turn, hot, session_id="agent-1")
    assert moved.decode != home and moved.decode_reason is not RouteReason.SESSION
    assert router.route("t4", 1601, turn, hot, session_id="agent-1").decode == moved.decode
    router.mark_up(moved.decode, cache_lost=True)  # it restarted: the session has no home
    assert router.route("t5", 1601, turn, idle, session_id="agent-1").decode_reason \
        is not RouteReason.SESSION
    router.check_invariants()


def test_the_session_slack_is_what_the_home_holds_below_the_cap():
    router = make_router(load_slack_tokens=0.0, session_slack_tokens=100_000.0)
    idle = {n: InstanceLoad() for n in PREFILL + DECODE}
    short = chain_keys(range(20))  # 320 tokens held: a 2-decode (512) excess is too much
    home = router.route("t1", 321, short, idle, session_id="a").decode
    busy = {**idle, home: InstanceLoad(running_decodes=2)}  # 512 > 141 + 320
    assert router.route("t2", 321, short, busy, session_id="a").decode != home


def test_sessions_are_forgotten_least_recently_routed_first():
    router = make_router(session_capacity=2)
    idle = {n: InstanceLoad() for n in PREFILL + DECODE}
    for session in ("a", "b", "a", "c"):
        router.route(session, 10, (), idle, session_id=session)
    router.check_invariants()
    assert router.route("b2", 10, (), idle, session_id="b").decode_reason \
        is not RouteReason.SESSION
    assert router.route("c2", 10, (), idle, session_id="c").decode_reason is RouteReason.SESSION


@settings(max_examples=50)
@given(history_st, cluster_loads, st.integers(0, 2**32), st.sampled_from([None, 2]))
def test_same_inputs_and_seed_give_the_same_decisions(history, loads, seed, choices):
    def run():
        router = make_router(seed=seed, choices=choices)
        return [router.route(f"r{i}", BLOCK * len(b) + 300, chain_keys(b), loads)
                for i, b in enumerate(history)], router.stats()
    assert run() == run()


@pytest.mark.parametrize("cls", [RoundRobinRouter, LeastLoadedRouter])
def test_baselines_skip_down_instances(cls):
    router = cls(prefill=PREFILL, decode=DECODE)
    router.mark_down("d0")
    router.mark_down("p1")
    loads = {n: InstanceLoad() for n in PREFILL + DECODE}
    decisions = [router.route(f"r{i}", 100, (), loads) for i in range(8)]
    assert {d.decode for d in decisions} <= {"d1", "d2", "d3"}
    assert {d.prefill for d in decisions} <= {"p0", "p2"}
    router.check_invariants()
    assert router.stats().routed == 8


def test_round_robin_cycles_and_least_loaded_follows_load():
    rr = RoundRobinRouter(prefill=(), decode=DECODE)
    assert [rr.route(str(i), 10).decode for i in range(5)] == ["d0", "d1", "d2", "d3", "d0"]
    assert rr.route("x", 10).prefill_reason is RouteReason.NO_PREFILL_INSTANCE
    ll = LeastLoadedRouter(prefill=(), decode=DECODE)
    loads = {n: InstanceLoad(running_decodes=5 - i) for i, n in enumerate(DECODE)}
    assert ll.route("x", 10, (), loads).decode == "d3"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"decode": ()}, "decode must name at least one instance"),
    ({"decode": ("a", "a")}, "decode must be distinct non-empty names"),
    ({"prefill": ("a",), "decode": ("a",)}, "in both the prefill and the decode pool"),
    ({"balance_epsilon": 1.5}, "balance_epsilon must be in [0, 1]"),
    ({"choices": 0}, "choices must be an integer >= 1"),
])
def test_constructor_rejects_bad_config(kwargs, message):
    config = {"prefill": PREFILL, "decode": DECODE, "block_size_tokens": BLOCK, **kwargs}
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        PDRouter(**config)


def test_unknown_instance_and_missing_load_raise():
    router = make_router()
    with pytest.raises(KeyError, match="unknown instance 'zz'"):
        router.mark_down("zz")
    with pytest.raises(KeyError, match="loads has no entry for healthy instance 'd0'"):
        router.route("r", 10, (), {})


class PrefixIndexMachine(RuleBasedStateMachine):
    """`PrefixIndex` against a model: per-instance LRU lists of keys, one key at a time.

    Capacity 5 with keys 0-9 (repeats within a call included) evicts, re-inserts
    and compacts the logs often.
    """

    def __init__(self):
        super().__init__()
        self.index = PrefixIndex(capacity_blocks=5)
        self.model: dict[str, list[int]] = {}
        self.evictions = 0

    @rule(names=st.lists(st.sampled_from("abc"), min_size=1, max_size=3),
          keys=st.lists(st.integers(0, 9), max_size=7))
    def insert(self, names, keys):
        self.index.insert(names, keys)
        for name in dict.fromkeys(names):
            lru = self.model.setdefault(name, [])
            before = set(lru) | set(keys)
            for key in keys:
                if key in lru:
                    lru.remove(key)
                lru.append(key)
                del lru[:-5]
            self.evictions += len(before) - len(lru)  # keys forgotten, each once
        assert self.index.evictions == self.evictions

    @rule(name=st.sampled_from("abc"), keys=st.lists(st.integers(0, 9), max_size=4))
    def drop(self, name, keys):
        self.index.drop(name, keys)
        self.model[name] = [k for k in self.model.get(name, []) if k not in keys]

    @rule(name=st.sampled_from("abc"))
    def clear(self, name):
        self.index.clear(name)
        self.model.pop(name, None)

    @rule(keys=st.lists(st.integers(0, 9), max_size=6))
    def match(self, keys):
        expected = {}
        for name, lru in self.model.items():
            run = next((i for i, k in enumerate(keys) if k not in lru), len(keys))
            if run:
                expected[name] = run
        assert self.index.match(keys) == expected

    @invariant()
    def consistent(self):
        self.index.check_invariants()
        for name in "abc":
            assert self.index.blocks(name) == len(self.model.get(name, []))
            held = {key for key in range(10) if name in self.index.match([key])}
            assert held == set(self.model.get(name, []))


TestPrefixIndex = PrefixIndexMachine.TestCase
