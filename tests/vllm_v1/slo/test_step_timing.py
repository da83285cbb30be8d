"""The ``step_model`` slot learns the engine's step time from the steps the scheduler runs."""

from __future__ import annotations

import random

import pytest

from integrations.vllm_v1.instruments.harness import EngineShape, SchedulerHarness, scheduled_work
from integrations.vllm_v1.pipeline import Pipeline
from integrations.vllm_v1.slo.step_timing import StepTimingHook
from policies import OnlineStepTimeModel, StepFeatures, StepTimeModel

ENGINE = StepTimeModel(base_s=0.004, decode_s_per_seq=2e-5, decode_s_per_context_token=4e-8,
                       prefill_s_per_token=3e-5, prefill_s_per_pair=2e-9)
"""The 'engine' of these tests: the virtual clock advances by what it prices each step."""


def run(harness: SchedulerHarness, requests: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    for index in range(requests):
        prompt = [rng.randrange(1, 30_000) for _ in range(rng.randint(16, 900))]
        harness.add_request(f"r{index}", prompt, rng.randint(1, 40))
        for _ in range(rng.randint(0, 6)):
            output = harness.scheduler.schedule()
            work = scheduled_work(harness.scheduler, output.num_scheduled_tokens)
            harness.clock.advance(ENGINE.features_s(StepFeatures.of(work.prefills,
                                                                    work.decode_contexts)))
            harness.complete(output)
    while harness.has_requests():
        harness.step()


def test_the_slot_runs_the_timing_hook_and_learns_the_engine():
    harness = SchedulerHarness.build(Pipeline(step_model=OnlineStepTimeModel()),
                                     shape=EngineShape(num_blocks=4096, block_size=16))
    model = harness.scheduler.pipeline.step_model  # the engine's copy
    assert any(isinstance(h, StepTimingHook) for h in harness.scheduler.hooks.hooks)
    run(harness, 300)
    stats = model.stats()
    assert stats.observations > 200
    # the last steps drained without advancing the clock: judge the fit on busy steps
    step = StepFeatures.of(((512, 256),), (300,) * 16)
    assert model.model.features_s(step) == pytest.approx(ENGINE.features_s(step), rel=0.15)
    model.check_invariants()


def test_steps_that_schedule_nothing_are_not_learned():
    harness = SchedulerHarness.build(Pipeline(step_model=OnlineStepTimeModel()))
    for _ in range(5):
        harness.step()  # nothing to run
    assert harness.scheduler.pipeline.step_model.stats().observations == 0
