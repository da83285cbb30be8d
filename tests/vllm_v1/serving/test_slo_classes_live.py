"""SLO classes over HTTP on a live server running the ``slo`` preset with tenants bound to
API keys: an undeclared class is 400, a class beyond the tenant's allowed classes 403 (on
every route shape that carries one), and an allowed class is served."""

import json
from types import SimpleNamespace

import pytest

from integrations.vllm_v1 import Pipeline, serve
from integrations.vllm_v1.config.spec import CONFIG_KEY
from tests.helpers.http import free_port
from tests.helpers.serving_client import model_name, send

pytestmark = pytest.mark.engine

GOLD_KEY, BRONZE_KEY = "gold-7c1e93", "bronze-2a64d0"
SLO = {"classes": {"chat": {"ttft_s": 60.0, "tpot_s": 5.0},  # loose: a CPU engine meets them
                   "rag": {"ttft_s": 120.0, "tpot_s": 5.0},
                   "batch": {"ttft_s": 600.0, "tpot_s": 10.0}},
       "tenants": {"gold": "chat", "bronze": "batch"},
       "by_prompt_tokens": [[4095, "chat"], [None, "rag"]],
       "protected": ["chat"]}
UNDECLARED = "vllm_xargs.slo_class 'chta' is not declared: use one of ['batch', 'chat', 'rag']"


@pytest.fixture(scope="module")
def server(random_model_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("slo_classes")
    for name, key in (("gold", GOLD_KEY), ("bronze", BRONZE_KEY)):
        (folder / f"{name}.key").write_text(key)
    tenants = {name: {"api_key_file": str(folder / f"{name}.key")} for name in ("gold", "bronze")}
    entry = {CONFIG_KEY: {"pipeline": "slo", "slo": SLO, "tenants": tenants}}
    args = ("--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
            "--block-size", "32", "--kv-cache-memory-bytes", str(64 << 20),
            "--enable-scale-out", "--additional-config", json.dumps(entry))
    with serve(Pipeline(), random_model_dir, port=free_port(), vllm_args=args,
               log_path=str(folder / "server.log")) as handle:
        handle.wait_until_healthy(timeout_s=400)
        yield SimpleNamespace(url=handle.url, model=model_name(handle.url))


def complete(server, slo_class=None, key=None, path="/v1/completions"):
    body = {"model": server.model, "max_tokens": 2}
    xargs = {} if slo_class is None else {"slo_class": slo_class}
    if path == "/inference/v1/generate":
        body = {"model": server.model, "token_ids": [1, 2, 3],
                "sampling_params": {"max_tokens": 2, "extra_args": xargs}}
    elif path == "/v1/chat/completions":
        body.update(messages=[{"role": "user", "content": "Hi"}], vllm_xargs=xargs)
    else:
        body.update(prompt="Hi", vllm_xargs=xargs)
    headers = [("Authorization", f"Bearer {key}")] if key else []
    return send(server.url, path, body, headers)


def test_class_errors_and_allowed_classes_on_a_live_slo_server(server):
    for path in ("/v1/completions", "/v1/chat/completions", "/inference/v1/generate"):
        reply = complete(server, "chta", GOLD_KEY, path)
        assert reply.status == 400, (path, reply.text)
        assert reply.json == {"error": {"message": UNDECLARED, "type": "BadRequestError",
                                        "param": None, "code": 400}}
        reply = complete(server, "chat", BRONZE_KEY, path)
        assert reply.status == 403, (path, reply.text)
        assert reply.json == {"error": {
            "message": "vllm_xargs.slo_class 'chat' is not allowed for tenant 'bronze' of its "
                       "API key (allowed: ['batch'])",
            "type": "PermissionDeniedError", "param": None, "code": 403}}
    reply = complete(server, "chat")  # no credential: no protected class
    assert reply.status == 403 and reply.message == (
        "vllm_xargs.slo_class 'chat' is not allowed for tenant 'default' of a request without "
        "a credential (allowed: ['batch', 'rag'])")
    reply = complete(server, "rag", BRONZE_KEY)  # tighter than bronze's own class
    assert reply.status == 403 and reply.message.endswith("(allowed: ['batch'])")
    for slo_class, key in (("chat", GOLD_KEY), ("rag", GOLD_KEY), ("batch", BRONZE_KEY),
                           ("rag", None), (None, None)):
        reply = complete(server, slo_class, key)
        assert reply.status == 200, (slo_class, key, reply.text)
        assert reply.json["usage"]["completion_tokens"] == 2
