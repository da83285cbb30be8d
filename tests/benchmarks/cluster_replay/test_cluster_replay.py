"""The cluster replay: every request ends once, a replica's rejection is retried once, and
the offered load follows the measured capacity."""

import argparse

import pytest

from benchmarks.cluster_replay.__main__ import (
    BUSINESS_PEER_ENGINE,
    FAIRNESS,
    cost_model_capacity,
    load_trace,
    main,
    offered,
)
from benchmarks.cluster_replay.cluster import replica_harness, run_cluster
from benchmarks.e2e_business_cases.workload import business_workload
from benchmarks.replay.cost_model import StepCostModel
from benchmarks.replay.metrics import summarize
from benchmarks.replay.trace import Trace, TraceRequest
from integrations.vllm_v1.config.slo import SLOSpec
from integrations.vllm_v1.instruments.harness import EngineShape
from policies.cluster_routing import RouteCause, SessionStickyReplicas, SLORouter
from policies.slo.fairness import ClassFairShare

SHAPE = EngineShape(num_blocks=2048)
COST = StepCostModel.preset("h100")


def burst(n: int) -> Trace:
    return Trace(name="burst", requests=tuple(
        TraceRequest(request_id=f"q{i}", arrival_s=0.0, prompt_tokens=1000, output_tokens=4)
        for i in range(n)))


def test_a_replica_rejection_is_retried_once_on_another_replica() -> None:
    # Stock replicas that hold one request each: the third request of a burst is refused by
    # the replica the router picks, placed on the other one, refused there too, and then
    # the client sees the second replica's rejection.
    router = SLORouter(replicas=("r0", "r1"))
    run = run_cluster(burst(3), router, "slo", replicas=("r0", "r1"),
                      engine="stock+queue-caps:fcfs:reqs=1", shape=SHAPE, cost_model=COST)
    outcomes = {r.request_id: (r.outcome, r.reason) for r in run.records}
    assert len(run.records) == 3 and set(outcomes) == {"q0", "q1", "q2"}
    assert outcomes["q0"][0] == outcomes["q1"][0] == "completed"
    assert outcomes["q2"] == ("rejected", "rejected:max_num_queued_reqs")
    stats = router.stats()
    assert (stats.retries, stats.retries_placed) == (2, 1)
    assert stats.by_cause[RouteCause.NO_RETRY.value] == 1
    # The second rejection reached the client while the first replica was predicted to meet
    # its deadline (the room test predicts latency; it cannot see a stock queue cap).
    assert stats.rejected_with_room == 1
    router.check_invariants()


def test_peers_pass_the_rejection_on_and_every_request_ends_once() -> None:
    router = SessionStickyReplicas(replicas=("r0", "r1"))
    run = run_cluster(burst(5), router, "sticky", replicas=("r0", "r1"),
                      engine="stock+queue-caps:fcfs:reqs=1", shape=SHAPE, cost_model=COST)
    summary = summarize(run)
    assert summary["offered"] == 5 == summary["completed"] + summary["rejected"]
    assert summary["completed"] == 2 and router.stats().retries_placed == 0
    assert router.stats().rejected_with_room == 3  # each time the other replica had room


def test_slo_replicas_serve_an_agent_window_with_nothing_lost() -> None:
    args = argparse.Namespace(trace="agent-swe", max_requests=60, skip_requests=0, seed=0,
                              tenants="none")
    trace = load_trace(args)
    router = SLORouter(replicas=("r0", "r1"), block_size_tokens=trace.block_size)
    run = run_cluster(trace, router, "slo", replicas=("r0", "r1"), engine="pipeline:slo",
                      shape=EngineShape(num_blocks=8192), cost_model=COST)
    assert sorted(r.request_id for r in run.records) == sorted(
        r.request_id for r in trace.requests)
    assert all(r.outcome is not None for r in run.records)
    stats = router.stats()
    assert stats.routed + stats.rejected == len(trace.requests) + stats.retries
    router.check_invariants()


