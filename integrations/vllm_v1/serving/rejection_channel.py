"""The channel between the engine and the API server: rejections, classes judged, first tokens.

vLLM 0.32 drops a rejected request's ``stop_reason`` on the way out for streams and
for the Responses and Anthropic Messages formats (a stream of only ``data: [DONE]``,
or a 200 with empty output), so the HTTP layer cannot tell why a request produced
nothing; and neither side sees the other's part of a request's latency. The channel
carries both, out of band, keyed by a per-request ticket:

* the middleware (`integrations.vllm_v1.serving.middleware`) gives each
  engine-bound request a random ticket, which it writes into the body's
  ``vllm_xargs`` (`TICKET_KEY`), so the engine sees it in ``extra_args``;
* `RejectionChannelHook`, a `SchedulerHook` in the engine-core process, sends over a
  ZeroMQ PUSH socket ``ticket, stop_reason`` for every rejected request that carries a
  ticket (before the engine returns the request's empty output) and, where the
  admission policy judges classes (`JudgesClasses`, the ``slo`` preset), the class each
  admitted request is judged in (`Judged`);
* `RejectionBook`, in the API server, binds the PULL end, keeps what arrives for the
  tickets of requests in flight, and lets the middleware wait (briefly) for it;
* back the other way, the book sends the wall-clock time at which a stream's first
  token left the API server (PUSH, connected to `first_token_address`), and the hook
  drains those once per step into the admission policy (`HearsClientFirstTokens`).

The channel only explains a response that produced nothing; it never turns a
response with output into an error. Both ends keep bounded state: messages that
find the channel full are dropped and counted. Configuration (our
``--additional-config`` entry; `integrations.vllm_v1.serving.server.server_args`
sets both; the reverse address is derived from it)::

    "hooks": ["integrations.vllm_v1.serving.rejection_channel:RejectionChannelHook"],
    "rejection_channel": "ipc://@some-unique-name"

One API server binds the address; a second one on the same address (vLLM's
``--api-server-count`` > 1) logs a warning and answers its streamed rejections
without the reason, as without the channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import secrets
import sys
import tempfile
import uuid
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import attrs

from integrations.vllm_v1.config.declarative import PipelineConfigError
from integrations.vllm_v1.config.spec import CONFIG_KEY, config_entry
from integrations.vllm_v1.hooks import SchedulerAccess, SchedulerHook
from integrations.vllm_v1.rejection import Rejection

CHANNEL_KEY = "rejection_channel"
"""Our config entry's key for the channel's ZeroMQ address."""
HOOK_PATH = "integrations.vllm_v1.serving.rejection_channel:RejectionChannelHook"
"""How the hook is named in the entry's ``hooks``."""
TICKET_KEY = "llm_serving_policies_ticket"
"""The ``vllm_xargs`` key that carries a request's ticket to the engine."""
MAX_PENDING_SENDS = 100_000
"""Messages either side queues before it drops (and counts) further ones."""
MAX_DRAIN_PER_STEP = 10_000
"""First-token reports the engine reads in one step at most (the rest wait a step)."""
RETAIN_FINISHED_S = 60.0
"""How long the engine keeps a finished request's ticket for its first-token report."""
MAX_RETAINED_FINISHED = 65_536
"""Finished requests' tickets kept at most (the oldest are forgotten first)."""
FIRST_TOKEN_SUFFIX = "-first-token"
_ADMITTED = "admitted:"
_STREAM_END = "end:"
_LOG = logging.getLogger("vllm.llm_serving_policies")


def new_channel_address() -> str:
    """A fresh ZeroMQ address: an abstract Unix socket on Linux (nothing to clean up)."""
    name = f"llm-serving-policies-{uuid.uuid4().hex}"
    if sys.platform == "linux":
        return f"ipc://@{name}"
    return f"ipc://{Path(tempfile.gettempdir()) / name}.sock"


def first_token_address(address: str) -> str:
    """The reverse channel's address (API server -> engine), derived from the channel's:
    the same IPC name with `FIRST_TOKEN_SUFFIX`, or the next TCP port.

    Raises:
        PipelineConfigError: a TCP address whose port has no next port.
    """
    if address.startswith("tcp://"):
        host, _, port = address.removeprefix("tcp://").rpartition(":")
        if not port.isdigit() or not 0 < int(port) < 65535:
            raise PipelineConfigError(f"{CONFIG_KEY}.{CHANNEL_KEY} must name a TCP port below "
                                      f"65535 (the next one carries first tokens), got "
                                      f"{address!r}")
        return f"tcp://{host}:{int(port) + 1}"
    return address + FIRST_TOKEN_SUFFIX


