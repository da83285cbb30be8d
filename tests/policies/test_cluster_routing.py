"""Cluster routers over a fake replica set: each peer's published rule, and `SLORouter`'s
guarantees (feasible placement, session then earliest first token, Retry-After, one retry)."""

import random

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.cluster_routing import (
    ClusterRequest,
    KVOverlapReplicas,
    PowerOfTwoReplicas,
    ReplicaReport,
    RoundRobinReplicas,
    RouteCause,
    SessionStickyReplicas,
    SLORouter,
    StickyUntilSaturated,
    make_router,
)
from policies.output_lengths import DEFAULT_OUTPUT_TOKENS
from policies.pd.router import chain_keys
from policies.slo.fairness import ClassFairShare
from policies.step_model import StepTimeModel

NAMES = ("r0", "r1", "r2")
BLOCK = 16
MODEL = StepTimeModel(base_s=0.007, decode_s_per_seq=1e-4, prefill_s_per_token=2.3e-5,
                      decode_s_per_context_token=5e-8, prefill_s_per_pair=1.4e-9)


def report(name: str, *, queued: int = 0, running: int = 0, accepting: bool = True,
           recent_step_s: float | None = None, kv_usage: float = 0.0) -> ReplicaReport:
    return ReplicaReport(name=name, queued_prefill_tokens=queued, running_requests=running,
                         kv_usage=kv_usage, kv_capacity_tokens=400_000, token_budget=8192,
                         step_model=MODEL, recent_step_s=recent_step_s, accepting=accepting)


def reports(**overrides: dict) -> dict[str, ReplicaReport]:
    return {name: report(name, **overrides.get(name, {})) for name in NAMES}


def request(rid: str = "q", *, blocks: tuple[int, ...] = (), prompt: int | None = None,
            session: str | None = None, ttft_s: float | None = 1.0, arrival_s: float = 0.0,
            demote_ttft_s: float | None = None) -> ClusterRequest:
    return ClusterRequest(request_id=rid, arrival_s=arrival_s,
                          prompt_tokens=prompt or BLOCK * len(blocks) + 1,
                          block_keys=chain_keys(blocks), session_id=session, ttft_s=ttft_s,
                          tpot_s=0.1, demote_ttft_s=demote_ttft_s)


def test_construction_and_report_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match="replicas must name at least one replica"):
        RoundRobinReplicas(replicas=())
    with pytest.raises(ValueError, match="replicas has duplicates"):
        RoundRobinReplicas(replicas=("a", "a"))
    with pytest.raises(ValueError, match="saturation_tokens"):
        StickyUntilSaturated(replicas=NAMES, saturation_tokens=0)
    with pytest.raises(ValueError, match="min_retry_after_s"):
        SLORouter(replicas=NAMES, min_retry_after_s=5.0, max_retry_after_s=1.0)
    with pytest.raises(KeyError, match="no entry for replica 'r2'"):
        RoundRobinReplicas(replicas=NAMES).route(request(), {"r0": report("r0"),
                                                             "r1": report("r1")}, 0.0)


def test_round_robin_cycles_over_accepting_replicas() -> None:
    router = RoundRobinReplicas(replicas=NAMES)
    state = reports(r1={"accepting": False})
    chosen = [router.route(request(f"q{i}"), state, 0.0).replica for i in range(4)]
    assert chosen == ["r0", "r2", "r0", "r2"]
    none = router.route(request(), {n: report(n, accepting=False) for n in NAMES}, 0.0)
    assert none.replica is None and none.cause is RouteCause.NO_REPLICA
    assert router.stats().rejected == 1 and router.stats().routed == 4
    router.check_invariants()


def test_power_of_two_takes_the_shorter_of_its_draws() -> None:
    router = PowerOfTwoReplicas(replicas=NAMES, rng=random.Random(1))
    state = reports(r0={"running": 50}, r1={"running": 50})
    # r2 is the emptiest: it wins every draw it is part of, and loses none.
    chosen = {router.route(request(f"q{i}"), state, 0.0).replica for i in range(30)}
    assert "r2" in chosen
    single = PowerOfTwoReplicas(replicas=("only",))
    assert single.route(request(), {"only": report("only")}, 0.0).replica == "only"


