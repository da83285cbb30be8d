"""The channel's SLO signals: message encodings, the engine-side hook over fake sockets, and
over a stand-in for vLLM's app the class headers, the first-token report and the frontend
gate."""

import argparse
import asyncio
import json
import time
from collections import deque
from types import SimpleNamespace

import httpx
import pytest
import zmq
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from prometheus_client import REGISTRY
from pydantic import BaseModel, ConfigDict

from integrations.vllm_v1.config.declarative import PipelineConfigError
from integrations.vllm_v1.config.slo import slo_pipeline
from integrations.vllm_v1.rejection import Rejection
from integrations.vllm_v1.serving.middleware import PolicyMiddleware
from integrations.vllm_v1.serving.rejection_channel import (
    MAX_RETAINED_FINISHED,
    RETAIN_FINISHED_S,
    TICKET_KEY,
    HearsClientFirstTokens,
    HearsClientStreams,
    Judged,
    JudgesClasses,
    RejectionBook,
    RejectionChannelHook,
    channel_address,
    decode_engine_word,
    decode_first_token,
    decode_stream_end,
    encode_first_token,
    encode_judged,
    encode_rejection,
    encode_stream_end,
    first_token_address,
    new_channel_address,
)

# -- messages ------------------------------------------------------------------------


@pytest.mark.parametrize("judged", [Judged("chat"), Judged("batch", "chat"), Judged(None),
                                    Judged("ünï\ncode", None)])
def test_a_judged_class_round_trips(judged):
    assert decode_engine_word(encode_judged("t1", judged)) == ("t1", judged)


def test_a_rejection_round_trips_and_garbage_decodes_to_nothing():
    rejection = Rejection(reason="slo_ttft", detail="chat", retry_after_s=2.5)
    assert decode_engine_word(encode_rejection("t1", rejection)) == ("t1", rejection)
    for garbage in (b"", b"t1", b"t1\nadmitted:", b"t1\nadmitted:[1, 2]", b"t1\nadmitted:{}",
                    b"t1\nrejected:", b"\xff\xfe"):
        assert decode_engine_word(garbage) is None, garbage


def test_a_first_token_report_round_trips_exactly():
    sent_s = time.time()
    assert decode_first_token(encode_first_token("t1", sent_s)) == ("t1", sent_s)
    for garbage in (b"t1\n", b"t1\nnan", b"t1\ninf", b"\n1.0", b"t1\nx"):
        assert decode_first_token(garbage) is None, garbage


def test_a_stream_end_report_round_trips_exactly():
    first_s = time.time()
    assert decode_stream_end(encode_stream_end("t1", first_s, first_s + 0.5, 17)) == (
        "t1", first_s, first_s + 0.5, 17)
    assert decode_stream_end(encode_first_token("t1", first_s)) is None
    for garbage in (b"end:t1\n1.0\n2.0", b"end:t1\n2.0\n1.0\n3", b"end:t1\n1.0\n2.0\n0",
                    b"end:\n1.0\n2.0\n3", b"end:t1\nnan\n2.0\n3", b"end:t1\n1\n2\nx"):
        assert decode_stream_end(garbage) is None, garbage


def test_headers_name_the_class_and_the_demotion_in_printable_ascii_only():
    assert Judged("chat").headers() == [(b"x-slo-class", b"chat")]
    assert Judged("batch", "chat").headers() == [(b"x-slo-class", b"batch"),
                                                 (b"x-slo-demoted-from", b"chat")]
    assert Judged("ch\nat", "gøld").headers() == []
    assert Judged(None).headers() == []


def test_the_reverse_address_is_derived_from_the_channels():
    assert first_token_address("ipc://@abc") == "ipc://@abc-first-token"
    assert first_token_address("tcp://127.0.0.1:5555") == "tcp://127.0.0.1:5556"
    with pytest.raises(PipelineConfigError, match="must name a TCP port below 65535"):
        channel_address({"rejection_channel": "tcp://127.0.0.1:65535"})


def test_the_slo_presets_admission_judges_classes_and_hears_first_tokens():
    admission = slo_pipeline().admission
    assert isinstance(admission, JudgesClasses) and isinstance(admission, HearsClientFirstTokens)
    assert isinstance(admission, HearsClientStreams)


