"""Fast-forward a replay through stretches of identical pure-decode steps, exactly.

When every running request is decoding (its whole context but the last sampled token
is in KV), no waiting request can start, and nothing arrives, is cancelled, finishes or
is sampled before some later step, every step until then is the same step again: each running request gets one token, the virtual
clock advances by the cost model's price of the batch, and new KV blocks are taken from
the free queue when a request's context crosses a block boundary. `FastForward` plays
those steps without calling vLLM's ``schedule()`` and ``update_from_output()``: it
appends the sampled tokens with vLLM's own `Request` methods, sets
``num_computed_tokens``, and calls vLLM's own ``KVCacheManager.allocate_slots`` at
exactly the steps, in exactly the order (step, then running order), in which the real
loop would have allocated or cached a block. The records (token times, counters), the
scheduler's requests and the block pool end up as the step-by-step loop leaves them; a
test checks the records field for field on every system.

It is used only where nothing else observes the skipped steps:

* the scheduler is vLLM's synchronous ``Scheduler`` or our `PolicyScheduler` (not the
  async one, nor a subclass such as the start-gated scheduler), with no KV connector,
  no speculative decoding, no lookahead slots and no Prometheus metrics;
* the pipeline has no fairness, levels or deadline policy (they charge or re-rank every
  step), and no hook that runs at every step (``before_schedule``, ``after_schedule``,
  ``before_update``, ``pending``: start gates, warming, draft budgets, step logs), unless
  it does nothing on a pure-decode step (``observes_decode_steps`` false). Rate,
  admission, watermarks, quotas, rankings and eviction orders only act on arrivals,
  prefills and frees, none of which happen in a pure-decode stretch;
* nothing waits, or the running list is full (vLLM then stops its waiting pass before
  looking at the queue), or the request at the head of the queue was refused KV blocks
  in the last step and nothing can make it fit sooner: in a pure-decode stretch free
  blocks only fall and cached prefixes only get evicted, so it is refused at every
  skipped step too. A pipeline with a rate, watermark or quota policy could shrink the
  head's chunk as time passes or KV fills, so its queue must be empty (or the running
  list full).

Anything else makes `FastForward.supported` false, and the replay steps one by one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from benchmarks.replay.cost_model import StepBatch, StepCostModel
from integrations.vllm_v1.instruments.harness import SAMPLED_TOKEN_ID, SchedulerHarness
from integrations.vllm_v1.scheduling.scheduler import PolicyScheduler, PolicySchedulerMixin

_PER_STEP_POINTS = ("before_schedule", "after_schedule", "before_update", "pending")
"""Hook points that run every step (a hook overriding one may see the skipped steps)."""


def unsupported_reason(harness: SchedulerHarness) -> str | None:
    """Why ``harness`` cannot be fast-forwarded, or None if it can."""
    scheduler = harness.scheduler
    cls = type(scheduler)
    if cls is not PolicyScheduler and cls not in PolicyScheduler.__mro__[1:]:
        return f"scheduler class {cls.__name__}"
    config = scheduler.vllm_config
    if getattr(scheduler, "connector", None) is not None:
        return "a KV connector"
    if config.speculative_config is not None or scheduler.num_lookahead_tokens:
        return "speculative decoding"
    if scheduler.lora_config is not None:
        return "LoRA"
    if getattr(scheduler, "defer_block_free", False):
        return "deferred block frees"
    if scheduler.num_sampled_tokens_per_step != 1:
        return "a pooling model"
    if len(scheduler.kv_cache_config.kv_cache_groups) != 1:
        return "more than one KV-cache group"
    if isinstance(scheduler, PolicySchedulerMixin):
        pipeline = scheduler.pipeline
        for slot in ("fairness", "levels"):
            if getattr(pipeline, slot) is not None:
                return f"the pipeline's {slot} policy observes every step"
        if pipeline.deadline_policy is not None:
            return "the pipeline's deadline policy observes every step"
        for point in _PER_STEP_POINTS:
            if any(call.__self__.observes_decode_steps for call in getattr(scheduler.hooks, point)):
                return f"a hook runs at {point}"
        if scheduler.metrics is not None:
            return "Prometheus metrics refresh every step"
    return None


class FastForward:
    """Plays runs of identical pure-decode steps of one replay without vLLM's step loop."""

    def __init__(self, harness: SchedulerHarness, cost_model: StepCostModel) -> None:
        self.harness = harness
        self.cost_model = cost_model
        self.reason = unsupported_reason(harness)
        """Why fast-forward is off for this harness (None: it is on)."""
        self.steps = 0
        """Steps played by fast-forward so far."""
        scheduler = harness.scheduler
        pipeline = getattr(scheduler, "pipeline", None)
        self._head_stays_blocked = pipeline is None or (
            pipeline.rate is None and pipeline.watermarks is None and pipeline.quotas is None)
        """Whether a waiting head refused KV blocks stays refused while nothing frees any."""
        self._reorders = pipeline is not None and pipeline.reorders_requests
        self._manager = scheduler.kv_cache_manager
        self._block_size = scheduler.kv_cache_config.kv_cache_groups[0].kv_cache_spec.block_size

    @property
    def supported(self) -> bool:
        """Whether this harness can be fast-forwarded at all."""
        return self.reason is None

    def next_decodes(self, *, started: bool, preempted: bool, finished: bool,
                     saturated: bool) -> tuple[str, ...] | None:
        """After a real step: the requests the next step decodes, in service order, if it
        is predictably a plain decode of every running request; else None.

        ``started``: the step started a request (new or resumed); ``preempted``: it
        preempted one; ``finished``: a request finished in it (its blocks were freed after
        the waiting queue was looked at). A pipeline that sorts the running list sorted it at the start of
        this step, so the order holds unless a request was appended since (``started``).
        ``saturated``: the step used its whole token budget, so a waiting head it left may
        not have been refused KV blocks at all.
        """
        scheduler = self.harness.scheduler
        if preempted or (started and self._reorders):
            return None
        running = scheduler.running
        if not running or len(running) > scheduler.max_num_scheduled_tokens:
            return None
        for request in running:
            computed = request.num_computed_tokens
            if request.num_tokens != computed + 1 or computed < request.num_prompt_tokens:
                return None  # a prefill chunk left, or not a plain one-token decode
        if not self._queue_is_inert(started or finished or saturated):
            return None
        return tuple(request.request_id for request in running)

    def _queue_is_inert(self, changed: bool) -> bool:
        """Whether no waiting request can start in the coming steps: the queue is empty,
        the running list is full, or the head was refused KV blocks in the last step and
        stays refused (``changed``: the last step started or freed something, or ran out of
        token budget before the head, so it may not)."""
        scheduler = self.harness.scheduler
        running, waiting = scheduler.get_request_counts()
        if not waiting:
            return True
        if running + scheduler.num_waiting_for_streaming_input >= scheduler.max_num_active_reqs:
            return True
        if changed or not self._head_stays_blocked or scheduler.kv_holding_waiting:
            return False
        return scheduler.waiting.peek_request().status.name in ("WAITING", "PREEMPTED")

    def plan(self, request_ids: Sequence[str], *, until_s: float, last_sample_s: float | None,
             sample_every_s: float) -> tuple[list[Any], list[float], bool]:
        """The requests and step durations of the steps that can be played from now, and
        whether the last of them ends with an engine sample.

        A step is played only if it starts before ``until_s`` (the next arrival or
        cancellation), no request finishes in it and every block it allocates is free.
        A step whose end takes an engine sample ends the run of steps (the sample is
        taken from the state it leaves).
        """
        scheduler = self.harness.scheduler
        requests = [scheduler.requests[req_id] for req_id in request_ids]
        limit = min(self.harness.tokens_left(r) for r in requests) - 1
        contexts = [r.num_computed_tokens for r in requests]
        size = self._block_size
        free = self._manager.block_pool.get_num_free_blocks()
        now = self.harness.clock.now()
        durations: list[float] = []
        for step in range(max(limit, 0)):
            if now >= until_s:
                break
            free -= sum(1 for c in contexts if (c + step) % size == 0)
            if free < 0:
                break
            batch = StepBatch(decode_context_tokens=tuple(c + step for c in contexts))
            duration = self.cost_model.step_time_s(batch)
            durations.append(duration)
            now += duration
            if last_sample_s is None or now - last_sample_s >= sample_every_s:
                return requests, durations, True
        return requests, durations, False

    def play(self, requests: list[Any], steps: int) -> None:
        """Advance ``requests`` by ``steps`` decode steps, allocating as vLLM would."""
        size = self._block_size
        start = [r.num_computed_tokens for r in requests]
        done = [0] * len(requests)  # steps applied so far to each request
        events = []
        for index, c in enumerate(start):
            first_alloc = (-c) % size
            first_full = (-c - 1) % size
            for first in sorted({first_alloc, first_full}):
                events.extend((step, index) for step in range(first, steps, size))
        events.sort()
        allocate = self._manager.allocate_slots
        lookahead = self.harness.scheduler.num_lookahead_tokens
        for step, index in events:
            request = requests[index]
            self._advance(request, start[index], done[index], step)
            done[index] = step
            if allocate(request, 1, num_lookahead_tokens=lookahead) is None:
                raise RuntimeError(f"fast-forward: no free block for {request.request_id} at "
                                   f"step {step} (the plan said there was one)")
        for index, request in enumerate(requests):
            self._advance(request, start[index], done[index], steps)
        self.harness.scheduler.current_step += steps
        self.steps += steps

    @staticmethod
    def _advance(request: Any, start: int, done: int, step: int) -> None:
        """Bring ``request`` from ``done`` to ``step`` played steps (tokens, computed)."""
        for _ in range(step - done):
            request.append_output_token_ids(SAMPLED_TOKEN_ID)
        request.num_computed_tokens = start + step
