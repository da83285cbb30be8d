"""`InteractivePrefillGuard`: long prefills shrink their chunks while short prompts wait.

vLLM's chunked prefill lets one long prompt (a RAG document) fill a step's whole token budget;
a short interactive prompt arriving meanwhile waits for that step, and the step is as slow as
its token count. The guard caps each long prompt's prefill chunk at ``contended_chunk_tokens``
whenever a short prompt still has prefill work, so the short one fits in the next step and that
step is short. Alone, a long prompt keeps the full budget (work-conserving).
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from policies.needs import Needs
from policies.validators import at_least
from policies.views import LoadSnapshot, RequestView


@attrs.frozen(kw_only=True)
class PrefillGuardStats:
    """A snapshot of an `InteractivePrefillGuard`."""

    short_prefills_outstanding: int
    capped_chunks: int
    """Long prefill chunks capped since construction."""


@attrs.define(eq=False, kw_only=True)
class InteractivePrefillGuard:
    """A token-cap policy: a long prompt's chunk is at most ``contended_chunk_tokens`` while
    any prompt of at most ``long_prompt_tokens`` tokens has prefill outstanding.

    Never caps decodes or short prompts; O(1) per call.
    """

    needs: ClassVar[Needs] = Needs(lifecycle=True)

    long_prompt_tokens: int = attrs.field(default=4096, validator=at_least(1))
    """Prompts longer than this are long; the others interactive."""
    contended_chunk_tokens: int = attrs.field(default=1024, validator=at_least(1))
    """A long prefill's chunk while an interactive prefill is outstanding."""
    _short: set[str] = attrs.field(init=False, factory=set, repr=False)
    _capped: int = attrs.field(init=False, default=0, repr=False)

    def token_cap(self, request: RequestView, load: LoadSnapshot) -> int | None:
        if request.prompt_tokens <= self.long_prompt_tokens or not self._short:
            return None
        self._capped += 1
        return self.contended_chunk_tokens

    def on_scheduled(self, request: RequestView, tokens: int, now: float) -> None:
        if request.computed_tokens + tokens >= request.prompt_tokens:
            self._short.discard(request.request_id)

    def on_admitted(self, request: RequestView, now: float) -> None:
        if (request.prompt_tokens <= self.long_prompt_tokens
                and request.computed_tokens < request.prompt_tokens):
            self._short.add(request.request_id)

    def on_first_scheduled(self, request: RequestView, now: float) -> None:
        pass

    def on_finished(self, request: RequestView, now: float) -> None:
        self._short.discard(request.request_id)

    def stats(self) -> PrefillGuardStats:
        return PrefillGuardStats(short_prefills_outstanding=len(self._short),
                                 capped_chunks=self._capped)
