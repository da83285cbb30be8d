"""A value of the wrong type in a declarative pipeline is named by its full field path, for
every field of every policy class, whatever the field's annotation (plain, optional, mapping,
list, pairs, another policy); values of the right shape still build."""

import attrs
import pytest

import policies
from integrations.vllm_v1.config.declarative import PipelineConfigError, build_pipeline
from integrations.vllm_v1.config.field_types import type_problem

WHERE = "llm_serving_policies.pipeline"
WRONG = ["ten", {"x": 1}, [1, "a"], 3.5]
"""A string, a mapping, a mixed list and a float: each is the wrong type for most fields."""


def policy_classes():
    """Every attrs class `policies` exports that builds without arguments."""
    for name in policies.__all__:
        cls = getattr(policies, name)
        if isinstance(cls, type) and attrs.has(cls) and all(
                f.default is not attrs.NOTHING for f in attrs.fields(cls) if f.init):
            yield name, cls


def builds(cls, **arguments):
    """Whether the class itself accepts ``arguments``."""
    try:
        cls(**arguments)
    except Exception:  # noqa: BLE001 - any refusal
        return False
    return True


@pytest.mark.parametrize(("name", "cls"), list(policy_classes()))
def test_a_wrong_type_for_any_field_names_the_field(name, cls):
    """Each field, given each wrong value, in the ``ranking`` slot: an error names the field,
    unless the class took the value and only the slot refused the policy."""
    for field in (f for f in attrs.fields(cls) if f.init):
        for value in WRONG:
            try:
                build_pipeline({"ranking": {"class": name, field.name: value}}, where=WHERE)
            except PipelineConfigError as error:
                message = str(error)
                assert message.startswith(f"{WHERE}.ranking"), message
                assert field.name in message or builds(cls, **{field.name: value}), (
                    field.name, value, message)


@pytest.mark.parametrize(("slot", "spec", "message"), [
    ("admission", {"class": "QueueDepthLimit", "max_waiting": "ten"},
     "admission.max_waiting must be an integer, got 'ten'"),
    ("fairness", {"class": "WFQ", "weights": "gold"},
     "fairness.weights must be a mapping of strings to numbers, got 'gold'"),
    ("fairness", {"class": "WFQ", "weights": {"gold": "4"}},
     "fairness.weights must be a mapping of strings to numbers, got {'gold': '4'}"),
    ("ranking", {"class": "QoSRanker", "length_thresholds_tokens": [1, "a"]},
     "ranking.length_thresholds_tokens must be a list of integers, got [1, 'a']"),
    ("ranking", {"class": "MLFQ", "quanta_tokens": 3.5},
     "ranking.quanta_tokens must be a list of numbers, got 3.5"),
    ("eviction", {"class": "DuelingSLRU", "session_pins": {"judged": False}},
     "eviction.session_pins must be a SessionPins (a mapping with 'class') or null, got "
     "{'judged': False}"),
    ("eviction", {"class": "DuelingSLRU",
                  "session_pins": {"class": "SessionPins", "tenant_weights": "acme"}},
     "eviction.session_pins.tenant_weights must be a list of pairs [a string, a number], "
     "got 'acme'"),
])
def test_the_message_says_what_the_field_must_be(slot, spec, message):
    with pytest.raises(PipelineConfigError) as error:
        build_pipeline({slot: spec}, where=WHERE)
    assert str(error.value) == f"{WHERE}.{message}"


@pytest.mark.parametrize("spec", [
    {"class": "WFQ", "weights": {"gold": 4, "bronze": 1.5}},
    {"class": "DuelingSLRU", "session_pins": {"class": "SessionPins",
                                              "tenant_weights": {"acme": 2}}},
    {"class": "DuelingSLRU", "session_pins": {"class": "SessionPins",
                                              "tenant_weights": [["acme", 2]]}},
    {"class": "DuelingSLRU", "session_pins": None},
    {"class": "QoSRanker", "length_thresholds_tokens": [512, 4096],
     "length_penalties_s": [0, 1, 5]},
    {"class": "AdmissionController", "max_waiting": 8, "rng": 0},
])
def test_values_of_the_right_shape_build(spec):
    slot = {"WFQ": "fairness", "DuelingSLRU": "eviction", "QoSRanker": "ranking",
            "AdmissionController": "admission"}[spec["class"]]
    assert type(getattr(build_pipeline({slot: spec}), slot)).__name__ == spec["class"]


def test_an_annotation_the_checker_does_not_know_accepts_anything():
    assert type_problem("Hashable", object()) is None
    assert type_problem("random.Random", 0) is None
    assert type_problem("RankingPolicy | None", "anything") is None
    assert type_problem("float | None", None) is None
    assert type_problem("float | None", "x") == "a number or null"