def test_kv_overlap_trades_cache_hits_against_queued_tokens() -> None:
    router = KVOverlapReplicas(replicas=NAMES, block_size_tokens=BLOCK)
    blocks = tuple(range(40))
    first = router.route(request("a", blocks=blocks), reports(), 0.0).replica
    again = router.route(request("b", blocks=blocks), reports(), 0.0)
    assert again.replica == first and again.cause is RouteCause.CACHE
    assert again.cached_tokens == 40 * BLOCK
    busy = reports(**{first: {"queued": 10_000}})
    assert router.route(request("c", blocks=blocks), busy, 0.0).replica != first


def test_session_sticky_keeps_a_session_until_its_replica_stops_accepting() -> None:
    router = SessionStickyReplicas(replicas=NAMES)
    home = router.route(request("t0", session="s"), reports(r0={"running": 5}), 0.0).replica
    assert home == "r1"  # least loaded at the first call
    loaded = reports(r1={"running": 99})
    follow = router.route(request("t1", session="s"), loaded, 0.0)
    assert follow.replica == "r1" and follow.cause is RouteCause.SESSION
    moved = router.route(request("t2", session="s"), reports(r1={"accepting": False}), 0.0)
    assert moved.replica != "r1" and moved.cause is RouteCause.LEAST_LOADED
    assert router.stats().sessions == 1


def test_sticky_until_saturated_leaves_the_warm_replica_at_the_limit() -> None:
    router = StickyUntilSaturated(replicas=NAMES, block_size_tokens=BLOCK,
                                  saturation_tokens=5_000)
    blocks = tuple(range(20))
    warm = router.route(request("a", blocks=blocks), reports(), 0.0).replica
    near = reports(**{warm: {"queued": 4_999}})
    assert router.route(request("b", blocks=blocks), near, 0.0).replica == warm
    full = reports(**{warm: {"queued": 5_000}})
    cold = router.route(request("c", blocks=blocks), full, 0.0)
    assert cold.replica != warm and cold.cause is RouteCause.LEAST_LOADED


def test_slo_router_prefers_the_session_replica_while_it_is_feasible() -> None:
    router = SLORouter(replicas=NAMES, block_size_tokens=BLOCK)
    first = router.route(request("t0", session="s", blocks=tuple(range(64))), reports(), 0.0)
    assert first.accepted and first.predicted_ttft_s <= 0.9
    home = first.replica
    assert home == "r0"  # equal predictions: the first listed
    # Some load at home, less elsewhere: still home while the deadline holds.
    state = reports(r0={"queued": 8_000})
    follow = router.route(request("t1", session="s", blocks=tuple(range(70))), state, 0.1)
    assert follow.replica == "r0" and follow.cause is RouteCause.SESSION
    # Home can no longer make it: the earliest first token elsewhere.
    state = reports(r0={"queued": 200_000}, r1={"queued": 3_000})
    moved = router.route(request("t2", session="s", blocks=tuple(range(70))), state, 0.2)
    assert moved.replica == "r2" and moved.cause is RouteCause.FEASIBLE


def test_slo_router_rejects_with_retry_after_when_no_replica_is_feasible() -> None:
    router = SLORouter(replicas=NAMES, min_retry_after_s=0.5, max_retry_after_s=30.0)
    swamped = {n: report(n, queued=1_000_000) for n in NAMES}
    decision = router.route(request(), swamped, 0.0)
    assert decision.replica is None and decision.cause is RouteCause.NO_FEASIBLE
    assert 0.5 <= decision.retry_after_s <= 30.0
    # Late already on arrival: rejected however empty the replicas are.
    late = router.route(request("late", arrival_s=0.0), reports(), now=5.0)
    assert late.cause is RouteCause.NO_FEASIBLE
    # A request with no target is always placed.
    free = router.route(request("free", ttft_s=None), swamped, 0.0)
    assert free.accepted


def test_slo_router_demotes_to_the_declared_lower_class() -> None:
    router = SLORouter(replicas=NAMES)
    state = {n: report(n, queued=100_000) for n in NAMES}  # ~2.5 s of prefill each
    decision = router.route(request(ttft_s=1.0, demote_ttft_s=10.0), state, 0.0)
    assert decision.cause is RouteCause.DEMOTED and decision.accepted


