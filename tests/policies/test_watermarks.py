"""KVWatermarks: levels, admission monotone in usage and urgency, block quotas, reclaim."""

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies import AdmissionPolicy, LoadSnapshot, RequestView
from policies.admission.watermarks import KVWatermarks, WatermarkLevel

usages = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
priorities = st.integers(min_value=-20, max_value=20)
prompt_lengths = st.integers(min_value=0, max_value=20000)


@st.composite
def watermark_configs(draw):
    yellow = draw(st.floats(min_value=0.01, max_value=0.98))
    red = draw(st.floats(min_value=yellow, max_value=1.0).filter(lambda r: r > yellow))
    high = draw(st.integers(min_value=-20, max_value=19))
    low = draw(st.integers(min_value=high + 1, max_value=20))
    return KVWatermarks(
        yellow_usage=yellow, red_usage=red, high_priority_at_most=high, low_priority_from=low,
        red_max_prompt_tokens=draw(st.integers(0, 4096)),
        base_quota_blocks=draw(st.integers(1, 100_000)),
        min_quota_blocks=draw(st.integers(1, 64)),
        quota_halving_priority_steps=draw(st.floats(min_value=0.5, max_value=20)),
    )


def view(priority=0, prompt_tokens=100):
    return RequestView(request_id="r", arrival_s=0.0, prompt_tokens=prompt_tokens,
                       priority=priority)


def load(kv_usage, waiting=1):
    return LoadSnapshot(now=0.0, waiting_requests=waiting, running_requests=0,
                        kv_usage=kv_usage, token_budget=8192)


def test_levels_switch_exactly_at_the_marks():
    marks = KVWatermarks()
    assert (marks.yellow_usage, marks.red_usage) == (0.70, 0.85)
    assert marks.level(0.0) is WatermarkLevel.GREEN
    assert marks.level(0.6999) is WatermarkLevel.GREEN
    assert marks.level(0.70) is WatermarkLevel.YELLOW
    assert marks.level(0.8499) is WatermarkLevel.YELLOW
    assert marks.level(0.85) is WatermarkLevel.RED
    assert marks.level(1.0) is WatermarkLevel.RED
    assert WatermarkLevel.GREEN < WatermarkLevel.YELLOW < WatermarkLevel.RED


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"yellow_usage": 0.9, "red_usage": 0.8}, "0 < yellow_usage < red_usage <= 1"),
        ({"yellow_usage": 0.5, "red_usage": 0.5}, "0 < yellow_usage < red_usage <= 1"),
        ({"yellow_usage": 0.0}, "0 < yellow_usage < red_usage <= 1"),
        ({"red_usage": 1.01}, "0 < yellow_usage < red_usage <= 1"),
        ({"yellow_usage": float("nan")}, "0 < yellow_usage < red_usage <= 1"),
        ({"high_priority_at_most": 1}, "high_priority_at_most must be below low_priority_from"),
        ({"red_max_prompt_tokens": -1}, "red_max_prompt_tokens must be >= 0"),
        ({"base_quota_blocks": 0}, "base_quota_blocks must be >= 1"),
        ({"min_quota_blocks": 0}, "min_quota_blocks must be >= 1"),
        ({"quota_halving_priority_steps": 0.0}, "quota_halving_priority_steps must be finite and > 0"),
        ({"yellow_retry_after_s": -1.0}, "yellow_retry_after_s must be finite and >= 0"),
        ({"red_retry_after_s": float("inf")}, "red_retry_after_s must be finite and >= 0"),
    ],
)
def test_constructor_rejects_bad_configs(kwargs, message):
    with pytest.raises(ValueError, match=message):
        KVWatermarks(**kwargs)


@pytest.mark.parametrize("usage", [-0.01, 1.01, float("nan")])
def test_usage_outside_unit_interval_is_refused(usage):
    marks = KVWatermarks()
    with pytest.raises(ValueError, match=r"kv_usage must be in \[0, 1\]"):
        marks.level(usage)
    with pytest.raises(ValueError, match=r"kv_usage must be in \[0, 1\]"):
        marks.block_quota(view(), usage)