def channel_address(entry: Any) -> str | None:
    """The channel address our config entry names, if any (checked)."""
    address = entry.get(CHANNEL_KEY) if hasattr(entry, "get") else None
    if address is not None and (not isinstance(address, str)
                                or not address.startswith(("ipc://", "tcp://"))):
        raise PipelineConfigError(f"{CONFIG_KEY}.{CHANNEL_KEY} must be a ZeroMQ address "
                                  f"('ipc://...' or 'tcp://...'), got {address!r}")
    if address is not None:
        first_token_address(address)
    return address


# -- messages ----------------------------------------------------------------------


@attrs.frozen
class Judged:
    """The class an admitted request is judged in, and the one it asked for when demoted
    (None: not demoted). ``slo_class`` None: admitted without a class."""

    slo_class: str | None
    demoted_from: str | None = None

    def headers(self) -> list[tuple[bytes, bytes]]:
        """``x-slo-class`` and, when demoted, ``x-slo-demoted-from`` (names that are not
        printable ASCII are left out)."""
        found = [(b"x-slo-class", self.slo_class), (b"x-slo-demoted-from", self.demoted_from)]
        return [(name, value.encode("ascii")) for name, value in found
                if value is not None and value.isascii() and value.isprintable()]


def encode_rejection(ticket: str, rejection: Rejection) -> bytes:
    """Engine -> API server: ``ticket``'s request was rejected."""
    return f"{ticket}\n{rejection.stop_reason}".encode()


def encode_judged(ticket: str, judged: Judged) -> bytes:
    """Engine -> API server: ``ticket``'s request was admitted, judged as ``judged``."""
    return f"{ticket}\n{_ADMITTED}{json.dumps([judged.slo_class, judged.demoted_from])}".encode()


def decode_engine_word(message: bytes) -> tuple[str, Rejection | Judged] | None:
    """(ticket, what the engine said of it) from `encode_rejection` or `encode_judged`;
    None for anything else."""
    ticket, _, text = message.decode("utf-8", "replace").partition("\n")
    if text.startswith(_ADMITTED):
        try:
            judged, asked = json.loads(text.removeprefix(_ADMITTED))
        except (ValueError, TypeError):
            return None
        if not all(v is None or isinstance(v, str) for v in (judged, asked)):
            return None
        return ticket, Judged(judged, asked)
    rejection = Rejection.parse(text)
    return None if rejection is None else (ticket, rejection)


def encode_first_token(ticket: str, sent_s: float) -> bytes:
    """API server -> engine: ``ticket``'s first token left at ``sent_s`` (wall clock)."""
    return f"{ticket}\n{sent_s!r}".encode()


def decode_first_token(message: bytes) -> tuple[str, float] | None:
    """(ticket, sent_s) from `encode_first_token`; None for anything else."""
    ticket, _, text = message.decode("utf-8", "replace").partition("\n")
    try:
        sent_s = float(text)
    except ValueError:
        return None
    return (ticket, sent_s) if ticket and math.isfinite(sent_s) else None


def encode_stream_end(ticket: str, first_s: float, last_s: float, chunks: int) -> bytes:
    """API server -> engine: ``ticket``'s stream sent ``chunks`` chunks with output, the first
    at ``first_s`` and the last at ``last_s`` (wall clock)."""
    return f"{_STREAM_END}{ticket}\n{first_s!r}\n{last_s!r}\n{chunks}".encode()


def decode_stream_end(message: bytes) -> tuple[str, float, float, int] | None:
    """(ticket, first_s, last_s, chunks) from `encode_stream_end`; None for anything else."""
    text = message.decode("utf-8", "replace")
    if not text.startswith(_STREAM_END):
        return None
    fields = text.removeprefix(_STREAM_END).split("\n")
    try:
        ticket, first_s, last_s, chunks = fields[0], float(fields[1]), float(fields[2]), int(
            fields[3])
    except (IndexError, ValueError):
        return None
    if not ticket or not (math.isfinite(first_s) and math.isfinite(last_s)) or (
            last_s < first_s or chunks < 1):
        return None
    return ticket, first_s, last_s, chunks


# -- engine side -----------------------------------------------------------------


@runtime_checkable
class JudgesClasses(Protocol):
    """An admission policy that says which class an admitted request is judged in."""

    def judged_class(self, request_id: str) -> tuple[str, str | None] | None:
        """(class judged, class asked for when demoted, else None); None when unjudged."""
        ...


@runtime_checkable
class HearsClientFirstTokens(Protocol):
    """An admission policy that learns when first tokens reached the client."""

    def on_client_first_token(self, request_id: str, sent_s: float) -> None:
        """``request_id``'s first token left the API server at ``sent_s`` (wall clock)."""
        ...


