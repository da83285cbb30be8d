"""Agent sessions kept across tool calls: the gap to a session's next turn, learned online.

An agent session's turns come back seconds apart (a tool runs between them), each with
the last turn's context as its prefix. `SessionGaps` learns, per session, how long that
gap is (an exponentially weighted mean of the gaps seen; a session without one yet gets
the mean over all sessions), and names a request's session: its ``session_id`` hint when
the client sent one, else the session whose last turn ended with a block the request's
prompt continues (prefix continuation), else a new session named by its prompt's last
block. An eviction order with session pins (`DuelingSLRU`) pins a finished turn's blocks
until ``gap_slack`` times the predicted gap has passed (`SessionHints`).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from typing import Protocol, runtime_checkable

import attrs


def _share(_instance: object, attribute: attrs.Attribute, value: float) -> None:
    if not 0.0 < value <= 1.0:  # also rejects NaN
        raise ValueError(f"{attribute.name} must be in (0, 1], got {value!r}")


def _positive(_instance: object, attribute: attrs.Attribute, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{attribute.name} must be a positive finite number, got {value!r}")


@runtime_checkable
class SessionHints(Protocol):
    """Hints for an eviction order that keeps agent sessions' blocks across tool calls."""

    def wants_turn(self, session_id: str | None) -> bool:
        """Whether a request with ``session_id`` (or None) can be pinned (skip the rest if not)."""
        ...

    def turn_started(self, session_id: str | None, keys: Sequence[Hashable], now: float,
                     tenant: str | None = None) -> Hashable:
        """A request of ``tenant`` (None: unknown) with prompt blocks ``keys`` arrived at
        ``now``; returns its session (a session id names a session within its tenant)."""
        ...

    def turn_finished(self, session: Hashable, keys: Sequence[Hashable], now: float) -> int:
        """``session``'s request released ``keys`` at ``now``; returns how many were pinned."""
        ...

    def pins_by_tenant(self) -> dict[str | None, int]:
        """Blocks holding a pin now, by the tenant charged for them (None: unknown)."""
        ...


def _weights(value: Mapping[str, float]) -> tuple[tuple[str, float], ...]:
    return tuple(sorted(dict(value).items()))


def _positive_weights(_instance: object, attribute: attrs.Attribute,
                      value: tuple[tuple[str, float], ...]) -> None:
    for tenant, weight in value:
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not (
                math.isfinite(weight) and weight > 0):
            raise ValueError(f"{attribute.name}[{tenant!r}] must be a positive finite number, "
                             f"got {weight!r}")


@attrs.frozen(kw_only=True)
class SessionPins:
    """How long and how much an order pins a finished turn's blocks for its session."""

    max_pinned_fraction: float = attrs.field(default=0.5, validator=_share)
    """Share of the cache's blocks pins may hold, all tenants together."""
    tenant_weights: tuple[tuple[str, float], ...] = attrs.field(
        factory=tuple, converter=_weights, validator=_positive_weights)
    """Weight of a tenant's share of the pinned budget (a mapping; tenants not named weigh
    1). Work-conserving: the budget is split among the tenants that hold or ask for pins now,
    so one tenant alone may use all of it, and a tenant under its share takes the oldest pin
    of the tenant most over its share when the budget is full."""
    gap_slack: float = attrs.field(default=1.5, validator=attrs.validators.ge(1.0))
    """A pin lasts this many times the session's predicted gap."""
    default_gap_s: float = attrs.field(default=10.0, validator=_positive)
    """The predicted gap before any session came back."""
    smoothing: float = attrs.field(default=0.5, validator=_share)
    """Weight of the newest gap in a session's (and the fleet's) running mean."""
    max_sessions: int = attrs.field(default=100_000, validator=attrs.validators.ge(1))
    """Sessions remembered (least recently seen forgotten first)."""
    judged: bool = True
    """Pin only while pinning pays against LRU: `DuelingSLRU` keeps a shadow LRU that pins
    as it would, and makes pins while that shadow out-hits the plain LRU shadow by a margin
    (none until it has). ``False``: always pin."""
    prefix_sessions: bool = False
    """Also pin requests without a ``session_id``, their session found by prefix
    continuation. Off by default: on the Mooncake synthetic trace such pins cost 1-3 points
    of hit rate against LRU (docs/kv_cache.md)."""


