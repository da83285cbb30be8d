"""The slot and key registries name real hooks: every import path resolves to a
`SchedulerHook` factory, slots name theirs in their `Pipeline` field, hooks run in field
order, and a bad path in config is an error naming the field."""

import random
import typing

import pytest

from integrations.vllm_v1 import Pipeline
from integrations.vllm_v1.composition import KEY_HOOKS
from integrations.vllm_v1.config.declarative import PipelineConfigError
from integrations.vllm_v1.config.slo import slo_pipeline
from integrations.vllm_v1.hooks import SchedulerHook
from integrations.vllm_v1.instruments import EngineShape, SchedulerHarness
from integrations.vllm_v1.pipeline import hooked_slots
from integrations.vllm_v1.scheduling.features import named_hook
from integrations.vllm_v1.scheduling.start_gate import StartGateHook
from integrations.vllm_v1.slo.admission_metrics import SLOAdmissionMetrics
from integrations.vllm_v1.slo.step_timing import StepTimingHook
from policies import AdmissionController, DecodeKVGate


def _hook_type(factory):
    if isinstance(factory, type):
        return factory
    hints = typing.get_type_hints(factory)["return"]  # a factory: Hook | None
    return next(arg for arg in typing.get_args(hints) if arg is not type(None))


@pytest.mark.parametrize(("name", "path"), hooked_slots() + KEY_HOOKS)
def test_every_registered_path_is_a_scheduler_hook_factory(name, path):
    hook = _hook_type(named_hook(path))
    assert isinstance(hook, type) and issubclass(hook, SchedulerHook), (name, path)


def test_the_hooked_slots_are_the_pipeline_fields_that_run_a_feature():
    assert [slot for slot, _ in hooked_slots()] == [
        "admission", "start_gate", "speculation", "warming", "eviction", "step_model"]


def test_hooks_are_built_in_field_order_and_only_for_what_they_report():
    shape = EngineShape(num_blocks=256, block_size=16)
    pipeline = slo_pipeline()
    gated = Pipeline(admission=pipeline.admission, step_model=pipeline.step_model,
                     start_gate=DecodeKVGate())
    hooks = SchedulerHarness.build(gated, shape=shape).scheduler.hooks.hooks
    assert [type(h) for h in hooks] == [SLOAdmissionMetrics, StartGateHook, StepTimingHook]
    plain = Pipeline(admission=AdmissionController(rng=random.Random(0), max_waiting=4))
    assert SchedulerHarness.build(plain, shape=shape).scheduler.hooks.hooks == ()


@pytest.mark.parametrize(("path", "message"), [
    ("no_colon", "expected 'package.module:factory'"),
    ("integrations.vllm_v1.hooks:Missing", "cannot import"),
])
def test_a_bad_hook_path_names_the_config_field(path, message):
    with pytest.raises(PipelineConfigError, match=f"llm_serving_policies.hooks: {message}"):
        named_hook(path)
