"""Drive a `SchedulerHarness` until nothing is left, in virtual time."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple


class Drained(NamedTuple):
    """What a drained harness did, step by step."""

    steps: list[tuple[float, dict[str, int]]]
    """(virtual time, scheduled tokens by request) per step."""
    finished: list[str]
    """Request ids in the order they finished."""
    outputs: list[Any]
    """Every `EngineCoreOutput`, in order."""


def drain(harness: Any, *, limit: int = 20000, step_s: float = 0.01,
          check: Callable[[Any], None] | None = None) -> Drained:
    """Step ``harness`` until it has no requests, advancing its clock ``step_s`` per step
    and calling ``check(scheduler)`` after each step.

    Raises:
        AssertionError: if it has not drained after ``limit`` steps (a stall).
    """
    steps, finished, outputs = [], [], []
    for _ in range(limit):
        if not harness.has_requests():
            return Drained(steps, finished, outputs)
        result = harness.step()
        if check is not None:
            check(harness.scheduler)
        steps.append((harness.clock.now(), dict(result.scheduler_output.num_scheduled_tokens)))
        finished += result.finished_request_ids
        outputs += result.outputs
        harness.clock.advance(step_s)
    raise AssertionError(f"did not drain in {limit} steps")
