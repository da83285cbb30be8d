"""``stock+queue-caps``: vLLM's frontend admission applied at the replay's arrival point."""

import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.replay.cost_model import StepCostModel
from benchmarks.replay.driver import replay
from benchmarks.replay.systems import (
    QUEUE_CAPS,
    QUEUE_CAPS_SWEEP,
    QueueCappedHarness,
    QueueCaps,
    best_queue_caps,
    build_system,
    expand_systems,
)
from benchmarks.replay.trace import Trace, TraceRequest
from integrations.vllm_v1.instruments import EngineShape

SHAPE = EngineShape(num_blocks=512, max_num_batched_tokens=512, max_num_seqs=16)
COST = StepCostModel.preset("h100")


def burst(count, prompt=200, output=20, spacing_s=0.0):
    return Trace(name="burst", requests=tuple(
        TraceRequest(request_id=f"r{i}", arrival_s=spacing_s * i, prompt_tokens=prompt,
                     output_tokens=output) for i in range(count)))


def vllm_check(caps, unfinished, queued_tokens):
    """The reason vLLM's own ``AsyncLLM.check_admission`` rejects with, or None."""
    from vllm.exceptions import MaxQueuedTokensError, QueueOverflowError
    from vllm.v1.engine.async_llm import AsyncLLM

    engine = types.SimpleNamespace(
        scheduler_config=types.SimpleNamespace(max_num_queued_reqs=caps.max_num_queued_reqs,
                                               max_num_queued_tokens=caps.max_num_queued_tokens),
        admission_stats=None, get_num_unfinished_requests=lambda: unfinished,
        get_num_queued_tokens=lambda: queued_tokens,
        _record_admission_rejection=lambda reason: None)
    try:
        AsyncLLM.check_admission(engine)
    except QueueOverflowError:
        return "max_num_queued_reqs"
    except MaxQueuedTokensError:
        return "max_num_queued_tokens"
    return None


@settings(max_examples=200, deadline=None)
@given(reqs=st.none() | st.integers(0, 50), tokens=st.none() | st.integers(0, 5000),
       unfinished=st.integers(0, 60), queued=st.integers(0, 6000))
def test_the_check_is_vllms_own(reqs, tokens, unfinished, queued):
    caps = QueueCaps(max_num_queued_reqs=reqs, max_num_queued_tokens=tokens)
    assert caps.rejection(unfinished, queued) == vllm_check(caps, unfinished, queued)


def test_names_parse_back_and_bad_ones_say_what_is_wrong():
    for caps in QUEUE_CAPS_SWEEP:
        assert QueueCaps.parse(caps.name) == caps
    both = QueueCaps.parse("stock+queue-caps:priority:reqs=8:tokens=4096")
    assert (both.base, both.max_num_queued_reqs, both.max_num_queued_tokens) == (
        "priority", 8, 4096)
    with pytest.raises(ValueError, match="'lifo' is not fcfs or priority"):
        QueueCaps.parse("stock+queue-caps:lifo")
    with pytest.raises(ValueError, match="'depth=3' is not reqs=N, tokens=N, chunk=N or"):
        QueueCaps.parse("stock+queue-caps:fcfs:depth=3")
    chunked = QueueCaps.parse("stock+queue-caps:fcfs:reqs=8:chunk=512:adaptive")
    assert (chunked.long_prefill_token_threshold, chunked.adaptive) == (512, True)
    with pytest.raises(ValueError, match="adaptive needs a long_prefill_token_threshold"):
        QueueCaps.parse("stock+queue-caps:fcfs:adaptive")
    with pytest.raises(ValueError, match="is a sweep"):
        build_system(QUEUE_CAPS, SHAPE)
    with pytest.raises(ValueError, match="max_num_queued_reqs must be an integer >= 0"):
        QueueCaps(max_num_queued_reqs=-1)


def test_a_burst_is_cut_at_the_request_cap_and_nothing_goes_missing():
    """All arrive at once: five fit. Finished requests free their places: a later arrival
    is admitted again."""
    late = TraceRequest(request_id="late", arrival_s=100.0, prompt_tokens=200, output_tokens=5)
    trace = Trace(name="burst", requests=(*burst(20).requests, late))
    harness = QueueCappedHarness.with_caps(QueueCaps(max_num_queued_reqs=5), SHAPE)
    run = replay(trace, "caps", shape=SHAPE, cost_model=COST, harness=harness)
    outcome = {r.request_id: r.outcome for r in run.records}
    assert [outcome[f"r{i}"] for i in range(20)] == ["completed"] * 5 + ["rejected"] * 15
    assert outcome["late"] == "completed"
    rejected = [r for r in run.records if r.outcome == "rejected"]
    assert {r.reason for r in rejected} == {"rejected:max_num_queued_reqs"}, "no Retry-After"
    assert harness.rejections == {"max_num_queued_reqs": 15}
    harness.check_invariants()
    assert harness.unfinished_requests == 0 and harness.queued_prompt_tokens == 0


def test_the_token_cap_counts_whole_prompts_until_the_first_output():
    harness = QueueCappedHarness.with_caps(QueueCaps(max_num_queued_tokens=1000), SHAPE)
    run = replay(burst(20, prompt=400), "caps", shape=SHAPE, cost_model=COST, harness=harness)
    outcomes = [r.outcome for r in run.records]
    # All arrive at once. 400, 800 queued: still under 1000, so the third is admitted (vLLM
    # does not add the newcomer's own prompt); at 1200 the rest are refused.
    assert outcomes == ["completed"] * 3 + ["rejected"] * 17
    assert all(r.reason == "rejected:max_num_queued_tokens" for r in run.records
               if r.outcome == "rejected")
    harness.check_invariants()


def test_no_caps_schedules_like_stock_vllm():
    trace = burst(12, spacing_s=0.01)
    capped = replay(trace, "caps", shape=SHAPE, cost_model=COST,
                    harness=QueueCappedHarness.with_caps(QueueCaps(base="fcfs"), SHAPE))
    stock = replay(trace, "fcfs", shape=SHAPE, cost_model=COST)
    assert [r.token_times_s for r in capped.records] == [r.token_times_s for r in stock.records]


def test_the_sweep_expands_and_its_best_is_the_highest_score():
    assert expand_systems(["fcfs", QUEUE_CAPS]) == ["fcfs", *(c.name for c in QUEUE_CAPS_SWEEP)]
    assert best_queue_caps({"a": (1.0, 0.5), "b": (2.0, None), "c": (2.0, 0.1)}) == "c"
    with pytest.raises(ValueError, match="no queue-caps setting was run"):
        best_queue_caps({})


def test_the_chunk_knobs_reach_vllms_scheduler_and_cap_a_long_prefill():
    """With a 128-token threshold, a 400-token prompt beside a running request takes 128
    tokens a step (vLLM's own cap); adaptive floors the cap at the budget's fair share
    (512 tokens over two requests: 256)."""
    firsts = {}
    for name in ("stock+queue-caps:fcfs", "stock+queue-caps:fcfs:chunk=128",
                 "stock+queue-caps:fcfs:chunk=128:adaptive"):
        harness = build_system(name, SHAPE)
        config = harness.scheduler.scheduler_config
        assert config.long_prefill_token_threshold == (0 if name.endswith("fcfs") else 128)
        harness.add_request("short", range(10), 50)
        harness.complete(harness.scheduler.schedule())
        harness.add_request("long", range(1000, 1400), 5)
        output = harness.scheduler.schedule()
        firsts[name] = output.num_scheduled_tokens["long"]
    assert list(firsts.values()) == [400, 128, 256]
