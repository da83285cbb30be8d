"""The identity pipeline schedules exactly like stock vLLM, ``fcfs`` and ``priority``, step
by step; an ordering pipeline refuses vLLM's ``priority`` policy."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from integrations.vllm_v1 import Pipeline
from integrations.vllm_v1.instruments import EngineShape, SchedulerHarness
from policies import QoSRanker
from tests.integration.workloads import workloads

requests = workloads(max_output_tokens=80, max_requests=16)


def run(harness, workload):
    """Per-step (scheduled tokens, preempted ids, finished ids) until everything finishes."""
    trace = []
    step = 0
    pending = sorted(enumerate(workload), key=lambda item: item[1][0])
    while pending or harness.has_requests():
        while pending and pending[0][1][0] <= step:
            index, (_, prompt, output, group) = pending.pop(0)
            tokens = [group * 1000 + i % 50 for i in range(prompt)]
            harness.add_request(f"r{index}", tokens, output, priority=index % 3 - 1)
        result = harness.step()
        out = result.scheduler_output
        trace.append((dict(out.num_scheduled_tokens), sorted(out.preempted_req_ids or ()),
                      result.finished_request_ids))
        harness.clock.advance(0.01)
        step += 1
        assert step < 2000, "workload did not drain"
    return trace


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload=requests, num_blocks=st.sampled_from([20, 40, 512]),
       budget=st.sampled_from([64, 256]), policy=st.sampled_from(["fcfs", "priority"]))
def test_identity_pipeline_matches_stock_every_step(workload, num_blocks, budget, policy):
    shape = EngineShape(num_blocks=num_blocks, max_num_batched_tokens=budget, max_num_seqs=8,
                        max_model_len=1024)
    stock = run(SchedulerHarness.build(None, shape=shape, stock_policy=policy), workload)
    ours = run(SchedulerHarness.build(Pipeline(), shape=shape, stock_policy=policy), workload)
    assert ours == stock


def test_an_ordering_pipeline_refuses_vllms_priority_policy():
    with pytest.raises(ValueError, match="--scheduling-policy priority cannot be combined"):
        SchedulerHarness.build(Pipeline(ranking=QoSRanker()), stock_policy="priority")