# -- the engine-side hook over fake sockets -------------------------------------------


class FakeSocket:
    """A ZeroMQ socket's non-blocking send/recv: sends up to ``capacity``, receives ``inbox``."""

    def __init__(self, capacity=1_000_000):
        self.sent, self.inbox, self.capacity, self.closed = [], deque(), capacity, False

    def send(self, data, flags=0):
        assert flags == zmq.NOBLOCK
        if len(self.sent) >= self.capacity:
            raise zmq.Again()
        self.sent.append(data)

    def recv(self, flags=0):
        assert flags == zmq.NOBLOCK
        if not self.inbox:
            raise zmq.Again()
        return self.inbox.popleft()

    def close(self, linger=None):
        self.closed = True


class Judge:
    """An admission policy with the two capabilities, answering from a table."""

    def __init__(self, classes):
        self.classes, self.first_tokens = classes, []

    def judged_class(self, request_id):
        return self.classes.get(request_id)

    def on_client_first_token(self, request_id, sent_s):
        self.first_tokens.append((request_id, sent_s))


class StreamJudge(Judge):
    """A `Judge` that also hears how streams went out."""

    def __init__(self, classes):
        super().__init__(classes)
        self.streams = []

    def on_client_stream_end(self, request_id, first_s, last_s, chunks):
        self.streams.append((request_id, first_s, last_s, chunks))


def hook_over_fakes(admission, capacity=1_000_000):
    clock = [100.0]
    scheduler = SimpleNamespace(
        vllm_config=SimpleNamespace(additional_config={"llm_serving_policies": {
            "rejection_channel": new_channel_address()}}),
        pipeline=SimpleNamespace(admission=admission), metrics=None, clock=lambda: clock[0])
    push, pull = FakeSocket(capacity), FakeSocket()
    return RejectionChannelHook(scheduler, sockets=(push, pull)), push, pull, clock


def request(request_id, ticket):
    extra = {TICKET_KEY: ticket} if ticket else {}
    return SimpleNamespace(request_id=request_id,
                           sampling_params=SimpleNamespace(extra_args=extra))


def finish(hook, req):
    with hook.releasing(req, preempted=False):
        pass


def test_the_class_judged_is_sent_at_the_next_step_and_rejections_at_once():
    judge = Judge({"r1": ("chat", None), "r2": ("batch", "chat")})
    hook, push, _, _ = hook_over_fakes(judge)
    for rid, ticket in (("r1", "t1"), ("r2", "t2"), ("r3", "t3"), ("r4", None)):
        hook.on_arrival(request(rid, ticket))
        hook.on_admitted(request(rid, ticket), "default")
    assert push.sent == []  # the admission policy hears of it after the hooks
    hook.before_schedule(100.0)
    assert [decode_engine_word(m) for m in push.sent] == [
        ("t1", Judged("chat")), ("t2", Judged("batch", "chat")), ("t3", Judged(None))]
    rejection = Rejection(reason="slo_ttft", detail="chat", retry_after_s=1)
    hook.on_arrival(request("r5", "t5"))
    hook.on_rejected(request("r5", "t5"), rejection)
    assert decode_engine_word(push.sent[-1]) == ("t5", rejection)
    assert hook.stats().tracked == 3


def test_without_a_judging_admission_only_rejections_are_sent():
    hook, push, _, _ = hook_over_fakes(None)
    hook.on_arrival(request("r1", "t1"))
    hook.on_admitted(request("r1", "t1"), "default")
    hook.before_schedule(100.0)
    assert push.sent == []


def test_first_token_reports_reach_the_admission_once_finished_too_and_unknown_are_counted():
    judge = Judge({})
    hook, _, pull, clock = hook_over_fakes(judge)
    for rid, ticket in (("r1", "t1"), ("r2", "t2")):
        hook.on_arrival(request(rid, ticket))
    finish(hook, request("r2", "t2"))  # a short request can finish before its report comes
    pull.inbox.extend([encode_first_token("t1", 1.5), encode_first_token("t2", 2.5),
                       encode_first_token("t1", 3.5), encode_first_token("nope", 4.5),
                       b"garbage"])
    hook.before_schedule(clock[0])
    assert judge.first_tokens == [("r1", 1.5), ("r2", 2.5)]
    stats = hook.stats()
    assert (stats.first_tokens, stats.unmatched, stats.tracked) == (2, 3, 0)


