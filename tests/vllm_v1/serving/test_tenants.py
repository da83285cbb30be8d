"""Tenants bound to credentials (`TenantBinding`): keys, limits, gateway, config errors."""

import hashlib
import hmac

import pytest

from integrations.vllm_v1.config.declarative import PipelineConfigError
from integrations.vllm_v1.serving import tenants as tenants_module
from integrations.vllm_v1.serving.tenants import Identity, Refusal, TenantBinding, sign_tenant

GOLD_KEY, BRONZE_KEY, PARTNER_KEY = "gold-secret-1", "bronze-secret-2", "partner-secret-3"


@pytest.fixture
def binding(tmp_path):
    key_file = tmp_path / "bronze.key"
    key_file.write_text(BRONZE_KEY + "\n")
    return TenantBinding.from_entry({"tenants": {
        "gold": {"api_key_env": "GOLD_KEY", "min_priority": -20},
        "bronze": {"api_key_file": str(key_file), "min_priority": 0,
                   "slo_classes": ["batch"]},
        "partner": {"api_key_sha256": hashlib.sha256(PARTNER_KEY.encode()).hexdigest()},
        "default": {"min_priority": 5},
    }}, environ={"GOLD_KEY": GOLD_KEY})


def bearer(key):
    return [(b"authorization", f"Bearer {key}".encode())]


def test_each_key_names_its_tenant_from_env_file_or_digest(binding):
    assert binding.identify(bearer(GOLD_KEY), None, 0).tenant == "gold"
    assert binding.identify(bearer(BRONZE_KEY), None, 0).tenant == "bronze"
    assert binding.identify(bearer(PARTNER_KEY), None, 0).tenant == "partner"


def test_no_key_is_the_default_tenant_and_a_wrong_key_is_401(binding):
    anonymous = binding.identify([], None, 0)
    assert isinstance(anonymous, Identity) and anonymous.tenant == "default"
    assert binding.identify(bearer("guess"), None, 0) == Refusal(401, "the API key matches "
                                                                      "no tenant")
    assert binding.identify([(b"authorization", b"Basic abc")], None, 0).status == 401
    strict = TenantBinding.from_entry({"tenants": {}, "require_credential": True})
    assert strict.identify([], None, 0).status == 401


def test_a_bronze_key_claiming_gold_is_refused_and_limits_hold(binding):
    bronze = binding.identify(bearer(BRONZE_KEY), None, 0)
    refusal = binding.authorize(bronze, "gold", 0, None)
    assert refusal.status == 403
    assert "'gold' does not match the tenant 'bronze' of its API key" in refusal.message
    assert binding.authorize(bronze, "bronze", 0, "batch") is None
    assert binding.authorize(bronze, None, 0, None) is None
    assert "more urgent than tenant 'bronze' may ask for (min_priority 0)" in binding.authorize(
        bronze, None, -1, None).message
    assert "slo_class 'gold' is not allowed" in binding.authorize(bronze, None, 0, "gold").message
    anonymous = binding.identify([], None, 0)
    assert binding.authorize(anonymous, "gold", 5, None).status == 403
    assert binding.authorize(anonymous, None, 4, None).status == 403  # "default" limits
    gold = binding.identify(bearer(GOLD_KEY), None, 0)
    assert binding.authorize(gold, "gold", -20, "anything") is None


def test_every_tenant_digest_is_compared_in_constant_time(binding, monkeypatch):
    calls = []
    real = hmac.compare_digest

    def counting(a, b):
        calls.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(tenants_module.hmac, "compare_digest", counting)
    assert binding.identify(bearer(GOLD_KEY), None, 0).tenant == "gold"  # the first tenant
    assert calls == [(32, 32)] * 3  # gold, bronze and partner: no early exit, digests only
    calls.clear()
    assert binding.identify(bearer("x" * 1000), None, 0).status == 401
    assert calls == [(32, 32)] * 3  # a long guess is hashed first: same work, same sizes