def test_slo_router_retries_once_elsewhere() -> None:
    router = SLORouter(replicas=NAMES)
    first = router.route(request("q"), reports(), 0.0)
    retry = router.retry(request("q"), reports(), 0.05, rejected_by=first.replica)
    assert retry.cause is RouteCause.RETRIED and retry.replica not in (first.replica, None)
    again = router.retry(request("q"), reports(), 0.1, rejected_by=retry.replica)
    assert again.replica is None and again.cause is RouteCause.NO_RETRY
    with pytest.raises(KeyError, match="rejected_by 'nowhere'"):
        router.retry(request("z"), reports(), 0.0, rejected_by="nowhere")
    stats = router.stats()
    assert stats.retries == 2 and stats.retries_placed == 1
    router.check_invariants()
    # Peers pass a replica's rejection on.
    peer = SessionStickyReplicas(replicas=NAMES)
    assert peer.retry(request("q"), reports(), 0.0, rejected_by="r0").cause is RouteCause.NO_RETRY


def test_a_rejection_passed_on_while_another_replica_had_room_is_counted() -> None:
    busy = {"queued": 10_000_000}  # days of prefill ahead: no room for a 1 s target
    peer = SessionStickyReplicas(replicas=NAMES)
    assert peer.replica_with_room(request("q"), reports(), 0.0,
                                  excluding=frozenset({"r0"})) == "r1"
    peer.retry(request("q"), reports(r1=busy), 0.0, rejected_by="r0")  # r2 had room
    peer.retry(request("p"), reports(r1=busy, r2=busy), 0.0, rejected_by="r0")  # none had
    assert peer.stats().rejected_with_room == 1
    peer.check_invariants()
    slo = SLORouter(replicas=NAMES)
    placed = slo.retry(request("q"), reports(), 0.0, rejected_by="r0")
    assert placed.accepted and slo.stats().rejected_with_room == 0
    # A second rejection of the same request is passed on (one retry), though r2 has room.
    slo.retry(request("q"), reports(r1=busy), 0.0, rejected_by=placed.replica)
    # No other replica meets the deadline: the rejection reaches the client, not counted.
    slo.retry(request("p"), reports(r1=busy, r2=busy), 0.0, rejected_by="r0")
    stats = slo.stats()
    assert (stats.retries, stats.retries_placed, stats.rejected_with_room) == (3, 1, 1)
    slo.check_invariants()


def test_a_retry_keeps_the_session_where_its_context_is() -> None:
    router = SLORouter(replicas=NAMES, block_size_tokens=BLOCK)
    blocks = tuple(range(32))
    home = router.route(request("t0", session="s", blocks=blocks), reports(), 0.0).replica
    moved = router.retry(request("t0", session="s", blocks=blocks), reports(), 0.0,
                         rejected_by=home)
    assert moved.replica != home
    follow = router.route(request("t1", session="s", blocks=blocks, arrival_s=1.0), reports(),
                          1.0)
    assert follow.replica == home and follow.cause is RouteCause.SESSION
    assert follow.cached_tokens == 32 * BLOCK


def test_a_replica_is_judged_by_the_headrooms_its_admission_reports() -> None:
    router = SLORouter(replicas=("a", "b"), headroom=0.9)
    # ~0.55 s predicted on either replica against a 1 s target: a's admission allows only
    # half the target now, b's the router's default.
    strict = attrs.evolve(report("a", queued=20_000), ttft_headroom=0.5)
    lax = report("b", queued=20_000)
    assert router.predict_ttft_s(request(), strict, 0, 0.0) == pytest.approx(
        router.predict_ttft_s(request(), lax, 0, 0.0))
    assert router.route(request("x"), {"a": strict, "b": lax}, 0.0).replica == "b"
    tight = attrs.evolve(lax, running_requests=10, recent_step_s=0.085, tpot_headroom=0.8)
    assert router.route(request("y"), {"a": strict, "b": tight}, 0.0).replica is None
    with pytest.raises(ValueError, match="tpot_headroom"):
        attrs.evolve(lax, tpot_headroom=0.0)


def test_an_idle_replica_is_judged_by_the_router_s_headroom_not_the_one_it_reports() -> None:
    # An overload left the replica's headrooms at their floor, and only the requests it
    # decides on correct them: judged by them while idle, it would never be sent one again.
    router = SLORouter(replicas=("a",), headroom=0.9)
    floored = attrs.evolve(report("a"), ttft_headroom=0.05, tpot_headroom=0.05,
                           tpot_bound_s=0.05)
    assert 0.05 < router.predict_ttft_s(request(prompt=4000), floored, 0, 0.0) < 0.9
    assert router.route(request("x", prompt=4000), {"a": floored}, 0.0).replica == "a"
    hopeless = router.route(request("big", prompt=60_000), {"a": floored}, 0.0)
    assert hopeless.replica is None, "predicted past the router's own headroom"
    for busy in (attrs.evolve(floored, running_requests=1),
                 attrs.evolve(floored, waiting_requests=1),
                 attrs.evolve(floored, queued_prefill_tokens=100)):
        assert router.route(request("y", prompt=4000), {"a": busy}, 0.0).replica is None


