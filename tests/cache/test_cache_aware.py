"""CacheAwareRanker: bounded head start for cached prompts, FCFS fallback, and inside vLLM."""

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from integrations.vllm_v1 import Pipeline
from integrations.vllm_v1.instruments import EngineShape, SchedulerHarness
from policies import FCFSOrder, QoSRanker, RankingPolicy, RequestView
from policies.cache_aware import CacheAwareRanker, LoadAwareRanking
from policies.deadline import EDFRanker
from policies.views import LoadSnapshot

BASES = st.sampled_from([FCFSOrder(), QoSRanker(), EDFRanker()])


@st.composite
def views(draw):
    prompt = draw(st.integers(0, 20_000))
    return RequestView(request_id=draw(st.text(max_size=3)),
                       arrival_s=draw(st.floats(0, 1e5, allow_nan=False)),
                       prompt_tokens=prompt, priority=draw(st.integers(-20, 20)),
                       cached_tokens=draw(st.integers(0, prompt + 10)))


def load(waiting):
    return LoadSnapshot(now=0.0, waiting_requests=waiting, running_requests=0, kv_usage=0.0,
                        token_budget=8192)


def test_implements_the_ranking_protocols():
    ranker = CacheAwareRanker()
    assert isinstance(ranker, RankingPolicy)
    assert isinstance(ranker, LoadAwareRanking)
    assert not isinstance(QoSRanker(), LoadAwareRanking)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"bonus_s": -1.0}, "'bonus_s' must be >= 0"),
    ({"bonus_s": float("inf")}, "'bonus_s' must be < inf"),
    ({"max_waiting_requests": -1}, "'max_waiting_requests' must be >= 0"),
])
def test_rejects_bad_configuration(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CacheAwareRanker(**kwargs)


def test_rejects_a_base_that_is_not_a_ranking():
    with pytest.raises(TypeError, match="base must implement RankingPolicy"):
        CacheAwareRanker(base=object())


@given(base=BASES, view=views(), bonus=st.floats(0, 100))
def test_the_head_start_is_bounded_by_bonus_s(base, view, bonus):
    ranker = CacheAwareRanker(base=base, bonus_s=bonus)
    base_key = base.effective_priority(view, 0.0)
    assert base_key - bonus - 1e-6 <= ranker.rank_key(view) <= base_key
    assert 0.0 <= ranker.cached_fraction(view) <= 1.0
    assert ranker.effective_priority(view, 7.0) == pytest.approx(ranker.rank_key(view) - 7.0)


@given(base=BASES, view=views(), more=st.integers(0, 5000))
def test_more_cached_tokens_never_rank_later(base, view, more):
    ranker = CacheAwareRanker(base=base)
    warmer = attrs.evolve(view, cached_tokens=view.cached_tokens + more)
    assert ranker.rank_key(warmer) <= ranker.rank_key(view)


@given(base=BASES, view=views(), waiting=st.integers(0, 300), limit=st.integers(0, 200))
def test_over_the_waiting_limit_the_key_is_the_base_key(base, view, waiting, limit):
    ranker = CacheAwareRanker(base=base, max_waiting_requests=limit)
    key = ranker.rank_key_under_load(view, load(waiting))
    if waiting > limit:
        assert key == base.effective_priority(view, 0.0)
    else:
        assert key == ranker.rank_key(view)


def test_a_fcfs_base_keys_by_arrival():
    ranker = CacheAwareRanker(base=FCFSOrder(), bonus_s=2.0)
    cold = RequestView(request_id="c", arrival_s=10.0, prompt_tokens=100)
    warm = RequestView(request_id="w", arrival_s=11.0, prompt_tokens=100, cached_tokens=100)
    late = RequestView(request_id="l", arrival_s=12.5, prompt_tokens=100, cached_tokens=100)
    assert ranker.rank_key(warm) == 9.0 < ranker.rank_key(cold) == 10.0 < ranker.rank_key(late)


# -- through the real scheduler -------------------------------------------------------------

SHAPE = EngineShape(num_blocks=128, max_num_seqs=1, max_num_batched_tokens=512,
                    max_model_len=2048)
PREFIX = [3 + i % 50 for i in range(160)]  # 10 blocks of 16 tokens


def first_scheduled_order(pipeline, arrivals):
    """Warm the cache with PREFIX, keep the engine busy, queue ``arrivals``; first-schedule order.

    ``arrivals`` are ``(request id, warm?)``: a warm request repeats PREFIX (and hits the
    cache), a cold one has a prompt of the same length no one has sent.
    """
    harness = SchedulerHarness.build(pipeline, shape=SHAPE)
    harness.add_request("warmup", PREFIX, 1)
    while harness.has_requests():
        harness.step()
    harness.add_request("busy", [9000 + i for i in range(32)], 20)
    harness.step()  # "busy" takes the only seat
    for index, (request_id, warm) in enumerate(arrivals):
        harness.clock.advance(0.1)
        prompt = PREFIX + [1] if warm else [20_000 + 500 * index + i for i in range(161)]
        harness.add_request(request_id, prompt, 2)
    order = []
    while harness.has_requests():
        harness.clock.advance(0.01)
        for new in harness.step().scheduler_output.scheduled_new_reqs:
            order.append(new.req_id)
    return order


def test_a_cache_hitting_request_is_served_before_an_earlier_cold_one():
    arrivals = [("cold", False), ("warm", True)]
    assert first_scheduled_order(Pipeline(), arrivals) == ["cold", "warm"]  # stock FCFS
    assert first_scheduled_order(Pipeline(ranking=CacheAwareRanker()), arrivals) == [
        "warm", "cold"]


def test_the_head_start_composes_with_a_qos_base_and_keeps_priority():
    pipeline = Pipeline(ranking=CacheAwareRanker(base=QoSRanker(), bonus_s=1.0))
    arrivals = [("cold", False), ("warm", True)]
    assert first_scheduled_order(pipeline, arrivals) == ["warm", "cold"]


def test_under_a_large_queue_the_fallback_keeps_arrival_order():
    pipeline = Pipeline(ranking=CacheAwareRanker(max_waiting_requests=2))
    arrivals = [("cold0", False), ("cold1", False), ("cold2", False), ("warm", True)]
    assert first_scheduled_order(pipeline, arrivals) == ["cold0", "cold1", "cold2", "warm"]
    light = Pipeline(ranking=CacheAwareRanker(max_waiting_requests=3))
    assert first_scheduled_order(light, arrivals)[0] == "warm"


def test_the_view_carries_the_cached_tokens_found_on_admission():
    harness = SchedulerHarness.build(Pipeline(ranking=CacheAwareRanker()), shape=SHAPE)
    harness.add_request("warmup", PREFIX, 1)
    while harness.has_requests():
        harness.step()
    harness.add_request("again", PREFIX, 1)
    request = harness.scheduler.requests["again"]
    assert harness.scheduler._view(request).cached_tokens == 144  # 9 full blocks; the last
    # token's block is recomputed, as vLLM's own lookup does
    assert harness.step().scheduler_output.num_scheduled_tokens["again"] == 160 - 144
