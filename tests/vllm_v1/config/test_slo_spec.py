"""The ``slo`` preset's declaration: named in plain vLLM config, validated field by field."""

from __future__ import annotations

import attrs
import pytest

from integrations.vllm_v1.config.declarative import PipelineConfigError
from integrations.vllm_v1.config.slo import DEFAULT_CLASSES, SLOSlots, SLOSpec, slo_slots
from integrations.vllm_v1.config.spec import pipeline_from_additional_config
from policies import (
    ClassFairShare,
    OnlineStepTimeModel,
    PrefillLedger,
    RequestView,
    SLOAdmission,
    StepTimeModel,
    TokenCaps,
)


def pipeline(slo=None, name="slo"):
    entry = {"pipeline": name} if slo is None else {"pipeline": name, "slo": slo}
    return pipeline_from_additional_config({"llm_serving_policies": entry})


def test_the_preset_shares_one_learned_step_model_between_its_slot_and_its_admission():
    slo = pipeline()
    assert isinstance(slo.step_model, OnlineStepTimeModel)
    assert isinstance(slo.admission, SLOAdmission)
    assert slo.admission.step_model is slo.step_model
    assert slo.admission.ledger in slo.rate.policies
    assert dict(slo.admission.slos) == dict(DEFAULT_CLASSES)


def test_a_declaration_reaches_admission_and_ranking():
    slo = pipeline({"classes": {"chat": {"ttft_s": 0.5, "tpot_s": 0.05},
                                "batch": {"ttft_s": 20, "tpot_s": 0.2}},
                    "tenants": {"acme": "batch"}, "by_prompt_tokens": [[1000, "chat"],
                                                                      [None, "batch"]],
                    "protected": ["chat"], "demotions": {"chat": "batch"},
                    "protected_priorities": {"-1": 0.05},
                    "min_prefill_tokens_per_step": 256,
                    "step_model_prior": {"base_s": 0.005, "decode_s_per_seq": 0.0,
                                         "prefill_s_per_token": 3e-5}})
    admission = slo.admission
    assert admission.protected_classes == {"chat"} and admission.demotions == {"chat": "batch"}
    assert admission.protected_tpot_s == {-1: pytest.approx(0.8 * 0.05)}  # with the margin
    assert admission.max_prefill_tokens_per_step == 256 and admission.tpot_step_bound
    assert slo.step_model.model == StepTimeModel(base_s=0.005, decode_s_per_seq=0.0,
                                                 prefill_s_per_token=3e-5)
    short = RequestView(request_id="a", arrival_s=0.0, prompt_tokens=100)
    assert admission.target_class(short) == "batch", "protected: not for anonymous requests"
    assert slo.ranking.rank_key(short) == 20.0
    acme = RequestView(request_id="b", arrival_s=0.0, prompt_tokens=100, tenant="acme")
    assert admission.target_class(acme) == "batch" and slo.ranking.rank_key(acme) == 20.0


@pytest.mark.parametrize(("slo", "message"), [
    ([1], "llm_serving_policies.slo must be a mapping, got list"),
    ({"clases": {}}, "llm_serving_policies.slo.clases is not a key"),
    ({"classes": {}}, "llm_serving_policies.slo.classes declares no class"),
    ({"classes": {"a": {"ttft_s": "1", "tpot_s": 1}}},
     "llm_serving_policies.slo.classes.a.ttft_s must be a positive number of seconds, got '1'"),
    ({"classes": {"a": {"ttft_s": 1}}}, "llm_serving_policies.slo.classes.a.tpot_s is missing"),
    ({"classes": {"a": {"ttft_s": 1, "tpot_s": 1, "p99": 1}}},
     r"classes.a has unknown keys \['p99'\]"),
    ({"tenants": {"acme": "platinum"}},
     "llm_serving_policies.slo.tenants.acme names class 'platinum', which is not declared"),
    ({"by_prompt_tokens": [[0, "short"]]}, r"by_prompt_tokens\[0\]\[0\] must be a positive"),
    ({"by_prompt_tokens": [512]}, r"by_prompt_tokens\[0\] must be a \[max prompt tokens"),
    ({"protected": "gold"}, "protected must be a list of class names"),
    ({"protected": ["nope"]}, r"protected\[0\] names class 'nope'"),
    ({"demotions": {"gold": "nope"}}, "demotions.gold names class 'nope'"),
    ({"protected_priorities": {"gold": 0.05}},
     "protected_priorities.gold must name an integer priority"),
    ({"protected_priorities": {"-1": 0}}, "protected_priorities.-1 must be a positive number"),
    ({"min_prefill_tokens_per_step": 0}, "min_prefill_tokens_per_step must be a positive"),
    ({"step_model_prior": {"base_s": 1}}, "step_model_prior is not a StepTimeModel"),
    ({"preemption": "yes"}, "llm_serving_policies.slo.preemption must be a mapping"),
    ({"preemption": {"risk": 1}}, "llm_serving_policies.slo.preemption.risk is not a key"),
    ({"preemption": {"risk_share": 1.5}}, r"preemption.risk_share must be a number in \[0, 1\]"),
    ({"preemption": {"max_per_request": 0}}, "preemption.max_per_request must be a positive"),
    ({"allowed_classes": ["gold"]}, "llm_serving_policies.slo.allowed_classes must be a mapping"),
    ({"allowed_classes": {"acme": "gold"}}, "allowed_classes.acme must be a list of class names"),
    ({"allowed_classes": {"acme": ["gold", "platinum"]}},
     r"allowed_classes.acme\[1\] names class 'platinum', which is not declared"),
])
def test_every_mistake_names_its_field(slo, message):
    with pytest.raises(PipelineConfigError, match=message):
        pipeline(slo)


