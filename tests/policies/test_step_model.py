"""`OnlineStepTimeModel`: learns a step-time model from observed steps, from a conservative prior."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import CONSERVATIVE_PRIOR, OnlineStepTimeModel, StepFeatures, StepTimeModel

TRUE = StepTimeModel(base_s=0.006, decode_s_per_seq=1e-5, decode_s_per_context_token=5e-8,
                     prefill_s_per_token=2.3e-5, prefill_s_per_pair=1.5e-9)


def random_step(rng: random.Random) -> StepFeatures:
    decodes = tuple(rng.randint(100, 30_000) for _ in range(rng.randint(0, 128)))
    prefills = tuple((rng.randint(1, 1024), rng.randint(0, 30_000))
                     for _ in range(rng.randint(0 if decodes else 1, 2)))
    return StepFeatures.of(prefills, decodes)


def test_features_count_pairs_of_the_chunks_attention():
    features = StepFeatures.of(((4, 10),), (100, 200))
    assert features.prefill_tokens == 4 and features.decodes == 2
    assert features.decode_context_tokens == 300
    assert features.prefill_pairs == 4 * 10 + (1 + 2 + 3 + 4)  # each new token sees what is before


def test_converges_to_the_engine_from_the_conservative_prior():
    rng = random.Random(0)
    model = OnlineStepTimeModel()
    assert model.model == CONSERVATIVE_PRIOR
    steps = [random_step(rng) for _ in range(3000)]
    for features in steps:
        model.observe(features, TRUE.features_s(features) * rng.uniform(0.97, 1.03))
    learned = model.model
    for step in steps[-200:]:
        assert learned.features_s(step) == pytest.approx(TRUE.features_s(step), rel=0.06)
    stats = model.stats()
    assert stats.observations == 3000
    assert stats.relative_error_p50 < 0.03 and stats.relative_error_p99 < 0.1
    model.check_invariants()


def test_error_statistics_are_out_of_sample_and_start_high():
    rng = random.Random(1)
    model = OnlineStepTimeModel(error_window=16)
    for _ in range(16):  # all predicted by the prior: the first refit comes after them
        features = random_step(rng)
        model.observe(features, TRUE.features_s(features))
    early = model.stats().relative_error_p50
    for _ in range(2000):
        features = random_step(rng)
        model.observe(features, TRUE.features_s(features))
    assert early > 0.5, "the prior is about 4x slow: its first predictions are far off"
    assert model.stats().relative_error_p50 < 0.02


def test_an_unexercised_term_stays_at_the_prior():
    model = OnlineStepTimeModel()
    for decodes in range(1, 2000):
        features = StepFeatures.of((), (1000,) * (decodes % 64 + 1))
        model.observe(features, TRUE.features_s(features))
    assert model.model.prefill_s_per_token == pytest.approx(
        CONSERVATIVE_PRIOR.prefill_s_per_token, rel=0.2)


def test_a_pause_does_not_swing_the_fit():
    rng = random.Random(2)
    model = OnlineStepTimeModel()
    for index in range(3000):
        features = random_step(rng)
        duration = TRUE.features_s(features) * (50 if index % 100 == 0 else 1)  # a GC pause
        model.observe(features, duration)
    step = StepFeatures.of(((512, 0),), (2000,) * 32)
    assert model.model.features_s(step) == pytest.approx(TRUE.features_s(step), rel=0.1)


def test_it_forgets_an_engine_that_changed():
    rng = random.Random(3)
    model = OnlineStepTimeModel(window_steps=500)
    slower = StepTimeModel(**{**{k: 2 * v for k, v in zip(
        ("base_s", "decode_s_per_seq", "decode_s_per_context_token", "prefill_s_per_token",
         "prefill_s_per_pair"), TRUE.coefficients(), strict=True)}})
    for engine in (TRUE, slower):
        for _ in range(3000):
            features = random_step(rng)
            model.observe(features, engine.features_s(features))
    step = StepFeatures.of(((512, 4096),), (2000,) * 32)
    assert model.model.features_s(step) == pytest.approx(slower.features_s(step), rel=0.05)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 64), st.integers(0, 4096), st.integers(0, 2048),
                          st.floats(1e-4, 1.0)), min_size=1, max_size=60))
def test_coefficients_stay_non_negative_whatever_it_sees(steps):
    model = OnlineStepTimeModel(refit_every=1)
    for decodes, context, prefill, duration in steps:
        model.observe(StepFeatures.of(((prefill, context),) if prefill else (),
                                      (context,) * decodes), duration)
        model.check_invariants()
    assert model.model.prefill_s_per_token > 0


def test_bad_durations_are_ignored_and_bad_settings_refused():
    model = OnlineStepTimeModel()
    for duration in (0.0, -1.0, float("nan"), float("inf")):
        model.observe(StepFeatures(decodes=1), duration)
    assert model.stats().observations == 0 and model.stats().relative_error_p50 is None
    with pytest.raises(ValueError, match="window_steps must be > 1"):
        OnlineStepTimeModel(window_steps=1)
    with pytest.raises(ValueError, match="prefill_s_per_token"):
        StepTimeModel(base_s=0, decode_s_per_seq=0, prefill_s_per_token=0)


def test_token_equivalents_price_context():
    assert TRUE.prefill_token_equivalents(1000, 0) == pytest.approx(
        1000 + 1.5e-9 * 1000 * 500.5 / 2.3e-5)
    assert TRUE.prefill_token_equivalents(1000, 30_000) > 2.9 * 1000


def test_recent_step_time_follows_the_measured_steps():
    model = OnlineStepTimeModel()
    assert model.recent_step_s is None
    for _ in range(1000):
        model.observe(StepFeatures(decodes=4), 0.02)
    assert model.recent_step_s == pytest.approx(0.02)
    for _ in range(1000):
        model.observe(StepFeatures(decodes=4), 0.04)
    assert model.recent_step_s == pytest.approx(0.04, rel=0.01)
