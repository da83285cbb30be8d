"""The PD router server against fake vLLM backends (aiohttp apps on loopback, no engine)."""

import asyncio
import json

import aiohttp
import attrs
import pytest
from aiohttp import web

from integrations.vllm_v1.pd.launch import free_port
from integrations.vllm_v1.pd.proxy import (
    REMOTE_DECODE,
    PDProxy,
    prefill_request,
    request_session_id,
    validation_error,
)
from policies.pd.router import PDRouter


@attrs.define(eq=False)
class FakeVllm:
    """Answers like a vLLM server; ``mode`` is ok, fail (HTTP 500) or cut (dies mid-stream)."""

    name: str
    mode: str = "ok"
    bodies: list = attrs.field(factory=list)
    gate: asyncio.Barrier | None = None
    """When set, streams pause after their first event until the barrier fills."""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self.complete)
        app.router.add_post("/v1/chat/completions", self.complete)
        app.router.add_get("/health", self.health)
        return app

    async def health(self, _request):
        return web.Response(status=200 if self.mode == "ok" else 503)

    async def complete(self, request):
        body = await request.json()
        self.bodies.append(body)
        if self.mode == "fail":
            return web.Response(status=500, text="engine dead")
        if not body.get("stream"):
            return web.json_response({"choices": [{"text": f"from {self.name}"}],
                                      "kv_transfer_params": {"from": self.name},
                                      "got_kv": body.get("kv_transfer_params")})
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await stream.prepare(request)
        for i in range(3):
            await stream.write(f"data: {json.dumps({'i': i})}\n\n".encode())
            if self.gate is not None and i == 0:
                await self.gate.wait()
            if self.mode == "cut":
                request.transport.close()
                return stream
        await stream.write(b"data: [DONE]\n\n")
        return stream


async def serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


def run_scenario(modes: dict[str, str], scenario, **proxy_kwargs):
    """Start fakes (``prefill*``/``decode*`` names) and a proxy; run ``scenario(session, url, fakes, proxy)``."""
    async def main():
        fakes = {name: FakeVllm(name, mode) for name, mode in modes.items()}
        runners, urls = [], {}
        for name, fake in fakes.items():
            runner, urls[name] = await serve(fake.app())
            runners.append(runner)
        prefill = {n: u for n, u in urls.items() if n.startswith("prefill")}
        decode = {n: u for n, u in urls.items() if n.startswith("decode")}
        router = PDRouter(prefill=list(prefill), decode=list(decode), block_size_tokens=16,
                          skip_prefill_max_tokens=0)
        proxy = PDProxy(prefill_urls=prefill, decode_urls=decode, router=router,
                        health_interval_s=3600, **proxy_kwargs)
        runner, url = await serve(proxy.app())
        runners.append(runner)
        try:
            async with aiohttp.ClientSession() as session:
                await scenario(session, url, fakes, proxy)
        finally:
            for r in reversed(runners):
                await r.cleanup()
    asyncio.run(main())


@pytest.mark.parametrize(("body", "message"), [
    ([1, 2], "JSON object"),
    ({"prompt": ""}, "prompt must be"),
    ({"prompt": [1, "x"]}, "prompt must be"),
    ({"prompt": "hi", "stream": "yes"}, "stream must be a boolean"),
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens must be a positive integer"),
    ({"prompt": "hi", "n": 2}, "n must be 1"),
    ({"prompt": "hi", "kv_transfer_params": {}}, "set by the router"),
])
def test_malformed_requests_get_400_and_no_backend_sees_them(body, message):
    async def scenario(session, url, fakes, _proxy):
        async with session.post(f"{url}/v1/completions", json=body) as answer:
            assert answer.status == 400
            assert message in (await answer.json())["error"]["message"]
        async with session.post(f"{url}/v1/chat/completions", data=b"{not json") as answer:
            assert answer.status == 400
        assert all(not fake.bodies for fake in fakes.values())
    run_scenario({"prefill0": "ok", "decode0": "ok"}, scenario)


def test_chat_needs_messages():
    assert "messages must be" in validation_error({"messages": []}, "chat")
    assert validation_error({"messages": [{"role": "user", "content": "x"}]}, "chat") is None


def test_prefill_then_decode_with_the_prefill_kv_transfer_params():
    async def scenario(session, url, fakes, _proxy):
        async with session.post(f"{url}/v1/completions",
                                json={"prompt": "hello", "max_tokens": 5}) as answer:
            assert answer.status == 200
            assert (await answer.json())["got_kv"] == {"from": "prefill0"}
        sent = fakes["prefill0"].bodies[0]
        assert sent["max_tokens"] == 1 and sent["stream"] is False
        assert sent["kv_transfer_params"]["do_remote_decode"] is True
        assert fakes["decode0"].bodies[0]["max_tokens"] == 5
        async with session.post(f"{url}/v1/completions",
                                json={"prompt": "hello", "stream": True}) as answer:
            text = await answer.text()
        assert text.count("data: ") == 4 and text.endswith("data: [DONE]\n\n")
    run_scenario({"prefill0": "ok", "decode0": "ok"}, scenario)


