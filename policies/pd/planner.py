"""Prefill/decode planning: how many of N instances prefill and how many decode.

A disaggregated deployment pays only at the right P:D ratio: too few prefill
instances queue prompts (TTFT), too few decode instances queue or slow the
generation (ITL). Colocated instances (each doing both) pool all the capacity
but a decode step that shares its batch with a prefill chunk takes as long as
the chunk, so they pay in ITL. `PDPlanner` chooses among these, as Dynamo's
planner and DistServe's placement do, from what it observed:

- **Demand** over a sliding window: each request's prefill work and decode work
  in instance-seconds, priced by a `CapacityModel` (for example the replay's
  step-cost model), so a 100k-token prompt costs what its quadratic attention
  costs rather than 100k times the mean.
- **Utilization** of a plan: ``max(prefill_work / P, decode_work / D)`` for a
  split (its bottleneck pool) and ``(prefill_work + decode_work) / N`` colocated.
- **The ITL bound**: with ``itl_slo_s`` set, colocation is allowed only if the
  capacity model's colocated inter-token gap (a decode step sharing a full prefill
  chunk) is within it. Without it, colocation always wins (its utilization is a
  mean of the split's pools, never above their maximum).
- **Hysteresis**: once a plan is in place, `plan` moves to a new one only when
  that lowers the utilization by at least the ``hysteresis`` fraction, so the
  split does not flap with noise; a shift in the mix (for example longer
  outputs) moves it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from typing import Protocol, runtime_checkable

import attrs

from policies.validators import finite_non_negative, finite_positive, fraction, int_at_least

__all__ = ["CapacityModel", "FixedCapacity", "PDDemand", "PDPlan", "PDPlanner",
           "PDPlannerStats"]


def _optional_positive(instance: object, attribute: attrs.Attribute, value: object) -> None:
    if value is not None:
        finite_positive(instance, attribute, value)


@attrs.frozen(kw_only=True)
class PDPlan:
    """How many instances prefill and how many decode; ``prefill == 0`` is colocated.

    A colocated plan has every instance in the decode pool doing both phases.
    """

    prefill: int = attrs.field(validator=int_at_least(0))
    decode: int = attrs.field(validator=int_at_least(1))

    @property
    def instances(self) -> int:
        """Instances the plan uses."""
        return self.prefill + self.decode

    @property
    def colocated(self) -> bool:
        """Every instance prefills and decodes (no prefill pool)."""
        return self.prefill == 0

    @property
    def name(self) -> str:
        """``"3P1D"`` for a split, ``"4C"`` for four colocated instances."""
        return f"{self.decode}C" if self.colocated else f"{self.prefill}P{self.decode}D"


@runtime_checkable
class CapacityModel(Protocol):
    """Prices requests in instance-seconds (what one instance spends on them)."""

    def prefill_s(self, prompt_tokens: int, cached_tokens: int) -> float:
        """Seconds a prefill-only instance computes this prompt (``cached_tokens`` reused)."""

    def decode_s(self, prompt_tokens: int, output_tokens: int) -> float:
        """A decode-only instance's seconds for these tokens: its share of the steps."""

    def colocated_itl_s(self) -> float:
        """The inter-token gap on a colocated instance when a prefill chunk shares the step."""


@attrs.frozen(kw_only=True)
class FixedCapacity:
    """A `CapacityModel` with constant per-token rates (for tests and rough sizing)."""

    prefill_tokens_per_s: float = attrs.field(validator=finite_positive)
    decode_tokens_per_s: float = attrs.field(validator=finite_positive)
    colocated_gap_s: float = attrs.field(default=0.25, validator=finite_non_negative)

    def prefill_s(self, prompt_tokens: int, cached_tokens: int) -> float:
        """``(prompt - cached) / prefill_tokens_per_s``."""
        return max(0, prompt_tokens - cached_tokens) / self.prefill_tokens_per_s

    def decode_s(self, prompt_tokens: int, output_tokens: int) -> float:
        """``output / decode_tokens_per_s``."""
        return output_tokens / self.decode_tokens_per_s

    def colocated_itl_s(self) -> float:
        """``colocated_gap_s``."""
        return self.colocated_gap_s