def test_a_replica_decoding_a_tighter_class_holds_the_request_to_that_class_tpot() -> None:
    router = SLORouter(replicas=("a", "b"))
    # ~0.085 s a token on either replica: within the request's own 0.1 s target, but a's
    # admission holds every classed request to the 0.05 s of a class decoding there.
    busy = attrs.evolve(report("a", running=10, recent_step_s=0.085), tpot_bound_s=0.05)
    free = report("b", running=10, recent_step_s=0.085)
    assert router.predict_tpot_s(request(), busy) == pytest.approx(
        router.predict_tpot_s(request(), free))
    assert router.route(request("x"), {"a": busy, "b": free}, 0.0).replica == "b"
    assert not router.room_test().has_room(request("y"), busy, 0.0)
    assert router.room_test().has_room(request("y"), free, 0.0)
    assert router.room_test().has_room(request("u", ttft_s=None), busy, 0.0), "no class"
    with pytest.raises(ValueError, match="tpot_bound_s"):
        attrs.evolve(free, tpot_bound_s=0.0)


def test_keep_sessions_rejects_rather_than_moving_a_session() -> None:
    router = SLORouter(replicas=NAMES, keep_sessions=True)
    home = router.route(request("t0", session="s"), reports(), 0.0).replica
    swamped = reports(**{home: {"queued": 500_000}})
    kept = router.route(request("t1", session="s"), swamped, 0.0)
    assert kept.replica is None and kept.cause is RouteCause.NO_FEASIBLE
    assert router.route(request("t2", session="other"), swamped, 0.0).replica != home
    moving = SLORouter(replicas=NAMES)
    moving.route(request("t0", session="s"), reports(), 0.0)
    assert moving.route(request("t1", session="s"), swamped, 0.0).replica not in (home, None)


def test_keep_sessions_leaves_a_late_call_to_its_replica_s_own_admission() -> None:
    router = SLORouter(replicas=NAMES, keep_sessions=True)
    judged = {name: attrs.evolve(r, ttft_headroom=0.9) for name, r in reports().items()}
    home = router.route(request("t0", session="s"), judged, 0.0).replica
    swamped = {**judged, home: attrs.evolve(judged[home], queued_prefill_tokens=500_000)}
    sent = router.route(request("t1", session="s"), swamped, 0.0)
    assert sent.replica == home and sent.cause is RouteCause.DEFERRED
    refused = router.retry(request("t1", session="s"), swamped, 0.0, rejected_by=home)
    assert refused.replica is None and refused.cause is RouteCause.NO_RETRY, (
        "a refused call is passed on, not moved away from its session's context")
    assert router.stats().rejected_with_room == 1, "the others had room: counted"
    other = router.route(request("t2", session="other"), swamped, 0.0)
    assert other.replica not in (home, None), "a new session goes where it is on time"
    assert router.retry(request("t2", session="other"), swamped, 0.0,
                        rejected_by=other.replica).replica is None
    flooded = {name: attrs.evolve(r, queued_prefill_tokens=500_000 + 1_000 * i)
               for i, (name, r) in enumerate(judged.items())}
    new = router.route(request("t3", session="new"), flooded, 0.0)
    assert new.replica == NAMES[0] and new.cause is RouteCause.DEFERRED, "the earliest"
    unjudged = SLORouter(replicas=NAMES, keep_sessions=True)
    assert unjudged.route(request("t4", session="new"), {
        n: attrs.evolve(r, ttft_headroom=None) for n, r in flooded.items()}, 0.0).replica is None
    moving = SLORouter(replicas=NAMES)
    first = moving.route(request("u", session="x"), judged, 0.0).replica
    assert moving.retry(request("u", session="x"), judged, 0.0,
                        rejected_by=first).replica not in (first, None), "without: moved"


def test_an_edf_replica_counts_only_the_work_due_before_the_request() -> None:
    router = SLORouter(replicas=("a",))
    fifo = report("a", queued=100_000)  # ~2.5 s of prefill: a 1 s target cannot be met
    edf = attrs.evolve(fifo, queued_prefill_deadlines=((0.5, 2_000), (20.0, 98_000)))
    assert router.route(request("x"), {"a": fifo}, 0.0).replica is None
    assert router.route(request("y"), {"a": edf}, 0.0).replica == "a"
    assert router.predict_ttft_s(request(), edf, 0, 0.0) < router.predict_ttft_s(
        request(), attrs.evolve(edf, queued_prefill_deadlines=((0.5, 100_000),)), 0, 0.0)


