"""PD-aware scheduling: a decode instance starts new requests only while its steps stay short.

A decode step's time grows with the context its batch reads (every decoding
sequence's KV is read once per token), so the inter-token latency of a decode
instance follows how much KV it holds. `DecodeKVGate` bounds that KV: a waiting
request starts only if the blocks it needs keep the instance's KV usage within
``max_kv_usage``. `DecodeStepGate` bounds the step time itself: a request starts
only while the step the batch would then run, predicted by a step-time model
learned from the instance's own steps, stays within a multiple of the
step's fixed cost (what a step costs before any sequence: reading the weights,
launches), learned the same way (and the KV bound still holds). Requests either
gate holds back wait (they are not rejected) and start as running ones finish.
The bound trades TTFT (queueing on the decode side) for a flatter ITL.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import attrs

from policies.step_model import OnlineStepTimeModel
from policies.validators import at_least, finite_positive, int_at_least


def _usage_bound(_instance: object, attribute: attrs.Attribute, value: float) -> None:
    if not 0.0 < value <= 1.0:  # also rejects NaN
        raise ValueError(f"{attribute.name} must be in (0, 1], got {value!r}")


@runtime_checkable
class StartGate(Protocol):
    """How many leading waiting requests may start this step (`DecodeKVGate`); the
    ``start_gate`` slot of a pipeline."""

    def startable(self, needed_blocks: list[int], *, used_blocks: int, total_blocks: int,
                  running_requests: int, block_size_tokens: int) -> int:
        """How many leading requests of the queue (``needed_blocks`` each, of
        ``block_size_tokens`` tokens) may start now."""
        ...


@attrs.frozen(kw_only=True)
class DecodeKVGate:
    """Starts waiting requests, in queue order, only while their KV fits under a usage bound.

    Guarantees:
        * While any request runs, the requests `startable` lets start need, together
          with the blocks in use, at most ``max_kv_usage * total_blocks`` blocks.
        * With nothing running, at least the head of the queue starts: the gate
          never stalls an idle engine (a request bigger than the bound runs alone).
        * Monotone: more blocks in use, or bigger requests, never let more start.
    """

    max_kv_usage: float = attrs.field(default=0.5, validator=_usage_bound)
    """Fraction of the KV blocks the running requests may hold after a start."""

    def startable(self, needed_blocks: list[int], *, used_blocks: int, total_blocks: int,
                  running_requests: int, block_size_tokens: int | None = None) -> int:
        """How many leading requests of the queue (``needed_blocks`` each) may start now
        (``block_size_tokens`` is not used: the bound counts blocks)."""
        budget = self.max_kv_usage * total_blocks - used_blocks
        count = 0
        for blocks in needed_blocks:
            budget -= blocks
            if budget < 0:
                break
            count += 1
        return count if count or running_requests else min(1, len(needed_blocks))


@attrs.frozen(kw_only=True)
class DecodeStepGateStats:
    """A snapshot of a `DecodeStepGate`."""

    step_bound_s: float | None
    """The predicted step time a start may not push the batch past (None while the step
    model has seen fewer than ``warmup_steps`` steps: only the KV bound applies)."""
    fixed_step_s: float
    """The step model's fixed cost of a step (`StepTimeModel.base_s`)."""
    calls: int
    """`startable` calls."""
    held_by_step: int
    """Calls in which the step bound, not the KV bound or the queue, stopped the starts."""


@attrs.define(eq=False, kw_only=True)
class DecodeStepGate:
    """Starts waiting requests, in queue order, only while the predicted decode step stays
    within ``max_step_ratio`` times the instance's own fixed step cost.

    The step is predicted by ``step_model`` (the pipeline's ``step_model`` slot must hold
    the same object, so that it learns from this instance's steps): the batch after a start
    decodes the running requests and the started ones over their context in all (the blocks
    in use and those the started requests need). The bound is ``max_step_ratio`` times the
    model's fixed cost of a step (its intercept, `StepTimeModel.base_s`: identified by the
    varying batch sizes an instance runs, where a step of one sequence over no context
    would be extrapolated along decodes and context that grow together), so it follows
    what the GPU and model cost, not the size of the KV cache.

    Guarantees:
        * Never more than `DecodeKVGate` with the same ``max_kv_usage`` lets start (the KV
          bound is a hard cap).
        * While any request runs and the model has seen ``warmup_steps`` steps, the batch
          the starts make is predicted to step within `stats` ``step_bound_s``.
        * With nothing running, at least the head of the queue starts: the gate never stalls
          an idle engine.
        * Monotone: more blocks in use, bigger requests or (while any runs) more running
          requests never let more start.
    """

    step_model: OnlineStepTimeModel = attrs.field(
        validator=attrs.validators.instance_of(OnlineStepTimeModel))
    """Predicts the step time; learns from the instance's steps through the pipeline's
    ``step_model`` slot (a model nobody feeds never warms up: only the KV bound applies)."""
    max_step_ratio: float = attrs.field(default=2.0, validator=[finite_positive, at_least(1.0)])
    """The predicted step may take at most this multiple of the fixed step cost (2: the
    batch's decodes and KV reads take at most as long as the rest of the step)."""
    max_kv_usage: float = attrs.field(default=0.5, validator=_usage_bound)
    """The hard cap: fraction of the KV blocks the running requests may hold after a start."""
    warmup_steps: int = attrs.field(default=256, validator=int_at_least(0))
    """Steps the model must have learned from before the step bound applies."""

    _calls: int = attrs.field(init=False, default=0, repr=False)
    _held_by_step: int = attrs.field(init=False, default=0, repr=False)

    def step_bound_s(self) -> float | None:
        """The step time starts may not push the predicted batch past (None while warming
        up)."""
        if self.step_model.observations < self.warmup_steps:
            return None
        return self.max_step_ratio * self.step_model.model.base_s

    def startable(self, needed_blocks: list[int], *, used_blocks: int, total_blocks: int,
                  running_requests: int, block_size_tokens: int) -> int:
        """How many leading requests of the queue (``needed_blocks`` each, of
        ``block_size_tokens`` tokens) may start now."""
        self._calls += 1
        bound = self.step_bound_s()
        model = self.step_model.model
        budget = self.max_kv_usage * total_blocks - used_blocks
        step_s = model.step_s(running_requests, 0, used_blocks * block_size_tokens)
        count = 0
        for blocks in needed_blocks:
            budget -= blocks
            if budget < 0:
                break
            step_s += model.decode_s(blocks * block_size_tokens)
            if bound is not None and step_s > bound:
                self._held_by_step += 1
                break
            count += 1
        return count if count or running_requests else min(1, len(needed_blocks))

    def stats(self) -> DecodeStepGateStats:
        """A frozen snapshot (see `DecodeStepGateStats`)."""
        return DecodeStepGateStats(step_bound_s=self.step_bound_s(),
                                   fixed_step_s=self.step_model.model.base_s,
                                   calls=self._calls, held_by_step=self._held_by_step)

    def check_invariants(self) -> None:
        """Counters consistent; the bound, once set, at least the fixed step cost."""
        assert 0 <= self._held_by_step <= self._calls
        bound = self.step_bound_s()
        assert bound is None or bound >= self.step_model.model.base_s