@attrs.frozen(kw_only=True)
class PDDemand:
    """What the planner observed over its window, per second of the window."""

    window_s: float
    requests: int
    prompt_tokens_per_s: float
    """Prompt tokens offered (cached ones included)."""
    prefill_tokens_per_s: float
    """Prompt tokens to compute (not cached)."""
    decode_tokens_per_s: float
    prefill_instances: float
    """Prefill work: instances busy prefilling, on average (instance-seconds per second)."""
    decode_instances: float
    """Decode work: instances busy decoding, on average."""


@attrs.frozen(kw_only=True)
class PDPlannerStats:
    """A snapshot of a planner's counters since construction."""

    observed: int
    """Requests given to `observe`."""
    in_window: int
    """Observations inside the current window."""
    plans: int
    """`plan` calls."""
    changes: int
    """Times `plan` moved to a different plan (the first plan included)."""
    current: PDPlan | None
    utilization: float | None
    """The current plan's utilization at the last `plan` call."""
    colocated_allowed: bool
    """Whether the ITL bound allows colocation."""


@attrs.define(eq=False, kw_only=True)
class PDPlanner:
    """Chooses the P:D split (or colocation) with the lowest bottleneck utilization.

    Guarantees:
        * Every plan uses exactly ``instances`` instances, with at least
          ``min_prefill`` prefill and ``min_decode`` decode instances when split.
        * `best` is optimal: no allowed plan has a lower `utilization` for the demand
          (ties go to colocation, then to fewer prefill instances).
        * A colocated plan is returned only if ``itl_slo_s`` is None or the capacity
          model's colocated gap is within it; with a single instance it is the only plan.
        * `plan` keeps its current plan unless `best` lowers the utilization by at
          least ``hysteresis`` of it (with no ``initial_plan``, the first call takes `best`).
        * Deterministic: same observations, same plans.
    """

    instances: int = attrs.field(validator=int_at_least(1))
    capacity: CapacityModel = attrs.field()
    itl_slo_s: float | None = attrs.field(default=None, validator=_optional_positive)
    """The ITL target; None: colocation is always allowed."""
    window_s: float = attrs.field(default=300.0, validator=finite_positive)
    """Observations older than this (before ``now - window_s``) are forgotten."""
    hysteresis: float = attrs.field(default=0.1, validator=fraction)
    min_prefill: int = attrs.field(default=1, validator=int_at_least(1))
    min_decode: int = attrs.field(default=1, validator=int_at_least(1))
    initial_plan: PDPlan | None = attrs.field(default=None)
    """The plan deployed before the first `plan` call (hysteresis applies to it)."""
    _seen: deque[tuple[float, int, int, int, float, float]] = attrs.field(
        init=False, repr=False, factory=deque)
    """(arrival_s, prompt, cached, output, prefill_s, decode_s) per observed request."""
    _first_s: float = attrs.field(init=False, repr=False, default=math.inf)
    _last_s: float = attrs.field(init=False, repr=False, default=-math.inf)
    _observed: int = attrs.field(init=False, repr=False, default=0)
    _plans: int = attrs.field(init=False, repr=False, default=0)
    _changes: int = attrs.field(init=False, repr=False, default=0)
    _current: PDPlan | None = attrs.field(init=False, repr=False, default=None)
    _utilization: float | None = attrs.field(init=False, repr=False, default=None)

    @initial_plan.validator
    def _check_initial(self, attribute: attrs.Attribute, value: PDPlan | None) -> None:
        if value is not None and (not isinstance(value, PDPlan)
                                  or value.instances != self.instances):
            raise ValueError(f"initial_plan must be a PDPlan of {self.instances} instances, "
                             f"got {value!r}")

    def __attrs_post_init__(self) -> None:
        if self.min_prefill + self.min_decode > self.instances and self.instances > 1:
            raise ValueError(f"min_prefill + min_decode must be at most instances "
                             f"({self.instances}), got {self.min_prefill} + {self.min_decode}")
        self._current = self.initial_plan

    @capacity.validator
    def _check_capacity(self, attribute: attrs.Attribute, value: object) -> None:
        if not isinstance(value, CapacityModel):
            raise ValueError(f"capacity must implement CapacityModel (prefill_s, decode_s, "
                             f"colocated_itl_s), got {value!r}")

    def observe(self, now: float, *, prompt_tokens: int, output_tokens: int,
                cached_tokens: int = 0) -> None:
        """One request that arrived at ``now`` (non-decreasing across calls)."""
        if not now >= self._last_s:
            raise ValueError(f"now must not go backwards: {now!r} after {self._last_s!r}")
        if not 0 <= cached_tokens <= prompt_tokens or output_tokens < 0:
            raise ValueError(f"need 0 <= cached_tokens <= prompt_tokens and output_tokens >= 0,"
                             f" got {cached_tokens}, {prompt_tokens}, {output_tokens}")
        if not self._observed:
            self._first_s = now
        self._last_s = now
        self._observed += 1
        self._seen.append((now, prompt_tokens, cached_tokens, output_tokens,
                           self.capacity.prefill_s(prompt_tokens, cached_tokens),
                           self.capacity.decode_s(prompt_tokens, output_tokens)))

    def demand(self, now: float) -> PDDemand:
        """The demand of the requests that arrived in ``(now - window_s, now]``."""
        self._forget(now)
        seen = [entry for entry in self._seen if entry[0] <= now]
        observed_s = now - self._first_s  # a window not yet full counts from the first arrival
        span = min(self.window_s, observed_s) if observed_s > 0 else self.window_s
        return PDDemand(
            window_s=span, requests=len(seen),
            prompt_tokens_per_s=sum(e[1] for e in seen) / span,
            prefill_tokens_per_s=sum(e[1] - e[2] for e in seen) / span,
            decode_tokens_per_s=sum(e[3] for e in seen) / span,
            prefill_instances=sum(e[4] for e in seen) / span,
            decode_instances=sum(e[5] for e in seen) / span)

    def colocated_allowed(self) -> bool:
        """Whether the ITL bound (if any) admits a colocated plan."""
        return self.itl_slo_s is None or self.capacity.colocated_itl_s() <= self.itl_slo_s

    def candidates(self) -> list[PDPlan]:
        """Every allowed plan: colocated first (if allowed), then splits by prefill count."""
        plans = [PDPlan(prefill=0, decode=self.instances)] if self.colocated_allowed() else []
        plans += [PDPlan(prefill=p, decode=self.instances - p)
                  for p in range(self.min_prefill, self.instances - self.min_decode + 1)]
        return plans or [PDPlan(prefill=0, decode=self.instances)]

    @staticmethod
    def utilization(plan: PDPlan, demand: PDDemand) -> float:
        """The busiest pool's average load in instances per instance (1.0: saturated)."""
        if plan.colocated:
            return (demand.prefill_instances + demand.decode_instances) / plan.decode
        return max(demand.prefill_instances / plan.prefill, demand.decode_instances / plan.decode)

    def best(self, demand: PDDemand) -> PDPlan:
        """The allowed plan with the lowest utilization (ties: colocated, fewer prefill)."""
        return min(self.candidates(), key=lambda plan: self.utilization(plan, demand))

    def plan(self, now: float) -> PDPlan:
        """The plan for what follows ``now``: `best`, unless the current one is close enough."""
        demand = self.demand(now)
        best = self.best(demand)
        current = self._current
        self._plans += 1
        if current is None or current not in self.candidates() or (
                self.utilization(best, demand)
                < (1 - self.hysteresis) * self.utilization(current, demand)):
            if best != current:
                self._changes += 1
            current = self._current = best
        self._utilization = self.utilization(current, demand)
        return current

    def _forget(self, now: float) -> None:
        while self._seen and self._seen[0][0] <= now - self.window_s:
            self._seen.popleft()

    def observe_all(self, requests: Iterable[tuple[float, int, int, int]]) -> None:
        """`observe` each ``(arrival_s, prompt_tokens, cached_tokens, output_tokens)``."""
        for now, prompt, cached, output in requests:
            self.observe(now, prompt_tokens=prompt, output_tokens=output, cached_tokens=cached)

    def stats(self) -> PDPlannerStats:
        """Counters since construction and the current plan."""
        return PDPlannerStats(observed=self._observed, in_window=len(self._seen),
                              plans=self._plans, changes=self._changes, current=self._current,
                              utilization=self._utilization,
                              colocated_allowed=self.colocated_allowed())

    def check_invariants(self) -> None:
        """Observations in arrival order and within their window; the plan fits."""
        times = [entry[0] for entry in self._seen]
        assert times == sorted(times), "observations out of order"
        assert len(self._seen) <= self._observed
        assert self._changes <= self._plans
        assert all(e[4] >= 0 and e[5] >= 0 and 0 <= e[2] <= e[1] for e in self._seen)
        if self._current is not None:
            assert self._current.instances == self.instances
            assert self._current.colocated or (self._current.prefill >= self.min_prefill
                                               and self._current.decode >= self.min_decode)
