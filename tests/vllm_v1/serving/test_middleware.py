"""The middleware over a stand-in for vLLM's app (FastAPI routes with vLLM's body fields)
and a real rejection channel (the stand-in sends what the engine's hook would)."""

import argparse
import asyncio
import json
import time

import httpx
import pytest
import zmq
from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict

from integrations.vllm_v1.rejection import Rejection
from integrations.vllm_v1.serving.http_status import has_output
from integrations.vllm_v1.serving.middleware import PolicyMiddleware
from integrations.vllm_v1.serving.rejection_channel import TICKET_KEY, new_channel_address
from policies.metadata import RECEIVED_KEY


class Body(BaseModel):
    model_config = ConfigDict(extra="allow")
    prompt: str = ""
    priority: int = 0
    vllm_xargs: dict | None = None
    stream: bool = False


class MessagesBody(BaseModel):
    messages: list = []
    vllm_xargs: dict | None = None
    stream: bool = False


class TokenizeBody(BaseModel):
    prompt: str


class AnthropicError(BaseModel):
    type: str
    error: dict


def stand_in(entry=None, channel=True):
    """(app, received bodies): routes answer as vLLM does for the ``mode`` in vllm_xargs."""
    address = new_channel_address()
    app = FastAPI()
    config = {**({"rejection_channel": address} if channel else {}), **(entry or {})}
    app.state.args = argparse.Namespace(additional_config={"llm_serving_policies": config})
    push = zmq.Context.instance().socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(address)
    received = []

    def engine(xargs):
        """What the engine does: reject (telling the channel) or generate."""
        mode = xargs.get("mode", "ok")
        if mode.startswith("reject:"):
            rejection = Rejection.parse(mode.removeprefix("reject:"))
            if TICKET_KEY in xargs and not xargs.get("silent"):
                push.send(f"{xargs[TICKET_KEY]}\n{rejection.stop_reason}".encode())
            return rejection
        return None

    def sse(events):
        async def stream():
            for event in events:
                yield f"data: {json.dumps(event)}\n\n"
            yield "data: [DONE]\n\n"
        return StreamingResponse(stream(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(body: Body):
        received.append(body.model_dump())
        xargs = body.vllm_xargs or {}
        rejection = engine(xargs)
        if body.stream:  # vLLM 0.32 drops a rejected stream's only (empty) output
            return sse([] if rejection else [{"choices": [{"text": "tok", "index": 0}]}])
        if rejection is not None:
            return {"choices": [{"text": "", "finish_reason": "abort",
                                 "stop_reason": rejection.stop_reason}],
                    "usage": {"completion_tokens": 0}}
        return {"choices": [{"text": "tok", "finish_reason": "length"}],
                "usage": {"completion_tokens": 1}}

    @app.post("/v1/messages", responses={400: {"model": AnthropicError}})
    async def messages(body: MessagesBody):
        received.append(body.model_dump())
        rejection = engine(body.vllm_xargs or {})
        text = "" if rejection else "tok"  # the reason is lost in this format
        return {"type": "message", "content": [{"type": "text", "text": text}],
                "usage": {"output_tokens": len(text) // 3}}

    @app.post("/tokenize")
    async def tokenize(body: TokenizeBody):
        return JSONResponse({"tokens": []})

    app.add_middleware(PolicyMiddleware)
    return app, received


def call(app, path, body, headers=None):
    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.post(path, json=body, headers=headers)

    return asyncio.run(go())


def reject(stop_reason, **xargs):
    return {"mode": f"reject:{stop_reason}", **xargs}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("stop_reason", "status", "retry_after"), [
    ("rejected:queue_full;retry_after_s=30", 503, "30"),
    ("rejected:class_full:gold;retry_after_s=6.2", 429, "7"),
    ("rejected:invalid_metadata:priority must be an integer;retry_after_s=0", 400, None),
])
def test_rejections_carry_their_reason_and_retry_after_streaming_or_not(
        stream, stop_reason, status, retry_after):
    app, _ = stand_in()
    reply = call(app, "/v1/completions", {"prompt": "x", "stream": stream,
                                          "vllm_xargs": reject(stop_reason)})
    rejection = Rejection.parse(stop_reason)
    assert reply.status_code == status, reply.text
    assert reply.headers.get("retry-after") == retry_after
    assert reply.json()["error"]["message"] == rejection.message


def test_a_stream_the_channel_says_nothing_about_is_the_generic_503():
    app, _ = stand_in()
    reply = call(app, "/v1/completions", {"stream": True, "vllm_xargs": reject(
        "rejected:queue_full;retry_after_s=30", silent=True)})
    assert reply.status_code == 503 and reply.headers["retry-after"] == "1"
    assert "reason unknown" in reply.json()["error"]["message"]


def test_output_is_never_turned_into_an_error():
    app, _ = stand_in()
    for stream in (False, True):
        reply = call(app, "/v1/completions", {"stream": stream, "vllm_xargs": {"mode": "ok"}})
        assert reply.status_code == 200 and "tok" in reply.text


def test_anthropic_route_rejections_use_its_error_format():
    app, _ = stand_in()
    reply = call(app, "/v1/messages", {"messages": [], "vllm_xargs": reject(
        "rejected:early_drop;retry_after_s=2.5")})
    assert reply.status_code == 503 and reply.headers["retry-after"] == "3"
    assert reply.json() == {"type": "error", "error": {
        "type": "overloaded_error", "message": "request rejected by the scheduler: early_drop; "
                                               "retry after 3 s"}}
    reply = call(app, "/v1/messages", {"messages": [], "vllm_xargs": {"tenant": "a b"}})
    assert reply.status_code == 400
    assert reply.json()["error"]["type"] == "invalid_request_error"
    assert call(app, "/v1/messages", {"messages": []}).status_code == 200


def test_the_ticket_reaches_the_engine_and_a_client_ticket_is_replaced():
    app, received = stand_in()
    call(app, "/v1/completions", {"vllm_xargs": {TICKET_KEY: "forged", "tenant": "acme"}})
    xargs = received[-1]["vllm_xargs"]
    assert xargs["tenant"] == "acme" and len(xargs[TICKET_KEY]) == 32
    assert xargs[TICKET_KEY] != "forged"
    app, received = stand_in(channel=False)
    call(app, "/v1/completions", {"vllm_xargs": {TICKET_KEY: "forged"}})
    assert received[-1]["vllm_xargs"] == {TICKET_KEY: "forged"}  # no channel: body untouched


def test_the_time_the_server_received_a_request_reaches_the_engine_and_a_forged_one_goes():
    app, received = stand_in()
    before = time.time()
    call(app, "/v1/completions", {"vllm_xargs": {RECEIVED_KEY: 0.0, "tenant": "acme"}})
    stamped = received[-1]["vllm_xargs"][RECEIVED_KEY]
    assert before <= stamped <= time.time()


@pytest.mark.parametrize("values", [("999", "0"), ("0", "999"), ("1", "1")])
def test_two_priority_headers_are_refused_whatever_their_order(values):
    app, received = stand_in()
    headers = [("x-vllm-priority", v) for v in values]
    reply = call(app, "/v1/completions", {"prompt": "x"}, headers=headers)
    assert reply.status_code == 400
    assert reply.json()["error"]["message"] == ("X-Vllm-Priority must be sent at most once, "
                                                "got 2 values")
    assert received == []


def test_credentials_pick_the_tenant_the_engine_sees(tmp_path):
    key_file = tmp_path / "bronze.key"
    key_file.write_text("bronze-key")
    app, received = stand_in({"tenants": {"bronze": {"api_key_file": str(key_file)}}})
    bronze = {"authorization": "Bearer bronze-key"}
    assert call(app, "/v1/completions", {"prompt": "x"}, bronze).status_code == 200
    assert received[-1]["vllm_xargs"]["tenant"] == "bronze"
    reply = call(app, "/v1/completions", {"vllm_xargs": {"tenant": "gold"}}, bronze)
    assert reply.status_code == 403 and "does not match" in reply.json()["error"]["message"]
    assert call(app, "/v1/completions", {"prompt": "x"}).status_code == 200
    assert received[-1]["vllm_xargs"]["tenant"] == "default"
    reply = call(app, "/v1/completions", {"prompt": "x"}, {"authorization": "Bearer nope"})
    assert reply.status_code == 401
    assert len(received) == 2
    assert call(app, "/tokenize", {"prompt": "x"}, {"authorization": "Bearer nope"}
                ).status_code == 200  # not an engine route: not ours to guard


def test_a_nan_in_an_unrelated_field_is_400_not_served_untenanted(tmp_path):
    key_file = tmp_path / "bronze.key"
    key_file.write_text("bronze-key")
    app, received = stand_in({"tenants": {"bronze": {"api_key_file": str(key_file)}}})

    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.post("/v1/completions", content=b'{"prompt": "x", '
                                     b'"vllm_xargs": {"weight": NaN}}', headers={
                                         "authorization": "Bearer bronze-key",
                                         "content-type": "application/json"})

    reply = asyncio.run(go())
    assert reply.status_code == 400 and "NaN" in reply.json()["error"]["message"]
    assert received == []


def test_a_bad_serving_config_fails_the_start_with_its_message():
    app, _ = stand_in({"tenants": {"gold": {"api_key_env": "LSP_TEST_UNSET_VARIABLE"}}})
    sent = []

    async def go():
        messages = [{"type": "lifespan.startup"}]

        async def receive():
            return messages.pop(0) if messages else await asyncio.sleep(3600)

        async def send(message):
            sent.append(message)

        await app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, receive, send)

    asyncio.run(asyncio.wait_for(go(), 30))
    assert sent[0]["type"] == "lifespan.startup.failed"
    assert "LSP_TEST_UNSET_VARIABLE is not set" in sent[0]["message"]


def test_output_detection_per_format():
    assert has_output({"choices": [{"delta": {"content": "a"}}]})
    assert has_output({"choices": [{"text": "", "finish_reason": "stop"}]})  # ran, said nothing
    assert not has_output({"choices": [{"delta": {"role": "assistant", "content": ""}}]})
    assert not has_output({"choices": [{"text": "", "finish_reason": "abort"}]})
    assert has_output({"type": "response.output_text.delta", "delta": "a"})
    assert not has_output({"type": "response.completed", "response": {"usage": {
        "output_tokens": 0}}})
    assert has_output({"object": "response", "status": "queued", "output": []})  # background
    assert not has_output({"object": "response", "status": "completed", "output": [
        {"type": "message", "content": []}]})
    assert has_output({"type": "content_block_delta", "delta": {"text": "a"}})
    assert not has_output({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                           "usage": {"output_tokens": 0}})
    assert has_output({"error": {"message": "x"}})
