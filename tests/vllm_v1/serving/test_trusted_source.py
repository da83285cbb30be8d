"""Tenant credentials a client cannot forge: the gateway's source comes from the socket (or
configured hops), signatures are single-use and bounded in time, and the request-handling edges
(repeated Authorization, non-ASCII keys, names with a newline, anonymous defaults)."""

import hashlib

import pytest
from uvicorn.config import Config
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from integrations.vllm_v1.config.declarative import PipelineConfigError
from integrations.vllm_v1.plugin import UVICORN_TRUSTED_PROXIES, register
from integrations.vllm_v1.serving.tenants import TenantBinding, sign_tenant

KEY = b"gateway-key"
NOW = 1_000_000


def gateway(**fields):
    return TenantBinding.from_entry({"gateway": {"hmac_key_env": "GW", **fields}},
                                    environ={"GW": KEY.decode()})


def signed(tenant, timestamp, *, key=KEY, extra=()):
    return [(b"x-llm-tenant", tenant.encode()),
            (b"x-llm-tenant-signature", sign_tenant(tenant, key, timestamp).encode()), *extra]


def test_a_forwarded_for_header_from_an_untrusted_peer_is_not_the_source():
    binding = gateway(trusted_sources=["10.0.0.1/32"])
    spoofed = signed("gold", NOW, extra=[(b"x-forwarded-for", b"10.0.0.1")])
    assert binding.identify(spoofed, "192.168.5.5", NOW).status == 401
    assert binding.identify(signed("gold", NOW + 1), "10.0.0.1", NOW).tenant == "gold"


def test_forwarded_for_counts_only_through_configured_hops():
    binding = gateway(trusted_sources=["10.0.0.1/32"], forwarded_allow_ips=["172.16.0.0/12"])
    via_hop = signed("gold", NOW, extra=[(b"x-forwarded-for", b"6.6.6.6, 10.0.0.1")])
    assert binding.identify(via_hop, "172.16.0.2", NOW).tenant == "gold"
    through_two = signed("gold", NOW + 1, extra=[(b"x-forwarded-for", b"10.0.0.1, 172.16.0.3")])
    assert binding.identify(through_two, "172.16.0.2", NOW).tenant == "gold"
    forged = signed("gold", NOW + 2, extra=[(b"x-forwarded-for", b"10.0.0.1, 6.6.6.6")])
    assert binding.identify(forged, "172.16.0.2", NOW).status == 401  # the hop saw 6.6.6.6


def test_uvicorn_behind_our_plugin_does_not_rewrite_the_peer_from_forwarded_for(monkeypatch):
    monkeypatch.delenv(UVICORN_TRUSTED_PROXIES, raising=False)
    register()
    seen = {}

    async def app(scope, receive, send):
        seen["client"] = scope["client"]

    import asyncio

    middleware = ProxyHeadersMiddleware(app, trusted_hosts=Config(app).forwarded_allow_ips)
    scope = {"type": "http", "client": ("127.0.0.1", 5000),
             "headers": [(b"x-forwarded-for", b"10.0.0.1")]}
    asyncio.run(middleware(scope, None, None))
    assert seen["client"] == ("127.0.0.1", 5000)


def test_a_signature_is_accepted_once():
    binding = gateway()
    headers = signed("gold", NOW)
    assert binding.identify(headers, None, NOW).tenant == "gold"
    assert binding.identify(headers, None, NOW + 1).status == 401  # replayed


def test_timestamps_ahead_are_bounded_and_stale_ones_refused():
    binding = gateway()
    assert binding.identify(signed("gold", NOW + 50), None, NOW).status == 401
    assert binding.identify(signed("gold", NOW + 4), None, NOW).tenant == "gold"
    assert binding.identify(signed("gold", NOW - 61), None, NOW).status == 401
    assert gateway(max_skew_s=600).identify(signed("gold", NOW - 500), None, NOW).tenant == "gold"
    with pytest.raises(PipelineConfigError, match="gateway.max_future_s must be a positive"):
        gateway(max_future_s=0)


def test_the_signature_hex_may_be_in_either_case():
    binding = gateway()
    header = sign_tenant("gold", KEY, NOW)
    upper = header.replace(header.rpartition("v1=")[2], header.rpartition("v1=")[2].upper())
    headers = [(b"x-llm-tenant", b"gold"), (b"x-llm-tenant-signature", upper.encode())]
    assert binding.identify(headers, None, NOW).tenant == "gold"
    assert binding.identify(signed("gold", NOW), None, NOW).status == 401  # same one, replayed


def test_two_authorization_headers_are_400():
    binding = TenantBinding.from_entry({"tenants": {"gold": {"api_key_env": "K"}}},
                                       environ={"K": "k1"})
    twice = [(b"authorization", b"Bearer k1"), (b"authorization", b"Bearer other")]
    refusal = binding.identify(twice, None, 0)
    assert refusal.status == 400 and "Authorization must be sent at most once" in refusal.message


def test_a_non_ascii_key_from_the_environment_matches_as_sent():
    key = "clé-secrète-ü"
    binding = TenantBinding.from_entry({"tenants": {"gold": {"api_key_env": "K"}}},
                                       environ={"K": key})
    headers = [(b"authorization", b"Bearer " + key.encode())]  # a client sends UTF-8
    assert binding.identify(headers, None, 0).tenant == "gold"
    by_digest = TenantBinding.from_entry({"tenants": {"gold": {
        "api_key_sha256": hashlib.sha256(key.encode()).hexdigest()}}})
    assert by_digest.identify(headers, None, 0).tenant == "gold"


def test_a_name_with_a_trailing_newline_is_not_a_tenant():
    with pytest.raises(PipelineConfigError, match="must be a string of 1-128"):
        TenantBinding.from_entry({"tenants": {"gold\n": {}}})
    binding = gateway()
    assert binding.identify(signed("gold\n", NOW), None, NOW).status == 401


def test_the_anonymous_tenant_gets_safe_limits_unless_configured():
    binding = TenantBinding.from_entry({"tenants": {"gold": {"api_key_env": "K"}}},
                                       environ={"K": "k1"})
    anonymous = binding.identify([], None, 0)
    assert "min_priority 0" in binding.authorize(anonymous, None, -20, None).message
    assert binding.authorize(anonymous, None, 0, "interactive").status == 403
    assert binding.authorize(anonymous, None, 0, None) is None
    configured = TenantBinding.from_entry({"tenants": {"default": {"min_priority": -5}}})
    anonymous = configured.identify([], None, 0)
    assert configured.authorize(anonymous, None, -5, "interactive") is None
