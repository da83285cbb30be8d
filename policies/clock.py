"""A clock you move by hand, for tests, notebooks and virtual-time replay."""

from __future__ import annotations

import attrs


@attrs.define(eq=False)
class ManualClock:
    """A monotonic clock that only moves when told to.

    Guarantees ``now()`` never decreases: ``advance`` rejects negative steps
    and ``set`` rejects going back in time.
    """

    _now: float = 0.0

    def now(self) -> float:
        """The current time in seconds."""
        return self._now

    def advance(self, dt_s: float) -> float:
        """Move forward by ``dt_s`` seconds and return the new time."""
        if dt_s < 0:
            raise ValueError(f"cannot advance a clock by a negative step: {dt_s!r}")
        self._now += dt_s
        return self._now

    def set(self, now_s: float) -> float:
        """Jump to ``now_s`` (not earlier than the current time) and return it."""
        if now_s < self._now:
            raise ValueError(f"clock cannot go back from {self._now!r} to {now_s!r}")
        self._now = float(now_s)
        return self._now