def test_admission_by_level_with_exact_reasons():
    marks = KVWatermarks()
    assert isinstance(marks, AdmissionPolicy)
    # Green: everything, even low-priority long prompts.
    assert marks.admit(view(priority=20, prompt_tokens=100_000), load(0.5)).admitted
    # Yellow: low priority (>= 1) rejected, priority 0 and urgent admitted.
    rejected = marks.admit(view(priority=1), load(0.75))
    assert (rejected.admitted, rejected.reason, rejected.retry_after_s) == (False, "kv_yellow",
                                                                           2.0)
    assert marks.admit(view(priority=0, prompt_tokens=100_000), load(0.75)).admitted
    # Red: only priority <= -1 with a prompt of at most 1024 tokens.
    assert marks.admit(view(priority=-1, prompt_tokens=1024), load(0.9)).admitted
    for request in (view(priority=-1, prompt_tokens=1025), view(priority=0, prompt_tokens=1)):
        decision = marks.admit(request, load(0.9))
        assert (decision.admitted, decision.reason, decision.retry_after_s) == (False, "kv_red",
                                                                               5.0)


@given(marks=watermark_configs(), u=usages, priority=priorities, prompt_tokens=prompt_lengths)
def test_with_nothing_waiting_every_request_is_admitted(marks, u, priority, prompt_tokens):
    assert marks.admit(view(priority, prompt_tokens), load(u, waiting=0)).admitted


@given(marks=watermark_configs(), u=usages, v=usages, priority=priorities,
       prompt_tokens=prompt_lengths)
def test_a_rejection_stays_a_rejection_at_higher_usage(marks, u, v, priority, prompt_tokens):
    low_u, high_u = sorted((u, v))
    request = view(priority, prompt_tokens)
    if not marks.admit(request, load(low_u)).admitted:
        assert not marks.admit(request, load(high_u)).admitted


@given(marks=watermark_configs(), u=usages, p=priorities, q=priorities,
       prompt_tokens=prompt_lengths)
def test_a_more_urgent_priority_is_never_worse_off(marks, u, p, q, prompt_tokens):
    urgent, relaxed = sorted((p, q))
    if marks.admit(view(relaxed, prompt_tokens), load(u)).admitted:
        assert marks.admit(view(urgent, prompt_tokens), load(u)).admitted
    assert marks.block_quota(view(urgent), u) >= marks.block_quota(view(relaxed), u)


def test_block_quota_follows_the_formula():
    marks = KVWatermarks(base_quota_blocks=2048, min_quota_blocks=16,
                         quota_halving_priority_steps=5)
    assert marks.priority_factor(0) == 1.0
    assert marks.priority_factor(5) == 0.5
    assert marks.priority_factor(-20) == 16.0
    assert marks.block_quota(view(priority=0), 0.0) == 2048
    assert marks.block_quota(view(priority=0), 0.5) == 1024
    assert marks.block_quota(view(priority=5), 0.5) == 512
    assert marks.block_quota(view(priority=-5), 0.75) == 1024
    assert marks.block_quota(view(priority=0), 0.3) == 1433  # floor(2048 * 0.7) = 1433
    assert marks.block_quota(view(priority=20), 0.99) == 16  # floor would give 1
    assert marks.block_quota(view(priority=0), 1.0) == 16
    assert KVWatermarks(base_quota_blocks=None).block_quota(view(priority=9), 0.99) is None


@given(marks=watermark_configs(), u=usages, v=usages, priority=priorities)
def test_block_quota_never_grows_with_usage(marks, u, v, priority):
    low_u, high_u = sorted((u, v))
    quota_low = marks.block_quota(view(priority), low_u)
    quota_high = marks.block_quota(view(priority), high_u)
    assert quota_high <= quota_low
    assert quota_high >= marks.min_quota_blocks


@given(marks=watermark_configs(), u=usages)
def test_reclaim_exactly_at_and_above_yellow(marks, u):
    assert marks.should_reclaim(u) == (u >= marks.yellow_usage)
    assert marks.should_reclaim(u) == (marks.level(u) is not WatermarkLevel.GREEN)


def test_survives_pickling_like_a_pipeline_does():
    marks = KVWatermarks(yellow_usage=0.6, red_usage=0.9)
    assert pickle.loads(pickle.dumps(marks)) == marks
