"""The replay driver on the real vLLM scheduler: conservation, cancellation, rejection, prefixes."""

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.replay.cost_model import StepCostModel
from benchmarks.replay.driver import build_harness, prompt_token_ids, replay
from benchmarks.replay.metrics import summarize
from benchmarks.replay.trace import Trace, TraceRequest
from integrations.vllm_v1.instruments import EngineShape, SchedulerHarness

SHAPE = EngineShape(num_blocks=256, max_num_batched_tokens=512, max_num_seqs=16)
COST = StepCostModel.preset("h100")


def trace_of(*requests, block_size=None):
    return Trace(name="t", requests=tuple(requests), block_size=block_size)


def req(i, arrival, prompt=64, output=8, **kw):
    return TraceRequest(
        request_id=f"r{i}", arrival_s=arrival, prompt_tokens=prompt, output_tokens=output, **kw
    )


def test_every_request_completes_with_its_output_tokens_in_arrival_order():
    trace = trace_of(*(req(i, i * 0.05, prompt=50 + 30 * i, output=5 + i) for i in range(12)))
    run = replay(trace, "fcfs", shape=SHAPE, cost_model=COST)
    assert {r.outcome for r in run.records} == {"completed"}
    for record in run.records:
        assert len(record.token_times_s) == record.output_tokens
        assert record.token_times_s == sorted(record.token_times_s)
        assert record.ttft_s > 0


def test_virtual_time_follows_the_cost_model():
    one = replay(trace_of(req(0, 0.0, prompt=1000, output=2)), "fcfs", shape=SHAPE, cost_model=COST)
    slow = replay(
        trace_of(req(0, 0.0, prompt=1000, output=2)),
        "fcfs",
        shape=SHAPE,
        cost_model=attrs.evolve(COST, t0_s=COST.t0_s + 1.0),
    )
    (fast_record,), (slow_record,) = one.records, slow.records
    assert one.steps == slow.steps
    # Every step, busy or idle, is exactly 1 s slower, so the run is that many seconds longer.
    assert slow.makespan_s - one.makespan_s == pytest.approx((one.steps + one.idle_steps) * 1.0)
    assert slow_record.ttft_s > fast_record.ttft_s + 1.0


def test_cancelled_requests_are_counted_not_lost():
    trace = trace_of(req(0, 0.0, prompt=200, output=400, cancel_after_s=0.5), req(1, 0.1, output=3))
    run = replay(trace, "fcfs", shape=SHAPE, cost_model=COST)
    outcome = {r.request_id: r.outcome for r in run.records}
    assert outcome == {"r0": "cancelled", "r1": "completed"}
    cancelled = next(r for r in run.records if r.request_id == "r0")
    assert 0 < len(cancelled.token_times_s) < 400
    assert cancelled.finish_s == pytest.approx(0.5, abs=0.1)


def test_rejections_are_counted_with_their_reason(tmp_path):
    pipeline_file = tmp_path / "pipe.py"
    pipeline_file.write_text(
        "from integrations.vllm_v1 import Pipeline\n"
        "from policies import QueueDepthLimit\n"
        "PIPE = Pipeline(admission=QueueDepthLimit(max_waiting=1, retry_after_s=2))\n"
    )
    trace = trace_of(*(req(i, 0.0) for i in range(5)))
    run = replay(trace, f"pipeline:{pipeline_file}:PIPE", shape=SHAPE, cost_model=COST)
    summary = summarize(run)
    assert summary["overall"]["completed"] + summary["overall"]["rejected"] == 5
    assert summary["overall"]["rejected"] == 4
    assert summary["rejections_by_reason"] == {"rejected:queue_full": 4}
    assert summary["rejections_with_retry_after"] == 4
    assert summary["by_priority"]["0"]["offered"] == 5


def test_shared_block_hashes_become_prefix_cache_hits():
    shared = (11, 12, 13, 14)
    trace = trace_of(
        req(0, 0.0, prompt=256, block_hashes=shared),
        req(1, 1.0, prompt=256, block_hashes=shared),
        req(2, 2.0, prompt=256, block_hashes=(99, 98, 97, 96)),
        block_size=64,
    )
    run = replay(trace, "fcfs", shape=SHAPE, cost_model=COST)
    cached = {r.request_id: r.cached_tokens for r in run.records}
    assert cached["r0"] == 0 and cached["r2"] == 0
    assert cached["r1"] == 240  # all full 16-token blocks but the last token's


def test_prompt_tokens_share_exactly_the_hashed_blocks():
    a = prompt_token_ids(req(0, 0.0, prompt=100, block_hashes=(1, 2)), 0, 32)
    b = prompt_token_ids(req(1, 0.0, prompt=100, block_hashes=(1, 3)), 1, 32)
    assert len(a) == len(b) == 100
    assert a[:32] == b[:32] and a[32:64] != b[32:64]
    assert not set(a[64:]) & set(b[64:])