def test_stream_ends_follow_first_tokens_to_the_admission_then_the_ticket_is_forgotten():
    judge = StreamJudge({})
    hook, _, pull, clock = hook_over_fakes(judge)
    hook.on_arrival(request("r1", "t1"))
    pull.inbox.append(encode_first_token("t1", 1.5))
    hook.before_schedule(clock[0])
    assert judge.first_tokens == [("r1", 1.5)] and hook.stats().tracked == 1
    finish(hook, request("r1", "t1"))
    pull.inbox.extend([encode_stream_end("t1", 1.5, 2.5, 11), encode_stream_end("t1", 1, 2, 3)])
    hook.before_schedule(clock[0])
    assert judge.streams == [("r1", 1.5, 2.5, 11)]
    stats = hook.stats()
    assert (stats.stream_ends, stats.unmatched, stats.tracked) == (1, 1, 0)


def test_finished_requests_are_forgotten_after_a_while():
    judge = Judge({})
    hook, _, pull, clock = hook_over_fakes(judge)
    hook.on_arrival(request("r1", "t1"))
    hook.on_arrival(request("r2", "t2"))
    finish(hook, request("r1", "t1"))
    hook.before_schedule(clock[0] + RETAIN_FINISHED_S - 1)
    assert hook.stats().tracked == 2
    hook.before_schedule(clock[0] + RETAIN_FINISHED_S + 1)
    assert (hook.stats().tracked, hook.stats().expired) == (1, 1)  # r2 runs on
    pull.inbox.append(encode_first_token("t1", 1.0))
    hook.before_schedule(clock[0] + RETAIN_FINISHED_S + 2)
    assert judge.first_tokens == [] and hook.stats().unmatched == 1
    assert MAX_RETAINED_FINISHED >= 1_000  # and never more than that many are kept


def test_a_full_channel_drops_and_counts():
    hook, push, _, _ = hook_over_fakes(Judge({}), capacity=1)
    for i in range(3):
        hook.on_rejected(request(f"r{i}", f"t{i}"), Rejection(reason="queue_full"))
    assert len(push.sent) == 1 and hook.stats().dropped == 2


def test_shutdown_closes_both_sockets():
    hook, push, pull, _ = hook_over_fakes(None)
    hook.shutdown(0.0)
    assert push.closed and pull.closed


# -- over a stand-in for vLLM's app ---------------------------------------------------

CLASSES = {"fast": {"ttft_s": 0.001, "tpot_s": 1.0}, "slow": {"ttft_s": 100.0, "tpot_s": 1.0}}


class Body(BaseModel):
    model_config = ConfigDict(extra="allow")
    prompt: str = ""
    vllm_xargs: dict | None = None
    stream: bool = False


def stand_in(entry):
    """(app, state): ``/v1/completions`` answers as vLLM would, after telling the channel
    the class in ``vllm_xargs.judged`` (and waiting, bounded, until the book has it)."""
    address = new_channel_address()
    app = FastAPI()
    app.state.args = argparse.Namespace(additional_config={"llm_serving_policies": {
        "rejection_channel": address, **entry}})
    context = zmq.Context.instance()
    push = context.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(address)
    reports = context.socket(zmq.PULL)
    reports.setsockopt(zmq.LINGER, 0)
    reports.bind(first_token_address(address))
    state = SimpleNamespace(received=[], reports=reports, held=None)

    @app.post("/v1/completions")
    async def completions(body: Body):
        xargs = body.vllm_xargs or {}
        state.received.append(xargs)
        if xargs.get("hold"):
            await state.held.wait()
        if "service_s" in xargs:
            await asyncio.sleep(xargs["service_s"])  # the stage's own work, simulated
        if xargs.get("judged"):
            push.send(encode_judged(xargs[TICKET_KEY], Judged(*xargs["judged"])))
            book = book_of(app)
            for _ in range(2000):  # bounded: until the book has read it
                if book.judged(xargs[TICKET_KEY]) is not None:
                    break
                await asyncio.sleep(0.001)
        if "reject" in xargs:
            reason, _, detail = xargs["reject"].partition(":")
            rejection = Rejection(reason=reason, detail=detail, retry_after_s=1)
            push.send(encode_rejection(xargs[TICKET_KEY], rejection))
            if body.stream:  # vLLM drops a rejected stream's only output
                return StreamingResponse(iter(["data: [DONE]\n\n"]),
                                         media_type="text/event-stream")
            return {"choices": [{"text": "", "finish_reason": "abort",
                                 "stop_reason": rejection.stop_reason}]}
        if body.stream:
            async def stream():
                yield 'data: {"choices": [{"text": "", "index": 0}]}\n\n'
                yield f"data: {json.dumps({'choices': [{'text': 'tok', 'index': 0}]})}\n\n"
                yield "data: [DONE]\n\n"
            return StreamingResponse(stream(), media_type="text/event-stream")
        return {"choices": [{"text": "tok", "finish_reason": "length"}],
                "usage": {"completion_tokens": 1}}

    app.add_middleware(PolicyMiddleware)
    return app, state


