"""vLLM's OpenAI server with a pipeline, on loopback: metadata reaches the scheduler,
bad metadata gets HTTP 400 and the server keeps serving."""

import json
import urllib.request

import pytest

from integrations.vllm_v1 import Pipeline, serve
from policies import QoSRanker
from tests.integration.http_client import free_port, post, server_model
from tests.integration.policies_for_tests import EchoProbeAdmission

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def server(random_model_dir, tmp_path_factory):
    pipeline = Pipeline(ranking=QoSRanker(), admission=EchoProbeAdmission())
    log = tmp_path_factory.mktemp("server") / "server.log"
    args = ("--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
            "--block-size", "32", "--kv-cache-memory-bytes", str(64 << 20))
    with serve(pipeline, random_model_dir, port=free_port(), vllm_args=args,
               log_path=str(log)) as handle:
        handle.wait_until_healthy(timeout_s=400)
        yield handle


def completion(server, **fields):
    return post(server, "/v1/completions", {"model": server_model(server), "prompt": "Hello",
                                            "max_tokens": 4, **fields})


def test_priority_and_tenant_reach_the_scheduler_and_overload_is_503(server):
    status, body, headers = post(
        server, "/v1/completions",
        {"model": server_model(server), "prompt": "Hello", "max_tokens": 4, "priority": 3,
         "vllm_xargs": {"tenant": "acme", "slo_class": "echo"}}, with_headers=True)
    assert status == 503, body
    assert headers["Retry-After"] == "3"  # 2.5 s, rounded up
    assert "echo: tenant=acme priority=3" in body["error"]["message"]


def test_priority_header_reaches_the_scheduler_and_quota_is_429(server):
    status, body, headers = post(
        server, "/v1/completions",
        {"model": server_model(server), "prompt": "Hi", "max_tokens": 2,
         "vllm_xargs": {"slo_class": "quota"}},
        headers={"X-Vllm-Priority": "-2"}, with_headers=True)
    assert status == 429, body
    assert headers["Retry-After"] == "7"
    assert "tenant=default priority=-2" in body["error"]["message"]


@pytest.mark.parametrize(
    ("fields", "headers", "message"),
    [
        ({"priority": 21}, None, "priority must be between -20 and 20"),
        ({"priority": "abc"}, None, "priority must be an integer"),
        ({"priority": 1.5}, None, "priority must be an integer"),
        ({"vllm_xargs": {"tenant": {"nested": 1}}}, None, "vllm_xargs.tenant must be a string"),
        ({"vllm_xargs": {"deadline_ms": -5}}, None, "deadline_ms must be a positive"),
        ({"vllm_xargs": {"slo_class": ""}}, None, "vllm_xargs.slo_class must be a string"),
        ({}, {"X-Vllm-Priority": "99"}, "priority must be between -20 and 20"),
        ({}, {"X-Vllm-Priority": "soon"}, "X-Vllm-Priority must be an integer"),
        ({"priority": 0}, {"X-Vllm-Priority": "99"}, "priority must be between -20 and 20"),
        ({"priority": 0}, {"X-Vllm-Priority": "99"}, "priority must be between -20 and 20"),
    ],
)
def test_malformed_metadata_gets_400_with_a_readable_message(server, fields, headers, message):
    body = {"model": server_model(server), "prompt": "Hello", "max_tokens": 4, **fields}
    status, reply = post(server, "/v1/completions", body, headers)
    assert status == 400
    assert message in reply["error"]["message"]


def test_vllm_own_validation_still_answers_400_for_wrong_shapes(server):
    status, _ = completion(server, vllm_xargs="not-an-object")
    assert status == 400
    status, _ = post(server, "/v1/completions", b"{not json")
    assert status == 400


def test_server_keeps_serving_after_bad_requests(server):
    for _ in range(3):
        assert completion(server, priority=999)[0] == 400
    status, body = completion(server, priority=-1, vllm_xargs={"tenant": "acme"})
    assert status == 200
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 4


def test_streaming_chat_works_through_the_middleware(server):
    request = urllib.request.Request(
        server.url + "/v1/chat/completions", method="POST",
        headers={"content-type": "application/json"},
        data=json.dumps({"model": server_model(server), "stream": True, "max_tokens": 4,
                         "messages": [{"role": "user", "content": "Hi"}],
                         "vllm_xargs": {"tenant": "acme"}}).encode())
    with urllib.request.urlopen(request, timeout=120) as response:
        events = [line for line in response.read().decode().splitlines()
                  if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert len(events) >= 3


def test_a_streamed_rejection_is_a_503_not_an_empty_stream(server):
    body = {"model": server_model(server), "prompt": "Hello", "max_tokens": 4, "stream": True,
            "vllm_xargs": {"slo_class": "echo"}}
    status, reply, headers = post(server, "/v1/completions", body, with_headers=True)
    assert status == 503, reply
    assert headers["Retry-After"] == "1"
    assert "dropped before its first token" in reply["error"]["message"]