def test_only_the_slo_preset_reads_a_declaration():
    with pytest.raises(PipelineConfigError, match="read by the slo preset only, not by 'default'"):
        pipeline({}, name="default")
    assert SLOSpec.parse(None) == SLOSpec()


def test_slot_preemption_is_off_unless_declared():
    assert pipeline().preemption is None
    on = pipeline({"protected": ["gold"], "preemption": {"risk_share": 0.25,
                                                          "max_per_request": 2}})
    assert (on.preemption.risk_share, on.preemption.max_preemptions_per_request) == (0.25, 2)
    assert on.preemption.protected_classes == {"gold"}
    assert pipeline({"preemption": True}).preemption.risk_share == 0.5


CLASSES = {"chat": {"ttft_s": 0.5, "tpot_s": 0.05}, "rag": {"ttft_s": 2.0, "tpot_s": 0.05},
           "batch": {"ttft_s": 20.0, "tpot_s": 0.2}}


def test_a_tenant_may_claim_its_own_class_and_looser_ones_and_others_no_protected_class():
    spec = SLOSpec.parse({"classes": CLASSES, "tenants": {"acme": "rag"},
                          "protected": ["chat"]})
    assert spec.allowed_classes("acme") == {"rag", "batch"}
    assert spec.allowed_classes(None) == spec.allowed_classes("walk-in") == {"rag", "batch"}
    declared = SLOSpec.parse({"classes": CLASSES, "tenants": {"acme": "rag"},
                              "allowed_classes": {"acme": ["chat", "rag"], "*": ["batch"]}})
    assert declared.allowed_classes("acme") == {"chat", "rag"}
    assert declared.allowed_classes(None) == {"batch"}


def test_anonymous_short_prompts_get_no_protected_class_by_length():
    slo = pipeline({"classes": CLASSES, "by_prompt_tokens": [[4095, "chat"], [None, "rag"]],
                    "protected": ["chat"], "allowed_classes": {"team-a": ["chat", "rag"]}})
    short = {"request_id": "a", "arrival_s": 0.0, "prompt_tokens": 100}
    anonymous = RequestView(**short)
    granted = RequestView(**short, tenant="team-a")
    assert slo.admission.target_class(anonymous) == "rag"
    assert slo.ranking.rank_key(anonymous) == 2.0
    assert slo.admission.target_class(granted) == "chat"
    assert slo.ranking.rank_key(granted) == 0.5


def test_the_slots_share_the_ledger_step_model_and_fairness_by_construction():
    slots = slo_slots(SLOSpec.parse({"fairness": True}))
    assert any(policy is slots.admission.ledger for policy in slots.rate.policies)
    assert slots.step_model is slots.admission.step_model
    assert slots.ranking.fairness is slots.admission.fairness is not None
    built = pipeline({"fairness": True})
    assert built.step_model is built.admission.step_model
    assert any(policy is built.admission.ledger for policy in built.rate.policies)


@pytest.mark.parametrize(("change", "message"), [
    (lambda s: {"rate": TokenCaps(policies=(PrefillLedger(),))},
     "rate must hold the admission's PrefillLedger"),
    (lambda s: {"step_model": OnlineStepTimeModel()},
     "step_model must be the admission's step model"),
    (lambda s: {"ranking": attrs.evolve(s.ranking, fairness=ClassFairShare())},
     "ranking.fairness must be the admission's ClassFairShare"),
])
def test_slots_that_do_not_share_are_an_error_naming_the_slot(change, message):
    slots = slo_slots()
    with pytest.raises(PipelineConfigError, match=message):
        SLOSlots(**{**slots.pipeline_slots(), **change(slots)})