def test_capacity_scales_with_replicas_and_the_offered_rate_follows_it() -> None:
    args = argparse.Namespace(trace="agent-swe", max_requests=300, skip_requests=100, seed=0,
                              tenants="none")
    trace = load_trace(args)
    one = cost_model_capacity(trace, COST, SHAPE, 1)
    four = cost_model_capacity(trace, COST, SHAPE, 4)
    assert four["capacity_rps"] == pytest.approx(4 * one["capacity_rps"])
    assert 0 < four["ideal_prefix_hit_rate"] < 1
    heavier, scale = offered(args, trace, 2 * four["capacity_rps"])
    rate = len(heavier.requests) / heavier.duration_s
    assert scale > 1 and rate == pytest.approx(2 * four["capacity_rps"], rel=0.25)


def test_tenants_weighed_once_at_the_router_and_on_every_replica() -> None:
    args = argparse.Namespace(trace="azure-conv", max_requests=80, skip_requests=0, seed=0,
                              tenants="servegen")
    trace = load_trace(args)
    spec = SLOSpec.parse(FAIRNESS)
    fairness = ClassFairShare(weights=spec.fairness_weights)
    router = SLORouter(replicas=("r0", "r1"), fairness=fairness)
    replica = replica_harness("pipeline:slo", SHAPE, FAIRNESS).scheduler.pipeline
    assert replica.admission.fairness.weights == fairness.weights
    assert replica.ranking.fairness is replica.admission.fairness
    assert replica_harness("pipeline:slo", SHAPE).scheduler.pipeline.admission.fairness is None
    run = run_cluster(trace.scaled(4.0), router, "slo", replicas=("r0", "r1"),
                      engine="pipeline:slo", shape=EngineShape(num_blocks=8192),
                      cost_model=COST, slo=FAIRNESS)
    assert len(run.records) == len(trace.requests)
    stats = fairness.stats()
    # Every request the router charged was settled when it finished, wherever it ran.
    assert stats.in_flight == 0
    routed_tenants = {r.tenant for r in run.records if r.first_scheduled_s is not None}
    assert routed_tenants <= set(stats.charged_tokens) and len(routed_tenants) >= 2
    router.check_invariants()


def test_the_business_case_runs_behind_the_routers_with_its_own_classes_and_systems(
        tmp_path) -> None:
    summary = main(["--trace", "business-case", "--phase-s", "2", "--replicas", "2",
                    "--load", "1.5", "--routers", "slo,pow2", "--out", str(tmp_path)])
    assert summary["config"]["peer_engine"] == BUSINESS_PEER_ENGINE
    systems = summary["loads"]["1.5"]["systems"]
    assert set(systems) == {"slo@pipeline+slo", f"pow2@{BUSINESS_PEER_ENGINE}"}
    offered_now = {s["offered"] for s in systems.values()}
    assert len(offered_now) == 1 and offered_now.pop() > 0
    for system in systems.values():
        assert system["completed"] + system["rejected"] <= system["offered"]
        # judged by the business case's own tenants and classes
        assert set(system["tenant_goodput_share"]) <= set(
            business_workload(phase_s=2.0).weights)
    goals = summary["loads"]["1.5"]["goals"]["slo@pipeline+slo"]
    assert goals["best_peer"] == f"pow2@{BUSINESS_PEER_ENGINE}" and "jain" in goals
    with pytest.raises(SystemExit, match="own tenants"):
        main(["--trace", "business-case", "--tenants", "servegen", "--out", str(tmp_path)])


def test_a_retried_request_leaves_no_cancel_behind_on_the_replica_that_refused_it() -> None:
    # The clients cancel after 0.2 s: the replica that refused the third request keeps
    # stepping past that time, with the request moved away.
    trace = Trace(name="burst", requests=tuple(
        TraceRequest(request_id=f"q{i}", arrival_s=0.0, prompt_tokens=1000, output_tokens=64,
                     cancel_after_s=0.2)
        for i in range(3)))
    router = SLORouter(replicas=("r0", "r1"))
    run = run_cluster(trace, router, "slo", replicas=("r0", "r1"),
                      engine="stock+queue-caps:fcfs:reqs=1", shape=SHAPE, cost_model=COST)
    assert sorted(r.request_id for r in run.records) == ["q0", "q1", "q2"]
    assert router.stats().retries_placed == 1
    assert {r.outcome for r in run.records} <= {"completed", "cancelled", "rejected"}
