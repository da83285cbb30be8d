"""An asyncio client that plays timed requests against a live OpenAI server, recording each.

Every request is a streaming ``/v1/completions`` call with prompt token ids,
sent at its arrival time; the client records, in `RequestRecord` form so the
replay's metrics apply unchanged:

- the time of every streamed token chunk (TTFT is the first, TPOT comes from the
  first, the last and the server's completion-token count);
- ``completed`` when the stream ends with a finish reason;
- ``cancelled`` when the client closes the stream at ``cancel_after_s``;
- ``rejected`` for HTTP 429/503 (reason ``rejected:<reason>;retry_after_s=<s>``
  when a ``Retry-After`` came with it), for any other error status
  (``rejected:http_<status>``), and for a 200 stream that ends without a token
  (``rejected:empty_stream``, no Retry-After: vLLM 0.32 drops a streamed rejection's
  reason; our `integrations.vllm_v1.serving.middleware` turns such a stream into a
  503 with Retry-After, so this only happens on a server without it).

A sampler polls the server's ``/metrics`` for the waiting and running queues and
KV usage (`EngineSample`). Times are seconds from the run's start.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence

import aiohttp
import attrs

from benchmarks.replay.records import EngineSample, MaxTokens, RequestRecord
from benchmarks.replay.trace import TraceRequest
from integrations.vllm_v1.rejection import Rejection

LOG = logging.getLogger(__name__)
CLIENT_NICE = -5
"""The client's nice value while it plays (lower runs first). On a machine it shares with the
server, a client that waits for a CPU sends late and reads late, and times its own delay as the
server's; clients of a real server run on other machines."""
REJECTED_STATUSES = (429, 503)
STOP_TOKEN_ID = 3
"""The token that ends an answer whose length the client does not send (``max_tokens=
"context"``): outside the tiny models' special tokens (0-2)."""
_GAUGES = {"vllm:num_requests_waiting": "waiting", "vllm:num_requests_running": "running",
           "vllm:kv_cache_usage_perc": "kv_usage"}


@attrs.frozen(kw_only=True)
class LiveRequest:
    """One trace request as the live client sends it (lengths and times already scaled)."""

    request: TraceRequest
    """The workload's request; its ``arrival_s`` is the send time and its lengths the
    original ones, so records keep the workload's short/long classes."""
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    """The answer's length."""
    cancel_after_s: float | None = None
    deadline_ms: float | None = None


def request_body(live: LiveRequest, model: str, *, with_priority: bool,
                 max_tokens: MaxTokens = "output", max_model_len: int | None = None) -> dict:
    """The streaming completion request: token-id prompt, tenant and class in ``vllm_xargs``.

    ``priority`` is sent only when the server schedules by it (stock ``fcfs``
    refuses a non-zero priority). With ``max_tokens="context"`` the request asks for the
    rest of ``max_model_len``, as a client sending no ``max_tokens`` does, and its answer
    still ends at its length with a stop token (`STOP_TOKEN_ID`): ``min_tokens`` holds the
    stop token back until then and ``logit_bias`` makes it the next token after, as a
    model that has finished its answer emits end-of-sequence. The policies, which read
    ``max_tokens``, never see the length. (A client that closed the stream at the length
    instead left the engine decoding for a while after each close: 2.4x the tokens under
    load on the CPU engine.)
    """
    request = live.request
    xargs = {"tenant": request.tenant or "default", "slo_class": request.slo_class}
    if live.deadline_ms is not None:
        xargs["deadline_ms"] = live.deadline_ms
    hidden = max_tokens == "context"
    if hidden and max_model_len is None:
        raise ValueError("max_tokens='context' needs max_model_len")
    body = {"model": model, "prompt": list(live.prompt_token_ids), "max_tokens": live.max_tokens,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
            "vllm_xargs": {k: v for k, v in xargs.items() if v is not None}}
    if hidden:
        body.update(max_tokens=max_model_len - len(live.prompt_token_ids),
                    min_tokens=live.max_tokens - 1, stop_token_ids=[STOP_TOKEN_ID],
                    logit_bias={str(STOP_TOKEN_ID): 100})
    if with_priority:
        body["priority"] = request.priority
    return body


def _rejection_reason(status: int, text: str, retry_after: str | None) -> str:
    rejection = Rejection.from_message(text, float(retry_after or 0))
    if rejection is not None and retry_after:
        return rejection.stop_reason
    reason = rejection.reason if rejection else f"http_{status}"
    return f"rejected:{reason}" + (f";retry_after_s={retry_after}" if retry_after else "")


