"""The slot and key registries name real hooks: every import path resolves to a
`SchedulerHook` subclass, every slot is a `Pipeline` field, and a bad path in config is an
error naming the field."""

import attrs
import pytest

from integrations.vllm_v1 import Pipeline
from integrations.vllm_v1.config.declarative import PipelineConfigError
from integrations.vllm_v1.hooks import SchedulerHook
from integrations.vllm_v1.scheduling.features import KEY_HOOKS, SLOT_HOOKS, named_hook


@pytest.mark.parametrize(("name", "path"), SLOT_HOOKS + KEY_HOOKS)
def test_every_registered_path_is_a_scheduler_hook(name, path):
    hook = named_hook(path)
    assert isinstance(hook, type) and issubclass(hook, SchedulerHook), (name, path)


def test_every_slot_hook_is_named_by_a_pipeline_field():
    fields = {field.name for field in attrs.fields(Pipeline)}
    assert {slot for slot, _ in SLOT_HOOKS} <= fields


@pytest.mark.parametrize(("path", "message"), [
    ("no_colon", "expected 'package.module:factory'"),
    ("integrations.vllm_v1.hooks:Missing", "cannot import"),
])
def test_a_bad_hook_path_names_the_config_field(path, message):
    with pytest.raises(PipelineConfigError, match=f"llm_serving_policies.hooks: {message}"):
        named_hook(path)
