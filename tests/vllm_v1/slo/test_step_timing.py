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


class _Engine:
    """What the hook reads of a scheduler: its clock and its requests."""

    def __init__(self) -> None:
        self.now = 0.0
        self.requests = {"a": _Request(100, 101)}  # decoding: 100 prompt tokens, 101 in KV

    def clock(self) -> float:
        return self.now


class _Request:
    def __init__(self, prompt: int, computed: int) -> None:
        self.num_prompt_tokens, self.num_computed_tokens = prompt, computed


class _Output:
    num_scheduled_tokens = {"a": 1}


class _Recorder:
    def __init__(self) -> None:
        self.durations: list[float] = []

    def observe(self, features: StepFeatures, duration_s: float) -> None:
        assert features == StepFeatures(decodes=1, decode_context_tokens=100)
        self.durations.append(duration_s)


def test_async_scheduling_times_each_step_from_the_previous_output():
    engine, recorder = _Engine(), _Recorder()
    hook = StepTimingHook(engine, recorder)
    first, second = _Output(), _Output()
    hook.after_schedule(first)          # step 1 scheduled at 0.0 and starts
    engine.now = 0.001
    hook.after_schedule(second)         # step 2 scheduled while step 1 runs
    engine.now = 0.030
    hook.before_update(first, None)     # step 1 done: 30 ms after it was scheduled
    engine.now = 0.055
    hook.before_update(second, None)    # step 2 ran from step 1's end: 25 ms
    assert recorder.durations == pytest.approx([0.030, 0.025])


def test_sync_scheduling_times_each_step_from_its_schedule():
    engine, recorder = _Engine(), _Recorder()
    hook = StepTimingHook(engine, recorder)
    for start, end in ((0.0, 0.02), (0.5, 0.51)):  # an idle gap between the steps
        output = _Output()
        engine.now = start
        hook.after_schedule(output)
        engine.now = end
        hook.before_update(output, None)
    assert recorder.durations == pytest.approx([0.02, 0.01])
