"""Deadline scheduling: earliest deadline first by slack, with expiry and lateness.

A request's *slack* at ``now`` is the time it could still wait and finish by
its deadline:

    slack(now) = deadline_s - now - estimated_remaining_s(request)

Every waiting request's slack shrinks at the same rate (one second per
second), so ordering by slack at any ``now`` is ordering by the time-invariant
*latest start* ``deadline_s - estimated_remaining_s``: that is `EDFRanker`'s
``rank_key``, and heaps keyed by it never need re-sorting while requests wait.
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from policies.needs import Needs
from policies.validators import finite_non_negative, finite_positive, int_at_least
from policies.views import RequestView


@attrs.frozen(kw_only=True)
class EDFRanker:
    """Least slack first: a lower ``deadline - now - remaining work`` is served first.

    Ranks by the time-invariant key ``deadline_s - estimated_remaining_s``
    (the latest time the request can start and still finish by its deadline);
    ``effective_priority(request, now)`` is the slack, ``rank_key - now``.

    Guarantees:
        * At every ``now``, ordering by ``rank_key`` is ordering by slack: a
          waiting request's key does not change while it waits.
        * Among requests with equal remaining work, earlier deadlines are
          served first (plain EDF).
        * Expiry and lateness are monotone in time: once ``is_expired`` or
          ``is_late`` holds for a request that makes no progress, it holds at
          every later ``now``.
        * Requests without a deadline are ordered as if due
          ``default_deadline_s`` after arrival, but never expire and are never
          late: only a client's own deadline can get a request rejected or
          demoted.

    The remaining-work estimate is a linear model: the prompt tokens not yet
    computed times ``prefill_s_per_token`` plus the output tokens not yet
    generated times ``decode_s_per_token``. Defaults fit Llama-3-8B bf16 on one
    H100 under load (the replay's step-cost model, `benchmarks.replay.cost_model`): a 2,048-token prefill takes
    about 55 ms (27 µs a token, rounded up to 30 µs for sharing steps with
    decodes) and a request gets one output token per engine step, which lasts
    about 20 ms with ~128 running sequences at 2k context.
    """

    needs: ClassVar[Needs] = Needs(deadlines=True)

    prefill_s_per_token: float = attrs.field(default=3e-5, validator=finite_non_negative)
    """Seconds of service one not-yet-computed prompt token is estimated to need."""
    decode_s_per_token: float = attrs.field(default=0.02, validator=finite_non_negative)
    """Seconds one output token is estimated to take (one engine step under load)."""
    default_output_tokens: int = attrs.field(default=256, validator=int_at_least(0))
    """Output length assumed when a request does not say (``max_output_tokens is None``)."""
    max_estimated_output_tokens: int = attrs.field(default=1024, validator=int_at_least(0))
    """Cap on the output length assumed for any request.

    vLLM fills ``max_tokens`` with the rest of the context window when a client
    sends none, so an uncapped estimate would make such requests look minutes
    long and expire on arrival.
    """
    default_deadline_s: float = attrs.field(default=60.0, validator=finite_positive)
    """Relative deadline, from arrival, used to *order* requests that carry none."""

    def deadline_s(self, request: RequestView) -> float:
        """The absolute deadline used for ordering: the request's own, else arrival + default."""
        if request.deadline_s is not None:
            return request.deadline_s
        return request.arrival_s + self.default_deadline_s

    def estimated_output_tokens(self, request: RequestView) -> int:
        """Output tokens the request is assumed to produce in total."""
        total = (
            request.max_output_tokens
            if request.max_output_tokens is not None
            else self.default_output_tokens
        )
        return min(total, self.max_estimated_output_tokens)

    def estimated_remaining_s(self, request: RequestView) -> float:
        """Estimated seconds of service left: remaining prefill plus remaining decode, >= 0."""
        prefill_tokens = max(request.prompt_tokens - request.computed_tokens, 0)
        decode_tokens = max(self.estimated_output_tokens(request) - request.output_tokens, 0)
        return prefill_tokens * self.prefill_s_per_token + decode_tokens * self.decode_s_per_token

    def rank_key(self, request: RequestView) -> float:
        """Latest start time ``deadline_s - estimated_remaining_s``; constant while waiting."""
        return self.deadline_s(request) - self.estimated_remaining_s(request)

    def slack_s(self, request: RequestView, now: float) -> float:
        """Seconds the request could still wait at ``now`` and finish by its deadline."""
        return self.rank_key(request) - now

    def effective_priority(self, request: RequestView, now: float) -> float:
        """The slack at ``now`` in seconds; lower is served first."""
        return self.slack_s(request, now)

    def is_expired(self, request: RequestView, now: float) -> bool:
        """True if a request with a deadline and no output yet can no longer finish in time.

        That is, ``now + estimated_remaining_s > deadline_s`` before its first
        output token. The integration rejects such a *waiting* request with
        reason ``deadline_expired``. Requests without a deadline never expire.
        """
        return (
            request.deadline_s is not None
            and request.output_tokens == 0
            and self.slack_s(request, now) < 0
        )

    def is_late(self, request: RequestView, now: float) -> bool:
        """True if a request with a deadline has negative slack at ``now``.

        The integration demotes such a *running* request (see ``service_key``).
        Requests without a deadline are never late.
        """
        return request.deadline_s is not None and self.slack_s(request, now) < 0

    def service_key(self, request: RequestView, now: float) -> tuple[bool, float]:
        """Sort key with demotion: on-time requests by ``rank_key``, then late ones by ``rank_key``.

        ``(is_late(request, now), rank_key(request))``: sorted ascending, every
        late request comes after every on-time one, so the running list's tail
        (the preemption victim) is the latest late request. Lateness depends on
        ``now``, so this key is for lists re-sorted each step, not for heaps.
        """
        return (self.is_late(request, now), self.rank_key(request))
