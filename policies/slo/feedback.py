"""Feedback: headrooms corrected by how far measurements came from their predictions."""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Mapping

import attrs

from policies.percentile import percentile
from policies.slo.path import PathDelays
from policies.validators import finite_positive

MIN_ERRORS = 20
"""Errors heard before the headroom is first corrected (fewer when ``window`` is smaller)."""


@attrs.define(eq=False, kw_only=True)
class HeadroomFeedback:
    """The headroom in force: ``headroom`` less the 90th percentile of the errors remembered
    (``(measured - predicted) / target``; the last ``window``, none older than ``memory_s``),
    within ``[min_headroom, max_headroom]``.

    It also keeps whether each measurement remembered was late, past its target
    (`late_share`): what the headroom is for.

    Predictions that come true leave it as configured; measurements later (slower) than
    predicted lower it; earlier (faster) ones raise it, past 1 when they come that much
    earlier. Forgetting by age keeps a transient (a burst, a stalled machine) from holding
    the headroom down after it passed: a low headroom admits few requests, and without
    ``memory_s`` their errors would be all that could ever replace the old ones.

    Guarantees: ``headroom`` while fewer than ``min(MIN_ERRORS, window)`` errors are
    remembered, and within the bounds otherwise; with ``window=0`` it never changes and
    `learn` is a no-op. O(window) per error heard or forgotten.
    """

    headroom: float = attrs.field(validator=finite_positive)
    """The configured headroom (a share of the target)."""
    window: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    """The last this many errors count (0: off)."""
    min_headroom: float = attrs.field(default=0.25, validator=finite_positive)
    max_headroom: float = attrs.field(default=1.0, validator=finite_positive)
    memory_s: float | None = attrs.field(
        default=None, validator=attrs.validators.optional(finite_positive))
    """Errors heard longer ago than this are forgotten (`expire`); None: only ``window``
    bounds them."""

    _errors: deque[tuple[float, float, bool]] = attrs.field(init=False, repr=False)
    """(when heard, error, late), oldest first."""
    _value: float = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        self._errors = deque(maxlen=self.window or None)
        self._value = self.headroom

    @property
    def value(self) -> float:
        """The headroom in force."""
        return self._value

    @property
    def error_p90(self) -> float | None:
        """90th percentile of the errors remembered (None when there are none)."""
        return percentile([error for _, error, _ in self._errors], 90) if self._errors else None

    @property
    def late_share(self) -> float | None:
        """The share of the measurements remembered that were late (None when there are
        none)."""
        if not self._errors:
            return None
        return sum(late for _, _, late in self._errors) / len(self._errors)

    def learn(self, error: float, now: float, *, late: bool = False) -> None:
        """One measurement's error against its prediction, as a share of its target, heard at
        ``now`` (seconds); ``late``: the measurement missed its target."""
        if not self.window:
            return
        self._errors.append((now, error, late))
        self.expire(now)
        self._correct()

    def expire(self, now: float) -> None:
        """Forget the errors heard before ``now - memory_s``."""
        if self.memory_s is None:
            return
        forgotten = False
        while self._errors and self._errors[0][0] < now - self.memory_s:
            self._errors.popleft()
            forgotten = True
        if forgotten:
            self._correct()

    def _corrected(self) -> bool:
        """Whether enough errors are remembered to correct the headroom."""
        return bool(self.window) and len(self._errors) >= min(MIN_ERRORS, self.window)

    def _correct(self) -> None:
        if self._corrected():
            self._value = min(max(self.headroom - self.error_p90, self.min_headroom),
                              self.max_headroom)
        else:
            self._value = self.headroom

    def check_invariants(self) -> None:
        """The configured headroom with too few errors remembered, within the bounds
        otherwise; bounded memory."""
        assert len(self._errors) <= self.window
        if self._corrected():
            assert self.min_headroom <= self._value <= self.max_headroom
        else:
            assert self._value == self.headroom


