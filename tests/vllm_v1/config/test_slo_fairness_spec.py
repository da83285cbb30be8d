"""``llm_serving_policies.slo.fairness``: one declaration for admission and ordering."""

from __future__ import annotations

import pytest

from integrations.vllm_v1.config.declarative import PipelineConfigError
from integrations.vllm_v1.config.slo import SLOSpec
from integrations.vllm_v1.config.spec import pipeline_from_additional_config
from policies.slo.fairness import ClassFairShare


def pipeline(slo):
    return pipeline_from_additional_config(
        {"llm_serving_policies": {"pipeline": "slo", "slo": slo}})


def test_one_declared_fairness_feeds_both_ranking_and_admission():
    slo = pipeline({"fairness": {"weights": {"team-a": 2, "team-b": 1}, "half_life_s": 5}})
    fairness = slo.admission.fairness
    assert isinstance(fairness, ClassFairShare) and slo.ranking.fairness is fairness
    assert fairness.weights == {"team-a": 2.0, "team-b": 1.0} and fairness.half_life_s == 5.0
    equal = pipeline({"fairness": True}).admission.fairness
    assert equal.weights == {} and equal.weight("anyone") == 1.0


def test_without_a_declaration_a_class_is_first_come_first_served():
    for slo in ({}, {"fairness": False}):
        built = pipeline(slo)
        assert built.admission.fairness is None and built.ranking.fairness is None


@pytest.mark.parametrize(("fairness", "message"), [
    ({"weights": {"team-a": -1}}, r"slo\.fairness\.weights\.team-a must be a positive number"),
    ({"weights": {"team-a": True}}, r"slo\.fairness\.weights\.team-a must be a positive"),
    ({"weights": {"team-a": "2"}}, r"slo\.fairness\.weights\.team-a must be a positive"),
    ({"weights": [1, 2]}, r"slo\.fairness\.weights must be a mapping"),
    ({"half_life_s": 0}, r"slo\.fairness\.half_life_s must be a positive number of seconds"),
    ({"share": 1}, r"slo\.fairness\.share is not a key: use weights, half_life_s"),
    ("on", r"slo\.fairness must be a mapping"),
])
def test_errors_name_the_field(fairness, message):
    with pytest.raises(PipelineConfigError, match=message):
        SLOSpec.parse({"fairness": fairness})