@attrs.define(eq=False, kw_only=True)
class SessionGaps:
    """Predicts each session's gap to its next turn from the gaps seen; O(1) per turn, plus
    O(prompt blocks) to find the session of a request without a ``session_id``."""

    config: SessionPins = attrs.field(factory=SessionPins)
    _last_end: OrderedDict = attrs.field(init=False, repr=False, factory=OrderedDict)
    """Session -> when its last turn finished."""
    _gap_s: dict = attrs.field(init=False, repr=False, factory=dict)
    _fleet_gap_s: float | None = attrs.field(init=False, repr=False, default=None)
    _tail_of: OrderedDict = attrs.field(init=False, repr=False, factory=OrderedDict)
    """Last block of a session's last turn -> the session (prefix continuation)."""

    def session_of(self, session_id: str | None, keys: Sequence[Hashable],
                   tenant: str | None = None) -> Hashable | None:
        """The session of a request of ``tenant``: its hint, else (with ``prefix_sessions``)
        the tenant's session its prompt continues or a new one named by its last block; else
        ``None``. Sessions of different tenants never meet (`session_tenant` names it)."""
        if session_id is not None:
            return ("id", tenant, session_id)
        if not self.config.prefix_sessions:
            return None
        for key in reversed(keys):
            session = self._tail_of.get((tenant, key))
            if session is not None:
                return session
        return ("prefix", tenant, keys[-1] if keys else None)

    def started(self, session: Hashable, now: float) -> None:
        """A turn of ``session`` arrived at ``now``: learn the gap since its last turn."""
        last = self._last_end.pop(session, None)
        if last is None:
            return
        gap = max(0.0, now - last)
        weight = self.config.smoothing
        old = self._gap_s.get(session)
        self._gap_s[session] = gap if old is None else (1 - weight) * old + weight * gap
        fleet = self._fleet_gap_s
        self._fleet_gap_s = gap if fleet is None else (1 - weight) * fleet + weight * gap
        while len(self._gap_s) > self.config.max_sessions:  # oldest learned first
            del self._gap_s[next(iter(self._gap_s))]

    def finished(self, session: Hashable, tail: Hashable | None, now: float) -> float:
        """A turn of ``session`` ending with block ``tail`` finished at ``now``; returns
        until when its blocks should be kept (``now`` + slack x predicted gap)."""
        self._last_end[session] = now
        self._last_end.move_to_end(session)
        if tail is not None:
            tail = (session_tenant(session), tail)
            self._tail_of[tail] = session
            self._tail_of.move_to_end(tail)
        limit = self.config.max_sessions
        while len(self._last_end) > limit:
            forgotten, _ = self._last_end.popitem(last=False)
            self._gap_s.pop(forgotten, None)
        while len(self._tail_of) > limit:
            self._tail_of.popitem(last=False)
        return now + self.config.gap_slack * self.predicted_gap_s(session)

    def predicted_gap_s(self, session: Hashable) -> float:
        """The session's mean gap, else the fleet's, else ``default_gap_s``."""
        gap = self._gap_s.get(session, self._fleet_gap_s)
        return self.config.default_gap_s if gap is None else gap

    def check_invariants(self) -> None:
        """Assert the bounded memory and non-negative gaps."""
        assert len(self._last_end) <= self.config.max_sessions
        assert len(self._tail_of) <= self.config.max_sessions
        assert len(self._gap_s) <= self.config.max_sessions
        assert all(gap >= 0 for gap in self._gap_s.values())


def session_tenant(session: Hashable) -> str | None:
    """The tenant a session of `SessionGaps.session_of` belongs to (None: unknown)."""
    return session[1]
