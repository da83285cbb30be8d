"""CacheAwareRanker: a bounded head start for cached prompts and the FCFS fallback."""

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies import FCFSOrder, QoSRanker, RankingPolicy, RequestView
from policies.kv.cache_aware import CacheAwareRanker, LoadAwareRanking
from policies.ordering.deadline import EDFRanker
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
