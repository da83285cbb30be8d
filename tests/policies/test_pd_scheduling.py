"""`DecodeStepGate`: a decode instance starts requests only while its predicted step stays
within a multiple of its own fixed step cost, under `DecodeKVGate`'s KV cap."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies import DecodeKVGate, DecodeStepGate, OnlineStepTimeModel, StepFeatures, StepTimeModel

H100 = StepTimeModel(base_s=0.0078, decode_s_per_seq=4e-6, decode_s_per_context_token=4.9e-8,
                     prefill_s_per_token=2.3e-5)
"""About the replay's H100 cost model for Llama-3-8B on decode steps."""
BLOCK = 16


def learned(truth: StepTimeModel = H100, steps: int = 400, seed: int = 0) -> OnlineStepTimeModel:
    """A model that has learned ``truth`` from a decode instance's steps (contexts of 50k to
    200k tokens: the narrow band where the intercept must be extrapolated)."""
    rng = random.Random(seed)
    model = OnlineStepTimeModel(prior_weight=1e-3)
    for _ in range(steps):
        features = StepFeatures(decodes=rng.randint(5, 40),
                                decode_context_tokens=rng.randint(50_000, 200_000))
        model.observe(features, truth.features_s(features))
    return model


WARM = learned()
needed_st = st.lists(st.integers(0, 4000), max_size=12)
used_st = st.integers(0, 25_000)
running_st = st.integers(1, 64)
ratio_st = st.floats(1.0, 4.0)
usage_st = st.floats(0.01, 1.0)


def gate(ratio: float = 2.0, usage: float = 0.5, model: OnlineStepTimeModel = WARM,
         warmup_steps: int = 256) -> DecodeStepGate:
    return DecodeStepGate(step_model=model, max_step_ratio=ratio, max_kv_usage=usage,
                          warmup_steps=warmup_steps)


def startable(policy, needed, used, running, total=24_800) -> int:
    return policy.startable(needed, used_blocks=used, total_blocks=total,
                            running_requests=running, block_size_tokens=BLOCK)


def predicted_s(running: int, context_blocks: int) -> float:
    return WARM.model.step_s(running, 0, context_blocks * BLOCK)


def test_the_bound_is_a_multiple_of_the_learned_fixed_step_cost():
    bound = gate().step_bound_s()
    assert bound == pytest.approx(2 * H100.base_s, rel=0.01)  # 15.6 ms
    assert gate(ratio=1.5).step_bound_s() == pytest.approx(1.5 * H100.base_s, rel=0.01)


def test_the_bound_is_in_time_not_in_cache_blocks():
    """A cache twice as large lets `DecodeKVGate` start twice the context (and each step take
    longer); the step gate starts the same batch, since the step costs the same."""
    requests = [1000] * 40  # 16k tokens each
    kv = DecodeKVGate(max_kv_usage=0.5)
    old = [kv.startable(requests, used_blocks=0, total_blocks=total, running_requests=1)
           for total in (24_800, 49_600)]
    new = [startable(gate(), requests, 0, 1, total) for total in (24_800, 49_600)]
    assert old == [12, 24]
    assert new[0] == new[1] == 9  # 9 x 16k tokens: 7.8 ms of KV reads, the 2x bound
    assert predicted_s(1 + 24, 24_000) > 1.6 * gate().step_bound_s()


@given(needed_st, used_st, running_st, ratio_st, usage_st)
def test_never_more_than_the_kv_gate_and_the_batch_steps_within_the_bound(
        needed, used, running, ratio, usage):
    policy = gate(ratio, usage)
    count = startable(policy, needed, used, running)
    assert 0 <= count <= startable(DecodeKVGate(max_kv_usage=usage), needed, used, running)
    bound = policy.step_bound_s()
    assert count == 0 or predicted_s(running + count, used + sum(needed[:count])) <= bound
    # maximal: the next one in line would break the KV cap or the step bound
    if count < len(needed):
        after = needed[:count + 1]
        assert (used + sum(after) > usage * 24_800
                or predicted_s(running + count + 1, used + sum(after)) > bound)


@given(needed_st, used_st, ratio_st, usage_st)
def test_an_idle_engine_always_starts_its_head(needed, used, ratio, usage):
    assert startable(gate(ratio, usage), needed, used, running=0) >= min(1, len(needed))


@given(needed_st, used_st, st.integers(0, 5000), running_st, st.integers(0, 16), ratio_st)
def test_more_load_never_starts_more(needed, used, more_blocks, running, more_running, ratio):
    policy = gate(ratio)
    count = startable(policy, needed, used, running)
    assert startable(policy, needed, used + more_blocks, running) <= count
    assert startable(policy, needed, used, running + more_running) <= count


@given(needed_st, st.lists(st.integers(0, 800), max_size=12), used_st, running_st, ratio_st)
def test_bigger_requests_never_start_more(needed, extra, used, running, ratio):
    extra = (extra + [0] * len(needed))[:len(needed)]
    bigger = [blocks + add for blocks, add in zip(needed, extra, strict=True)]
    policy = gate(ratio)
    assert startable(policy, bigger, used, running) <= startable(policy, needed, used, running)


@given(needed_st, used_st, running_st, usage_st)
def test_until_the_model_is_warm_it_is_the_kv_gate(needed, used, running, usage):
    cold = gate(usage=usage, model=learned(steps=100), warmup_steps=101)
    assert cold.step_bound_s() is None
    assert startable(cold, needed, used, running) == startable(
        DecodeKVGate(max_kv_usage=usage), needed, used, running)


def test_stats_count_the_holds_of_the_step_bound():
    policy = gate()
    assert startable(policy, [1000] * 20, 0, 1) == 9  # held by the step bound
    assert startable(policy, [100], 12_350, 1) == 0  # held by the KV cap (12,400 blocks)
    assert startable(policy, [100], 0, 1) == 1
    stats = policy.stats()
    assert (stats.calls, stats.held_by_step) == (3, 1)
    assert stats.step_bound_s == pytest.approx(2 * stats.fixed_step_s)
    policy.check_invariants()


@pytest.mark.parametrize(("field", "bad", "message"), [
    ("max_step_ratio", 0.5, r"max_step_ratio must be >= 1.0"),
    ("max_step_ratio", float("inf"), r"max_step_ratio must be finite and > 0"),
    ("max_kv_usage", 0.0, r"max_kv_usage must be in \(0, 1\]"),
    ("warmup_steps", -1, r"warmup_steps must be an integer >= 0"),
])
def test_bad_values_are_rejected_naming_the_field(field, bad, message):
    with pytest.raises(ValueError, match=message):
        DecodeStepGate(step_model=OnlineStepTimeModel(), **{field: bad})


def test_the_step_model_is_required_and_typed():
    with pytest.raises(TypeError):
        DecodeStepGate(step_model=H100)