def test_slo_router_checks_tpot_on_running_replicas() -> None:
    router = SLORouter(replicas=("a", "b"))
    slow = attrs.evolve(report("a"), running_requests=100, recent_step_s=0.12)
    quick = attrs.evolve(report("b", queued=2_000), running_requests=10, recent_step_s=0.03)
    assert router.route(request(), {"a": slow, "b": quick}, 0.0).replica == "b"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 300_000), st.integers(0, 200), st.booleans()),
                min_size=3, max_size=3),
       st.integers(1, 30_000), st.floats(0.0, 3.0))
def test_slo_router_places_only_where_the_prediction_meets_the_deadline(
        loads: list[tuple[int, int, bool]], prompt: int, waited_s: float) -> None:
    router = SLORouter(replicas=NAMES)
    state = {n: report(n, queued=q, running=r, accepting=a)
             for n, (q, r, a) in zip(NAMES, loads, strict=True)}
    req = request(prompt=prompt, arrival_s=0.0)
    decision = router.route(req, state, waited_s)
    accepting = [n for n in NAMES if state[n].accepting]
    predictions = {n: router.predict_ttft_s(req, state[n], 0, waited_s) for n in accepting}
    if decision.accepted:
        assert predictions[decision.replica] <= router.headroom * req.ttft_s
        assert decision.predicted_ttft_s == predictions[decision.replica]
    elif accepting:
        assert all(router.predict_ttft_s(req, state[n], 0, waited_s) > 0.9 * req.ttft_s
                   or router.predict_tpot_s(req, state[n]) > req.tpot_s for n in accepting)
        assert router.min_retry_after_s <= decision.retry_after_s <= router.max_retry_after_s
    router.check_invariants()


def tenant_request(rid: str, tenant: str, *, blocks: tuple[int, ...] = tuple(range(100)),
                   arrival_s: float = 0.0) -> ClusterRequest:
    return attrs.evolve(request(rid, blocks=blocks, arrival_s=arrival_s), tenant=tenant,
                        slo_class="chat")


def loaded_reports(load_s: float) -> dict[str, ReplicaReport]:
    """Every replica with ``load_s`` of prefill queued at the whole rate."""
    rate = MODEL.prefill_tokens_per_s(0, 8192, 0)
    return {n: report(n, queued=round(load_s * rate)) for n in NAMES}


def test_fair_router_refuses_the_tenant_over_its_share_first() -> None:
    router = SLORouter(replicas=NAMES, block_size_tokens=BLOCK,
                       fairness=ClassFairShare(weights={"a": 1, "b": 1}))
    # Across replicas, a has lately been sent twice b's work: a is over its half.
    for rid, tenant in (("a0", "a"), ("a1", "a"), ("b0", "b")):
        assert router.route(tenant_request(rid, tenant, blocks=(hash(rid),)), reports(),
                            0.0).accepted
    assert router.fair_rate_share(tenant_request("x", "a"), 0.0) == pytest.approx(2 / 3)
    assert router.fair_rate_share(tenant_request("x", "b"), 0.0) == 1.0
    # ~0.7 s of prefill queued everywhere: within 0.9 s at the whole rate, not on 2/3 of it.
    state = loaded_reports(0.7)
    refused = router.route(tenant_request("a2", "a"), state, 0.0)
    assert refused.cause is RouteCause.NO_FEASIBLE and refused.retry_after_s >= 0.5
    # The room test judges a by the same share: a's refusal by a replica is no refusal
    # "while another replica had room".
    assert router.replica_with_room(tenant_request("a3", "a"), state, 0.0) is None
    assert router.replica_with_room(tenant_request("b2", "b"), state, 0.0) is not None
    placed = router.route(tenant_request("b1", "b"), state, 0.0)
    assert placed.accepted
    stats = router.stats()
    assert stats.over_share_rejected == 1 and stats.over_share_routed == 0  # b came after a1
    # b has now been sent as much as a: a is at its share again, planned on the whole rate.
    assert router.fair_rate_share(tenant_request("x", "a"), 0.0) == 1.0
    router.check_invariants()