@attrs.define(eq=False, kw_only=True)
class PredictionFeedback:
    """Admitted requests' predictions matched with what was measured: each first token where
    the engine produces it, or, once `PathDelays` has heard a client report, where it leaves
    the server (correcting the first-token headroom of the class it was admitted in), and
    each stream as the client received it (correcting ``tpot``, with ``path`` only).

    Guarantees: a prediction is learned from at most once; the predictions awaiting a client
    report are at most ``path.max_awaiting`` of each kind (the oldest go first), so memory is
    bounded whatever the clients do. Pure: time is passed in.
    """

    ttft: Mapping[str, HeadroomFeedback]
    """Class -> the first-token headroom it corrects: a class served late (say, long prompts
    behind a tighter class) lowers its own, not the others'."""
    tpot: HeadroomFeedback
    """The TPOT headroom it corrects (from client streams)."""
    path: PathDelays | None = None
    """The path outside the engine step (None: first tokens measured at the engine)."""

    _pending: dict[str, tuple[str, float, float, float]] = attrs.field(
        init=False, factory=dict, repr=False)
    """Request id -> (class, predicted TTFT, TTFT target, planned egress), from decision to
    admission."""
    _predicted: dict[str, tuple[str, float, float, float]] = attrs.field(
        init=False, factory=dict, repr=False)
    """Admitted request id -> (class, arrival, predicted TTFT, TTFT target), until its first
    token."""
    _awaiting_client: OrderedDict[str, tuple[str, float, float, float]] = attrs.field(
        init=False, factory=OrderedDict, repr=False)
    """Request id -> (class, arrival, predicted TTFT at the client, TTFT target), from the
    engine's first token to the client report."""
    _predicted_tpot: OrderedDict[str, tuple[float, float]] = attrs.field(
        init=False, factory=OrderedDict, repr=False)
    """Admitted request id -> (predicted TPOT, TPOT target), until its stream's client report
    (kept past its finish, when the report comes)."""

    def on_decided(self, request_id: str, *, slo_class: str, ttft_s: float,
                   ttft_target_s: float, egress_s: float, tpot_s: float | None,
                   tpot_target_s: float) -> None:
        """``request_id`` was accepted in ``slo_class`` with these predictions (kept until it
        is admitted)."""
        self._pending[request_id] = (slo_class, ttft_s, ttft_target_s, egress_s)
        if self.path is not None and tpot_s is not None:
            self._predicted_tpot[request_id] = (tpot_s, tpot_target_s)
            while len(self._predicted_tpot) > self.path.max_awaiting:
                self._predicted_tpot.popitem(last=False)

    def on_admitted(self, request_id: str, arrival_s: float) -> float:
        """``request_id`` was admitted: await its first token. Returns the egress delay its
        deadline was planned with (0 without a prediction)."""
        prediction = self._pending.pop(request_id, None)
        if prediction is None:
            return 0.0
        cls, ttft, ttft_target, egress = prediction
        self._predicted[request_id] = (cls, arrival_s, ttft + egress, ttft_target)
        return egress

    def engine_first_token(self, request_id: str, now: float) -> None:
        """The engine produced ``request_id``'s first token at ``now``."""
        entry = self._predicted.pop(request_id, None)
        if self.path is not None:
            self.path.engine_first_token(request_id, now)
            if entry is not None:
                self._awaiting_client[request_id] = entry
                while len(self._awaiting_client) > self.path.max_awaiting:
                    self._awaiting_client.popitem(last=False)
            if self.path.has_client_reports:
                return
        if entry is not None:
            cls, arrival, predicted, target = entry
            self.ttft[cls].learn((now - arrival - predicted) / target, now,
                                 late=now - arrival > target)

    def client_first_token(self, request_id: str, sent_s: float) -> None:
        """``request_id``'s first token left the server at ``sent_s`` (ignored without
        ``path``)."""
        if self.path is None:
            return
        self.path.client_first_token(request_id, sent_s)
        entry = self._awaiting_client.pop(request_id, None)
        if entry is not None:
            cls, arrival, predicted, target = entry
            self.ttft[cls].learn((sent_s - arrival - predicted) / target, sent_s,
                                 late=sent_s - arrival > target)

    def client_stream_end(self, request_id: str, first_s: float, last_s: float,
                          chunks: int) -> None:
        """``request_id``'s stream reached the client as ``chunks`` chunks from ``first_s``
        to ``last_s`` (ignored without ``path``, unknown, or of one chunk)."""
        entry = self._predicted_tpot.pop(request_id, None)
        if self.path is None or entry is None or chunks < 2 or not self.tpot.window:
            return
        predicted, target = entry
        tpot = (last_s - first_s) / (chunks - 1)
        self.tpot.learn((tpot - predicted) / target, last_s, late=tpot > target)

    def expire(self, now: float) -> None:
        """Every headroom forgets the errors older than its memory (`HeadroomFeedback`)."""
        for feedback in self.ttft.values():
            feedback.expire(now)
        self.tpot.expire(now)

    def forget(self, request_id: str) -> None:
        """``request_id`` finished: drop its first-token prediction."""
        self._predicted.pop(request_id, None)
        self._pending.pop(request_id, None)

    def check_invariants(self) -> None:
        """Every headroom's invariants; bounded memory."""
        for feedback in self.ttft.values():
            feedback.check_invariants()
        self.tpot.check_invariants()
        if self.path is not None:
            assert len(self._awaiting_client) <= self.path.max_awaiting
            assert len(self._predicted_tpot) <= self.path.max_awaiting
