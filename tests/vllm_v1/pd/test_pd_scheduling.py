"""PD-aware scheduling: `DecodeKVGate`'s guarantees, and the gate inside vLLM's real scheduler."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from integrations.vllm_v1 import Pipeline, engine_kwargs
from integrations.vllm_v1.config.pd_roles import PD_DECODE, PD_PREFILL, STOCK
from integrations.vllm_v1.config.spec import resolve_pipeline
from integrations.vllm_v1.instruments import SchedulerHarness
from integrations.vllm_v1.instruments.harness import EngineShape
from integrations.vllm_v1.scheduling.start_gate import StartGateHook
from policies import DecodeKVGate
from tests.helpers.drain import drain

needed_st = st.lists(st.integers(0, 400), max_size=12)
usage_st = st.floats(0.01, 1.0)


@given(needed_st, st.integers(0, 1000), st.integers(1, 1000), usage_st)
def test_starts_fit_under_the_bound_while_anything_runs(needed, used, running, usage):
    total = 1000
    count = DecodeKVGate(max_kv_usage=usage).startable(
        needed, used_blocks=used, total_blocks=total, running_requests=running)
    assert 0 <= count <= len(needed)
    assert count == 0 or used + sum(needed[:count]) <= usage * total
    # maximal: the next one in line would not have fitted
    assert count == len(needed) or used + sum(needed[:count + 1]) > usage * total


@given(needed_st, st.integers(0, 1000), usage_st)
def test_an_idle_engine_always_starts_its_head(needed, used, usage):
    count = DecodeKVGate(max_kv_usage=usage).startable(
        needed, used_blocks=used, total_blocks=1000, running_requests=0)
    assert count >= min(1, len(needed))


@given(needed_st, st.integers(0, 1000), st.integers(0, 200), st.integers(0, 3), usage_st)
def test_more_blocks_in_use_never_starts_more(needed, used, more, running, usage):
    gate = DecodeKVGate(max_kv_usage=usage)
    assert gate.startable(needed, used_blocks=used + more, total_blocks=1000,
                          running_requests=running) <= gate.startable(
        needed, used_blocks=used, total_blocks=1000, running_requests=running)


@pytest.mark.parametrize("bad", [0.0, 1.5, float("nan")])
def test_the_bound_is_validated(bad):
    with pytest.raises(ValueError, match=r"max_kv_usage must be in \(0, 1\]"):
        DecodeKVGate(max_kv_usage=bad)


def run_to_completion(harness: SchedulerHarness, prompts: int, tokens: int) -> list[int]:
    """Submit ``prompts`` distinct prompts at once; the running count after every step."""
    for i in range(prompts):
        harness.add_request(f"r{i}", range(i * 10_000, i * 10_000 + tokens), max_tokens=8)
    running = []
    drain(harness, check=lambda scheduler: running.append(len(scheduler.running)))
    return running


SHAPE = EngineShape(num_blocks=64, block_size=16, max_num_batched_tokens=4096,
                    max_model_len=2048)


def test_the_gate_holds_requests_back_in_vllms_scheduler_and_all_complete():
    gated = SchedulerHarness.build(Pipeline(start_gate=DecodeKVGate(max_kv_usage=0.5)),
                                   shape=SHAPE)
    assert [type(h) for h in gated.scheduler.hooks.hooks] == [StartGateHook]
    # 13 blocks each: two fit in half of 64 blocks, three do not
    assert max(run_to_completion(gated, prompts=5, tokens=200)) == 2
    stock = SchedulerHarness.build(None, shape=SHAPE)
    assert max(run_to_completion(stock, prompts=5, tokens=200)) == 4  # as many as KV holds


def test_a_request_bigger_than_the_bound_runs_alone():
    gated = SchedulerHarness.build(Pipeline(start_gate=DecodeKVGate(max_kv_usage=0.25)),
                                   shape=SHAPE)
    assert max(run_to_completion(gated, prompts=2, tokens=400)) == 1


def test_role_presets_run_on_the_one_policy_scheduler_with_their_engine_limits():
    for role in (PD_DECODE, PD_PREFILL):
        assert engine_kwargs(role.pipeline, async_scheduling=False)["scheduler_cls"] == (
            "integrations.vllm_v1.scheduling.scheduler.PolicyScheduler")
        assert engine_kwargs(role.pipeline, async_scheduling=True)["scheduler_cls"] == (
            "integrations.vllm_v1.scheduling.scheduler.AsyncPolicyScheduler")
    assert PD_PREFILL.vllm_args() == ("--max-num-batched-tokens", "16384")
    assert STOCK.vllm_args() == ()
    assert repr(resolve_pipeline("pd-decode")) == repr(PD_DECODE.pipeline)
    assert repr(resolve_pipeline("pd-prefill")) == repr(PD_PREFILL.pipeline)
