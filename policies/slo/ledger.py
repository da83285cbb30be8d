"""`PrefillLedger`: each admitted request's remaining prefill, the requests decoding, and the
KV and slots they will free."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable
from typing import ClassVar

import attrs

from policies.needs import Needs
from policies.output_lengths import OutputLengths
from policies.views import LoadSnapshot, RequestView

RELEASE_QUANTILES = 8
"""How many equally likely finishing times each admitted request's KV and slot release is
spread over: the resolution of the expected-free-KV curve (finer costs more per
decision; nothing is fitted to it)."""


@attrs.frozen(kw_only=True)
class PrefillLedgerStats:
    """A snapshot of a `PrefillLedger`."""

    requests_with_prefill: int
    """Admitted requests with prefill tokens left (by the ledger's estimate)."""
    backlog_tokens: int
    """Their remaining prefill tokens."""
    decoding: int
    """Admitted requests whose prefill is done and that have not finished."""
    decoding_context_tokens: int
    """The prompt tokens of the requests decoding."""


@attrs.define(eq=False, kw_only=True)
class PrefillLedger:
    """Each admitted request's remaining prefill tokens, and the requests decoding.

    A token-cap policy that never caps (`token_cap` returns ``None``): put it in the ``rate``
    slot, with `TokenCaps` beside other caps, so it hears every prefill chunk. A request enters
    with its whole prompt (less its tenant's learned prefix-cache hit) on admission, starts
    decoding when a chunk completes its prompt and leaves when it finishes. The scheduler's
    view of a request starting this step does not show its prefix-cache hit yet, so the
    ledger learns each tenant's hit from its requests that take more than one chunk (the
    second chunk's view shows what the first really covered) and assumes it for the others;
    a request wrongly taken as done is put back by its next chunk.

    Where the scheduler looks each request's prefix-cache hit up on arrival (it does for
    `SLOAdmission`, whose ``needs`` ask for it), set ``learn_tenant_hits=False``:
    the request's own hit (`RequestView.cached_tokens`) is then the whole estimate, so a
    session's first call is not taken to hit like its tenant's later ones.

    Guarantee: ``backlog_tokens`` is always the sum of the requests' remaining tokens, and the
    decoding context the sum of the decoding requests' prompts (`check_invariants`). O(1) per
    event.
    """

    needs: ClassVar[Needs] = Needs(lifecycle=True)

    learn_tenant_hits: bool = True
    """Assume each tenant's learned hit for requests whose own hit is unknown (0)."""
    outputs: OutputLengths = attrs.field(factory=OutputLengths)
    """Finished requests' output lengths: each admitted request's expected output, and how
    much more a decoding one will generate."""

    _entries: dict[str, list] = attrs.field(init=False, factory=dict, repr=False)
    """request id -> [tenant, remaining, chunks seen, tokens granted, prompt tokens]"""
    _backlog: int = attrs.field(init=False, default=0, repr=False)
    _decoding: dict[str, tuple[str | None, int, int]] = attrs.field(init=False, factory=dict,
                                                                     repr=False)
    """request id -> (slo_class, prompt tokens, priority) of admitted requests with their
    prefill done"""
    _decoding_context: int = attrs.field(init=False, default=0, repr=False)
    _prefilling_context: int = attrs.field(init=False, default=0, repr=False)
    """The prompt tokens of the requests with prefill left (the context they will decode over)."""
    _cached: dict[str, int] = attrs.field(init=False, factory=dict, repr=False)
    _on_prefill_done: Callable[[str, float], None] | None = attrs.field(
        init=False, default=None, repr=False)
    _kv: dict[str, tuple[int, float]] = attrs.field(init=False, factory=dict, repr=False)
    """Admitted, unfinished request id -> (the KV tokens it will hold: prompt + expected output,
    its ``max_tokens`` or ``inf``)."""
    _kv_demand: int = attrs.field(init=False, default=0, repr=False)
    _decode_start: dict[str, float] = attrs.field(init=False, factory=dict, repr=False)
    _finishes: deque[float] = attrs.field(init=False, factory=deque, repr=False)
    """When admitted requests finished, within the window last asked of `finish_rate`."""
    _finish_window_s: float = attrs.field(init=False, default=math.inf, repr=False)
    _first_admitted_s: float | None = attrs.field(init=False, default=None, repr=False)

    def listen(self, on_prefill_done: Callable[[str, float], None]) -> None:
        """Call ``on_prefill_done(request id, now)`` when a chunk completes a request's
        prompt (its first token comes with that step)."""
        self._on_prefill_done = on_prefill_done

    def expected_cached_tokens(self, tenant: str) -> int:
        """The prefix-cache hit the ledger has learned for ``tenant``'s requests (0 at first,
        and always without ``learn_tenant_hits``)."""
        return self._cached.get(tenant, 0) if self.learn_tenant_hits else 0

    def _set(self, request: RequestView, remaining: int, chunks: int, granted: int) -> None:
        entry = self._entries.pop(request.request_id, None)
        if entry is not None:
            self._backlog -= entry[1]
            self._prefilling_context -= entry[4]
        if remaining <= 0:
            if request.request_id not in self._decoding:
                self._decoding[request.request_id] = (request.slo_class, request.prompt_tokens,
                                                      request.priority)
                self._decoding_context += request.prompt_tokens
            return
        self._stop_decoding(request.request_id)
        self._entries[request.request_id] = [request.tenant, remaining, chunks, granted,
                                             request.prompt_tokens]
        self._backlog += remaining
        self._prefilling_context += request.prompt_tokens

    def _stop_decoding(self, request_id: str) -> None:
        entry = self._decoding.pop(request_id, None)
        if entry is not None:
            self._decoding_context -= entry[1]

    # -- token-cap policy -------------------------------------------------------

    def token_cap(self, request: RequestView, load: LoadSnapshot) -> None:
        """Never caps."""
        return None

    def on_scheduled(self, request: RequestView, tokens: int, now: float) -> None:
        """A prefill chunk of ``tokens`` after ``request.computed_tokens``."""
        entry = self._entries.get(request.request_id)
        chunks, granted = (entry[2], entry[3]) if entry is not None else (0, 0)
        if chunks == 1 and request.computed_tokens > granted:  # the first chunk's hit, revealed
            self._cached[request.tenant] = request.computed_tokens - granted
        assumed = max(self.expected_cached_tokens(request.tenant),
                      request.cached_tokens - request.computed_tokens) if chunks == 0 else 0
        remaining = request.prompt_tokens - request.computed_tokens - tokens - assumed
        self._set(request, remaining, chunks + 1, granted + tokens)
        if remaining <= 0:
            self._decode_start.setdefault(request.request_id, now)
            if self._on_prefill_done is not None:
                self._on_prefill_done(request.request_id, now)

    # -- lifecycle -----------------------------------------------------------------

    def on_admitted(self, request: RequestView, now: float) -> None:
        """Count the request's prompt, less its tenant's learned hit (repeats change nothing)."""
        if request.request_id in self._entries or request.request_id in self._decoding:
            return
        if self._first_admitted_s is None:
            self._first_admitted_s = now
        self._set(request, self.prefill_tokens(request), 0, 0)
        footprint = request.prompt_tokens + self.expected_output_tokens(request)
        self._kv[request.request_id] = (footprint, request.max_output_tokens or math.inf)
        self._kv_demand += footprint

    def on_first_scheduled(self, request: RequestView, now: float) -> None:
        pass

    def on_finished(self, request: RequestView, now: float) -> None:
        """Forget the request; learn its output length."""
        entry = self._entries.pop(request.request_id, None)
        if entry is not None:
            self._backlog -= entry[1]
            self._prefilling_context -= entry[4]
        self._stop_decoding(request.request_id)
        kv = self._kv.pop(request.request_id, None)
        if kv is not None:  # an admitted request's slot is free
            self._kv_demand -= kv[0]
            self._finishes.append(now)
            self._forget_finishes(now, self._finish_window_s)
        self._decode_start.pop(request.request_id, None)
        self.outputs.observe(request.output_tokens)

    # -- reading ---------------------------------------------------------------

    def expected_output_tokens(self, request: RequestView) -> int:
        """Output tokens a new ``request`` is expected to generate: the recent finished
        requests' mean, each cut at its ``max_output_tokens`` (`OutputLengths.remaining`)."""
        return round(self.outputs.remaining(0, request.max_output_tokens or math.inf))

    @property
    def kv_demand_tokens(self) -> int:
        """KV tokens the admitted, unfinished requests will hold (prompts + expected outputs)."""
        return self._kv_demand

    def kv_releases(self, now: float, tpot_s: float, prefill_tokens_per_s: float
                    ) -> list[tuple[float, float]]:
        """``(when, KV tokens)`` the admitted requests are expected to free, earliest first, at
        ``tpot_s`` a token. Each request's footprint is spread over `RELEASE_QUANTILES` equally
        likely finishing times (`OutputLengths.remaining_quantiles`), so the running total
        is the KV expected free by then, and every `RELEASE_QUANTILES` entries one slot: one
        decoding finishes what may remain after the tokens it has generated since its
        decoding began (the longer it has run, the longer it may run on); one still in
        prefill, a new request's output after its remaining prefill is done at
        ``prefill_tokens_per_s``. (Each request at its own expected finish would put the
        first releases late: the earliest of many uncertain finishes comes sooner than the
        earliest expected one.)"""
        releases = []
        quantiles = self.outputs.remaining_quantiles
        n = RELEASE_QUANTILES
        for rid, (footprint, limit) in self._kv.items():
            start = self._decode_start.get(rid)
            if start is None:
                entry = self._entries.get(rid)
                start = now + (entry[1] if entry else 0) / prefill_tokens_per_s
                outputs = quantiles(0, n, limit)
            else:
                outputs = quantiles((now - start) / tpot_s, n, limit)
                start = now
            share = footprint / n
            releases.extend((start + output * tpot_s, share) for output in outputs)
        releases.sort()
        return releases

    def finish_rate(self, now: float, window_s: float) -> float:
        """Admitted requests finishing per second, observed over the last ``window_s`` (or
        since the first admission, if later), counting one more finishing now (so a rate is
        never 0, and it falls the longer nothing finishes); ``inf`` before any time passed."""
        self._finish_window_s = window_s  # finishes older are forgotten from now on
        self._forget_finishes(now, window_s)
        if self._first_admitted_s is None or now <= self._first_admitted_s:
            return math.inf
        return (len(self._finishes) + 1) / (now - max(now - window_s, self._first_admitted_s))

    def _forget_finishes(self, now: float, window_s: float) -> None:
        finishes = self._finishes
        while finishes and finishes[0] < now - window_s:
            finishes.popleft()

    def prefill_tokens(self, request: RequestView) -> int:
        """Prefill tokens a new ``request`` needs: its prompt less the expected hit (>= 1)."""
        hit = max(request.cached_tokens, self.expected_cached_tokens(request.tenant))
        return max(request.prompt_tokens - request.computed_tokens - hit, 1)

    def remaining(self, request_id: str) -> int:
        """Prefill tokens ``request_id`` has left (0 when done or unknown)."""
        entry = self._entries.get(request_id)
        return 0 if entry is None else entry[1]

    def with_prefill(self) -> list[tuple[str, int, int]]:
        """``(request id, remaining prefill tokens, tokens before them)`` of every request with
        some left (the last is the context its remaining chunks attend to)."""
        return [(rid, entry[1], entry[4] - entry[1]) for rid, entry in self._entries.items()]

    @property
    def backlog_tokens(self) -> int:
        """All remaining prefill tokens."""
        return self._backlog

    def decoding_ids(self) -> Iterable[str]:
        """The ids of the requests decoding now."""
        return self._decoding.keys()

    def decoding_priorities(self) -> set[int]:
        """The priorities of the requests decoding now."""
        return {priority for _, _, priority in self._decoding.values()}

    @property
    def decoding_context_tokens(self) -> int:
        """The prompt tokens of the requests decoding now (their context, less output)."""
        return self._decoding_context

    @property
    def prefilling(self) -> tuple[int, int]:
        """``(requests with prefill left, their prompt tokens)``: the decodes the batch will
        take on once their prefill is done."""
        return len(self._entries), self._prefilling_context

    def stats(self) -> PrefillLedgerStats:
        """A frozen snapshot (see `PrefillLedgerStats`)."""
        return PrefillLedgerStats(requests_with_prefill=len(self._entries),
                                  backlog_tokens=self._backlog, decoding=len(self._decoding),
                                  decoding_context_tokens=self._decoding_context)

    def check_invariants(self) -> None:
        """Sums match their parts; nothing negative; no request both prefilling and decoding."""
        assert all(entry[1] > 0 for entry in self._entries.values())
        assert self._backlog == sum(entry[1] for entry in self._entries.values())
        assert not set(self._entries) & set(self._decoding)
        assert self._decoding_context == sum(p for _, p, _ in self._decoding.values())
        assert self._prefilling_context == sum(entry[4] for entry in self._entries.values())
        assert self._kv_demand == sum(footprint for footprint, _ in self._kv.values())
        assert set(self._decode_start) <= set(self._kv) | set(self._decoding)
        assert all(v >= 0 for v in self._cached.values())

