"""The rejection channel: each rejected request's `Rejection`, from the engine to the HTTP layer.

vLLM 0.32 drops a rejected request's ``stop_reason`` on the way out for streams and
for the Responses and Anthropic Messages formats (a stream of only ``data: [DONE]``,
or a 200 with empty output), so the HTTP layer cannot tell why a request produced
nothing. The channel says it, out of band:

* the middleware (`integrations.vllm_v1.serving.middleware`) gives each
  engine-bound request a random ticket, which it writes into the body's
  ``vllm_xargs`` (`TICKET_KEY`), so the engine sees it in ``extra_args``;
* `RejectionChannelHook`, a `SchedulerHook` in the engine-core process, sends
  ``ticket, stop_reason`` for every rejected request that carries a ticket over a
  ZeroMQ PUSH socket, before the engine returns the request's (empty) output;
* `RejectionBook`, in the API server, binds the PULL end, keeps what arrives for the
  tickets of requests in flight, and lets the middleware wait (briefly) for one.

The channel only explains a response that produced nothing; it never turns a
response with output into an error. Configuration (our ``--additional-config``
entry; `integrations.vllm_v1.serving.server.server_args` sets both)::

    "hooks": ["integrations.vllm_v1.serving.rejection_channel:RejectionChannelHook"],
    "rejection_channel": "ipc://@some-unique-name"

One API server binds the address; a second one on the same address (vLLM's
``--api-server-count`` > 1) logs a warning and answers its streamed rejections
without the reason, as without the channel.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

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
"""Messages the engine side queues before it drops (and counts) further ones."""
_LOG = logging.getLogger("vllm.llm_serving_policies")


def new_channel_address() -> str:
    """A fresh ZeroMQ address: an abstract Unix socket on Linux (nothing to clean up)."""
    name = f"llm-serving-policies-{uuid.uuid4().hex}"
    if sys.platform == "linux":
        return f"ipc://@{name}"
    return f"ipc://{Path(tempfile.gettempdir()) / name}.sock"


def channel_address(entry: Any) -> str | None:
    """The channel address our config entry names, if any (checked)."""
    address = entry.get(CHANNEL_KEY) if hasattr(entry, "get") else None
    if address is not None and (not isinstance(address, str)
                                or not address.startswith(("ipc://", "tcp://"))):
        raise PipelineConfigError(f"{CONFIG_KEY}.{CHANNEL_KEY} must be a ZeroMQ address "
                                  f"('ipc://...' or 'tcp://...'), got {address!r}")
    return address


class RejectionChannelHook(SchedulerHook):
    """Engine side: sends each rejected request's ticket and `Rejection` to the API server."""

    def __init__(self, scheduler: SchedulerAccess) -> None:
        import zmq

        address = channel_address(config_entry(scheduler.vllm_config.additional_config))
        if address is None:
            raise PipelineConfigError(f"{CONFIG_KEY}.{CHANNEL_KEY} must name the channel's "
                                      "address for RejectionChannelHook")
        self._zmq = zmq
        self._context = zmq.Context(io_threads=1)
        self._socket = self._context.socket(zmq.PUSH)
        self._socket.setsockopt(zmq.SNDHWM, MAX_PENDING_SENDS)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.connect(address)
        self.dropped = 0
        """Rejections not sent: the channel was full (logged once)."""

    def on_rejected(self, request: Any, rejection: Rejection) -> None:
        """``request`` was rejected (called by the scheduler once per rejection)."""
        self._publish(request, rejection)

    def _publish(self, request: Any, rejection: Rejection) -> None:
        params = getattr(request, "sampling_params", None)
        ticket = (getattr(params, "extra_args", None) or {}).get(TICKET_KEY)
        if not isinstance(ticket, str):
            return
        try:
            self._socket.send(f"{ticket}\n{rejection.stop_reason}".encode(), self._zmq.NOBLOCK)
        except self._zmq.Again:
            if not self.dropped:
                _LOG.warning("rejection channel full: streamed rejections lose their reason")
            self.dropped += 1

    def shutdown(self, now: float) -> None:
        self._socket.close(linger=0)
        self._context.term()


class RejectionBook:
    """API side: the rejections the engine reported for tickets of requests in flight."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._entries: dict[str, list[Any]] = {}
        """ticket -> [Rejection or None, asyncio.Event or None]."""
        self._socket: Any = None
        self._reader: asyncio.Task | None = None

    def start(self) -> bool:
        """Bind the channel and start reading it (on the running loop); False if taken."""
        if self._reader is not None:
            return True
        import zmq
        import zmq.asyncio

        socket = zmq.asyncio.Context.instance().socket(zmq.PULL)
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
        self._reader = asyncio.get_running_loop().create_task(self._read())
        return True

    @property
    def running(self) -> bool:
        return self._reader is not None and not self._reader.done()

    def expect(self) -> str:
        """A new ticket, whose rejection (if any) the book keeps until `forget`."""
        ticket = secrets.token_hex(16)
        self._entries[ticket] = [None, None]
        return ticket

    def forget(self, ticket: str) -> None:
        self._entries.pop(ticket, None)

    def get(self, ticket: str) -> Rejection | None:
        entry = self._entries.get(ticket)
        return None if entry is None else entry[0]

    async def wait(self, ticket: str, timeout_s: float) -> Rejection | None:
        """The ticket's rejection, waiting up to ``timeout_s`` for it to arrive."""
        entry = self._entries.get(ticket)
        if entry is None or entry[0] is not None or not self.running:
            return None if entry is None else entry[0]
        if entry[1] is None:
            entry[1] = asyncio.Event()
        try:
            await asyncio.wait_for(entry[1].wait(), timeout_s)
        except TimeoutError:
            return None
        return entry[0]

    async def _read(self) -> None:
        while True:
            message = await self._socket.recv()
            ticket, _, stop_reason = message.decode("utf-8", "replace").partition("\n")
            entry = self._entries.get(ticket)
            rejection = Rejection.parse(stop_reason)
            if entry is None or rejection is None:
                continue  # not a request in flight here, or not ours
            entry[0] = rejection
            if entry[1] is not None:
                entry[1].set()

    def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        if self._socket is not None:
            self._socket.close(linger=0)
