"""Replay a trace through the real vLLM scheduler in virtual time.

Each system (stock ``fcfs`` / ``priority``, or ``pipeline:NAME``) gets its own
`SchedulerHarness` over the same engine shape. The loop admits arrivals whose
time has come, calls vLLM's ``schedule()``, prices the scheduled batch with the
step-cost model, advances the virtual clock by that much, and feeds back one
sampled token per finished prefill or decode. Cancellations abort requests at
their time. Every offered request ends completed, rejected or cancelled; one
that does none of these fails the run.

As vLLM's API does, a request whose prompt does not leave room for one output token
in ``max_model_len`` is rejected on arrival (``prompt_too_long``, an HTTP 400) and
never reaches the scheduler, and ``max_tokens`` is clamped to what the context leaves.
A replay in which nothing is scheduled for ``max_idle_steps`` steps in a row raises
`ReplayStalled` naming the stuck requests, instead of stepping forever.

Stretches of identical pure-decode steps are played by `FastForward`
(`benchmarks.replay.fast_forward`) without vLLM's step loop where nothing can observe
the difference; ``fast_forward=False`` steps one by one (the records are identical).
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable

import attrs

from benchmarks.replay.cost_model import PrefillChunk, StepBatch, StepCostModel
from benchmarks.replay.fast_forward import FastForward
from benchmarks.replay.records import EngineSample, MaxTokens, RequestRecord, SystemRun
from benchmarks.replay.trace import Trace, TraceRequest
from benchmarks.replay.workloads import TENANT_WEIGHTS
from integrations.vllm_v1.config.spec import resolve_pipeline
from integrations.vllm_v1.instruments.harness import (
    EngineShape,
    ScheduledWork,
    SchedulerHarness,
    scheduled_work,
)
from integrations.vllm_v1.rejection import Rejection

STOCK_SYSTEMS = ("fcfs", "priority")
_TOKEN_SPACE = 1 << 30
DEFAULT_MAX_IDLE_STEPS = 10_000
"""Steps in a row that schedule nothing before a replay is declared stuck (10 s of virtual
time at the default 1 ms fixed step cost; the token bucket refills in well under that)."""
PROMPT_TOO_LONG = Rejection(reason="prompt_too_long")
"""How the replay records a prompt vLLM's API would refuse with a 400."""


class ReplayStalled(RuntimeError):
    """A replay scheduled nothing for ``max_idle_steps`` steps in a row: no request can run."""

    def __init__(self, message: str, stuck: list[str]) -> None:
        super().__init__(message)
        self.stuck = stuck
        """Ids of the requests still waiting or running when the replay gave up."""


def build_harness(system: str, shape: EngineShape) -> SchedulerHarness:
    """A harness for ``fcfs``, ``priority`` or ``pipeline:SPEC`` (see `resolve_pipeline`)."""
    if system in STOCK_SYSTEMS:
        return SchedulerHarness.build(None, shape=shape, stock_policy=system)
    if system.startswith("pipeline:"):
        pipeline = resolve_pipeline(system.removeprefix("pipeline:"),
                                    tenant_weights=TENANT_WEIGHTS)
        return SchedulerHarness.build(pipeline, shape=shape)
    raise ValueError(f"unknown system {system!r}: use fcfs, priority or pipeline:NAME")


def prompt_token_ids(request: TraceRequest, index: int, block_size: int | None) -> list[int]:
    """Token ids whose vLLM block hashes share exactly where the trace's hashes do.

    Block ``j`` with trace hash ``h`` becomes ``block_size`` tokens derived from
    ``h`` alone; the rest of the prompt is unique to the request.
    """
    tokens: list[int] = []
    for block_hash in request.block_hashes:
        base = (block_hash * 2654435761) % _TOKEN_SPACE
        tokens.extend((base + t) % _TOKEN_SPACE for t in range(block_size or 0))
    tokens = tokens[: request.prompt_tokens]
    unique = _TOKEN_SPACE + index * 1_000_003
    tokens.extend(range(unique, unique + request.prompt_tokens - len(tokens)))
    return tokens


