"""`StepPrefillBudget`: a per-step bound on prefill tokens while protected requests decode.

Every request decoding in a step waits for the whole step, and a step costs about as much as
the tokens it pushes through the model: one 8,192-token prefill chunk makes the step, and so
the inter-token latency of every decode in it, several times longer than a decode-only step.
vLLM's per-request chunking (``long_prefill_token_threshold``) and `TokenBucket` bound what one
request gets; this bounds the step. While at least one protected request decodes, the prefill
chunks of one step together stay within ``max_prefill_tokens`` (interactive prompts apart, see
below); with nothing protected decoding, prefills get the whole token budget (work-conserving).
This is Sarathi-Serve's stall-free batching made conditional on who is decoding.
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from policies.needs import Needs
from policies.protocols import TokenCapPolicy
from policies.validators import at_least
from policies.views import LoadSnapshot, RequestView


@attrs.frozen(kw_only=True)
class StepPrefillBudgetStats:
    """A snapshot of a `StepPrefillBudget`."""

    protected_decoding: int
    """Protected requests whose prefill is done and that have not finished."""
    bounded_steps: int
    """Steps in which the bound applied (a protected request was decoding)."""
    capped_chunks: int
    """Prefill chunks given a cap below their remaining prompt."""
    tokens_withheld: int
    """Sum over capped chunks of the remaining prompt the cap held back this step."""


@attrs.define(eq=False, kw_only=True)
class StepPrefillBudget:
    """A token-cap policy: while a protected request decodes, one step's prefill chunks sum to
    at most ``max_prefill_tokens``, not counting interactive prompts.

    A request is *protected* when its priority is at most ``protected_priority_at_most`` (every
    request when it is ``None``) and *decoding* from the step its prefill completes until it
    finishes. A prefill chunk whose remaining prompt is at most ``interactive_prompt_tokens``
    is never capped (a short prompt's first token must not wait for a long one's chunks), but
    it counts against the step's bound, so long prefills get what is left. The step is the
    scheduler's `LoadSnapshot` (one object per step). Caps assume every granted token is
    scheduled, so the bound holds even when the scheduler schedules less.

    Guarantee: in a step where a protected request decodes, the chunks capped by this policy
    total at most the bound (``max_prefill_tokens``, or ``bound``'s cap for the request)
    minus what interactive prompts were granted before them.
    O(1) per call.
    """

    needs: ClassVar[Needs] = Needs(lifecycle=True)

    max_prefill_tokens: int = attrs.field(default=1024, validator=at_least(1))
    """Prefill tokens per step while a protected request decodes."""
    protected_priority_at_most: int | None = None
    """Requests with priority at most this are protected; ``None``: every request."""
    interactive_prompt_tokens: int = attrs.field(default=1024, validator=at_least(0))
    """A prefill chunk with at most this many prompt tokens left is never capped."""
    bound: TokenCapPolicy | None = None
    """Where the step's bound comes from instead of ``max_prefill_tokens``: its ``token_cap``
    for the request being capped (`SLOAdmission.token_cap`, the bound its TPOT targets
    allow on the learned step model)."""

    _decoding: set[str] = attrs.field(init=False, factory=set, repr=False)
    _step: LoadSnapshot | None = attrs.field(init=False, default=None, repr=False)
    _granted: int = attrs.field(init=False, default=0, repr=False)
    _bounded_steps: int = attrs.field(init=False, default=0, repr=False)
    _capped: int = attrs.field(init=False, default=0, repr=False)
    _withheld: int = attrs.field(init=False, default=0, repr=False)

    def is_protected(self, request: RequestView) -> bool:
        """Whether ``request``'s decodes are protected."""
        limit = self.protected_priority_at_most
        return limit is None or request.priority <= limit

    def token_cap(self, request: RequestView, load: LoadSnapshot) -> int | None:
        """What is left of this step's bound; ``None`` when nothing protected decodes."""
        if load is not self._step:
            self._step, self._granted = load, 0
            self._bounded_steps += bool(self._decoding)
        if not self._decoding:
            return None
        remaining = max(request.prompt_tokens - request.computed_tokens, 0)
        if remaining <= self.interactive_prompt_tokens:
            self._granted += remaining
            return None
        limit = (self.max_prefill_tokens if self.bound is None
                 else self.bound.token_cap(request, load))
        cap = max(limit - self._granted, 0)
        self._granted += min(cap, remaining)
        if cap < remaining:
            self._capped += 1
            self._withheld += remaining - cap
        return cap

    def on_scheduled(self, request: RequestView, tokens: int, now: float) -> None:
        """A request whose prefill completes with this chunk starts decoding."""
        if (request.computed_tokens + tokens >= request.prompt_tokens
                and self.is_protected(request)):
            self._decoding.add(request.request_id)

    def on_admitted(self, request: RequestView, now: float) -> None:
        pass

    def on_first_scheduled(self, request: RequestView, now: float) -> None:
        pass

    def on_finished(self, request: RequestView, now: float) -> None:
        self._decoding.discard(request.request_id)

    def stats(self) -> StepPrefillBudgetStats:
        """A frozen snapshot (see `StepPrefillBudgetStats`)."""
        return StepPrefillBudgetStats(protected_decoding=len(self._decoding),
                                      bounded_steps=self._bounded_steps,
                                      capped_chunks=self._capped,
                                      tokens_withheld=self._withheld)

    def check_invariants(self) -> None:
        """Counters are never negative."""
        assert self._granted >= 0 and self._capped >= 0 and self._withheld >= 0
        assert self._bounded_steps >= 0