def test_fair_router_is_work_conserving() -> None:
    router = SLORouter(replicas=NAMES, block_size_tokens=BLOCK,
                       fairness=ClassFairShare(weights={"a": 1, "b": 4}))
    for i in range(20):
        router.route(tenant_request(f"a{i}", "a", blocks=(i,)), reports(), 0.0)
    # Alone in its class, a may use every replica, whatever its weight.
    assert router.fair_rate_share(tenant_request("x", "a"), 0.0) == 1.0
    assert router.route(tenant_request("last", "a"), loaded_reports(0.7), 0.0).accepted
    # Another class is another pool: b's chat work does not hold a back in batch.
    router.route(tenant_request("b0", "b"), reports(), 0.0)
    batch = attrs.evolve(tenant_request("y", "a"), slo_class="batch")
    assert router.fair_rate_share(batch, 0.0) == 1.0
    assert router.stats().over_share_routed == 0
    router.check_invariants()


def test_fair_router_charges_uncached_prefill_then_what_was_generated() -> None:
    fairness = ClassFairShare(weights={"a": 1})
    router = SLORouter(replicas=NAMES, block_size_tokens=BLOCK, fairness=fairness)
    first = router.route(tenant_request("q0", "a", blocks=tuple(range(10))), reports(), 0.0)
    assert fairness.stats().charged_tokens["a"] == 161 + DEFAULT_OUTPUT_TOKENS
    router.on_finished("q0", 40, 1.0)
    assert fairness.stats().charged_tokens["a"] == 161 + 40
    # The same prefix again, on the replica that holds it: only the uncached tail is charged,
    # and the expected decode is the output learned from finished requests.
    again = router.route(tenant_request("q1", "a", blocks=tuple(range(10)), arrival_s=1.0),
                         reports(), 1.0)
    assert again.replica == first.replica and again.cached_tokens == 160
    assert fairness.stats().charged_tokens["a"] == 161 + 40 + 1 + 40
    router.on_finished("q1", 0, 2.0)
    router.on_finished("unknown", 5, 2.0)  # never routed here: ignored
    assert fairness.stats().in_flight == 0
    # A finish whose output is not known (Ray tells no token count) keeps the expected charge.
    router.route(tenant_request("q2", "a", blocks=(99,), arrival_s=2.0), reports(), 2.0)
    charged = fairness.stats().charged_tokens["a"]
    router.on_finished("q2", None, 3.0)
    assert fairness.stats().charged_tokens["a"] == charged and fairness.stats().in_flight == 0
    router.check_invariants()


def test_make_router_gives_the_declared_weights_to_our_routers_only() -> None:
    ours = make_router("slo", NAMES, fairness_weights={"a": 2.0}, fairness_half_life_s=5.0)
    assert isinstance(ours, SLORouter) and ours.fairness is not None
    assert ours.fairness.weight("a") == 2.0 and ours.fairness.half_life_s == 5.0
    assert make_router("slo", NAMES).fairness is None
    peer = make_router("pow2", NAMES, fairness_weights={"a": 2.0})
    assert peer.fair_rate_share(tenant_request("x", "a"), 0.0) == 1.0


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(1, 4000),
                          st.booleans(), st.integers(0, 500)), min_size=1, max_size=30))
def test_fair_router_plans_only_tenants_over_their_share_on_less_than_the_rate(steps) -> None:
    weights = {"a": 1.0, "b": 2.0, "c": 4.0}
    fairness = ClassFairShare(weights=weights)
    router = SLORouter(replicas=NAMES, block_size_tokens=BLOCK, fairness=fairness)
    live: list[str] = []
    for i, (tenant, prompt, finish, output) in enumerate(steps):
        now = 0.1 * i
        probe = attrs.evolve(tenant_request("probe", tenant, arrival_s=now), prompt_tokens=prompt)
        share = router.fair_rate_share(probe, now)
        if fairness.over_share(tenant, "chat", now):
            # At least the tenant's weight over the active tenants' weights.
            active = {t for t in weights if fairness.stats().shares.get("chat", {}).get(t)
                      is not None} | {tenant}
            assert weights[tenant] / sum(weights[t] for t in active) - 1e-9 <= share < 1.0
        else:
            assert share == 1.0
        decision = router.route(attrs.evolve(probe, request_id=f"q{i}"), reports(), now)
        if decision.accepted:
            live.append(f"q{i}")
        if finish and live:
            router.on_finished(live.pop(0), output, now)
        router.check_invariants()