def test_gateway_header_counts_only_when_signed_and_current():
    key = b"gateway-key"
    binding = TenantBinding.from_entry({"gateway": {"hmac_key_env": "GW"},
                                        "tenants": {"gold": {"min_priority": -5}}},
                                       environ={"GW": key.decode()})
    now = 1_000_000

    def headers(tenant, signature):
        return [(b"x-llm-tenant", tenant.encode()),
                (b"x-llm-tenant-signature", signature.encode())]

    good = binding.identify(headers("gold", sign_tenant("gold", key, now)), "10.0.0.9", now + 5)
    assert good.tenant == "gold" and good.grant.min_priority == -5
    assert binding.identify(headers("gold", sign_tenant("bronze", key, now)), None,
                            now).status == 401  # signed for another tenant
    assert binding.identify(headers("gold", sign_tenant("gold", b"other", now)), None,
                            now).status == 401
    assert binding.identify(headers("gold", sign_tenant("gold", key, now)), None,
                            now + 301).status == 401  # replayed too late
    assert binding.identify([(b"x-llm-tenant", b"gold")], None, now).status == 401
    assert binding.identify(bearer(GOLD_KEY), None, now).tenant == "default"  # keys ignored
    claimed = binding.authorize(binding.identify([], None, now), "gold", 0, None)
    assert claimed.status == 403


def test_gateway_by_trusted_source():
    binding = TenantBinding.from_entry({"gateway": {"trusted_sources": ["10.0.0.0/8"],
                                                    "tenant_header": "X-Team"}})
    header = [(b"x-team", b"silver")]
    assert binding.identify(header, "10.1.2.3", 0).tenant == "silver"
    assert binding.identify(header, "192.168.0.1", 0).status == 401
    assert binding.identify(header, None, 0).status == 401
    assert binding.identify(header + header, "10.1.2.3", 0).status == 401


@pytest.mark.parametrize(("entry", "message"), [
    ({"tenants": {"gold": {"api_key_env": "MISSING"}}}, "environment variable MISSING is not set"),
    ({"tenants": {"gold": {"api_key_file": "/nonexistent"}}}, "file not found: /nonexistent"),
    ({"tenants": {"gold": {"api_key_sha256": "abc"}}}, "must be 64 hex digits"),
    ({"tenants": {"gold": {"api_key": "literal"}}}, "unknown field(s) ['api_key']"),
    ({"tenants": {"gold": {"api_key_env": "A", "api_key_file": "/x"}}}, "give one of"),
    ({"tenants": {"gold": {"min_priority": 99}}}, "tenants.gold.min_priority: priority must be"),
    ({"tenants": {"gold": {"slo_classes": "batch"}}}, "must be a list of class names"),
    ({"tenants": {"bad name": {}}}, "must be a string of 1-128"),
    ({"tenants": {"a": {"api_key_env": "A"}, "b": {"api_key_env": "A"}}}, "share one API key"),
    ({"tenants": {"default": {"api_key_env": "A"}}}, "the anonymous tenant is the one without"),
    ({"gateway": {}}, "else any client could set the tenant"),
    ({"gateway": {"trusted_sources": ["not-an-ip"]}}, "gateway.trusted_sources"),
    ({"require_credential": "yes"}, "require_credential must be true or false"),
    ({"tenants": "/nonexistent.json"}, "tenants: file not found"),
])
def test_config_errors_name_the_field(entry, message):
    with pytest.raises(PipelineConfigError, match=None) as error:
        TenantBinding.from_entry(entry, environ={"A": "same"})
    assert message in str(error.value)
    assert "llm_serving_policies." in str(error.value)


def test_no_serving_keys_means_no_binding(tmp_path):
    assert TenantBinding.from_entry({"pipeline": "qos"}) is None
    path = tmp_path / "tenants.toml"
    path.write_text('[gold]\napi_key_sha256 = "' + "0" * 64 + '"\n')
    assert set(TenantBinding.from_entry({"tenants": str(path)}).grants) == {"gold"}