def policy_middleware(app):
    layer = app.middleware_stack
    while not isinstance(layer, PolicyMiddleware):
        layer = layer.app
    return layer


def book_of(app) -> RejectionBook:
    return policy_middleware(app)._setup.book


async def post(client, xargs, stream=False, headers=None):
    return await client.post("/v1/completions", json={"prompt": "x", "stream": stream,
                                                      "vllm_xargs": xargs}, headers=headers)


def run(app, scenario):
    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await scenario(client)

    return asyncio.run(go())


@pytest.mark.parametrize("stream", [False, True])
def test_served_and_demoted_responses_name_their_class(stream):
    app, _ = stand_in({})

    async def scenario(client):
        return [await post(client, {"judged": judged}, stream)
                for judged in (["chat", None], ["batch", "chat"], None)]

    served, demoted, silent = run(app, scenario)
    assert served.status_code == demoted.status_code == silent.status_code == 200
    assert served.headers["x-slo-class"] == "chat" and "x-slo-demoted-from" not in served.headers
    assert (demoted.headers["x-slo-class"], demoted.headers["x-slo-demoted-from"]) == (
        "batch", "chat")
    assert "x-slo-class" not in silent.headers  # no word from the engine: no header
    assert "tok" in served.text and "tok" in demoted.text


@pytest.mark.parametrize("stream", [False, True])
def test_an_slo_rejection_names_the_class_it_was_judged_in(stream):
    app, _ = stand_in({})
    reply = run(app, lambda client: post(client, {"reject": "slo_ttft:chat"}, stream))
    assert reply.status_code == 503 and reply.headers["x-slo-class"] == "chat"
    assert "x-slo-demoted-from" not in reply.headers
    reply = run(app, lambda client: post(client, {"reject": "queue_full"}, stream))
    assert reply.status_code == 503 and "x-slo-class" not in reply.headers


def test_a_streams_first_token_is_reported_to_the_engine_with_its_ticket():
    app, state = stand_in({})

    async def scenario(client):
        before = time.time()
        reply = await post(client, {"judged": ["chat", None]}, stream=True)
        return before, reply, time.time()

    before, reply, after = run(app, scenario)
    assert reply.status_code == 200
    assert state.reports.poll(5000), "no first-token report"
    ticket, sent_s = decode_first_token(state.reports.recv())
    assert ticket == state.received[-1][TICKET_KEY]
    assert before <= sent_s <= after
    assert state.reports.poll(5000), "no stream-end report"
    end_ticket, first_s, last_s, chunks = decode_stream_end(state.reports.recv())
    assert (end_ticket, first_s) == (ticket, sent_s)
    assert sent_s <= last_s <= after and chunks >= 1
    run(app, lambda client: post(client, {}, stream=False))
    assert not state.reports.poll(200)  # a whole response reports nothing


async def until(check):
    """Wait (bounded, about 5 s) until ``check()`` holds."""
    for _ in range(5000):
        if check():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("waited 5 s in vain")


