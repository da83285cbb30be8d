"""Drive a `SchedulerHarness` until nothing is left, in virtual time."""

from __future__ import annotations

from typing import Any

import attrs


@attrs.frozen
class Drained:
    """What a drained harness did, step by step."""

    steps: list[tuple[float, dict[str, int]]]
    """(virtual time, scheduled tokens by request) per step."""
    finished: list[str]
    """Request ids in the order they finished."""
    outputs: list[Any]
    """Every `EngineCoreOutput`, in order."""


def drain(harness: Any, *, limit: int = 20000, step_s: float = 0.01) -> Drained:
    """Step ``harness`` until it has no requests, advancing its clock ``step_s`` per step.

    Raises:
        AssertionError: if it has not drained after ``limit`` steps (a stall).
    """
    steps, finished, outputs = [], [], []
    for _ in range(limit):
        if not harness.has_requests():
            return Drained(steps, finished, outputs)
        result = harness.step()
        steps.append((harness.clock.now(), dict(result.scheduler_output.num_scheduled_tokens)))
        finished += result.finished_request_ids
        outputs += result.outputs
        harness.clock.advance(step_s)
    raise AssertionError(f"did not drain in {limit} steps")