def _scaled_cached(usage: dict | None, live: LiveRequest) -> int:
    """Cached prompt tokens, rescaled from the live prompt to the workload's prompt length."""
    details = (usage or {}).get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens") or 0
    return round(cached / len(live.prompt_token_ids) * live.request.prompt_tokens)


async def _stream(response: aiohttp.ClientResponse, record: RequestRecord, live: LiveRequest,
                  clock: Callable[[], float]) -> tuple[str | None, dict | None]:
    """Read SSE events into ``record.token_times_s``; the finish reason and the usage."""
    finish, usage = None, None
    async for raw in response.content:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[6:])
        usage = event.get("usage") or usage
        for choice in event.get("choices") or ():
            if choice.get("text") is not None:  # a token may decode to no text yet
                record.token_times_s.append(clock())
            if choice.get("finish_reason"):
                finish = choice["finish_reason"]
                record.reason = choice.get("stop_reason") or ""
    return finish, usage


@attrs.define(eq=False)
class HttpReply:
    """What the HTTP layer answered one request (beside its `RequestRecord`)."""

    send_lag_s: float | None = None
    """How late the client sent it after its arrival time (its times are shifted by this)."""
    status: int | None = None
    """The response's HTTP status; None when no response came."""
    retry_after: str | None = None
    """The ``Retry-After`` header of a non-200 response."""
    body: str = ""
    """The start of a non-200 response's body (the reason a server gives)."""


REPLY_BODY_CHARS = 300


async def send(session: aiohttp.ClientSession, url: str, body: dict, live: LiveRequest,
               record: RequestRecord, start: float, reply: HttpReply | None = None) -> None:
    """Send one request at its arrival time and close ``record`` with its outcome (and fill
    ``reply``, if given, with what the HTTP layer answered).

    Token times are shifted so that the actual send time reads as the arrival
    time: a client that falls behind does not inflate TTFT.
    """
    reply = reply if reply is not None else HttpReply()
    await asyncio.sleep(max(0.0, start + live.request.arrival_s - time.perf_counter()))
    sent = time.perf_counter()
    reply.send_lag_s = sent - start - live.request.arrival_s

    def clock() -> float:
        return time.perf_counter() - sent + live.request.arrival_s

    try:
        async with asyncio.timeout(live.cancel_after_s):
            async with session.post(f"{url}/v1/completions", json=body) as response:
                reply.status = response.status
                if response.status != 200:
                    text = await response.text()
                    reply.retry_after = response.headers.get("Retry-After")
                    reply.body = text[:REPLY_BODY_CHARS]
                    record.finish("rejected", clock(), _rejection_reason(
                        response.status, text, response.headers.get("Retry-After")))
                    return
                finish, usage = await _stream(response, record, live, clock)
    except TimeoutError:
        record.finish("cancelled", clock(), "client_cancel")
        return
    except aiohttp.ClientError as error:
        record.finish("cancelled", clock(), f"client_error:{type(error).__name__}")
        return
    _close(record, live, finish, usage, clock())


def _close(record: RequestRecord, live: LiveRequest, finish: str | None, usage: dict | None,
           now: float) -> None:
    if not record.token_times_s:
        reason = record.reason if record.reason.startswith("rejected:") else (
            f"rejected:{finish or 'empty_stream'}")
        record.finish("rejected", now, reason)
        return
    record.first_scheduled_s = record.token_times_s[0]
    record.cached_tokens = _scaled_cached(usage, live)
    tokens = (usage or {}).get("completion_tokens") or len(record.token_times_s)
    # a slow reader gets several tokens in one chunk: count them all at the last chunk
    record.token_times_s.extend([record.token_times_s[-1]] * (tokens - len(record.token_times_s)))
    record.finish("completed" if finish in ("length", "stop") else "cancelled", now,
                  record.reason)


def parse_gauges(text: str, time_s: float) -> EngineSample:
    """An `EngineSample` from a Prometheus ``/metrics`` page (sums over label sets)."""
    values = {field: 0.0 for field in _GAUGES.values()}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in _GAUGES:
            values[_GAUGES[name]] += float(line.rsplit(" ", 1)[1])
    return EngineSample(time_s=time_s, kv_usage=values["kv_usage"],
                        waiting=int(values["waiting"]), running=int(values["running"]))