def gauge(name, **labels):
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_the_frontend_gate_refuses_at_once_what_the_stage_alone_makes_late():
    app, state = stand_in({"pipeline": "slo", "slo": {"classes": CLASSES,
                                                      "tenants": {"acme": "slow"}}})
    refused_before = gauge("policies:frontend_gate_rejections_total", slo_class="fast")

    async def scenario(client):
        state.held = asyncio.Event()
        for _ in range(10):  # the stage learns its rate: ~10 ms a request
            assert (await post(client, {"service_s": 0.01})).status_code == 200
        held = [asyncio.create_task(post(client, {"hold": True, "tenant": "acme"}))
                for _ in range(5)]
        stage = policy_middleware(app)._setup.frontend
        await until(lambda: stage.gate.in_stage == 5)
        offered = len(state.received)
        refused = await post(client, {"slo_class": "fast"})
        tightest = await post(client, {})
        loose = await post(client, {"tenant": "acme"})
        forwarded = len(state.received) - offered
        state.held.set()
        return refused, tightest, loose, forwarded, await asyncio.gather(*held)

    refused, tightest, loose, forwarded, held = run(app, scenario)
    for reply in (refused, tightest):
        assert reply.status_code == 503, reply.text
        assert reply.headers["retry-after"] == "1" and reply.headers["x-slo-class"] == "fast"
        message = reply.json()["error"]["message"]
        assert message.startswith("request rejected by the scheduler: frontend_busy: fast: "
                                  "predicted wait before the engine"), message
        assert Rejection.from_message(message).reason == "frontend_busy"
    assert loose.status_code == 200  # the tenant's class waits 100 s
    assert forwarded == 1  # the refused ones never reached vLLM
    assert [r.status_code for r in held] == [200] * 5
    assert gauge("policies:frontend_gate_rejections_total",
                 slo_class="fast") - refused_before == 2
    assert gauge("policies:frontend_stage_requests") == 0
    assert gauge("policies:frontend_service_rate") > 0


def door_limits(app):
    """The door's concurrency limits, set to count every late report (their late budget has
    tests of its own: `tests/policies/test_concurrency_limit.py`)."""
    limits = policy_middleware(app)._setup.frontend.limits
    for limit in limits.limits.values():
        limit.late_budget = 0.0
    return limits


def learned(limits):
    return {name: limit.limit for name, limit in limits.limits.items()}


def test_a_late_stream_lowers_its_class_limit_and_the_door_refuses_past_it():
    app, state = stand_in({"pipeline": "slo", "slo": {"classes": CLASSES}})
    late_before = gauge("policies:frontend_late_reports_total", what="ttft")
    refused_before = gauge("policies:frontend_limit_rejections_total", slo_class="fast")

    async def scenario(client):
        state.held = asyncio.Event()
        on_time = await post(client, {"slo_class": "slow"}, stream=True)
        limits = door_limits(app)
        unlimited = learned(limits)
        held = [asyncio.create_task(post(client, {"hold": True, "slo_class": "fast"}))
                for _ in range(4)]
        await until(lambda: limits.in_flight == 4)
        late = await post(client, {"slo_class": "fast", "service_s": 0.01}, stream=True)
        lowered = learned(limits)
        offered = len(state.received)
        refused = await post(client, {"slo_class": "fast"})
        forwarded = len(state.received) - offered
        looser = await post(client, {"slo_class": "slow"})
        state.held.set()
        done = await asyncio.gather(*held)
        after = await post(client, {"slo_class": "fast"})
        return on_time, unlimited, late, lowered, refused, forwarded, looser, done, after

    on_time, unlimited, late, lowered, refused, forwarded, looser, done, after = run(
        app, scenario)
    assert on_time.status_code == late.status_code == 200
    assert unlimited == {"fast": 4096, "slow": 4096}  # nothing late yet: no limit
    # five fast in flight when the fast class's first token came late: 5 x 0.9
    assert lowered == {"fast": 4, "slow": 4096}
    assert refused.status_code == 503 and refused.headers["x-slo-class"] == "fast"
    assert int(refused.headers["retry-after"]) >= 1
    message = refused.json()["error"]["message"]
    assert Rejection.from_message(message).reason == "concurrency_limit", message
    assert "4 requests in flight ahead of it" in message
    assert forwarded == 0  # refused at the door
    assert looser.status_code == 200  # the slow class's limit learned nothing late
    assert [r.status_code for r in done] == [200] * 4 and after.status_code == 200
    assert gauge("policies:frontend_late_reports_total", what="ttft") - late_before == 1
    assert gauge("policies:frontend_limit_rejections_total",
                 slo_class="fast") - refused_before == 1
    assert gauge("policies:frontend_concurrency_limit", slo_class="fast") == 4
    assert gauge("policies:frontend_concurrency_limit", slo_class="slow") == 4096
    assert gauge("policies:frontend_in_flight") == 0


