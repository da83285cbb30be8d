"""`PathDelays`: the part of a request's time to first token spent outside the engine step.

A client's TTFT runs from the moment the API server receives the request (vLLM's
``arrival_time``) to the moment its first token leaves the server. The engine's step
model sees neither end of that path: parsing and tokenizing, the hop into the engine
core (**ingress**), nor the output processor, detokenizing and streaming (**egress**).
On a GPU server at high concurrency the path is tens to hundreds of milliseconds; on a
loaded machine it is seconds. `PathDelays` learns both online, the way the step model
learns the step, so that `SLOAdmission` can plan a deadline end to end.

* ingress: ``now - arrival`` when the engine decides on a request;
* egress: from the engine's first token of a request to the API server's report that it
  left (`client_first_token`; over HTTP, the middleware reports it for streams).

Each term is the 90th percentile of its recent observations: the last ``window`` within
``horizon_s``. Older observations are forgotten, so a machine that stops being loaded
stops being treated as loaded once ``horizon_s`` has passed without a slow observation.
"""

from __future__ import annotations

from collections import OrderedDict, deque

import attrs

from policies.percentile import percentile
from policies.validators import at_least, finite_positive

QUANTILE = 90.0
"""The percentile of recent delays each term is planned on."""


@attrs.frozen(kw_only=True)
class PathDelaysStats:
    """A snapshot of a `PathDelays`."""

    ingress_s: float
    """Planned ingress delay (p90 of recent observations; 0 before any)."""
    egress_s: float
    """Planned egress delay (p90 of recent observations; 0 before any)."""
    ingress_samples: int
    egress_samples: int
    """Observations each term rests on now (within ``horizon_s``)."""
    awaiting_client: int
    """Requests whose first token left the engine and whose client report is pending."""
    client_reports: int
    """Client first-token reports received in all."""
    unmatched_reports: int
    """Reports for requests it did not know (finished long ago, or never judged)."""


@attrs.define(eq=False, kw_only=True)
class PathDelays:
    """Learns the ingress and egress delays around the engine step from observations.

    Guarantees: each planned delay is a percentile of observations made within the last
    ``horizon_s`` (0 with none); at most ``window`` observations per term and
    ``max_awaiting`` requests awaiting a client report are kept (the oldest go first), so
    memory is bounded whatever the clients do. A term's percentile is computed again only
    when an observation comes or ages out (asking per decision is O(1) in between). Pure:
    time is passed in.
    """

    window: int = attrs.field(default=200, validator=at_least(1))
    """Observations kept per term."""
    horizon_s: float = attrs.field(default=30.0, validator=finite_positive)
    """Observations older than this (seconds) no longer count."""
    max_awaiting: int = attrs.field(default=10_000, validator=at_least(1))
    """Requests awaiting their client report, at most."""

    _ingress: deque[tuple[float, float]] = attrs.field(init=False, repr=False)
    _egress: deque[tuple[float, float]] = attrs.field(init=False, repr=False)
    _awaiting: OrderedDict[str, float] = attrs.field(init=False, factory=OrderedDict,
                                                     repr=False)
    """request id -> when the engine produced its first token"""
    _planned_s: dict[str, float] = attrs.field(init=False, factory=dict, repr=False)
    """Term -> its planned delay, until its samples change or age out (`_planned`)."""
    _reports: int = attrs.field(init=False, default=0, repr=False)
    _unmatched: int = attrs.field(init=False, default=0, repr=False)

    def __attrs_post_init__(self) -> None:
        self._ingress = deque(maxlen=self.window)
        self._egress = deque(maxlen=self.window)

    @property
    def has_client_reports(self) -> bool:
        """Whether a client report ever came (the egress is measured, not assumed 0)."""
        return self._reports > 0

    def observe_ingress(self, arrival_s: float, now: float) -> None:
        """The engine decides at ``now`` on a request the API server received at
        ``arrival_s``."""
        self._ingress.append((now, max(now - arrival_s, 0.0)))
        self._planned_s.pop("ingress", None)

    def engine_first_token(self, request_id: str, now: float) -> None:
        """The engine produced ``request_id``'s first token at ``now``."""
        self._awaiting[request_id] = now
        self._awaiting.move_to_end(request_id)
        while len(self._awaiting) > self.max_awaiting:
            self._awaiting.popitem(last=False)

    def client_first_token(self, request_id: str, sent_s: float) -> float | None:
        """``request_id``'s first token left the server at ``sent_s``: its egress delay,
        or None for a request it does not know."""
        self._reports += 1
        produced = self._awaiting.pop(request_id, None)
        if produced is None:
            self._unmatched += 1
            return None
        egress = max(sent_s - produced, 0.0)
        self._egress.append((sent_s, egress))
        self._planned_s.pop("egress", None)
        return egress

    def ingress_s(self, now: float) -> float:
        """The ingress delay to plan on at ``now``."""
        return self._planned("ingress", self._ingress, now)

    def egress_s(self, now: float) -> float:
        """The egress delay to plan on at ``now``."""
        return self._planned("egress", self._egress, now)

    def _planned(self, term: str, samples: deque[tuple[float, float]], now: float) -> float:
        """The percentile of ``samples`` within the horizon at ``now``, recomputed only when
        an observation came or aged out since it was last asked."""
        while samples and samples[0][0] < now - self.horizon_s:
            samples.popleft()
            self._planned_s.pop(term, None)
        planned = self._planned_s.get(term)
        if planned is None:
            planned = percentile([delay for _, delay in samples], QUANTILE) if samples else 0.0
            self._planned_s[term] = planned
        return planned

    def stats(self, now: float) -> PathDelaysStats:
        """A frozen snapshot at ``now`` (see `PathDelaysStats`)."""
        return PathDelaysStats(ingress_s=self.ingress_s(now), egress_s=self.egress_s(now),
                               ingress_samples=len(self._ingress),
                               egress_samples=len(self._egress),
                               awaiting_client=len(self._awaiting),
                               client_reports=self._reports,
                               unmatched_reports=self._unmatched)

    def check_invariants(self) -> None:
        """Bounded memory; delays are never negative."""
        assert len(self._awaiting) <= self.max_awaiting
        assert all(delay >= 0 for _, delay in (*self._ingress, *self._egress))
        assert 0 <= self._unmatched <= self._reports
        for term, samples in (("ingress", self._ingress), ("egress", self._egress)):
            if term in self._planned_s:  # a cached delay is the one its samples give
                assert self._planned_s[term] == (percentile(
                    [delay for _, delay in samples], QUANTILE) if samples else 0.0)
