"""`Drain`: on ``SIGTERM`` the API server finishes what it serves before it stops.

vLLM's own ``SIGTERM`` handler aborts every request in flight (its streams end with
``finish_reason: "abort"``). `PolicyMiddleware` installs `Drain` in its place at
start-up (vLLM's handler stays on ``SIGINT``). After ``SIGTERM``:

* a new request on an engine route gets **503** with ``Retry-After: 1``, and
  ``/health`` answers 503 (not ready), so a load balancer or Kubernetes sends new
  traffic elsewhere;
* requests in flight run to their end, for at most ``drain_grace_s`` seconds (our
  config entry, default `DEFAULT_GRACE_S`; 0: stop at once, as vLLM does);
* then the server stops as on ``SIGINT`` (vLLM's own shutdown).

Kubernetes' ``terminationGracePeriodSeconds`` must exceed ``drain_grace_s`` plus
the engine's shutdown, or the pod is killed mid-drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Iterator, Mapping
from typing import Any

import attrs

from integrations.vllm_v1.config.declarative import PipelineConfigError
from integrations.vllm_v1.config.spec import CONFIG_KEY

DRAIN_KEY = "drain_grace_s"
"""Our config entry's key for the grace period, in seconds."""
DEFAULT_GRACE_S = 30.0
HEALTH_PATHS = ("/health", "/ready")
"""Paths that report readiness: 503 while draining."""
_LOG = logging.getLogger("vllm.llm_serving_policies")


@attrs.define(eq=False, kw_only=True)
class Drain:
    """Counts the engine requests in flight; after `begin`, refuses new ones and stops the
    server once none is left or ``grace_s`` has passed."""

    grace_s: float = DEFAULT_GRACE_S
    draining: bool = attrs.field(default=False, init=False)
    in_flight: int = attrs.field(default=0, init=False)
    _idle: asyncio.Event | None = attrs.field(default=None, init=False, repr=False)

    @classmethod
    def from_entry(cls, entry: Mapping[str, Any]) -> Drain:
        """The drain our config entry asks for.

        Raises:
            PipelineConfigError: ``drain_grace_s`` is not a number >= 0.
        """
        grace = entry.get(DRAIN_KEY, DEFAULT_GRACE_S)
        if isinstance(grace, bool) or not isinstance(grace, int | float) or not 0 <= grace \
                < float("inf"):
            raise PipelineConfigError(f"{CONFIG_KEY}.{DRAIN_KEY} must be a number of seconds "
                                      f">= 0, got {grace!r}")
        return cls(grace_s=float(grace))

    def install(self) -> bool:
        """Take over ``SIGTERM`` on the running loop; False where signals cannot be handled
        (not the main thread, e.g. an app served in-process)."""
        try:
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, self.begin)
        except (RuntimeError, ValueError, NotImplementedError):
            return False
        return True

    def begin(self) -> None:
        """Stop admitting; stop the server when the requests in flight are done."""
        if self.draining:
            return
        self.draining = True
        _LOG.info("SIGTERM: draining %d request(s) in flight for up to %.0f s",
                  self.in_flight, self.grace_s)
        asyncio.get_running_loop().create_task(self._stop())

    async def _stop(self) -> None:
        if self.in_flight:
            self._idle = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), self.grace_s)
        _LOG.info("drained (%d request(s) still in flight): stopping", self.in_flight)
        os.kill(os.getpid(), signal.SIGINT)  # vLLM's own shutdown

    @contextlib.contextmanager
    def track(self) -> Iterator[None]:
        """Around one engine request: counted in flight until it has been answered."""
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1
            if not self.in_flight and self._idle is not None:
                self._idle.set()
