"""SLO classes checked over HTTP with the ``slo`` preset: a class it does not declare is 400,
one beyond what the request's tenant may claim (``slo.allowed_classes``) is 403."""

import hashlib

import pytest

from integrations.vllm_v1.config.declarative import PipelineConfigError
from integrations.vllm_v1.config.presets import preset
from integrations.vllm_v1.config.slo import SLOSpec, slo_pipeline
from integrations.vllm_v1.config.spec import CONFIG_KEY, served_slo, to_additional_config
from integrations.vllm_v1.serving.http_validation import check_request
from integrations.vllm_v1.serving.routes import EngineRoute
from integrations.vllm_v1.serving.tenants import TenantBinding
from tests.vllm_v1.serving.test_middleware import call, stand_in

GOLD_KEY, BRONZE_KEY = "gold-key-1", "bronze-key-2"
SLO = {"classes": {"chat": {"ttft_s": 0.5, "tpot_s": 0.05},
                   "rag": {"ttft_s": 2.0, "tpot_s": 0.05},
                   "batch": {"ttft_s": 20.0, "tpot_s": 0.2}},
       "tenants": {"gold": "chat", "bronze": "batch"},
       "by_prompt_tokens": [[4095, "chat"], [None, "rag"]],
       "protected": ["chat"]}
TENANTS = {"gold": {"api_key_sha256": hashlib.sha256(GOLD_KEY.encode()).hexdigest()},
           "bronze": {"api_key_sha256": hashlib.sha256(BRONZE_KEY.encode()).hexdigest()}}
ENTRY = {"pipeline": "slo", "slo": SLO}
COMPLETIONS = EngineRoute(path="/v1/completions", reads_priority=True, reads_xargs=True)


def bearer(key):
    return [(b"authorization", f"Bearer {key}".encode())] if key else []


def checked(slo_class, key=None, *, entry=ENTRY, tenants=TENANTS, **xargs):
    """(status, message) of one completion naming ``slo_class`` with ``key`` (or none)."""
    entry = {**entry, "tenants": tenants} if tenants is not None else entry
    slo = served_slo(entry)
    binding = TenantBinding.from_entry(entry, slo=slo)
    result = check_request({"prompt": "Hi", "vllm_xargs": {"slo_class": slo_class, **xargs}},
                           bearer(key), COMPLETIONS, binding=binding, slo=slo)
    return result.status, result.message


@pytest.mark.parametrize("tenants", [TENANTS, None])
def test_a_class_the_preset_does_not_declare_is_400_listing_the_declared(tenants):
    assert checked("chta", GOLD_KEY if tenants else None, tenants=tenants) == (
        400, "vllm_xargs.slo_class 'chta' is not declared: use one of ['batch', 'chat', 'rag']")
    assert checked("chat", GOLD_KEY if tenants else None, tenants=tenants,
                   tenant="gold") == (0, "")


def test_a_pipeline_built_in_python_serves_the_declaration_it_carries():
    pipeline = slo_pipeline(SLOSpec.parse(SLO))
    entry = to_additional_config(pipeline)[CONFIG_KEY]  # how serve() hands it to the server
    assert served_slo(entry) == SLOSpec.parse(SLO)
    assert checked("chta", entry=entry, tenants=None)[0] == 400
    assert checked("chat", entry=entry, tenants=None)[0] == 403  # protected, anonymous
    assert checked("rag", entry=entry, tenants=None) == (0, "")
    assert served_slo(to_additional_config(preset("default"))[CONFIG_KEY]) is None


def test_without_the_slo_preset_class_names_are_not_checked_here():
    entry = {"pipeline": "default"}
    assert served_slo(entry) is None
    assert checked("chta", entry=entry, tenants=None) == (0, "")


def test_a_tenant_claims_its_class_and_looser_ones_only():
    assert checked("chat", GOLD_KEY) == (0, "")
    assert checked("batch", GOLD_KEY) == (0, "")
    assert checked("batch", BRONZE_KEY) == (0, "")
    assert checked("rag", BRONZE_KEY) == (
        403, "vllm_xargs.slo_class 'rag' is not allowed for tenant 'bronze' of its API key "
             "(allowed: ['batch'])")
    assert checked("chat", BRONZE_KEY)[0] == 403


