"""Scheduler hooks that raise on every N-th call of one hook point, and policies whose answers
are invalid: fault injection for the containment tests. Named in config by import path
(``tests.helpers.faulty_hooks:Flaky_<point>``)."""

from __future__ import annotations

import contextlib

import attrs

from policies import PrefixWarmer
from tests.helpers.faulty import _flaky

EVERY = 3
POINTS = ("on_arrival", "on_admitted", "on_rejected", "before_schedule", "after_schedule",
          "before_update", "releasing", "pending", "refresh_metrics", "shutdown")
"""Every point of `SchedulerHook` (the test checks this list against the real one)."""


class _FlakyHook:
    """Every hook point; ``point`` raises on every `EVERY`-th call, the others do nothing."""

    point = ""

    def __init__(self, scheduler: object) -> None:
        self.calls = 0

    def _tick(self, point: str) -> None:
        if point == self.point:
            self.calls += 1
            if self.calls % EVERY == 0:
                raise RuntimeError(f"injected {point} fault #{self.calls}")

    def on_arrival(self, request):
        self._tick("on_arrival")

    def on_admitted(self, request, tenant):
        self._tick("on_admitted")

    def on_rejected(self, request, rejection):
        self._tick("on_rejected")

    def before_schedule(self, now):
        self._tick("before_schedule")

    def after_schedule(self, scheduler_output):
        self._tick("after_schedule")

    def before_update(self, scheduler_output, model_runner_output):
        self._tick("before_update")

    @contextlib.contextmanager
    def releasing(self, request, *, preempted):
        self._tick("releasing")
        yield

    def pending(self):
        self._tick("pending")
        return False

    def refresh_metrics(self, metrics):
        self._tick("refresh_metrics")

    def shutdown(self, now):
        self._tick("shutdown")


for _point in POINTS:
    globals()[f"Flaky_{_point}"] = type(f"Flaky_{_point}", (_FlakyHook,), {"point": _point})


class InvalidRanking:
    """A ranking whose key is, call after call, one of ``answers`` (None, NaN, a string...)."""

    def __init__(self, answers: tuple) -> None:
        self.answers, self.calls = answers, 0

    def rank_key(self, request):
        self.calls += 1
        return self.answers[self.calls % len(self.answers)]

    def effective_priority(self, request, now):
        return 0.0


def _here(cls: type) -> type:
    cls.__module__ = __name__  # picklable from this module (the pipeline travels pickled)
    return cls


FlakyEviction = _here(_flaky("FlakyEviction", ("evict", "release", "acquire", "discard",
                                               "release_uncached", "__len__", "__contains__",
                                               "__iter__")))
FlakyDeadlines = _here(_flaky("FlakyDeadlines", ("rank_key", "effective_priority", "is_late",
                                                 "is_expired")))
FlakyWatermarks = _here(_flaky("FlakyWatermarks", ("admit",)))
FlakyQuotas = _here(_flaky("FlakyQuotas", ("eligible",)))
FlakyStartGate = _here(_flaky("FlakyStartGate", ("startable",)))
FlakyStepModel = _here(_flaky("FlakyStepModel", ("observe",)))
FlakyPreemption = _here(_flaky("FlakyPreemption", ("choose", "on_preempted")))


@attrs.define(eq=False, kw_only=True)
class FlakyWarmer(PrefixWarmer):
    """A `PrefixWarmer` whose ``observe`` raises on every `EVERY`-th call."""

    flaky_calls: int = 0

    def observe(self, *args, **kwargs):
        self.flaky_calls += 1
        if self.flaky_calls % EVERY == 0:
            raise RuntimeError(f"injected fault #{self.flaky_calls}")
        return super().observe(*args, **kwargs)
