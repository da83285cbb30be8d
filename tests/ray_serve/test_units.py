"""The Ray Serve package's pure parts: prefix keys, the in-process ASGI call, the local
cluster's core shares."""

from __future__ import annotations

import asyncio

import pytest

from integrations.ray_serve.asgi import ResponseStart, call_asgi
from integrations.ray_serve.cluster import engine_core_binds
from integrations.ray_serve.prefix import PromptKeys, block_keys


def test_block_keys_agree_exactly_on_shared_prefix_blocks():
    a = block_keys(list(range(100)), 32)
    b = block_keys([*range(64), 999, *range(65, 100)], 32)
    assert len(a) == len(b) == 3  # the partial last block has no key
    assert a[:2] == b[:2] and a[2] != b[2]
    with pytest.raises(ValueError, match="block_size_tokens"):
        block_keys([1], 0)


def test_prompt_keys_without_a_tokenizer_use_characters():
    keys = PromptKeys(block_size_tokens=4)
    hint = keys.hint("completions", {"prompt": "abcdefghij"})
    assert hint.prompt_tokens == 3 and len(hint.block_keys) == 2
    assert keys.hint("completions", {"prompt": [1, 2, 3, 4, 5]}).prompt_tokens == 5
    assert keys.hint("completions", {}).block_keys == ()
    chat = keys.hint("chat/completions", {"messages": [{"role": "user", "content": "hi" * 9}]})
    assert chat.block_keys


def test_prompt_keys_with_the_model_tokenizer_count_tokens(random_model_dir):
    keys = PromptKeys.for_model(random_model_dir, 8)
    assert keys.tokenizer is not None
    prompt = "The quick brown fox jumps over the lazy dog. " * 4
    hint = keys.hint("completions", {"prompt": prompt})
    assert hint.prompt_tokens == len(keys.tokenizer.encode(prompt))
    longer = keys.hint("completions", {"prompt": prompt + "And then it slept."})
    assert longer.block_keys[:len(hint.block_keys) - 1] == hint.block_keys[:-1]


def test_call_asgi_yields_the_start_then_each_chunk_as_sent():
    sent_second = asyncio.Event()

    async def app(scope, receive, send):
        request = await receive()
        assert scope["path"] == "/v1/x" and request["body"] == b"{}"
        await send({"type": "http.response.start", "status": 201,
                    "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"one", "more_body": True})
        await sent_second.wait()
        await send({"type": "http.response.body", "body": b"two", "more_body": False})

    async def run():
        answer = call_asgi(app, "POST", "/v1/x", body=b"{}")
        start = await anext(answer)
        assert isinstance(start, ResponseStart) and start.status == 201
        assert start.header("Content-Type") == "text/event-stream"
        assert await anext(answer) == b"one"  # before the app sends the second chunk
        sent_second.set()
        assert [chunk async for chunk in answer] == [b"two"]

    asyncio.run(run())


def test_closing_the_call_tells_the_app_the_client_left():
    seen = []

    async def app(scope, receive, send):
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"a", "more_body": True})
        seen.append((await receive())["type"])

    async def run():
        answer = call_asgi(app, "GET", "/")
        await anext(answer)
        assert await anext(answer) == b"a"
        await answer.aclose()

    asyncio.run(run())
    assert seen == ["http.disconnect"]


def test_each_local_node_gets_its_own_cores_for_its_engines():
    """vLLM's automatic binding would put every replica's threads on the same cores."""
    assert engine_core_binds(2, 2) == ["0", "1"]
    assert engine_core_binds(2, 8) == ["0-3", "4-7"]
    assert engine_core_binds(3, 8) == ["0-1", "2-3", "4-5"]
    assert engine_core_binds(3, 2) == ["0", "1", "0"]  # fewer cores than nodes: they share
    with pytest.raises(ValueError, match="nodes and cpus"):
        engine_core_binds(0, 2)
