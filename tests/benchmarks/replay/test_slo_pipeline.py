"""The SLO policies through vLLM's real scheduler: the step bound holds step by step, SLO
admission answers overload with 503 + Retry-After, and the ledger ends empty."""

import attrs

from benchmarks.e2e_business_cases.systems import slo_pipeline
from benchmarks.replay.cost_model import StepCostModel
from benchmarks.replay.driver import replay, step_batch
from benchmarks.replay.pipelines import decode_protected
from benchmarks.replay.trace import Trace, TraceRequest
from integrations.vllm_v1.instruments import EngineShape, SchedulerHarness
from integrations.vllm_v1.pipeline import Pipeline
from integrations.vllm_v1.rejection import Rejection
from policies import StepPrefillBudget, TokenCaps

SHAPE = EngineShape(num_blocks=4096, max_num_batched_tokens=4096, max_num_seqs=64)
COST = StepCostModel.preset("h100")


def test_no_step_mixes_more_prefill_than_the_bound_with_a_decode():
    harness = SchedulerHarness.build(Pipeline(rate=TokenCaps(policies=(
        StepPrefillBudget(max_prefill_tokens=512, interactive_prompt_tokens=0),))), shape=SHAPE)
    harness.add_request("chat", range(100), max_tokens=200)
    for i in range(3):
        harness.add_request(f"rag{i}", range(10_000 * (i + 1), 10_000 * (i + 1) + 6000),
                            max_tokens=2)
    mixed_steps = 0
    while harness.has_requests():
        output = harness.scheduler.schedule()
        batch = (step_batch(harness, output.num_scheduled_tokens)
                 if output.num_scheduled_tokens else None)
        if batch is not None and batch.decode_context_tokens:
            # a waiting request starts with at least one token, beyond the bound
            assert batch.prefill_tokens <= 512 + len(batch.prefills), batch
            mixed_steps += bool(batch.prefills)
        harness.complete(output)
        harness.clock.advance(0.02)
    # the first step has no decode yet: the budget (4,096) goes unbounded; the rest is spread
    assert mixed_steps >= (3 * 6000 - 4096) // 512


def test_decode_protection_cuts_the_longest_step_a_decode_sits_in():
    trace = Trace(name="mix", requests=(
        TraceRequest(request_id="chat", arrival_s=0.0, prompt_tokens=100, output_tokens=300),
        *(TraceRequest(request_id=f"rag{i}", arrival_s=0.5 + i, prompt_tokens=8000,
                       output_tokens=2) for i in range(4))))
    shape = attrs.evolve(SHAPE, max_num_batched_tokens=8192)
    stock = replay(trace, "fcfs", shape=shape, cost_model=COST)
    protected = replay(trace, "protected", shape=shape, cost_model=COST,
                       harness=SchedulerHarness.build(decode_protected(), shape=shape))

    def longest_gap(run):
        times = next(r for r in run.records if r.request_id == "chat").token_times_s
        return max(b - a for a, b in zip(times, times[1:], strict=False))

    assert longest_gap(protected) < 0.5 * longest_gap(stock)


def test_slo_admission_sheds_a_burst_with_retry_after_and_serves_what_it_admits():
    shape = EngineShape(num_blocks=24800, max_num_batched_tokens=8192, max_num_seqs=256)
    requests = tuple(TraceRequest(request_id=f"g{i}", arrival_s=0.001 * i, prompt_tokens=4000,
                                  output_tokens=20, tenant="acme-bank", priority=-1,
                                  slo_class="gold-chat") for i in range(40))
    harness = SchedulerHarness.build(slo_pipeline(), shape=shape)
    run = replay(Trace(name="burst", requests=requests), "slo", shape=shape, cost_model=COST,
                 harness=harness)
    rejected = [r for r in run.records if r.outcome == "rejected"]
    admitted = [r for r in run.records if r.outcome == "completed"]
    assert rejected and admitted, "a 160k-token burst of 0.5 s requests does not all fit"
    for record in rejected:
        rejection = Rejection.parse(record.reason)
        assert rejection.reason == "slo_ttft" and rejection.http_status == 503
        assert 1.0 <= rejection.retry_after_s <= 60.0
    late = [r for r in admitted if r.ttft_s > 0.5]
    assert len(late) <= 0.05 * len(admitted), [r.ttft_s for r in late]
    policies = harness.scheduler.pipeline  # the engine's own copy
    policies.admission.check_invariants()
    assert policies.admission.ledger.stats().backlog_tokens == 0
    assert policies.admission.stats().rejected == {"slo_ttft": len(rejected)}
