"""`StepTimingHook`: feeds the pipeline's ``step_model`` what each engine step ran and took.

A step's features come from the scheduler's output (`scheduled_chunks`: prefill chunks with
the tokens already in KV, prefix-cache hits included, and decode contexts); its duration is
read off the scheduler's clock, from when the step was scheduled, or from the previous
step's output when that came later, to when its output reaches ``update_from_output``:

- synchronous scheduling (CPU; GPU without async): schedule, run, update, so the duration is
  the step's own run plus the scheduler's work around it;
- asynchronous scheduling (GPU default): step N+1 is scheduled while N runs and starts when
  N ends, so from N's output to N+1's is N+1's run.

In the replay the clock is virtual and advanced by the cost model between the two calls, so
the same code learns the cost model's steps.

Metrics, with a model that has ``stats()`` (`OnlineStepTimeModel`):
``policies:step_model_coefficient{term}`` (``base``, ``decode``, ``decode_context_token``,
``prefill_token``, ``prefill_pair``), ``policies:step_model_relative_error{quantile}``
(``0.5``, ``0.99``: out-of-sample, over the recent steps) and
``policies:step_model_observations``.
"""

from __future__ import annotations

from typing import Any

from integrations.vllm_v1.hooks import SchedulerHook
from integrations.vllm_v1.metrics import PolicyMetrics, Series
from policies import StepFeatures, StepModelStats, StepObserver

_MAX_PENDING = 8
"""Outputs scheduled and not yet updated that are remembered (async scheduling has 2)."""

COEFFICIENT = Series("policies:step_model_coefficient", "The learned step-time model's "
                     "coefficients (seconds per unit of the term)", ("term",))
RELATIVE_ERROR = Series("policies:step_model_relative_error", "Relative error of the "
                        "step-time model's predictions over its recent steps", ("quantile",))
OBSERVATIONS = Series("policies:step_model_observations",
                      "Engine steps the step-time model has learned from")


def report_step_model(metrics: PolicyMetrics, stats: StepModelStats) -> None:
    """Set the step-time model's gauges: its coefficients and its recent error."""
    model = stats.model
    for term, value in (("base", model.base_s), ("decode", model.decode_s_per_seq),
                        ("decode_context_token", model.decode_s_per_context_token),
                        ("prefill_token", model.prefill_s_per_token),
                        ("prefill_pair", model.prefill_s_per_pair)):
        metrics.set(COEFFICIENT, value, term=term)
    for quantile, value in (("0.5", stats.relative_error_p50),
                            ("0.99", stats.relative_error_p99)):
        if value is not None:
            metrics.set(RELATIVE_ERROR, value, quantile=quantile)
    metrics.set(OBSERVATIONS, stats.observations)


def scheduled_chunks(scheduler: Any, num_scheduled_tokens: dict[str, int]
                     ) -> tuple[tuple[tuple[int, int], ...], tuple[int, ...]]:
    """``(prefill chunks as (new tokens, tokens already in KV), decode contexts)`` of a
    scheduled step; call between ``schedule()`` and ``update_from_output()``.

    A request scheduled for one token with its whole prompt in KV decodes; anything else
    (first prefill, chunk, recompute after preemption) is a prefill chunk.
    """
    prefills, decodes = [], []
    requests = scheduler.requests
    for req_id, tokens in num_scheduled_tokens.items():
        request = requests[req_id]
        before = request.num_computed_tokens - tokens
        if tokens == 1 and before >= request.num_prompt_tokens:
            decodes.append(before)
        else:
            prefills.append((tokens, before))
    return tuple(prefills), tuple(decodes)


class StepTimingHook(SchedulerHook):
    """Times every step that ran something and hands it to the ``step_model`` policy."""

    def __init__(self, scheduler: Any, model: StepObserver) -> None:
        self._scheduler = scheduler
        self._model = model
        self._pending: dict[int, tuple[StepFeatures, float]] = {}
        self._last_output_s = float("-inf")

    def after_schedule(self, scheduler_output: Any) -> None:
        scheduled = scheduler_output.num_scheduled_tokens
        if not scheduled:
            return
        if len(self._pending) >= _MAX_PENDING:  # outputs that never came back
            self._pending.clear()
        prefills, decodes = scheduled_chunks(self._scheduler, scheduled)
        self._pending[id(scheduler_output)] = (StepFeatures.of(prefills, decodes),
                                               self._scheduler.clock())

    def before_update(self, scheduler_output: Any, model_runner_output: Any) -> None:
        now = self._scheduler.clock()
        entry = self._pending.pop(id(scheduler_output), None)
        if entry is not None:
            features, scheduled_s = entry
            self._model.observe(features, now - max(scheduled_s, self._last_output_s))
        self._last_output_s = now

    def refresh_metrics(self, metrics: PolicyMetrics) -> None:
        stats = getattr(self._model, "stats", None)
        if stats is not None:
            report_step_model(metrics, stats())