def step_batch(harness: SchedulerHarness, num_scheduled_tokens: dict[str, int]) -> StepBatch:
    """The cost-model view of a scheduled step (call after ``schedule()``)."""
    return work_batch(scheduled_work(harness.scheduler, num_scheduled_tokens))


def work_batch(work: ScheduledWork) -> StepBatch:
    """A `ScheduledWork` as the cost model's `StepBatch`."""
    return StepBatch(prefills=tuple(PrefillChunk(tokens=c, cached_tokens=k)
                                    for c, k in work.prefills),
                     decode_context_tokens=work.decode_contexts)

@attrs.define(eq=False)
class ReplayRun:
    """One engine's replay in progress: its harness stepped in virtual time, its records."""

    harness: SchedulerHarness
    trace: Trace
    cost_model: StepCostModel
    records: dict[str, RequestRecord] = attrs.field(factory=dict)
    _cancels: list[tuple[float, str]] = attrs.field(factory=list)
    steps: int = 0
    idle_steps: int = 0
    busy_s: float = 0.0
    preemptions: int = 0
    samples: list[EngineSample] = attrs.field(factory=list)
    sample_every_s: float = 1.0
    idle_run: int = 0
    """Steps in a row that scheduled nothing (the watchdog's count)."""
    fast: FastForward | None = None
    stable: tuple[str, ...] | None = None
    """The requests the next step will decode, in order, when `FastForward` can predict it."""
    touched: bool = False
    """A request arrived or was cancelled since the last step (its effects show in the next)."""
    max_tokens: MaxTokens = "output"

    def admit(self, index: int, request: TraceRequest) -> None:
        self.touched = True
        max_model_len = self.harness.scheduler.max_model_len
        if request.prompt_tokens >= max_model_len:  # vLLM's API: HTTP 400, never scheduled
            record = self.records[request.request_id] = RequestRecord.offered(request)
            record.finish("rejected", request.arrival_s, reason=PROMPT_TOO_LONG.stop_reason)
            return
        extra = {"tenant": request.tenant} if request.tenant else {}
        if request.slo_class:
            extra["slo_class"] = request.slo_class
        if request.deadline_s is not None:
            extra["deadline_ms"] = request.deadline_s * 1000.0
        self.records[request.request_id] = RequestRecord.offered(request)
        room = max_model_len - request.prompt_tokens
        max_tokens = room if self.max_tokens == "context" else min(request.output_tokens, room)
        self.harness.add_request(
            request.request_id, prompt_token_ids(request, index, self.trace.block_size),
            max_tokens, priority=request.priority, extra_args=extra or None,
            arrival_s=request.arrival_s, session_id=request.session_id,
            output_tokens=request.output_tokens)
        if request.cancel_after_s is not None:
            heapq.heappush(self._cancels, (request.arrival_s + request.cancel_after_s,
                                           request.request_id))

    def next_cancel_s(self) -> float:
        """When the next client cancel is due (inf: none pending)."""
        return self._cancels[0][0] if self._cancels else math.inf

    def forget(self, req_id: str) -> None:
        """Drop a finished request's record and any cancel still pending for it (a cluster
        retries a replica's rejection on another replica, which then keeps its record)."""
        del self.records[req_id]
        if any(pending == req_id for _, pending in self._cancels):
            self._cancels = [entry for entry in self._cancels if entry[1] != req_id]
            heapq.heapify(self._cancels)

    def cancel_due(self, now: float) -> None:
        while self._cancels and self._cancels[0][0] <= now:
            _, req_id = heapq.heappop(self._cancels)
            record = self.records[req_id]
            if record.outcome is None:
                self.harness.abort(req_id)
                record.finish("cancelled", now)
                self.touched = True

    def step(self) -> None:
        self.touched = False
        scheduler = self.harness.scheduler
        running_before = {request.request_id for request in scheduler.running}
        output = scheduler.schedule()
        for req_id in output.preempted_req_ids or ():
            self.records[req_id].preemptions += 1
            self.preemptions += 1
        scheduled = output.num_scheduled_tokens
        for req_id, tokens in scheduled.items():
            request = scheduler.requests[req_id]
            before = request.num_computed_tokens - tokens
            record = self.records[req_id]
            if record.first_scheduled_s is None:
                record.first_scheduled_s = self.harness.clock.now()
                record.cached_tokens = before
            high = record.computed_high_water
            record.recomputed_tokens += max(0, min(high, before + tokens) - before)
            record.computed_high_water = max(high, before + tokens)
        # A step that schedules nothing (e.g. every request throttled) still costs the
        # engine's fixed overhead, so virtual time moves and buckets refill.
        duration = (self.cost_model.step_time_s(step_batch(self.harness, scheduled))
                    if scheduled else self.cost_model.t0_s)
        now = self.harness.clock.advance(duration)
        self.busy_s += duration
        self.steps += bool(scheduled)
        self.idle_steps += not scheduled
        self.idle_run = 0 if scheduled else self.idle_run + 1
        result = self.harness.complete(output)
        if not self.samples or now - self.samples[-1].time_s >= self.sample_every_s:
            self._sample(now)
        finished = False
        for out in result.outputs:
            record = self.records[out.request_id]
            if out.new_token_ids:
                record.token_times_s.append(now)
            if out.finish_reason is not None and record.outcome is None:
                self.idle_run = 0
                finished = True
                if out.stop_reason and str(out.stop_reason).startswith("rejected:"):
                    record.finish("rejected", now, reason=str(out.stop_reason))
                else:
                    record.finish("completed", now)
        if self.fast is not None:
            started = any(req_id not in running_before for req_id in scheduled)
            self.stable = self.fast.next_decodes(
                started=started, finished=finished, preempted=bool(output.preempted_req_ids),
                saturated=sum(scheduled.values()) >= scheduler.max_num_scheduled_tokens)

    def fast_forward(self, fast: FastForward, until_s: float) -> int:
        """Play the pure-decode steps that can be skipped from now; returns how many."""
        last_sample = self.samples[-1].time_s if self.samples else None
        requests, durations, sample = fast.plan(
            self.stable, until_s=until_s, last_sample_s=last_sample,
            sample_every_s=self.sample_every_s)
        if not durations:
            return 0
        fast.play(requests, len(durations))
        clock = self.harness.clock
        times = []
        for duration in durations:  # the same float additions as one step at a time
            times.append(clock.advance(duration))
            self.busy_s += duration
        self.steps += len(durations)
        for request in requests:
            record = self.records[request.request_id]
            record.token_times_s.extend(times)
            start = request.num_computed_tokens - len(times)  # the context before
            high = record.computed_high_water
            record.recomputed_tokens += max(0, min(len(times), high - start))
            record.computed_high_water = max(high, start + len(times))
        if sample:
            self._sample(times[-1])
        return len(durations)

    def _sample(self, now: float) -> None:
        scheduler = self.harness.scheduler
        running, waiting = scheduler.get_request_counts()
        self.samples.append(EngineSample(now, scheduler.get_kv_cache_usage(), waiting, running))

    def stalled(self, system: str) -> ReplayStalled:
        """The error for a replay that scheduled nothing for `idle_run` steps."""
        scheduler = self.harness.scheduler
        capacity = scheduler.kv_cache_config.num_blocks
        stuck, lines = [], []
        for req_id, request in scheduler.requests.items():
            if self.records[req_id].outcome is not None:
                continue
            stuck.append(req_id)
            if len(lines) < 10:
                need = -(-request.num_tokens // scheduler.block_size)
                lines.append(f"{req_id} ({request.status.name.lower()}, "
                             f"{request.num_prompt_tokens} prompt tokens, "
                             f"{request.num_computed_tokens} computed, needs {need} of "
                             f"{capacity} KV blocks)")
        more = f" and {len(stuck) - len(lines)} more" if len(stuck) > len(lines) else ""
        return ReplayStalled(
            f"{system}: no request was scheduled for {self.idle_run} steps in a row "
            f"(virtual time {self.harness.clock.now():.3f} s); stuck: {'; '.join(lines)}{more}",
            stuck)


def replay(trace: Trace, system: str, *, shape: EngineShape, cost_model: StepCostModel,
           progress: Callable[[int], None] | None = None,
           harness: SchedulerHarness | None = None, fast_forward: bool = True,
           max_idle_steps: int = DEFAULT_MAX_IDLE_STEPS,
           max_tokens: MaxTokens = "output") -> SystemRun:
    """Run ``trace`` through ``system``; every request ends completed, rejected or cancelled.

    ``max_tokens`` is what each client asks for: ``output``, its answer's length (the
    scheduler, and so every policy, sees how long each answer will be), or ``context``, none
    (vLLM's default, the rest of the context window): the answer then ends with a stop token
    at its length, and a policy has to learn output lengths as it would live.

    ``harness`` replaces the one built from ``system`` and ``shape`` (to inspect it afterwards).
    ``fast_forward`` plays stretches of identical decode steps without vLLM's step loop where
    that is exact (`benchmarks.replay.fast_forward`); the records are the same either way.

    Raises:
        ReplayStalled: if nothing is scheduled for ``max_idle_steps`` steps in a row.
        ValueError: if ``max_idle_steps`` < 1.
    """
    if max_idle_steps < 1:
        raise ValueError(f"max_idle_steps must be >= 1, got {max_idle_steps!r}")
    started = time.perf_counter()
    harness = harness or build_harness(system, shape)
    fast = FastForward(harness, cost_model) if fast_forward else None
    if fast is not None and not fast.supported:
        fast = None
    run = ReplayRun(harness, trace, cost_model, fast=fast, max_tokens=max_tokens)
    requests = trace.requests
    next_index = 0
    clock = harness.clock
    while next_index < len(requests) or harness.has_requests():
        while next_index < len(requests) and requests[next_index].arrival_s <= clock.now():
            run.admit(next_index, requests[next_index])
            next_index += 1
            if progress:
                progress(1)
        run.cancel_due(clock.now())
        if harness.has_requests():
            if fast is not None and run.stable is not None and not run.touched:
                until = requests[next_index].arrival_s if next_index < len(requests) else math.inf
                until = min(until, run.next_cancel_s())
                if run.fast_forward(fast, until):
                    continue
            run.step()
            if run.idle_run >= max_idle_steps:
                raise run.stalled(system)
        else:
            upcoming = [requests[next_index].arrival_s] if next_index < len(requests) else []
            if run.next_cancel_s() < math.inf:
                upcoming.append(run.next_cancel_s())
            if not upcoming:
                break
            clock.set(max(clock.now(), min(upcoming)))
    lost = [r.request_id for r in run.records.values() if r.outcome is None]
    if lost or len(run.records) != len(requests):
        raise RuntimeError(f"{system}: {len(lost)} requests neither completed nor rejected "
                           f"(e.g. {lost[:5]}); offered {len(requests)}, seen {len(run.records)}")
    return SystemRun(system=system, records=tuple(run.records.values()), steps=run.steps,
                     idle_steps=run.idle_steps,
                     busy_s=run.busy_s, makespan_s=clock.now(), preemptions=run.preemptions,
                     samples=tuple(run.samples), wall_s=time.perf_counter() - started,
                     fast_forwarded_steps=fast.steps if fast is not None else 0)
