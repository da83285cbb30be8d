"""Orders in which requests are served: FCFS and QoS ranking with aging.

A ranking gives each request a *time-invariant* key (lower is served first).
Aging that is linear in waiting time is folded into the key: if every waiting
request gains urgency at the same rate, their relative order never changes,
so ``effective_priority(r, now)`` ranks requests exactly as ``rank_key(r)``
does at every ``now``, and queues stay sorted without re-evaluation.
"""

from __future__ import annotations

import attrs

from policies.views import RequestView


@attrs.frozen
class FCFSOrder:
    """First come, first served: every key is equal, so insertion order decides.

    A queue that breaks ties by insertion order (and puts re-queued requests in
    front) behaves exactly like vLLM's ``fcfs`` policy under this ranking.
    """

    def rank_key(self, request: RequestView) -> float:
        """Always 0.0: no request outranks another."""
        return 0.0

    def effective_priority(self, request: RequestView, now: float) -> float:
        """Minus the time waited: older is more urgent."""
        return request.arrival_s - now


def _ascending(_instance: object, attribute: attrs.Attribute, value: tuple[int, ...]) -> None:
    if any(b <= a for a, b in zip(value, value[1:], strict=False)) or any(v <= 0 for v in value):
        raise ValueError(f"{attribute.name} must be positive and strictly ascending, got {value!r}")


def _finite_non_negative(_instance: object, attribute: attrs.Attribute, value: tuple) -> None:
    if any(not 0 <= v < float("inf") for v in value):
        raise ValueError(f"{attribute.name} must be finite and >= 0, got {value!r}")


@attrs.frozen(kw_only=True)
class QoSRanker:
    """Business priority + prompt-length class + wait-time aging, short first.

    A request's effective priority, in seconds (lower is served first), is:

        priority * priority_step_s + length_penalty_s(prompt_tokens) - waited_s

    Guarantees:
        * Among requests that arrived at the same time, a more urgent API
          priority, then a shorter prompt class, is served first.
        * No starvation: a request is never overtaken by one that arrived more
          than ``max_overtake_s(p_min, p_max)`` seconds after it, whatever
          the load.
    """

    priority_step_s: float = attrs.field(default=2.0, validator=attrs.validators.ge(0.0))
    """Waiting time one step of API priority is worth."""
    length_thresholds_tokens: tuple[int, ...] = attrs.field(
        default=(256, 1024, 4096), converter=tuple, validator=_ascending
    )
    """Upper bounds (exclusive) of the prompt-length classes, shortest first."""
    length_penalties_s: tuple[float, ...] = attrs.field(
        default=(0.0, 1.0, 4.0, 16.0), converter=tuple, validator=_finite_non_negative
    )
    """Handicap of each length class; one more entry than thresholds."""

    def __attrs_post_init__(self) -> None:
        if len(self.length_penalties_s) != len(self.length_thresholds_tokens) + 1:
            raise ValueError(
                "length_penalties_s needs one entry more than length_thresholds_tokens, got "
                f"{len(self.length_penalties_s)} and {len(self.length_thresholds_tokens)}"
            )

    def length_penalty_s(self, prompt_tokens: int) -> float:
        """Handicap of the length class ``prompt_tokens`` falls in."""
        for threshold, penalty in zip(
            self.length_thresholds_tokens, self.length_penalties_s, strict=False
        ):
            if prompt_tokens < threshold:
                return penalty
        return self.length_penalties_s[-1]

    def rank_key(self, request: RequestView) -> float:
        """Time-invariant key: ``effective_priority(request, now) + now``."""
        return (
            request.arrival_s
            + request.priority * self.priority_step_s
            + self.length_penalty_s(request.prompt_tokens)
        )

    def effective_priority(self, request: RequestView, now: float) -> float:
        """Urgency at ``now`` in seconds; lower is served first."""
        return self.rank_key(request) - now

    def max_overtake_s(self, priority_min: int, priority_max: int) -> float:
        """Longest head start a later arrival can overcome, for priorities in range."""
        if priority_max < priority_min:
            raise ValueError(f"empty priority range [{priority_min}, {priority_max}]")
        penalties = self.length_penalties_s
        return (priority_max - priority_min) * self.priority_step_s + max(penalties) - min(
            penalties
        )
