"""`Drain` without a server: after the grace period it ends what is still open by itself (a
stream that never ends gets an SSE error event naming the shutdown and ``data: [DONE]``, a
request that sent nothing gets 503), cancels the tasks serving them, and stops the server."""

import asyncio
import json

from integrations.vllm_v1.serving.drain import STOPPED_MESSAGE, Drain

START_STREAM = {"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream")]}


def test_what_is_still_open_after_the_grace_period_is_ended_and_the_server_stops():
    sent = {"stream": [], "whole": []}
    stopped = []

    async def scenario():
        drain = Drain(grace_s=0.05, end_wait_s=0.05, stop_server=lambda: stopped.append(1))

        async def request(kind):
            async def downstream(message):
                sent[kind].append(message)

            with drain.track(downstream) as send:
                if kind == "stream":
                    await send(START_STREAM)
                    await send({"type": "http.response.body", "body": b'data: {"x": 1}\n\n',
                                "more_body": True})
                await asyncio.Event().wait()  # an engine that never answers

        tasks = [asyncio.create_task(request(kind)) for kind in sent]
        await asyncio.sleep(0)  # both in flight
        drain.begin()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)  # ended, not cancelled
        for _ in range(100):
            if stopped:
                break
            await asyncio.sleep(0.01)
        return drain

    drain = asyncio.run(scenario())
    assert stopped == [1] and drain.in_flight == 0
    last = sent["stream"][-1]
    assert last["more_body"] is False
    events = last["body"].decode().split("\n\n")
    assert json.loads(events[0].removeprefix("data: "))["error"]["message"] == STOPPED_MESSAGE
    assert events[1] == "data: [DONE]"
    start, body = sent["whole"]
    assert start["status"] == 503 and (b"retry-after", b"1") in start["headers"]
    assert json.loads(body["body"])["error"]["message"] == STOPPED_MESSAGE


def test_a_response_starting_after_the_grace_period_gets_503():
    sent = []

    async def scenario():
        drain = Drain(grace_s=0.0, end_wait_s=5.0, stop_server=lambda: None)

        async def downstream(message):
            sent.append(message)

        with drain.track(downstream) as send:
            drain.begin()
            await asyncio.sleep(0.01)  # the grace period is over
            assert drain.stopping
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b'{"choices": []}'})

    asyncio.run(scenario())
    assert [m.get("status") for m in sent] == [503, None]
    assert json.loads(sent[1]["body"])["error"]["message"] == STOPPED_MESSAGE
