"""Every policy slot and every hook point is contained, under sync and async scheduling: a
policy or hook that raises every N calls, or answers with None/NaN/a wrong type, costs its own
decision and is counted, and every request still finishes (the real vLLM scheduler, no model)."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry

from integrations.vllm_v1 import Pipeline
from integrations.vllm_v1.instruments import EngineShape, SchedulerHarness
from integrations.vllm_v1.metrics import PolicyMetrics
from integrations.vllm_v1.scheduling.scheduler import AsyncPolicyScheduler, PolicyScheduler
from policies import (
    LRU,
    WFQ,
    DecodeKVGate,
    EDFRanker,
    KVWatermarks,
    OnlineStepTimeModel,
    SLOTarget,
    SlotPreemption,
    TenantQuota,
)
from tests.helpers import faulty_hooks
from tests.helpers.drain import drain
from tests.helpers.faulty import AcceptAll, FlakyAdmission
from tests.helpers.faulty_hooks import (
    EVERY,
    FlakyDeadlines,
    FlakyEviction,
    FlakyPreemption,
    FlakyQuotas,
    FlakyStartGate,
    FlakyStepModel,
    FlakyWarmer,
    FlakyWatermarks,
)
from tests.helpers.probe_admission import ProbeAdmission

SCHEDULERS = [PolicyScheduler, AsyncPolicyScheduler]
COUNT = 24
SHAPE = EngineShape(num_blocks=64, max_num_seqs=4, max_num_batched_tokens=128)
"""Small enough that blocks are evicted and requests preempted."""


def workload(harness, *, drop_every=0):
    for i in range(COUNT):
        xargs = {"tenant": "ab"[i % 2], "deadline_ms": 60_000.0}
        if drop_every and i % drop_every == 0:
            xargs["slo_class"] = "drop"  # ProbeAdmission rejects these
        harness.add_request(f"r{i}", range(i * 100, i * 100 + 40 + 7 * i), 6,
                            priority=i % 3, extra_args=xargs)
        harness.clock.advance(0.003)


def run(pipeline, scheduler_cls, *, hooks=(), drop_every=0):
    harness = SchedulerHarness.build(pipeline, shape=SHAPE, scheduler_cls=scheduler_cls,
                                     entry={"hooks": list(hooks)} if hooks else None)
    harness.scheduler.metrics = PolicyMetrics(refresh_interval_s=0.0, registry=CollectorRegistry())
    workload(harness, drop_every=drop_every)
    drained = drain(harness)
    for _ in range(EVERY):  # idle: asked for pending work (a raise there is no work)
        assert not harness.has_requests()
    assert sorted(drained.finished) == sorted(f"r{i}" for i in range(COUNT))
    return harness.scheduler, drained


SLOTS = {
    "eviction": (lambda: FlakyEviction(LRU(), 3), "eviction"),
    "deadlines": (lambda: FlakyDeadlines(EDFRanker(), 3), "pre_step"),
    "watermarks": (lambda: FlakyWatermarks(KVWatermarks(), 2), "admission"),
    "admission": (lambda: FlakyAdmission(AcceptAll(), 2), "admission"),
    "quotas": (lambda: FlakyQuotas(TenantQuota(), 3), "fairness"),
    "start_gate": (lambda: FlakyStartGate(DecodeKVGate(), 3), "before_schedule"),
    "step_model": (lambda: FlakyStepModel(OnlineStepTimeModel(), 3), "before_update"),
    "warming": (lambda: FlakyWarmer(), "on_admitted"),
    "preemption": (lambda: FlakyPreemption(SlotPreemption(
        slos={"any": SLOTarget(ttft_s=60.0, tpot_s=60.0)}, length_classes=((2**31, "any"),),
        risk_share=0.0), 3), "preemption"),
}
NEEDS = {"quotas": {"fairness": WFQ(weights={"a": 2.0})}}
"""Slots that need another slot set."""


@pytest.mark.parametrize("scheduler_cls", SCHEDULERS)
@pytest.mark.parametrize("slot", sorted(SLOTS))
def test_a_slot_raising_every_n_calls_loses_no_request(slot, scheduler_cls, caplog):
    make, seam = SLOTS[slot]
    scheduler, drained = run(Pipeline(**{slot: make()}, **NEEDS.get(slot, {})), scheduler_cls)
    assert not [o for o in drained.outputs if o.stop_reason]  # nothing rejected by a fault
    policy = type(getattr(scheduler.pipeline, slot)).__name__
    assert scheduler.faults.counts[(policy, seam)] >= 1, dict(scheduler.faults.counts)
    assert "RuntimeError('injected fault" in scheduler.faults.errors[(policy, seam)]
    assert any(f"policy {policy} raised at {seam}: RuntimeError('injected" in r.getMessage()
               for r in caplog.records)


def test_a_failing_eviction_order_falls_back_to_lru_for_that_eviction():
    scheduler, _ = run(Pipeline(eviction=FlakyEviction(LRU(), 3)), PolicyScheduler)
    queue = scheduler.hooks.hooks[0].queue
    assert queue.faults == scheduler.faults.counts[("FlakyEviction", "eviction")] > 0
    assert queue.num_free_blocks == scheduler.kv_cache_manager.block_pool.num_gpu_blocks - 1


@pytest.mark.parametrize("scheduler_cls", SCHEDULERS)
@pytest.mark.parametrize("answers", [(None, 1.0), (math.nan, 2.0), ("soon", 3.0),
                                     (True, 4.0)], ids=["None", "NaN", "str", "bool"])
def test_an_invalid_rank_key_is_contained_as_arrival_order(answers, scheduler_cls):
    scheduler, _ = run(Pipeline(ranking=faulty_hooks.InvalidRanking(answers)), scheduler_cls)
    faults = scheduler.faults.counts[("InvalidRanking", "ranking")]
    assert faults == COUNT // 2, dict(scheduler.faults.counts)
    assert "must be a number" in scheduler.faults.errors[("InvalidRanking", "ranking")]


def test_the_point_list_is_every_point_of_scheduler_hook():
    from integrations.vllm_v1.scheduling.scheduler import HookTable

    table = HookTable([faulty_hooks.Flaky_on_arrival(None)])
    assert all(len(getattr(table, point)) == 1 for point in faulty_hooks.POINTS)


@pytest.mark.parametrize("scheduler_cls", SCHEDULERS)
@pytest.mark.parametrize("point", faulty_hooks.POINTS)
def test_a_hook_raising_every_n_calls_at_any_point_loses_no_request(point, scheduler_cls,
                                                                    caplog):
    path = f"tests.helpers.faulty_hooks:Flaky_{point}"
    scheduler, drained = run(Pipeline(admission=ProbeAdmission(max_waiting=COUNT)), scheduler_cls,
                             hooks=[path], drop_every=4)
    rejected = [o for o in drained.outputs if o.stop_reason]
    assert len(rejected) == COUNT // 4  # only the probe's own rejections
    if point == "shutdown":
        for _ in range(EVERY):
            scheduler.shutdown()
    hook = f"Flaky_{point}"
    assert scheduler.faults.counts[(hook, point)] >= 1, dict(scheduler.faults.counts)
    assert any(f"policy {hook} raised at {point}: RuntimeError" in r.getMessage()
               for r in caplog.records)
