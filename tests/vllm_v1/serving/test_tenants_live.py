"""Tenants bound to credentials on a live server: the scheduler sees the key's tenant, never a
claimed one (the probe admission echoes the tenant and priority the scheduler saw)."""

import json
from types import SimpleNamespace

import pytest

from integrations.vllm_v1 import Pipeline, serve
from integrations.vllm_v1.config.spec import CONFIG_KEY
from tests.helpers.http import free_port
from tests.helpers.probe_admission import ProbeAdmission
from tests.helpers.serving_client import model_name, send

pytestmark = pytest.mark.engine

GOLD_KEY, BRONZE_KEY = "gold-0f9c2a7e", "bronze-5b1d8e33"


@pytest.fixture(scope="module")
def server(random_model_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tenants")
    (folder / "gold.key").write_text(GOLD_KEY)
    (folder / "bronze.key").write_text(BRONZE_KEY)
    tenants = {"gold": {"api_key_file": str(folder / "gold.key"), "min_priority": -20},
               "bronze": {"api_key_file": str(folder / "bronze.key"), "min_priority": 0,
                          "slo_classes": ["drop", "batch"]},
               "default": {"min_priority": 0, "slo_classes": ["drop"]}}  # the probe's class
    (folder / "tenants.json").write_text(json.dumps(tenants))
    entry = {CONFIG_KEY: {"tenants": str(folder / "tenants.json")}}  # keys never on argv
    args = ("--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
            "--block-size", "32", "--kv-cache-memory-bytes", str(64 << 20),
            "--enable-scale-out", "--additional-config", json.dumps(entry))
    with serve(Pipeline(admission=ProbeAdmission()), random_model_dir, port=free_port(),
               vllm_args=args, log_path=str(folder / "server.log")) as handle:
        handle.wait_until_healthy(timeout_s=400)
        yield SimpleNamespace(url=handle.url, model=model_name(handle.url))


def seen(server, key=None, path="/v1/completions", stream=False, priority=None, **xargs):
    """The reply to a request of class ``drop``: the probe rejects it, echoing what it saw."""
    body = {"model": server.model, "max_tokens": 2, "stream": stream,
            "vllm_xargs": {"slo_class": "drop", **xargs}}
    body.update({"prompt": "Hi"} if path == "/v1/completions" else {"input": "Hi"})
    headers = [("Authorization", f"Bearer {key}")] if key else []
    if priority is not None:
        headers.append(("X-Vllm-Priority", str(priority)))
    return send(server.url, path, body, headers)


def test_a_bronze_key_claiming_gold_is_not_served_as_gold(server):
    reply = seen(server, BRONZE_KEY, tenant="gold")
    assert reply.status == 403, reply.text
    assert reply.message == ("vllm_xargs.tenant 'gold' does not match the tenant 'bronze' of "
                             "its API key")
    reply = seen(server, BRONZE_KEY)  # no claim: served as the key's tenant
    assert reply.status == 503 and "tenant=bronze priority=0" in reply.message


@pytest.mark.parametrize("stream", [False, True])
def test_the_key_names_the_tenant_the_scheduler_sees_on_every_route(server, stream):
    for path in ("/v1/completions", "/v1/responses"):
        reply = seen(server, GOLD_KEY, path, stream, priority=-10)
        assert reply.status == 503, reply.text
        assert "early_drop: tenant=gold priority=-10" in reply.message


def test_no_key_is_the_default_tenant_and_cannot_claim_one(server):
    reply = seen(server)
    assert reply.status == 503 and "tenant=default priority=0" in reply.message
    reply = seen(server, tenant="gold")
    assert reply.status == 403
    assert "'gold' does not match the tenant 'default' of a request without a credential" in (
        reply.message)


def test_tenant_limits_and_unknown_keys(server):
    reply = seen(server, BRONZE_KEY, priority=-5)
    assert reply.status == 403 and "min_priority 0" in reply.message
    reply = seen(server, BRONZE_KEY, slo_class="gold")
    assert reply.status == 403 and "slo_class 'gold' is not allowed" in reply.message
    reply = seen(server, "not-a-key")
    assert reply.status == 401 and reply.message == "the API key matches no tenant"


def test_generate_route_is_the_keys_tenant_and_refuses_a_claim(server):
    body = {"model": server.model, "token_ids": [1, 2, 3],
            "sampling_params": {"max_tokens": 2, "extra_args": {"slo_class": "drop"}}}
    reply = send(server.url, "/inference/v1/generate", body,
                 [("Authorization", f"Bearer {BRONZE_KEY}")])
    assert reply.status == 503 and "tenant=bronze" in reply.message, reply.text
    body["sampling_params"]["extra_args"]["tenant"] = "gold"  # no key: a privilege escalation
    reply = send(server.url, "/inference/v1/generate", body)
    assert reply.status == 403 and "'gold' does not match" in reply.message, reply.text


def test_a_tenant_with_its_key_is_served(server):
    body = {"model": server.model, "prompt": "Hi", "max_tokens": 3}
    reply = send(server.url, "/v1/completions", body, [("Authorization", f"Bearer {GOLD_KEY}")])
    assert reply.status == 200, reply.text
    assert reply.json["usage"]["completion_tokens"] == 3