def test_a_failed_decode_instance_is_retried_elsewhere_and_marked_down():
    async def scenario(session, url, fakes, proxy):
        for _ in range(4):
            async with session.post(f"{url}/v1/completions", json={"prompt": "x" * 50}) as a:
                assert a.status == 200
                assert (await a.json())["choices"][0]["text"] == "from decode1"
        assert not proxy.router.is_up("decode0") and len(fakes["decode0"].bodies) == 1
        async with session.get(f"{url}/metrics") as answer:
            metrics = await answer.text()
        assert "pd_router_retries_total 1.0" in metrics
        assert 'pd_router_instance_up{instance="decode0",pool="decode"} 0.0' in metrics
        fakes["decode0"].mode = "ok"
        await proxy.check_health()
        assert proxy.router.is_up("decode0")
    run_scenario({"prefill0": "ok", "decode0": "fail", "decode1": "ok"}, scenario)


def test_no_healthy_decode_gives_503_and_exhausted_retries_give_502():
    async def scenario(session, url, fakes, proxy):
        async with session.post(f"{url}/v1/completions", json={"prompt": "hi"}) as answer:
            assert answer.status == 502  # decode0 fails; the retry finds prefill0 down too
            assert "backend failed" in (await answer.json())["error"]["message"]
        await proxy.check_health()
        async with session.post(f"{url}/v1/completions", json={"prompt": "hi"}) as answer:
            assert answer.status == 503
            assert "no decode instance is healthy" in (await answer.json())["error"]["message"]
        async with session.get(f"{url}/health") as answer:
            assert answer.status == 503
    run_scenario({"prefill0": "fail", "decode0": "fail"}, scenario, max_attempts=2)


def test_a_stream_cut_midway_ends_with_an_error_event():
    async def scenario(session, url, fakes, proxy):
        async with session.post(f"{url}/v1/completions",
                                json={"prompt": "hi", "stream": True}) as answer:
            assert answer.status == 200
            text = await answer.text()
        assert '"i": 0' in text
        assert "failed mid-stream" in text and text.endswith("data: [DONE]\n\n")
        assert not proxy.router.is_up("decode0")
    run_scenario({"prefill0": "ok", "decode0": "cut"}, scenario)


def test_500_concurrent_streams_are_each_answered_once():
    async def scenario(_session, url, fakes, _proxy):
        gate = asyncio.Barrier(500)  # opens only once all 500 streams are open at once
        decoders = [fakes["decode0"], fakes["decode1"]]
        for fake in decoders:
            fake.gate = gate

        async def one(session, i):
            async with session.post(f"{url}/v1/completions",
                                    json={"prompt": f"p{i}", "stream": True}) as answer:
                return (await answer.text()).count("data: ")

        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            async with asyncio.timeout(120):
                counts = await asyncio.gather(*(one(session, i) for i in range(500)))
        assert counts == [4] * 500
        prompts = sorted(b["prompt"] for f in decoders for b in f.bodies)
        assert prompts == sorted(f"p{i}" for i in range(500))  # none dropped, none duplicated
    run_scenario({"prefill0": "ok", "decode0": "ok", "decode1": "ok"}, scenario)


def test_the_prefill_request_asks_one_token_unstreamed_and_leaves_the_body_alone():
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": True,
            "stream_options": {"include_usage": True}, "max_completion_tokens": 50,
            "temperature": 0.5}
    request = prefill_request(body)
    assert request == {"messages": body["messages"], "stream": False, "max_tokens": 1,
                       "max_completion_tokens": 1, "temperature": 0.5,
                       "kv_transfer_params": REMOTE_DECODE}
    assert "kv_transfer_params" not in body and body["stream"] is True
    request["kv_transfer_params"]["remote_host"] = "x"
    assert REMOTE_DECODE["remote_host"] is None


def test_a_sessions_turns_are_routed_as_one_session():
    assert request_session_id({"vllm_xargs": {"session_id": "agent-1"}}) == "agent-1"
    assert request_session_id({"session_id": "own", "vllm_xargs": {"session_id": "x"}}) == "own"
    assert request_session_id({"vllm_xargs": {"session_id": "bad id!"}}) is None
    assert request_session_id({"vllm_xargs": "nope"}) is None

    async def scenario(session, url, fakes, _proxy):
        for turn in range(4):  # unrelated prompts: only the session ties them together
            body = {"prompt": f"turn {turn} " * (turn + 1), "max_tokens": 2,
                    "vllm_xargs": {"session_id": "agent-1"}}
            async with session.post(f"{url}/v1/completions", json=body) as answer:
                assert answer.status == 200
        async with session.get(f"{url}/metrics") as page:
            text = await page.text()
        assert 'pd_router_decisions_total{pool="decode",reason="session"} 3.0' in text
        assert len(fakes["decode0"].bodies) + len(fakes["decode1"].bodies) == 4
        assert {len(fakes["decode0"].bodies), len(fakes["decode1"].bodies)} == {0, 4}
    run_scenario({"prefill0": "ok", "decode0": "ok", "decode1": "ok"}, scenario)
