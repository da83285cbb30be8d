"""Naming a pipeline in plain vLLM configuration: every form builds the same objects, and
every mistake is an error that names the slot and the field."""

from __future__ import annotations

import json

import pytest

from integrations.vllm_v1 import Pipeline
from integrations.vllm_v1.config.declarative import PipelineConfigError
from integrations.vllm_v1.config.spec import (
    CONFIG_KEY,
    pipeline_from_additional_config,
    resolve_pipeline,
    to_additional_config,
)
from policies import WFQ, AdmissionController, QoSRanker

MAPPING = {"fairness": {"class": "WFQ", "weights": {"gold": 4, "bronze": 1}},
           "ranking": "QoSRanker",
           "admission": {"class": "AdmissionController", "max_waiting": 64, "rng": 7}}


def check(pipeline: Pipeline) -> None:
    assert isinstance(pipeline.fairness, WFQ) and pipeline.fairness.weight("gold") == 4
    assert isinstance(pipeline.ranking, QoSRanker)
    assert isinstance(pipeline.admission, AdmissionController)
    assert pipeline.admission.max_waiting == 64


def test_a_preset_name_in_additional_config():
    pipeline = pipeline_from_additional_config(
        {CONFIG_KEY: {"pipeline": "default", "tenant_weights": {"gold": 4}}})
    assert pipeline.fairness.weight("gold") == 4 and pipeline.fairness.weight("x") == 1


def test_no_entry_is_the_identity_pipeline():
    assert pipeline_from_additional_config({}) == Pipeline()
    assert pipeline_from_additional_config({"other_plugin": 1}) == Pipeline()


def test_an_inline_mapping():
    check(resolve_pipeline(MAPPING))


@pytest.mark.parametrize("suffix", [".json", ".yaml", ".toml"])
def test_a_file_in_each_format(tmp_path, suffix):
    path = tmp_path / f"pipeline{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps(MAPPING))
    elif suffix == ".yaml":
        import yaml

        path.write_text(yaml.safe_dump(MAPPING))
    else:
        path.write_text('ranking = "QoSRanker"\n[fairness]\nclass = "WFQ"\n'
                        'weights = {gold = 4, bronze = 1}\n[admission]\n'
                        'class = "AdmissionController"\nmax_waiting = 64\nrng = 7\n')
    check(resolve_pipeline(str(path)))


def test_an_import_path_to_a_pipeline_or_a_factory(tmp_path):
    (tmp_path / "site_pipelines.py").write_text(
        "from integrations.vllm_v1.config.declarative import build_pipeline\n"
        f"PIPE = build_pipeline({MAPPING!r})\n"
        f"def make():\n    return build_pipeline({MAPPING!r})\n")
    check(resolve_pipeline(f"{tmp_path / 'site_pipelines.py'}:PIPE"))
    check(resolve_pipeline(f"{tmp_path / 'site_pipelines.py'}:make"))


def test_the_pickled_transport_round_trips():
    pipeline = resolve_pipeline(MAPPING)
    check(pipeline_from_additional_config(to_additional_config(pipeline)))


@pytest.mark.parametrize(("spec", "message"), [
    ({"fairnes": "WFQ"}, "unknown pipeline slot 'fairnes'"),
    ({"ranking": "QoSRankr"},
     "llm_serving_policies.pipeline.ranking: unknown policy class 'QoSRankr'"),
    ({"fairness": {"class": "WFQ", "weight": 1}},
     r"llm_serving_policies.pipeline.fairness \(WFQ\): .*unexpected keyword argument 'weight'"),
    ({"admission": {"class": "AdmissionController", "max_waiting": -1, "rng": 0}},
     r"llm_serving_policies.pipeline.admission \(AdmissionController\): .*max_waiting"),
    ({"admission": {"class": "AdmissionController"}},
     r"llm_serving_policies.pipeline.admission \(AdmissionController\): .*'rng'"),
    ({"quotas": "TenantQuota"}, "llm_serving_policies.pipeline.quotas needs a fairness policy"),
    ({"ranking": {"weights": 1}}, "llm_serving_policies.pipeline.ranking: expected a class name"),
    ({"ranking": "os:path"}, "llm_serving_policies.pipeline.ranking: 'os:path' is not a class"),
    ("nope", "unknown pipeline 'nope'"),
    ("missing.yaml", "pipeline file not found"),
    (3, "must be a preset name, an import path or a mapping"),
])
def test_mistakes_name_the_slot_and_field(spec, message):
    with pytest.raises(PipelineConfigError, match=message):
        resolve_pipeline(spec)


def test_a_bad_entry_shape_is_refused():
    with pytest.raises(PipelineConfigError, match="must be a mapping"):
        pipeline_from_additional_config({CONFIG_KEY: "default"})
    with pytest.raises(PipelineConfigError, match="tenant_weights must be a mapping"):
        pipeline_from_additional_config({CONFIG_KEY: {"pipeline": "wfq", "tenant_weights": 3}})
    with pytest.raises(PipelineConfigError) as error:
        pipeline_from_additional_config({CONFIG_KEY: {"pipeline": "wfq", "tenant_weights": {
            "gold": "x", "silver": 2, "bronze": 0}}})
    assert str(error.value).splitlines() == [
        "llm_serving_policies.tenant_weights.gold must be a number > 0, got 'x'",
        "llm_serving_policies.tenant_weights.bronze must be a number > 0, got 0"]
