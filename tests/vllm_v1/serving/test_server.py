"""vLLM's OpenAI server with a pipeline, on loopback, every route that reaches the engine:
metadata reaches the scheduler, bad metadata gets 400 with the engine's message, rejections
get their real status, reason and Retry-After (streaming or not), and an overload burst
accounts for every request (offered = completed + rejected)."""

import json
import time
from concurrent.futures import ThreadPoolExecutor, wait
from types import SimpleNamespace

import pytest

from integrations.vllm_v1 import Pipeline, serve
from integrations.vllm_v1.config.spec import CONFIG_KEY
from integrations.vllm_v1.instruments.hold import HOLD_HOOK
from policies import EDFRanker, QoSRanker
from tests.helpers.http import free_port, metric
from tests.helpers.probe_admission import ProbeAdmission
from tests.helpers.serving_client import get_text, model_name, send

pytestmark = pytest.mark.engine

MAX_WAITING = 6
HELLO = [{"role": "user", "content": "Hello"}]
BODIES = {
    "/v1/completions": {"prompt": "Hello", "max_tokens": 3},
    "/v1/chat/completions": {"messages": HELLO, "max_tokens": 3},
    "/v1/responses": {"input": "Hello", "max_output_tokens": 3},
    "/v1/messages": {"messages": HELLO, "max_tokens": 3},
    "/invocations": {"prompt": "Hello", "max_tokens": 3},
    "/v1/chat/completions/batch": {"messages": [HELLO, HELLO], "max_tokens": 3},
}
XARGS_ROUTES = ["/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages",
                "/invocations"]
"""Routes whose body carries ``vllm_xargs`` (all but batch chat)."""
PRIORITY_ROUTES = ["/v1/completions", "/v1/chat/completions", "/v1/responses", "/invocations",
                   "/v1/chat/completions/batch"]
"""Routes whose body's ``priority`` reaches the scheduler (Anthropic's has no such field)."""
STREAM_ROUTES = XARGS_ROUTES