def test_a_demoted_stream_is_judged_at_the_door_by_the_class_it_was_served_in():
    app, state = stand_in({"pipeline": "slo", "slo": {"classes": CLASSES}})

    async def scenario(client):
        await post(client, {"slo_class": "slow"})
        limits = door_limits(app)
        demoted = await post(client, {"slo_class": "fast", "judged": ["slow", "fast"],
                                      "service_s": 0.01}, stream=True)
        kept = learned(limits)
        late = await post(client, {"slo_class": "fast", "judged": ["fast", None],
                                   "service_s": 0.01}, stream=True)
        return demoted, kept, late, learned(limits)

    demoted, kept, late, lowered = run(app, scenario)
    assert demoted.headers["x-slo-demoted-from"] == "fast" and late.status_code == 200
    # served as slow (100 s): on time, whatever fast's 1 ms asked
    assert kept == {"fast": 4096, "slow": 4096}
    assert lowered["fast"] < 4096 and lowered["slow"] == 4096  # served as fast: late


def test_with_fairness_a_quiet_team_passes_the_door_a_noisy_team_filled():
    app, state = stand_in({"pipeline": "slo", "slo": {
        "classes": CLASSES, "tenants": {"acme": "fast", "globex": "fast"},
        "fairness": {"weights": {"acme": 1, "globex": 1}}}})

    async def scenario(client):
        state.held = asyncio.Event()
        await post(client, {"tenant": "globex"})
        limits = door_limits(app)
        held = [asyncio.create_task(post(client, {"hold": True, "tenant": "globex"}))
                for _ in range(4)]
        await until(lambda: limits.in_flight == 4)
        late = await post(client, {"service_s": 0.01, "tenant": "globex"}, stream=True)
        lowered = learned(limits)["fast"]
        noisy = await post(client, {"tenant": "globex"})
        quiet = await post(client, {"tenant": "acme"})
        state.held.set()
        await asyncio.gather(*held)
        return late, lowered, noisy, quiet

    late, lowered, noisy, quiet = run(app, scenario)
    assert late.status_code == 200 and lowered == 4
    assert noisy.status_code == 503 and "concurrency_limit" in noisy.text  # its 4 fill it
    assert quiet.status_code == 200  # same class, below its half of the places


@pytest.mark.parametrize("stream", [False, True])
def test_an_engine_refusal_leaves_the_doors_limit_alone(stream):
    """The engine refusing a request (for its targets or a full queue) is its admission at
    work, not lateness: the door's limit neither falls nor grows, and nothing counts late."""
    app, state = stand_in({"pipeline": "slo", "slo": {"classes": CLASSES}})
    late_before = {what: gauge("policies:frontend_late_reports_total", what=what)
                   for what in ("ttft", "tpot")}

    async def scenario(client):
        state.held = asyncio.Event()
        full = await post(client, {"slo_class": "slow", "reject": "queue_full"}, stream)
        limits = door_limits(app)
        held = [asyncio.create_task(post(client, {"hold": True, "slo_class": "slow"}))
                for _ in range(3)]
        await until(lambda: limits.in_flight == 3)
        refused = await post(client, {"slo_class": "slow", "reject": "slo_ttft:slow"}, stream)
        after = learned(limits)["slow"]
        state.held.set()
        await asyncio.gather(*held)
        return full, refused, after

    full, refused, after = run(app, scenario)
    assert full.status_code == refused.status_code == 503
    assert "slo_ttft" in refused.text and refused.headers["x-slo-class"] == "slow"
    assert after == 4096
    assert all(gauge("policies:frontend_late_reports_total", what=what) == before
               for what, before in late_before.items())


def test_without_the_slo_preset_there_is_no_gate():
    app, _ = stand_in({})
    run(app, lambda client: post(client, {}))
    assert policy_middleware(app)._setup.frontend is None