@runtime_checkable
class HearsClientStreams(Protocol):
    """An admission policy that learns how fast streams reached the client."""

    def on_client_stream_end(self, request_id: str, first_s: float, last_s: float,
                             chunks: int) -> None:
        """``request_id``'s stream sent ``chunks`` chunks with output, the first at
        ``first_s`` and the last at ``last_s`` (wall clock)."""
        ...


def request_ticket(request: Any) -> str | None:
    """The ticket in a vLLM request's ``extra_args``, if any."""
    params = getattr(request, "sampling_params", None)
    ticket = (getattr(params, "extra_args", None) or {}).get(TICKET_KEY)
    return ticket if isinstance(ticket, str) else None


@attrs.frozen(kw_only=True)
class ChannelHookStats:
    """A snapshot of a `RejectionChannelHook`."""

    dropped: int
    """Messages to the API server not sent: the channel was full."""
    first_tokens: int
    """First-token reports passed to the admission policy."""
    stream_ends: int
    """Stream-end reports passed to the admission policy."""
    unmatched: int
    """First-token reports for a ticket the engine no longer (or never) knew."""
    expired: int
    """Finished requests forgotten without a first-token report (non-streaming ones, or
    reports that came later than `RETAIN_FINISHED_S`)."""
    tracked: int
    """Tickets the engine keeps now (requests in flight, and finished ones for a while)."""


class RejectionChannelHook(SchedulerHook):
    """Engine side: sends each rejected request's `Rejection` and each admitted request's
    `Judged` class to the API server; hands first-token reports to the admission policy.

    ``sockets`` (PUSH to the API server, PULL from it) replace the ZeroMQ ones (tests).
    """

    def __init__(self, scheduler: SchedulerAccess, sockets: tuple[Any, Any] | None = None
                 ) -> None:
        import zmq

        address = channel_address(config_entry(scheduler.vllm_config.additional_config))
        if address is None:
            raise PipelineConfigError(f"{CONFIG_KEY}.{CHANNEL_KEY} must name the channel's "
                                      "address for RejectionChannelHook")
        self._zmq = zmq
        self._context = None
        if sockets is None:
            self._context = zmq.Context(io_threads=1)
            sockets = (self._context.socket(zmq.PUSH), self._context.socket(zmq.PULL))
            sockets[0].setsockopt(zmq.SNDHWM, MAX_PENDING_SENDS)
            for socket in sockets:
                socket.setsockopt(zmq.LINGER, 0)
            sockets[1].setsockopt(zmq.RCVHWM, MAX_PENDING_SENDS)
            sockets[0].connect(address)
            sockets = (sockets[0], _bound(sockets[1], first_token_address(address)))
        self._push, self._pull = sockets
        admission = scheduler.pipeline.admission
        self._judge = admission if isinstance(admission, JudgesClasses) else None
        self._hears = admission if isinstance(admission, HearsClientFirstTokens) else None
        self._streams = admission if isinstance(admission, HearsClientStreams) else None
        self._clock = scheduler.clock
        self._requests: dict[str, str] = {}
        """ticket -> request id, from arrival until forgotten."""
        self._finished: OrderedDict[str, float] = OrderedDict()
        """ticket -> when its request finished, oldest first."""
        self._unannounced: list[tuple[str, str]] = []
        """(ticket, request id) admitted since the last step."""
        self._counts: Counter[str] = Counter()
        self._counters = None if scheduler.metrics is None else _hook_counters()

    def on_arrival(self, request: Any) -> None:
        ticket = request_ticket(request)
        if ticket is not None and self._hears is not None:
            self._requests[ticket] = request.request_id

    def on_rejected(self, request: Any, rejection: Rejection) -> None:
        """``request`` was rejected (called by the scheduler once per rejection)."""
        ticket = request_ticket(request)
        if ticket is not None:
            self._requests.pop(ticket, None)
            self._finished.pop(ticket, None)
            self._send(encode_rejection(ticket, rejection))

    def on_admitted(self, request: Any, tenant: str) -> None:
        """Announce the request's class at the next step: the admission policy hears of the
        admission after the hooks do."""
        ticket = request_ticket(request)
        if ticket is not None and self._judge is not None:
            self._unannounced.append((ticket, request.request_id))

    @contextlib.contextmanager
    def releasing(self, request: Any, *, preempted: bool) -> Iterator[None]:
        ticket = request_ticket(request)
        if not preempted and ticket in self._requests:
            self._finished[ticket] = self._clock()
            self._finished.move_to_end(ticket)
        yield

    def before_schedule(self, now: float) -> None:
        """Send the classes of the requests admitted since the last step; hand the
        first-token reports that arrived to the admission policy (non-blocking); forget
        finished requests kept past `RETAIN_FINISHED_S`."""
        announce, self._unannounced = self._unannounced, []
        for ticket, request_id in announce:
            judged = self._judge.judged_class(request_id)
            self._send(encode_judged(ticket, Judged(*judged) if judged else Judged(None)))
        for _ in range(MAX_DRAIN_PER_STEP if self._pull is not None else 0):
            try:
                message = self._pull.recv(self._zmq.NOBLOCK)
            except self._zmq.Again:
                break
            end = decode_stream_end(message)
            if end is not None:
                self._stream_end(end)
            else:
                self._first_token(decode_first_token(message))
        while self._finished and (len(self._finished) > MAX_RETAINED_FINISHED or next(
                iter(self._finished.values())) < now - RETAIN_FINISHED_S):
            ticket, _ = self._finished.popitem(last=False)
            self._requests.pop(ticket, None)
            self._count("expired")

    def _first_token(self, report: tuple[str, float] | None) -> None:
        request_id = None if report is None else self._requests.get(report[0])
        if request_id is None:
            self._count("unmatched")
            return
        if self._streams is None:  # no stream-end report to wait for
            self._requests.pop(report[0], None)
            self._finished.pop(report[0], None)
        if self._hears is not None:
            self._hears.on_client_first_token(request_id, report[1])
        self._count("first_tokens")

    def _stream_end(self, report: tuple[str, float, float, int]) -> None:
        ticket, first_s, last_s, chunks = report
        request_id = self._requests.pop(ticket, None)
        self._finished.pop(ticket, None)
        if request_id is None:
            self._count("unmatched")
            return
        if self._streams is not None:
            self._streams.on_client_stream_end(request_id, first_s, last_s, chunks)
        self._count("stream_ends")

    def _count(self, what: str) -> None:
        self._counts[what] += 1
        if self._counters is not None and what in self._counters:
            self._counters[what].inc()

    def _send(self, message: bytes) -> None:
        try:
            self._push.send(message, self._zmq.NOBLOCK)
        except self._zmq.Again:
            if not self._counts["dropped"]:
                _LOG.warning("rejection channel full: streamed rejections lose their reason "
                             "and responses their SLO class")
            self._count("dropped")

    def stats(self) -> ChannelHookStats:
        """A frozen snapshot (see `ChannelHookStats`)."""
        return ChannelHookStats(dropped=self._counts["dropped"],
                                first_tokens=self._counts["first_tokens"],
                                stream_ends=self._counts["stream_ends"],
                                unmatched=self._counts["unmatched"],
                                expired=self._counts["expired"], tracked=len(self._requests))

    def shutdown(self, now: float) -> None:
        for socket in (self._push, self._pull):
            if socket is not None:
                socket.close(linger=0)
        if self._context is not None:
            self._context.term()