async def _sample(session: aiohttp.ClientSession, url: str, start: float, every_s: float,
                  samples: list[EngineSample], done: asyncio.Event) -> None:
    while not done.is_set():
        try:
            async with session.get(f"{url}/metrics") as response:
                samples.append(parse_gauges(await response.text(), time.perf_counter() - start))
        except aiohttp.ClientError:
            pass
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), every_s)


@contextlib.contextmanager
def client_priority(nice: int = CLIENT_NICE) -> Iterator[bool]:
    """Run the calling thread (and the threads it starts) at ``nice`` while open, restoring
    its old value after. Where raising a priority is not permitted (it needs CAP_SYS_NICE)
    it changes nothing, warns that the client's times include its own waits for a CPU, and
    yields False."""
    before = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, min(nice, before))
    except PermissionError:
        LOG.warning("the live client runs at normal priority (raising it needs CAP_SYS_NICE): "
                    "on a machine shared with the server its times include its own waits")
        yield False
        return
    try:
        yield True
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, before)


STALL_TICK_S = 0.02
STALL_MIN_S = 0.25
"""A wake-up this much later than asked counts as a machine stall."""


class StallWatch:
    """Stalls the client lives through while open: a thread that sleeps `STALL_TICK_S` and
    records each wake-up more than `STALL_MIN_S` late, as (start, seconds) on
    `time.perf_counter`.

    On a virtual machine whose host pauses it, every process stands still at once, the
    server's and the client's alike, and the requests in flight read seconds late whatever
    the system served (the client's own process held up reads the same). `stall_s` says how
    much of a run that was, so that a result can be told from the machine's pauses.
    """

    def __init__(self) -> None:
        self.stalls: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="stall-watch", daemon=True)

    def __enter__(self) -> StallWatch:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        last = time.perf_counter()
        while not self._stop.wait(STALL_TICK_S):
            now = time.perf_counter()
            if now - last > STALL_TICK_S + STALL_MIN_S:
                self.stalls.append((last, now - last - STALL_TICK_S))
            last = now

    @property
    def stall_s(self) -> float:
        """Seconds the machine stood still while watched."""
        return sum(seconds for _start, seconds in self.stalls)

    @property
    def longest_s(self) -> float:
        return max((seconds for _start, seconds in self.stalls), default=0.0)


async def play(url: str, model: str, requests: Sequence[LiveRequest], *, with_priority: bool,
               sample_every_s: float = 0.5, drain_timeout_s: float = 120.0,
               max_tokens: MaxTokens = "output", max_model_len: int | None = None,
               replies: Sequence[HttpReply] | None = None, fresh_connections: bool = False,
               ) -> tuple[list[RequestRecord], list[EngineSample]]:
    """Send every request at its arrival time; one closed record per request, and the samples.
    ``max_tokens`` and ``max_model_len``: as in `request_body`; ``replies``: one `HttpReply`
    per request, filled as it is answered; ``fresh_connections``: each request on a
    connection of its own (none kept alive for the next).

    Requests still open ``drain_timeout_s`` after the last arrival are cancelled
    (outcome ``cancelled``, reason ``client_timeout``), so every offered request
    ends completed, rejected or cancelled.
    """
    records = [RequestRecord.offered(live.request) for live in requests]
    samples: list[EngineSample] = []
    done = asyncio.Event()
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
    connector = aiohttp.TCPConnector(limit=0, force_close=fresh_connections)
    replies = replies if replies is not None else [HttpReply() for _ in requests]
    bodies = [request_body(live, model, with_priority=with_priority, max_tokens=max_tokens,
                           max_model_len=max_model_len) for live in requests]
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        start = time.perf_counter()  # after the bodies: building them is not the server's time
        sampler = asyncio.create_task(_sample(session, url, start, sample_every_s, samples, done))
        tasks = [asyncio.create_task(send(session, url, body, live, record, start, reply))
                 for body, live, record, reply in zip(bodies, requests, records, replies,
                                                      strict=True)]
        last_arrival_s = max((live.request.arrival_s for live in requests), default=0.0)
        await asyncio.wait(tasks, timeout=last_arrival_s + drain_timeout_s)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        done.set()
        await sampler
    now = time.perf_counter() - start
    for record in records:
        if record.outcome is None:
            record.finish("cancelled", now, "client_timeout")
    return records, samples