def test_unknown_system_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown system"):
        replay(trace_of(req(0, 0.0)), "lifo", shape=SHAPE, cost_model=COST)


traces = st.lists(
    st.tuples(st.floats(0, 3), st.integers(1, 600), st.integers(1, 40),
              st.one_of(st.none(), st.floats(0.01, 2.0)), st.sampled_from(["a", "b", None])),
    min_size=1, max_size=25)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=traces, system=st.sampled_from(["fcfs", "priority", "pipeline:qos", "pipeline:default"]))
def test_every_offered_request_is_accounted_for(rows, system):
    trace = trace_of(*(req(i, arrival, prompt=prompt, output=output, cancel_after_s=cancel,
                           tenant=tenant, priority=i % 3 - 1)
                       for i, (arrival, prompt, output, cancel, tenant) in enumerate(rows)))
    tight = EngineShape(num_blocks=48, max_num_batched_tokens=256, max_num_seqs=6)
    run = replay(trace, system, shape=tight, cost_model=COST)
    summary = summarize(run)
    assert summary["offered"] == len(rows)
    assert summary["completed"] + summary["rejected"] + summary["cancelled"] == len(rows)
    for record in run.records:
        if record.outcome == "completed":
            assert len(record.token_times_s) == record.output_tokens


def test_cancellation_frees_the_kv_cache():
    trace = trace_of(req(0, 0.0, prompt=500, output=10_000, cancel_after_s=1.0))
    harness = build_harness("fcfs", SHAPE)
    run = replay(trace, "fcfs", shape=SHAPE, cost_model=COST, harness=harness)
    assert run.records[0].outcome == "cancelled"
    pool = harness.scheduler.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == SHAPE.num_blocks - 1  # all but vLLM's null block
    assert harness.scheduler.get_kv_cache_usage() == 0.0


@pytest.mark.slow
def test_same_seed_gives_identical_summary(tmp_path):
    from benchmarks.replay.__main__ import main

    args = ["--trace", "azure-code", "--tenants", "servegen", "--rate-scale", "3",
            "--max-requests", "120", "--systems", "fcfs,pipeline:qos", "--kv-blocks", "4000"]
    first = main([*args, "--out", str(tmp_path / "a")])
    second = main([*args, "--out", str(tmp_path / "b")])
    for summary in (first, second):
        for system in summary["systems"].values():
            system.pop("wall_s")
            system.pop("steps_per_s")
    assert first == second
    assert (tmp_path / "a" / "ttft.png").stat().st_size > 0
    assert set(first["systems"]) == {"fcfs", "pipeline:qos"}
    assert {"short", "long"} <= set(first["systems"]["fcfs"]["by_class"])


@pytest.mark.parametrize("fast_forward", [True, False])
def test_clients_without_max_tokens_hide_each_answers_length_and_change_nothing_stock(
        fast_forward):
    trace = trace_of(*(req(i, i * 0.02, prompt=40 + 25 * i, output=3 + 4 * i) for i in range(10)))
    told = replay(trace, "fcfs", shape=SHAPE, cost_model=COST, fast_forward=fast_forward)
    seen = []

    class Spy(SchedulerHarness):
        def add_request(self, *args, **kwargs):
            request = super().add_request(*args, **kwargs)
            seen.append((request.max_tokens, kwargs["output_tokens"]))
            return request

    harness = Spy(build_harness("fcfs", SHAPE).scheduler)
    hidden = replay(trace, "fcfs", shape=SHAPE, cost_model=COST, harness=harness,
                    fast_forward=fast_forward, max_tokens="context")
    assert [r.token_times_s for r in hidden.records] == [r.token_times_s for r in told.records]
    assert {r.outcome for r in hidden.records} == {"completed"}
    room = [SHAPE.max_model_len - r.prompt_tokens for r in trace.requests]
    assert seen == list(zip(room, (r.output_tokens for r in trace.requests), strict=True))


def test_a_long_answer_sets_the_makespan_but_not_the_arrival_window_goodput():
    short = [req(i, i * 0.1, output=4) for i in range(10)]
    quick = summarize(replay(trace_of(*short), "fcfs", shape=SHAPE, cost_model=COST))
    drained = summarize(replay(trace_of(*short, req(10, 0.9, output=2000)), "fcfs",
                               shape=SHAPE, cost_model=COST))
    assert drained["met_slo"] == quick["met_slo"] + 1 == 11
    assert drained["overall"]["goodput_rps"] < quick["overall"]["goodput_rps"] / 2
    assert drained["goodput_arrival_window_rps"] == pytest.approx(11 / 0.9)
    assert quick["goodput_arrival_window_rps"] == pytest.approx(10 / 0.9)
