"""The cluster replay: every request ends once, a replica's rejection is retried once, and
the offered load follows the measured capacity."""

import argparse

import pytest

from benchmarks.cluster_replay.__main__ import cost_model_capacity, load_trace, offered
from benchmarks.cluster_replay.cluster import run_cluster
from benchmarks.replay.cost_model import StepCostModel
from benchmarks.replay.metrics import summarize
from benchmarks.replay.trace import Trace, TraceRequest
from integrations.vllm_v1.instruments.harness import EngineShape
from policies.cluster_routing import RouteCause, SessionStickyReplicas, SLORouter

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