@pytest.fixture(scope="module")
def server(random_model_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("server")
    pipeline = Pipeline(ranking=QoSRanker(), admission=ProbeAdmission(max_waiting=MAX_WAITING),
                        deadlines=EDFRanker())
    entry = {CONFIG_KEY: {"hooks": [HOLD_HOOK], "hold_path": str(folder / "hold")}}
    args = ("--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
            "--block-size", "32", "--kv-cache-memory-bytes", str(64 << 20),
            "--additional-config", json.dumps(entry))
    with serve(pipeline, random_model_dir, port=free_port(), vllm_args=args,
               log_path=str(folder / "server.log")) as handle:
        handle.wait_until_healthy(timeout_s=400)
        yield SimpleNamespace(url=handle.url, model=model_name(handle.url),
                              hold=folder / "hold", log=handle.log_tail)


def call(server, path, stream=False, headers=(), xargs=None, **fields):
    body = {"model": server.model, **BODIES[path], **fields}
    if stream:
        body["stream"] = True
    if xargs is not None:
        body["vllm_xargs"] = xargs
    return send(server.url, path, body, headers)


def produced_output(reply):
    """Whether a 200 reply holds generated text, in the route's format."""
    text = reply.text
    if reply.headers.get("content-type", "").startswith("text/event-stream"):
        return any(event.get("type") in ("response.output_text.delta", "content_block_delta")
                   or any(c.get("text") or (c.get("delta") or {}).get("content")
                          for c in event.get("choices") or ()) for event in reply.events)
    body = json.loads(text)
    usage = body.get("usage") or {}
    return (usage.get("completion_tokens") or usage.get("output_tokens") or 0) > 0


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("path", XARGS_ROUTES)
def test_metadata_reaches_the_scheduler_and_its_rejection_is_503_on_every_route(
        server, path, stream):
    priority = {} if path == "/v1/messages" else {"priority": 3}
    headers = [("X-Vllm-Priority", "3")] if path == "/v1/messages" else []
    reply = call(server, path, stream, headers, xargs={"tenant": "acme", "slo_class": "drop"},
                 **priority)
    assert reply.status == 503, reply.text
    assert reply.headers["retry-after"] == "3"  # 2.5 s, rounded up
    assert reply.message == ("request rejected by the scheduler: early_drop: tenant=acme "
                             "priority=3; retry after 3 s")


def test_batch_chat_rejection_is_503_with_the_reason(server):
    reply = call(server, "/v1/chat/completions/batch", priority=13)
    assert reply.status == 503, reply.text
    assert reply.headers["retry-after"] == "3"
    assert "early_drop: tenant=default priority=13" in reply.message


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("path", XARGS_ROUTES)
def test_a_client_quota_is_429_on_every_route(server, path, stream):
    reply = call(server, path, stream, headers=[("X-Vllm-Priority", "-2")],
                 xargs={"slo_class": "quota"})
    assert reply.status == 429, reply.text
    assert reply.headers["retry-after"] == "7"
    assert "class_full: quota tenant=default priority=-2" in reply.message


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("path", STREAM_ROUTES)
def test_served_requests_pass_unchanged(server, path, stream):
    reply = call(server, path, stream, xargs={"tenant": "acme"})
    assert reply.status == 200, reply.text
    assert produced_output(reply)


def test_batch_chat_served_passes_unchanged(server):
    reply = call(server, "/v1/chat/completions/batch", priority=-1)
    assert reply.status == 200, reply.text
    assert len(reply.json["choices"]) == 2 and produced_output(reply)


BAD_METADATA = [
    *[(path, {"priority": 21}, (), "priority must be between -20 and 20") for path in
      PRIORITY_ROUTES],
    *[(path, {"priority": 1.5}, (), "priority must be an integer") for path in PRIORITY_ROUTES],
    *[(path, {"vllm_xargs": {"tenant": "acme corp"}}, (), "vllm_xargs.tenant must be a string")
      for path in XARGS_ROUTES],
    *[(path, {"vllm_xargs": {"deadline_ms": -5}}, (), "deadline_ms must be a positive")
      for path in XARGS_ROUTES],
    *[(path, {"vllm_xargs": {"slo_class": ""}}, (), "vllm_xargs.slo_class must be a string")
      for path in XARGS_ROUTES],
    *[(path, {}, [("X-Vllm-Priority", "99")], "priority must be between -20 and 20")
      for path in BODIES],
    *[(path, {}, [("X-Vllm-Priority", "soon")], "X-Vllm-Priority must be an integer")
      for path in BODIES],
    ("/v1/completions", {"priority": 0}, [("X-Vllm-Priority", "99")], "priority must be"),
    ("/v1/completions", {"priority": 99}, [("X-Vllm-Priority", "0")], "priority must be"),
]


@pytest.mark.parametrize(("path", "fields", "headers", "message"), BAD_METADATA)
def test_malformed_metadata_gets_400_with_the_engines_message_on_every_route(
        server, path, fields, headers, message):
    reply = call(server, path, headers=headers, **fields)
    assert reply.status == 400, reply.text
    assert message in reply.message
    assert "retry-after" not in reply.headers


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/messages", "/v1/responses"])
@pytest.mark.parametrize("values", [("999", "0"), ("0", "999")])
def test_two_priority_headers_are_refused_in_either_order(server, path, values):
    reply = call(server, path, headers=[("X-Vllm-Priority", v) for v in values])
    assert reply.status == 400, reply.text
    assert reply.message == "X-Vllm-Priority must be sent at most once, got 2 values"


def test_vllm_own_validation_still_answers_400_for_wrong_shapes(server):
    assert call(server, "/v1/completions", vllm_xargs="not-an-object").status == 400
    assert send(server.url, "/v1/completions", b"{not json").status == 400
    assert send(server.url, "/v1/messages", b"[1, 2]").status == 400


def test_server_keeps_serving_after_bad_requests(server):
    for _ in range(3):
        assert call(server, "/v1/completions", priority=999).status == 400
    reply = call(server, "/v1/completions", priority=-1, xargs={"tenant": "acme"})
    assert reply.status == 200
    assert reply.json["choices"][0]["finish_reason"] == "length"
    assert reply.json["usage"]["completion_tokens"] == 3


def test_a_deadline_that_expires_in_the_queue_says_so_on_a_stream(server):
    server.hold.touch()  # nothing starts: the request waits until its deadline is past
    try:
        reply = call(server, "/v1/completions", stream=True, xargs={"deadline_ms": 300})
    finally:
        server.hold.unlink()
    assert reply.status == 503, reply.text
    assert reply.headers["retry-after"] == "1"
    assert reply.message == "request rejected by the scheduler: deadline_expired; retry after 1 s"


BURST_ROUTES = ["/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages"]


def test_an_overload_burst_streaming_or_not_every_rejection_says_queue_full_30s(server):
    offered = [(path, stream) for _ in range(3) for path in BURST_ROUTES
               for stream in (False, True)]
    before = metric(get_text(server.url, "/metrics"), "policies:rejections_total",
                    reason="queue_full")
    server.hold.touch()  # the first MAX_WAITING wait; everyone after them is rejected
    try:
        with ThreadPoolExecutor(len(offered)) as pool:
            futures = [pool.submit(call, server, path, stream, xargs={"tenant": f"t{i % 3}"})
                       for i, (path, stream) in enumerate(offered)]
            deadline = time.monotonic() + 300
            while (sum(f.done() for f in futures) < len(offered) - MAX_WAITING
                   and time.monotonic() < deadline):
                wait(futures, timeout=1)
            server.hold.unlink()  # the waiting ones now run
            replies = [f.result(timeout=300) for f in futures]
    finally:
        server.hold.unlink(missing_ok=True)
    rejected = [(kind, r) for kind, r in zip(offered, replies, strict=True) if r.status != 200]
    completed = [(kind, r) for kind, r in zip(offered, replies, strict=True)
                 if r.status == 200 and produced_output(r)]
    assert len(offered) == len(completed) + len(rejected)
    assert len(completed) == MAX_WAITING
    for (path, stream), reply in rejected:
        assert (reply.status, reply.headers.get("retry-after"), reply.message) == (
            503, "30", "request rejected by the scheduler: queue_full; retry after 30 s"), (
            path, stream, reply.text)
    assert {stream for (_, stream), _ in rejected} == {False, True}
    after = metric(get_text(server.url, "/metrics"), "policies:rejections_total",
                   reason="queue_full")
    assert after - before == len(rejected)
