"""Each PolicyScheduler seam, driven through the real vLLM scheduler (no model)."""

import attrs

from integrations.vllm_v1 import Pipeline
from integrations.vllm_v1.instruments import EngineShape, SchedulerHarness
from integrations.vllm_v1.rejection import Rejection
from integrations.vllm_v1.vllm_surface.names import FinishReason
from policies import Needs, QoSRanker, QueueDepthLimit
from tests.helpers.drain import drain


def test_qos_serves_short_and_urgent_requests_first():
    harness = SchedulerHarness.build(Pipeline(ranking=QoSRanker()),
                                     shape=EngineShape(max_num_batched_tokens=128, max_num_seqs=1))
    harness.add_request("long", range(3000), 2)
    harness.add_request("short", range(50), 2)
    harness.add_request("urgent-long", range(3000), 2, priority=-10)
    assert drain(harness).finished == ["urgent-long", "short", "long"]


def test_stock_fcfs_serves_in_arrival_order_on_the_same_workload():
    harness = SchedulerHarness.build(None, shape=EngineShape(max_num_batched_tokens=128,
                                                             max_num_seqs=1))
    harness.add_request("long", range(3000), 2)
    harness.add_request("short", range(50), 2)
    harness.add_request("urgent-long", range(3000), 2, priority=-10)
    assert drain(harness).finished == ["long", "short", "urgent-long"]


def test_preemption_victim_is_the_lowest_ranked_running_request():
    # 3 requests fit at first; decoding grows them until one must be preempted.
    shape = EngineShape(num_blocks=12, block_size=16, max_num_batched_tokens=512, max_num_seqs=8)
    harness = SchedulerHarness.build(Pipeline(ranking=QoSRanker()), shape=shape)
    harness.add_request("relaxed", range(40), 60, priority=5)
    harness.add_request("urgent", range(40), 60, priority=-5)
    harness.add_request("normal", range(40), 60, priority=0)
    preempted = []
    while harness.has_requests():
        preempted += sorted(harness.step().scheduler_output.preempted_req_ids or ())
        harness.clock.advance(0.01)
    assert preempted, "the workload must force a preemption"
    assert preempted[0] == "relaxed"
    assert "urgent" not in preempted


def test_rejected_requests_finish_with_a_reason_and_never_enter_the_engine():
    harness = SchedulerHarness.build(Pipeline(admission=QueueDepthLimit(max_waiting=2,
                                                                        retry_after_s=3)))
    for i in range(4):
        harness.add_request(f"r{i}", range(20), 1)
    assert set(harness.scheduler.requests) == {"r0", "r1"}
    result = harness.step()
    rejected = {out.request_id: out for out in result.outputs if out.stop_reason}
    assert sorted(rejected) == ["r2", "r3"]
    for out in rejected.values():
        assert out.finish_reason == FinishReason.ABORT
        assert out.stop_reason == Rejection(reason="queue_full", retry_after_s=3).stop_reason
    assert sorted(result.finished_request_ids + tuple(drain(harness).finished)) == ["r0", "r1", "r2", "r3"]


def test_invalid_metadata_is_rejected_not_crashed():
    harness = SchedulerHarness.build(Pipeline())
    harness.add_request("bad", range(20), 1, priority=99)
    harness.add_request("good", range(20), 1, extra_args={"tenant": "acme"})
    result = harness.step()
    bad = [out for out in result.outputs if out.request_id == "bad"]
    assert bad and bad[0].finish_reason == FinishReason.ABORT
    assert "priority must be between -20 and 20" in bad[0].stop_reason
    assert sorted(result.finished_request_ids + tuple(drain(harness).finished)) == ["bad", "good"]


@attrs.define
class PrefillChunkCap:
    """A test policy: at most ``tokens`` prefill tokens per step for tenant ``batch``."""

    tokens: int

    scheduled: list = attrs.field(factory=list)

    def token_cap(self, request, load):
        return self.tokens if request.tenant == "batch" else None

    def on_scheduled(self, request, tokens, now):
        self.scheduled.append((request.request_id, tokens))


def test_token_cap_clamps_prefill_chunks_but_never_decodes():
    harness = SchedulerHarness.build(Pipeline(rate=PrefillChunkCap(tokens=32)),
                                     shape=EngineShape(max_num_batched_tokens=1024))
    harness.add_request("capped", range(200), 3, extra_args={"tenant": "batch"})
    harness.add_request("free", range(1000, 1200), 3)  # no shared prefix
    chunks = {"capped": [], "free": []}
    while harness.has_requests():
        for req_id, n in harness.step().scheduler_output.num_scheduled_tokens.items():
            chunks[req_id].append(n)
        harness.clock.advance(0.01)
    assert chunks["free"][0] == 200
    assert chunks["capped"][:7] == [32] * 6 + [8]
    assert chunks["capped"][7:] == [1, 1]  # decodes run uncapped (1 token each)
    # the policy is told every prefill grant (the engine's pipeline holds its own copy)
    told = [n for req_id, n in harness.scheduler.pipeline.rate.scheduled if req_id == "capped"]
    assert told == chunks["capped"][:7]  # prefill grants only; decodes are never capped


def test_async_variant_schedules_like_the_sync_one():
    from integrations.vllm_v1 import AsyncPolicyScheduler

    def order(scheduler_cls):
        harness = SchedulerHarness.build(Pipeline(ranking=QoSRanker()), scheduler_cls=scheduler_cls,
                                         shape=EngineShape(max_num_batched_tokens=128,
                                                           max_num_seqs=2))
        for name, prompt, priority in [("a", 900, 3), ("b", 60, 0), ("c", 400, -4), ("d", 30, 0)]:
            harness.add_request(name, range(prompt), 4, priority=priority)
        return drain(harness).finished

    sync = order(None)
    assert order(AsyncPolicyScheduler) == sync
    assert sorted(sync) == ["a", "b", "c", "d"]


@attrs.define
class RecordingRanker:
    """FCFS ranking that also records every lifecycle event it is told about."""

    needs = Needs(lifecycle=True)

    events: list = attrs.field(factory=list)

    def rank_key(self, request):
        return 0.0

    def effective_priority(self, request, now):
        return request.arrival_s - now

    def on_admitted(self, request, now):
        self.events.append(("admitted", request.request_id))

    def on_first_scheduled(self, request, now):
        self.events.append(("started", request.request_id))

    def on_finished(self, request, now):
        self.events.append(("finished", request.request_id))


def test_lifecycle_observers_see_admission_start_and_finish_once():
    shape = EngineShape(num_blocks=12, block_size=16, max_num_batched_tokens=512, max_num_seqs=8)
    harness = SchedulerHarness.build(Pipeline(ranking=RecordingRanker()), shape=shape)
    for name in ("a", "b", "c"):
        harness.add_request(name, range(40), 60)  # forces a preemption and a resume
    drain(harness)
    events = harness.scheduler.pipeline.ranking.events
    for name in ("a", "b", "c"):
        mine = [kind for kind, req_id in events if req_id == name]
        assert mine == ["admitted", "started", "finished"]
