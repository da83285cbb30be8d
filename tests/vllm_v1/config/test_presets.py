"""Resolving pipelines by name, module path and file path."""

import pickle

import pytest

from integrations.vllm_v1 import PRESETS, Pipeline, preset, resolve_pipeline
from integrations.vllm_v1.config.spec import pipeline_from_additional_config, to_additional_config


def test_presets_resolve_by_name():
    assert resolve_pipeline("identity") == Pipeline()
    assert resolve_pipeline("default", tenant_weights={"gold": 4}).fairness.weight("gold") == 4


def test_presets_are_factories_of_fresh_state():
    for name in PRESETS:
        first, second = preset(name), preset(name)
        assert [type(p) for p in first.policies] == [type(p) for p in second.policies], name
        assert all(a is not b for a, b in zip(first.policies, second.policies, strict=True)), name


def test_a_file_pipeline_with_its_own_policy_class_pickles_for_the_engine(tmp_path):
    (tmp_path / "my_policies_file.py").write_text(
        "import attrs\n"
        "from integrations.vllm_v1 import Pipeline\n"
        "@attrs.frozen\n"
        "class ShortestFirst:\n"
        "    def rank_key(self, request):\n"
        "        return float(request.prompt_tokens)\n"
        "    def effective_priority(self, request, now):\n"
        "        return float(request.prompt_tokens)\n"
        "PIPE = Pipeline(ranking=ShortestFirst())\n")
    pipeline = resolve_pipeline(f"{tmp_path / 'my_policies_file.py'}:PIPE")
    assert pickle.loads(pickle.dumps(pipeline)) == pipeline
    assert pipeline_from_additional_config(to_additional_config(pipeline)) == pipeline


@pytest.mark.parametrize(("spec", "message"), [
    ("nope", "unknown pipeline 'nope'"),
    ("missing_file.py:X", "pipeline file not found"),
    ("integrations.vllm_v1.config.presets:PRESETS", "is not a Pipeline"),
])
def test_bad_specs_are_clear_errors(spec, message):
    with pytest.raises(ValueError, match=message):
        resolve_pipeline(spec)


def test_pipeline_slots_are_type_checked():
    with pytest.raises(TypeError, match="Pipeline.ranking must implement RankingPolicy"):
        Pipeline(ranking=object())


def test_the_example_pipeline_resolves_and_travels_to_the_engine():
    pipeline = resolve_pipeline("examples/my_pipeline.py:PIPELINE")
    restored = pipeline_from_additional_config(to_additional_config(pipeline))
    assert restored.admission.max_waiting == 512