def _bound(socket: Any, address: str) -> Any:
    """``socket`` bound to ``address``; None (closed) when another engine holds it."""
    import zmq

    try:
        socket.bind(address)
    except zmq.ZMQError as error:
        socket.close(linger=0)
        _LOG.warning("first-token channel %s not bound (%s): this engine does not hear when "
                     "first tokens reach clients", address, error)
        return None
    return socket


def _hook_counters() -> dict[str, Any]:
    """The hook's Prometheus counters (multiprocess mode: written to the metrics directory)."""
    from prometheus_client import Counter as PromCounter

    lost = PromCounter("policies:slo_channel_lost", "Channel messages lost, by what: dropped "
                       "(the channel to the API server was full), unmatched (a first-token "
                       "report for a request the engine no longer knew)", ["what"],
                       registry=None)
    forgotten = PromCounter("policies:slo_channel_forgotten", "Finished requests the engine "
                            "forgot without a first-token report (every non-streaming one, and "
                            "streams whose report came too late)", registry=None)
    return {"dropped": lost.labels(what="dropped"), "unmatched": lost.labels(what="unmatched"),
            "expired": forgotten}


# -- API server side ---------------------------------------------------------------


@attrs.define(eq=False)
class _Entry:
    rejection: Rejection | None = None
    judged: Judged | None = None
    event: asyncio.Event | None = None
    """Set (and cleared away) when a message arrives; created by a waiter."""
    on_word: Callable[[], None] | None = None
    """Called once, on the engine's first message about the ticket."""


