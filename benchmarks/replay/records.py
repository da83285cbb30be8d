"""What a replay records per request and per system run."""

from __future__ import annotations

from typing import Literal

import attrs

from benchmarks.replay.trace import TraceRequest

Outcome = Literal["completed", "rejected", "cancelled"]
MaxTokens = Literal["output", "context"]
"""What clients send as ``max_tokens``: each answer's length (policies see it), or the rest
of the context window (they do not; the answer ends at its length all the same)."""


@attrs.define(eq=False, kw_only=True)
class RequestRecord:
    """One request's life in a replay, in virtual seconds."""

    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    tenant: str
    priority: int
    slo_class: str | None
    first_scheduled_s: float | None = None
    cached_tokens: int = 0
    """Prompt tokens found in the prefix cache when first scheduled."""
    recomputed_tokens: int = 0
    """Tokens computed again after a preemption threw their KV away."""
    computed_high_water: int = 0
    """The most tokens this request ever had in KV; scheduling below it is recomputation."""
    preemptions: int = 0
    token_times_s: list[float] = attrs.field(factory=list)
    outcome: Outcome | None = None
    finish_s: float | None = None
    reason: str = ""

    @classmethod
    def offered(cls, request: TraceRequest) -> RequestRecord:
        """A fresh record for a request as the trace offers it."""
        return cls(request_id=request.request_id, arrival_s=request.arrival_s,
                   prompt_tokens=request.prompt_tokens, output_tokens=request.output_tokens,
                   tenant=request.tenant or "default", priority=request.priority,
                   slo_class=request.slo_class)

    def finish(self, outcome: Outcome, now: float, reason: str = "") -> None:
        """Close the record once; a second outcome is a bug."""
        if self.outcome is not None:
            raise RuntimeError(f"{self.request_id} already {self.outcome}, now {outcome}")
        self.outcome, self.finish_s, self.reason = outcome, now, reason

    @property
    def ttft_s(self) -> float | None:
        """Arrival to first output token."""
        return self.token_times_s[0] - self.arrival_s if self.token_times_s else None

    @property
    def tpot_s(self) -> float | None:
        """Mean time between output tokens after the first."""
        times = self.token_times_s
        return (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None

    @property
    def e2e_s(self) -> float | None:
        """Arrival to last token of a completed request."""
        return self.finish_s - self.arrival_s if self.outcome == "completed" else None


@attrs.frozen
class EngineSample:
    """Engine state after one step: the series behind the KV-usage and queue plots."""

    time_s: float
    kv_usage: float
    waiting: int
    running: int


@attrs.frozen(kw_only=True)
class SystemRun:
    """Every request record of one system's replay, plus engine-level counters."""

    system: str
    records: tuple[RequestRecord, ...]
    steps: int
    """Engine steps that ran a batch."""
    idle_steps: int = 0
    """Engine steps that scheduled nothing (each costs the cost model's ``t0_s``)."""
    busy_s: float
    makespan_s: float
    preemptions: int
    samples: tuple[EngineSample, ...] = ()
    wall_s: float = 0.0
    """Real seconds the replay took."""
    fast_forwarded_steps: int = 0
    """Of ``steps``, those played by fast-forward (`benchmarks.replay.fast_forward`)."""