def test_a_request_without_a_credential_gets_no_protected_class():
    assert checked("rag") == (0, "")  # the tenants' safe default gives way to the preset's
    assert checked("chat") == (
        403, "vllm_xargs.slo_class 'chat' is not allowed for tenant 'default' of a request "
             "without a credential (allowed: ['batch', 'rag'])")


def test_without_credentials_the_named_tenant_is_checked_as_the_engine_takes_it():
    assert checked("chat", tenants=None, tenant="gold") == (0, "")
    assert checked("chat", tenants=None, tenant="bronze")[0] == 403
    assert checked("chat", tenants=None) == (
        403, "vllm_xargs.slo_class 'chat' is not allowed for a request without a tenant "
             "(allowed: ['batch', 'rag'])")
    assert checked("rag", tenants=None) == (0, "")


def test_declared_allowed_classes_decide_and_the_tenants_own_limit_narrows_them():
    entry = {**ENTRY, "slo": {**SLO, "allowed_classes": {"bronze": ["rag", "batch"],
                                                         "*": ["batch"]}}}
    assert checked("rag", BRONZE_KEY, entry=entry) == (0, "")
    assert checked("rag", entry=entry)[1].endswith("(allowed: ['batch'])")
    assert checked("chat", entry=entry, tenants=None, tenant="acme")[1] == (
        "vllm_xargs.slo_class 'chat' is not allowed for tenant 'acme' (allowed: ['batch'])")
    narrowed = {**TENANTS, "bronze": {**TENANTS["bronze"], "slo_classes": ["batch", "chat"]}}
    assert checked("rag", BRONZE_KEY, entry=entry, tenants=narrowed)[1].endswith(
        "(allowed: ['batch'])")  # both limits hold: the message names what is left
    granted = {**TENANTS, "default": {"slo_classes": ["chat", "rag"]}}
    assert checked("rag", entry=entry, tenants=granted)[1].endswith("(allowed: [])")


def test_without_the_slo_preset_the_anonymous_safe_default_still_names_no_class():
    assert checked("batch", entry={"pipeline": "default"})[1] == (
        "vllm_xargs.slo_class 'batch' is not allowed for tenant 'default' of a request "
        "without a credential (allowed: [])")


def test_class_errors_over_http_use_each_routes_error_format_and_never_reach_the_app():
    app, received = stand_in({**ENTRY, "tenants": TENANTS})
    reply = call(app, "/v1/completions", {"prompt": "x", "vllm_xargs": {"slo_class": "chta"}})
    assert reply.status_code == 400 and "retry-after" not in reply.headers
    assert reply.json() == {"error": {
        "message": "vllm_xargs.slo_class 'chta' is not declared: use one of "
                   "['batch', 'chat', 'rag']",
        "type": "BadRequestError", "param": None, "code": 400}}
    reply = call(app, "/v1/completions", {"prompt": "x", "vllm_xargs": {"slo_class": "chat"}},
                 {"authorization": f"Bearer {BRONZE_KEY}"})
    assert reply.status_code == 403 and "retry-after" not in reply.headers
    assert reply.json() == {"error": {
        "message": "vllm_xargs.slo_class 'chat' is not allowed for tenant 'bronze' of its API "
                   "key (allowed: ['batch'])",
        "type": "PermissionDeniedError", "param": None, "code": 403}}
    reply = call(app, "/v1/messages", {"messages": [], "vllm_xargs": {"slo_class": "chat"}})
    assert reply.status_code == 403
    assert reply.json()["type"] == "error"
    assert reply.json()["error"]["type"] == "permission_error"
    assert received == []
    reply = call(app, "/v1/completions", {"prompt": "x", "vllm_xargs": {"slo_class": "chat"}},
                 {"authorization": f"Bearer {GOLD_KEY}"})
    assert reply.status_code == 200
    assert received[-1]["vllm_xargs"]["slo_class"] == "chat"


def test_a_bad_slo_declaration_fails_the_middleware_setup():
    app, _ = stand_in({"pipeline": "slo", "slo": {"allowed_classes": {"*": ["gold", "x"]}}})
    with pytest.raises(PipelineConfigError, match=r"allowed_classes\.\*\[1\] names class 'x'"):
        call(app, "/v1/completions", {"prompt": "x"})