class RejectionBook:
    """API side: what the engine said of the tickets of requests in flight (`Rejection`,
    `Judged`), and the first-token reports back to it."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._entries: dict[str, _Entry] = {}
        self._socket: Any = None
        self._reports: Any = None
        self._reader: asyncio.Task | None = None
        self.dropped_reports = 0
        """First-token reports not sent: the reverse channel was full."""
        self.hears_classes = False
        """Whether the engine has announced a class (its admission judges classes)."""

    def start(self) -> bool:
        """Bind the channel and start reading it (on the running loop); False if taken."""
        if self._reader is not None:
            return True
        import zmq
        import zmq.asyncio

        context = zmq.asyncio.Context.instance()
        socket = context.socket(zmq.PULL)
        socket.setsockopt(zmq.LINGER, 0)
        try:
            socket.bind(self.address)
        except zmq.ZMQError as error:
            socket.close()
            _LOG.warning("rejection channel %s not bound (%s): rejections this API server "
                         "cannot see in the response are answered without their reason",
                         self.address, error)
            return False
        self._socket = socket
        self._reports = context.socket(zmq.PUSH)
        self._reports.setsockopt(zmq.LINGER, 0)
        self._reports.setsockopt(zmq.SNDHWM, MAX_PENDING_SENDS)
        self._reports.connect(first_token_address(self.address))
        self._reader = asyncio.get_running_loop().create_task(self._read())
        return True

    @property
    def running(self) -> bool:
        return self._reader is not None and not self._reader.done()

    def expect(self, on_word: Callable[[], None] | None = None) -> str:
        """A new ticket, whose messages the book keeps until `forget`; ``on_word`` is called
        once, when the engine first says something of it (admitted or rejected)."""
        ticket = secrets.token_hex(16)
        self._entries[ticket] = _Entry(on_word=on_word)
        return ticket

    def forget(self, ticket: str) -> None:
        self._entries.pop(ticket, None)

    def get(self, ticket: str) -> Rejection | None:
        entry = self._entries.get(ticket)
        return None if entry is None else entry.rejection

    def judged(self, ticket: str) -> Judged | None:
        """The class the engine judged the ticket's request in, if it said so yet."""
        entry = self._entries.get(ticket)
        return None if entry is None else entry.judged

    async def wait(self, ticket: str, timeout_s: float) -> Rejection | None:
        """The ticket's rejection, waiting up to ``timeout_s`` for it to arrive."""
        return await self._wait(ticket, timeout_s, lambda entry: entry.rejection)

    async def wait_judged(self, ticket: str, timeout_s: float) -> Judged | None:
        """The ticket's `Judged`, waiting up to ``timeout_s`` for it to arrive."""
        return await self._wait(ticket, timeout_s, lambda entry: entry.judged)

    async def _wait(self, ticket: str, timeout_s: float, read: Callable[[_Entry], Any]) -> Any:
        entry = self._entries.get(ticket)
        if entry is None:
            return None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while read(entry) is None and self.running:
            if entry.event is None:
                entry.event = asyncio.Event()
            try:
                await asyncio.wait_for(entry.event.wait(), deadline - loop.time())
            except TimeoutError:
                break
        return read(entry)

    def report_first_token(self, ticket: str, sent_s: float) -> None:
        """Tell the engine that ``ticket``'s first token left at ``sent_s`` (never blocks)."""
        self._report(encode_first_token(ticket, sent_s))

    def report_stream_end(self, ticket: str, first_s: float, last_s: float,
                          chunks: int) -> None:
        """Tell the engine how ``ticket``'s stream went out (`encode_stream_end`; never
        blocks)."""
        self._report(encode_stream_end(ticket, first_s, last_s, chunks))

    def _report(self, message: bytes) -> None:
        if self._reports is None:
            return
        import zmq

        try:
            self._reports.send(message, zmq.NOBLOCK)
        except zmq.Again:
            self.dropped_reports += 1

    async def _read(self) -> None:
        while True:
            self.receive(await self._socket.recv())

    def receive(self, message: bytes) -> None:
        """Keep what ``message`` says of a ticket in flight (others are ignored)."""
        word = decode_engine_word(message)
        entry = None if word is None else self._entries.get(word[0])
        if entry is None:
            return  # not a request in flight here, or not ours
        if isinstance(word[1], Rejection):
            entry.rejection = word[1]
        else:
            entry.judged = word[1]
            self.hears_classes = True
        if entry.on_word is not None:
            on_word, entry.on_word = entry.on_word, None
            on_word()
        if entry.event is not None:
            event, entry.event = entry.event, None
            event.set()

    def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        for socket in (self._socket, self._reports):
            if socket is not None:
                socket.close(linger=0)
