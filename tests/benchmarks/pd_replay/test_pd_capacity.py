"""The planner's capacity model from the step-cost model, and the shifting-mix trace."""

from hypothesis import given
from hypothesis import strategies as st

from benchmarks.pd_replay.capacity import StepCostCapacity
from benchmarks.pd_replay.mix import shifted_mix
from benchmarks.replay.cost_model import StepCostModel
from policies.pd.planner import CapacityModel

MODEL = StepCostModel.preset("h100")
CAPACITY = StepCostCapacity(cost_model=MODEL, kv_capacity_tokens=24_800 * 16, itl_target_s=0.1)


def test_it_is_a_capacity_model_and_prices_long_prompts_by_their_attention():
    assert isinstance(CAPACITY, CapacityModel)
    short, long = CAPACITY.prefill_s(10_000, 0), CAPACITY.prefill_s(100_000, 0)
    assert long > 15 * short  # quadratic attention: 10x the tokens, far more than 10x the time
    assert CAPACITY.prefill_s(10_000, 10_000) == 0.0
    assert CAPACITY.prefill_s(10_000, 8_192) < CAPACITY.prefill_s(10_000, 0)


@given(st.integers(1, 100_000), st.integers(0, 100_000), st.integers(1, 4_000))
def test_more_cached_tokens_never_cost_more(prompt, cached, output):
    assert CAPACITY.prefill_s(prompt, min(prompt, cached)) <= CAPACITY.prefill_s(prompt, 0)
    assert CAPACITY.decode_s(prompt, output) > 0


@given(st.integers(1, 60_000), st.integers(1, 60_000), st.integers(1, 2_000))
def test_decode_costs_grow_with_context_and_output(small, extra, output):
    batched = StepCostCapacity(cost_model=MODEL, kv_capacity_tokens=24_800 * 16,
                               batch_context_tokens=8_000)
    assert batched.decode_s(small + extra, output) >= batched.decode_s(small, output)
    assert batched.decode_s(small, output + 1) > batched.decode_s(small, output)


def test_the_batch_is_bounded_by_kv_and_the_itl_target_and_the_colocated_gap_by_a_chunk():
    assert CAPACITY.batch_size(100_000, 0) == 3  # 396,800 KV tokens / 100k
    tight = StepCostCapacity(cost_model=MODEL, kv_capacity_tokens=10**9, itl_target_s=0.02)
    size = tight.batch_size(10_000, 100)
    assert MODEL.step_time_s(_decodes(size, 10_050)) <= 0.02 < MODEL.step_time_s(
        _decodes(size * 2, 10_050))
    assert 0.24 < CAPACITY.colocated_itl_s() < 0.27  # an 8,192-token chunk on the H100 model


def _decodes(count, context):
    from benchmarks.replay.cost_model import StepBatch

    return StepBatch(decode_context_tokens=[context] * count)


def test_the_shifting_mix_plays_each_trace_after_the_other():
    trace = shifted_mix(["azure-code", "azure-conv"], seconds_each=20.0, rate_scale=2.0)
    first = [r for r in trace.requests if r.request_id.startswith("0-")]
    second = [r for r in trace.requests if r.request_id.startswith("1-")]
    assert first and second and trace.name == "azure-code+azure-conv"
    assert max(r.arrival_s for r in first) < 20.0 <= min(r.arrival_s for r in second) < 40.0
    assert sum(r.output_tokens for r in second) / len(second) > 3 * sum(
        r.output_tokens for r in first) / len(first)  # conversations answer at length
