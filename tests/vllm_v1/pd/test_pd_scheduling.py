"""PD-aware scheduling: `DecodeKVGate`'s guarantees, and the gates inside vLLM's real scheduler
(`DecodeStepGate`'s own guarantees: tests/policies/test_pd_scheduling.py)."""

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from integrations.vllm_v1 import Pipeline, engine_kwargs
from integrations.vllm_v1.config.pd_roles import PD_DECODE, PD_PREFILL, STOCK
from integrations.vllm_v1.config.spec import resolve_pipeline
from integrations.vllm_v1.instruments import SchedulerHarness
from integrations.vllm_v1.instruments.harness import EngineShape
from integrations.vllm_v1.scheduling.start_gate import StartGateHook
from integrations.vllm_v1.slo.step_timing import StepTimingHook, scheduled_chunks
from policies import (
    DecodeKVGate,
    DecodeStepGate,
    OnlineStepTimeModel,
    StepFeatures,
    StepTimeModel,
)
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


H100 = StepTimeModel(base_s=0.0078, decode_s_per_seq=4e-6, decode_s_per_context_token=4.9e-8,
                     prefill_s_per_token=2.3e-5)
"""About the replay's H100 cost model for Llama-3-8B: decodes double the 7.8 ms fixed cost of
a step at about 159k context tokens."""


def run_timed(harness: SchedulerHarness) -> int:
    """Step ``harness`` until it drains, each step taking `H100`'s time on its clock; the
    most context its running requests held."""
    most = 0
    while harness.has_requests():
        output = harness.scheduler.schedule()
        prefills, decodes = scheduled_chunks(harness.scheduler, output.num_scheduled_tokens)
        harness.clock.advance(H100.features_s(StepFeatures.of(prefills, decodes)))
        harness.complete(output)
        most = max(most, sum(r.num_computed_tokens for r in harness.scheduler.running))
    return most


def max_context(decode: Pipeline, num_blocks: int) -> int:
    """The most context ``decode``'s pipeline lets 30 prompts of 16k tokens (50 output
    tokens each) hold on a cache of ``num_blocks``, after a warm-up of twelve requests of
    2k to 12k tokens finishing at different steps (what the step model learns from)."""
    shape = EngineShape(num_blocks=num_blocks, block_size=16, max_num_batched_tokens=8192,
                        max_model_len=32_768)
    harness = SchedulerHarness.build(decode, shape=shape)
    rng = random.Random(0)
    for i in range(12):
        prompt = range(i * 100_000, i * 100_000 + rng.randint(2000, 12_000))
        harness.add_request(f"warm{i}", prompt, max_tokens=rng.randint(30, 330))
    run_timed(harness)
    for i in range(30):
        harness.add_request(f"r{i}", range(i * 100_000 + 50_000, i * 100_000 + 66_000),
                            max_tokens=50)
    return run_timed(harness)


def test_the_decode_preset_bounds_the_step_in_time_whatever_the_cache_size():
    """The old preset (`DecodeKVGate(max_kv_usage=0.5)`) holds twice the context on twice
    the cache, and so steps twice as long in KV reads; the step gate learns the step from
    the instance's own steps and holds the same batch on both."""
    decode = PD_DECODE.pipeline
    gate = decode.start_gate
    assert isinstance(gate, DecodeStepGate) and gate.step_model is decode.step_model
    built = SchedulerHarness.build(decode, shape=SHAPE)
    assert [type(h) for h in built.scheduler.hooks.hooks] == [StartGateHook, StepTimingHook]
    small, large = (max_context(decode, blocks) for blocks in (24_800, 49_600))
    # 2 x 7.8 ms: about 159k context tokens (10 requests of 16k, then their answers grow)
    assert 120_000 <= small == large <= 165_000
    old = Pipeline(start_gate=DecodeKVGate(max_kv_usage=0.5))
    assert [max_context(old, blocks) for blocks in (24_800, 49_600)] == [
        pytest.approx(198_400, rel=0.1), pytest.approx(396_800, rel=0.1)]


def test_the_role_gate_predicts_with_the_step_model_a_users_pipeline_feeds():
    mine = OnlineStepTimeModel()
    decode = PD_DECODE.applied_to(Pipeline(step_model=mine))
    assert decode.step_model is mine and decode.start_gate.step_model is mine
    assert decode.start_gate.max_step_ratio == PD_DECODE.pipeline.start_gate.max_step_ratio
    plain = PD_DECODE.applied_to(Pipeline())
    assert plain.start_gate is PD_DECODE.pipeline.start_gate
    assert plain.start_gate.step_model is plain.step_model



class _CountingSteps:
    """A step observer of the user's own that is no step-time model (a gate cannot use it)."""

    def observe(self, features, duration_s):
        pass


def test_the_role_gate_keeps_its_own_model_where_the_users_observer_cannot_predict():
    users = _CountingSteps()
    decode = PD_DECODE.applied_to(Pipeline(step_model=users))
    assert decode.step_model is users
    assert decode.start_gate is PD_DECODE.pipeline.start_gate
