"""Policies that raise on every N-th call: fault injection for the containment tests."""

from __future__ import annotations

import attrs

from policies import AdmissionDecision


@attrs.define(eq=False)
class Flaky:
    """Raises on every ``every``-th call of the wrapped methods, else delegates to ``inner``."""

    inner: object
    every: int
    calls: int = 0

    def _tick(self) -> None:
        self.calls += 1
        if self.calls % self.every == 0:
            raise RuntimeError(f"injected fault #{self.calls}")


def _flaky(name: str, methods: tuple[str, ...]) -> type:
    def make(method_name: str):
        def method(self, *args, **kwargs):
            self._tick()
            return getattr(self.inner, method_name)(*args, **kwargs)
        return method
    cls = type(name, (Flaky,), {m: make(m) for m in methods})
    cls.__module__ = __name__
    return cls


class AcceptAll:
    """Admits everything."""

    def admit(self, request, load):
        return AdmissionDecision.accept()


FlakyRanking = _flaky("FlakyRanking", ("rank_key", "effective_priority"))
FlakyFairness = _flaky("FlakyFairness", ("select", "charge", "counter", "on_backlogged",
                                         "on_idle", "weight"))
FlakyLevels = _flaky("FlakyLevels", ("level", "on_scheduled", "on_preempted"))
FlakyRate = _flaky("FlakyRate", ("token_cap", "on_scheduled"))
FlakyAdmission = _flaky("FlakyAdmission", ("admit",))
