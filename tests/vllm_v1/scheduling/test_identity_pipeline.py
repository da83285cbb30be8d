"""The identity pipeline schedules exactly like stock vLLM, ``fcfs`` and ``priority``, step
by step; an ordering pipeline refuses vLLM's ``priority`` policy."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from integrations.vllm_v1 import Pipeline
from integrations.vllm_v1.instruments import EngineShape, SchedulerHarness
from policies import QoSRanker
from tests.helpers.workloads import replay_workload, workloads

requests = workloads(max_output_tokens=80, max_requests=16)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload=requests, num_blocks=st.sampled_from([20, 40, 512]),
       budget=st.sampled_from([64, 256]), policy=st.sampled_from(["fcfs", "priority"]))
def test_identity_pipeline_matches_stock_every_step(workload, num_blocks, budget, policy):
    shape = EngineShape(num_blocks=num_blocks, max_num_batched_tokens=budget, max_num_seqs=8,
                        max_model_len=1024)
    def run(harness):
        return replay_workload(harness, workload, priority=lambda index: index % 3 - 1)

    stock = run(SchedulerHarness.build(None, shape=shape, stock_policy=policy))
    ours = run(SchedulerHarness.build(Pipeline(), shape=shape, stock_policy=policy))
    assert ours == stock


def test_an_ordering_pipeline_refuses_vllms_priority_policy():
    with pytest.raises(ValueError, match="--scheduling-policy priority cannot be combined"):
        SchedulerHarness.build(Pipeline(ranking=QoSRanker()), stock_policy="priority")
