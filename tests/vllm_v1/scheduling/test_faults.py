"""Policy faults are contained: a policy that raises every N calls costs its decision, never
a request (the real vLLM scheduler, no model)."""

from __future__ import annotations

import pytest

from integrations.vllm_v1 import Pipeline
from integrations.vllm_v1.instruments import EngineShape, SchedulerHarness
from policies import MLFQ, WFQ, QoSRanker, TokenBucket
from tests.helpers.drain import drain
from tests.helpers.faulty import (
    AcceptAll,
    FlakyAdmission,
    FlakyFairness,
    FlakyLevels,
    FlakyRanking,
    FlakyRate,
)

SLOTS = {
    "ranking": (lambda: FlakyRanking(QoSRanker(), 3), "ranking"),
    "fairness": (lambda: FlakyFairness(WFQ(weights={"a": 2.0}), 5), "fairness"),
    "levels": (lambda: FlakyLevels(MLFQ(), 4), "levels"),
    "rate": (lambda: FlakyRate(TokenBucket(capacity_tokens=64, min_refill_per_s=64.0,
                                           max_refill_per_s=64.0), 3), "token_cap"),
    "admission": (lambda: FlakyAdmission(AcceptAll(), 2), "admission"),
}


def workload(harness, count=24):
    for i in range(count):
        harness.add_request(f"r{i}", range(i * 100, i * 100 + 40 + 7 * i), 6,
                            priority=i % 3, extra_args={"tenant": "ab"[i % 2]})
        harness.clock.advance(0.003)


@pytest.mark.parametrize("slot", sorted(SLOTS))
def test_a_policy_raising_every_n_calls_loses_no_request(slot, caplog):
    make, seam = SLOTS[slot]
    policy = make()
    harness = SchedulerHarness.build(Pipeline(**{slot: policy}), shape=EngineShape(
        num_blocks=256, max_num_seqs=4, max_num_batched_tokens=128))
    workload(harness)
    run = drain(harness)
    assert sorted(run.finished) == sorted(f"r{i}" for i in range(24))
    assert not [o for o in run.outputs if o.stop_reason]  # nothing rejected by a fault
    faults = harness.scheduler.faults.counts
    # the engine's own copy of the policy raised (the pipeline travels pickled)
    assert faults[(type(policy).__name__, seam)] >= 1, dict(faults)
    logged = [r for r in caplog.records if "raised at" in r.getMessage()]
    assert len(logged) == len(faults)  # once per (policy, seam), however often it raised


def test_faults_are_counted_on_metrics_and_the_culprit_is_named():
    from prometheus_client import CollectorRegistry

    from integrations.vllm_v1.metrics import PolicyMetrics

    harness = SchedulerHarness.build(Pipeline(ranking=FlakyRanking(QoSRanker(), 2)))
    registry = CollectorRegistry()
    harness.scheduler.faults.metrics = PolicyMetrics(registry=registry)
    workload(harness, count=6)
    drain(harness)
    assert registry.get_sample_value("policies:policy_faults_total",
                                     {"policy": "FlakyRanking", "seam": "ranking",
                                      "exception": "RuntimeError"}) == 3
