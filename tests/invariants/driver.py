"""Build every scheduler under test and step it with a fake model, checking as it goes.

A *case* is a scheduler configuration: stock vLLM (``fcfs`` or ``priority``), or
`PolicyScheduler` running one preset of `PRESETS` (the identity pipeline also under vLLM's
``priority`` policy), each synchronous or asynchronous. `Driver` steps it like
`SchedulerHarness` does (one token per step once a prefill completes) but also plays a KV
connector's worker (``finished_recving``/``failed_recving``/``invalid_block_ids``), keeps
each step's `SchedulerStats`, checks the preemption bookkeeping of every step, counts what
the prefix-cache stats should say, and asserts `assert_consistent` after every step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs
from vllm.config import KVTransferConfig
from vllm.v1.outputs import KVConnectorOutput

from benchmarks.replay.workloads import TENANT_WEIGHTS
from integrations.vllm_v1.config.presets import PRESETS, preset
from integrations.vllm_v1.instruments import EngineShape, SchedulerHarness
from integrations.vllm_v1.instruments.harness import SAMPLED_TOKEN_ID, build_scheduler
from integrations.vllm_v1.scheduling.scheduler import AsyncPolicyScheduler
from integrations.vllm_v1.vllm_surface.names import (
    AsyncScheduler,
    ModelRunnerOutput,
    RequestStatus,
)
from tests.helpers.engine import PREEMPT_AT_ONCE_SLO
from tests.invariants import connector as scripted
from tests.invariants.checks import assert_consistent, blocks_of

STOCK = "stock"
CASES: tuple[tuple[str, str], ...] = (
    (STOCK, "fcfs"), (STOCK, "priority"), ("identity", "priority"),
    *((name, "fcfs") for name in PRESETS),
)
"""(preset or ``stock``, vLLM scheduling policy) of every scheduler under test."""
CASE_IDS = tuple(name if policy == "fcfs" else f"{name}+{policy}" for name, policy in CASES)
TENANTS = ("t0", "t2", "t5")
"""Gold, Silver and Bronze in `TENANT_WEIGHTS`."""


def build(case: tuple[str, str], *, is_async: bool, shape: EngineShape,
          connector: str | None = None) -> Any:
    """The scheduler of ``case``; with ``connector`` (a ``kv_load_failure_policy``), one
    with `ScriptedConnector` as its KV connector."""
    name, policy = case
    pipeline = None if name == STOCK else preset(name, TENANT_WEIGHTS,
                                                 slo=PREEMPT_AT_ONCE_SLO if name == "slo" else None)
    cls = ((AsyncPolicyScheduler if pipeline else AsyncScheduler) if is_async else None)
    scheduler = build_scheduler(shape, pipeline, policy, cls)
    if connector is None:
        return scheduler
    scripted.register()
    config = scheduler.vllm_config  # the same config, now naming a connector
    config.kv_transfer_config = KVTransferConfig(
        kv_connector=scripted.NAME, kv_role="kv_both", kv_load_failure_policy=connector)
    config.scheduler_config.disable_hybrid_kv_cache_manager = True  # as VllmConfig would
    return type(scheduler)(vllm_config=config, kv_cache_config=scheduler.kv_cache_config,
                           structured_output_manager=scheduler.structured_output_manager,
                           block_size=shape.block_size, log_stats=True)


@attrs.define
class PrefixCounts:
    """Prefix-cache counters: fresh lookups and lookups of resumed (preempted) requests."""

    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0

    def add(self, stats: Any) -> None:
        for field in attrs.fields(PrefixCounts):
            setattr(self, field.name, getattr(self, field.name) + getattr(stats, field.name))


@attrs.frozen
class Step:
    scheduler_output: Any
    outputs: tuple[Any, ...]
    finished: tuple[str, ...]


@attrs.define(eq=False)
class Driver:
    """Steps one scheduler, checking every invariant after every step."""

    scheduler: Any
    harness: SchedulerHarness = attrs.field(init=False)
    reported: PrefixCounts = attrs.field(factory=PrefixCounts)
    """What the scheduler's `SchedulerStats` said, summed over steps."""
    expected: PrefixCounts = attrs.field(factory=PrefixCounts)
    """What they should say: each start counted once, by its prompt and its cache hit."""
    finished: list[str] = attrs.field(factory=list)
    outputs: list[Any] = attrs.field(factory=list)
    preemptions: int = 0
    _seen_preemptions: dict[str, int] = attrs.field(factory=dict)
    """``num_preemptions`` of every request as the last step ended."""

    def __attrs_post_init__(self) -> None:
        self.harness = SchedulerHarness(self.scheduler)

    @classmethod
    def of(cls, case: tuple[str, str], *, is_async: bool = False,
           shape: EngineShape | None = None, connector: str | None = None) -> Driver:
        return cls(build(case, is_async=is_async, shape=shape or small_shape(),
                         connector=connector))

    @property
    def connector(self) -> scripted.ScriptedConnector:
        return self.scheduler.connector

    @property
    def fcfs_queue(self) -> bool:
        """Whether the waiting queue is plain FCFS (stock or identity under ``fcfs``)."""
        pipeline = getattr(self.scheduler, "pipeline", None)
        return (self.scheduler.scheduler_config.policy == "fcfs"
                and (pipeline is None or not pipeline.reorders_requests))

    def add(self, request_id: str, prompt: Sequence[int], max_tokens: int, *,
            tenant: str | None = None, priority: int = 0, deadline_ms: float | None = None
            ) -> Any:
        extra = {key: value for key, value in (("tenant", tenant), ("deadline_ms", deadline_ms))
                 if value is not None}
        return self.harness.add_request(request_id, prompt, max_tokens, priority=priority,
                                        extra_args=extra or None)

    def abort(self, request_id: str) -> None:
        self.harness.abort(request_id)
        assert_consistent(self.scheduler)

    def step(self, *, finished_recving: Iterable[str] = (), failed_recving: Iterable[str] = (),
             invalid_block_ids: Iterable[int] | Callable[[Any], Iterable[int]] = (),
             abort_in_flight: Callable[[Any], Iterable[str]] | None = None) -> Step:
        """One schedule -> fake model -> update round, reporting the given connector results
        (``invalid_block_ids`` may be computed from the step's output) and aborting
        ``abort_in_flight(output)`` between the schedule and the model's output."""
        scheduler = self.scheduler
        output = scheduler.schedule()
        self._check_preempted(output)
        self._expect_prefix_lookups(output)
        if abort_in_flight is not None:
            for request_id in abort_in_flight(output):
                self.abort(request_id)
        if callable(invalid_block_ids):
            invalid_block_ids = invalid_block_ids(output)
        kv = None
        finished_recving, failed_recving = set(finished_recving), set(failed_recving)
        invalid_block_ids = set(invalid_block_ids)
        if finished_recving or failed_recving or invalid_block_ids:
            kv = KVConnectorOutput(finished_recving=finished_recving or None,
                                   failed_recving=failed_recving,
                                   invalid_block_ids=invalid_block_ids)
            for request_id in finished_recving:
                self.connector.loading.pop(request_id, None)
        engine_outputs = scheduler.update_from_output(output, self._model_output(output, kv))
        outputs = tuple(o for batch in engine_outputs.values() for o in batch.outputs)
        for batch in engine_outputs.values():
            if batch.scheduler_stats is not None:
                self.reported.add(batch.scheduler_stats.prefix_cache_stats)
        finished = tuple(o.request_id for o in outputs if o.finish_reason is not None)
        self.finished += finished
        self.outputs += outputs
        self.harness.clock.advance(0.01)
        assert_consistent(scheduler)
        self._seen_preemptions = {rid: r.num_preemptions for rid, r in scheduler.requests.items()}
        return Step(output, outputs, finished)

    def _model_output(self, output: Any, kv: KVConnectorOutput | None) -> ModelRunnerOutput:
        req_ids = list(output.num_scheduled_tokens)
        sampled = []
        for req_id in req_ids:
            request = self.scheduler.requests.get(req_id)  # gone if aborted in flight
            done = request is not None and request.num_computed_tokens >= request.num_tokens
            sampled.append([SAMPLED_TOKEN_ID] if done else [])
        return ModelRunnerOutput(req_ids=req_ids,
                                 req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                 sampled_token_ids=sampled, kv_connector_output=kv)

    def _check_preempted(self, output: Any) -> None:
        """Every request preempted since the last step (by this schedule or, between steps,
        by ``reset_prefix_cache``): counted once, blocks freed, computed tokens reset, back in
        the waiting queue (at its head, in reverse order, under FCFS) unless resumed now."""
        preempted = set(output.preempted_req_ids or ())
        self.preemptions += len(preempted)
        for request_id in preempted:
            request = self.scheduler.requests.get(request_id)
            if request is None:  # preempted between steps (reset_prefix_cache), then aborted
                continue
            seen = self._seen_preemptions.get(request_id, 0)
            assert request.num_preemptions == seen + 1, (request_id, seen)
            if request_id in output.num_scheduled_tokens:
                continue  # resumed in the same step (reset_prefix_cache)
            if request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:  # restarted by a load
                assert request in list(self.scheduler.kv_holding_waiting), request_id
                continue
            assert request.status == RequestStatus.PREEMPTED, (request_id, request.status)
            assert request.num_computed_tokens == 0 and request.num_output_placeholders == 0
            assert not blocks_of(self.scheduler, request_id), f"{request_id} kept its blocks"
            assert request in list(self.scheduler.waiting), f"{request_id} not re-queued"
            assert request not in self.scheduler.running
        queued = {r for r in preempted if r in self.scheduler.requests
                  and self.scheduler.requests[r].status == RequestStatus.PREEMPTED}
        if queued and self.fcfs_queue:
            head = list(self.scheduler.waiting)[:len(queued)]
            assert {r.request_id for r in head} == queued, "preempted not prepended"

    def _expect_prefix_lookups(self, output: Any) -> None:
        """vLLM records a prefix lookup when it allocates a request's first blocks (at its
        start, or its restart after preemption): each start counts once."""
        if self.scheduler.connector is not None or not self.scheduler.log_stats:
            return  # external hits and remote loads are out of this oracle
        expected, scheduled = self.expected, output.num_scheduled_tokens
        starts = [new.req_id for new in output.scheduled_new_reqs]
        starts += sorted(output.scheduled_cached_reqs.resumed_req_ids)
        for request_id in starts:
            request = self.scheduler.requests[request_id]
            hit = request.num_computed_tokens - scheduled[request_id]
            if request.num_preemptions:
                expected.preempted_requests += 1
                expected.preempted_queries += request.num_tokens
                expected.preempted_hits += hit
            else:
                expected.requests += 1
                expected.queries += request.num_tokens
                expected.hits += hit

    def run(self, *, limit: int = 3000, **report: Any) -> None:
        """Step until nothing is left (reporting every in-flight remote load as done)."""
        for _ in range(limit):
            if not self.scheduler.has_requests():
                return
            loading = set(self.connector.loading) if self.scheduler.connector else set()
            self.step(finished_recving=loading, **report)
            report = {}
        raise AssertionError(f"did not drain in {limit} steps: {sorted(self.scheduler.requests)}")


def small_shape(**changes: Any) -> EngineShape:
    """A tiny engine: 24 usable blocks of 16 tokens, 6 sequences, 128 tokens a step."""
    return EngineShape(**{"num_blocks": 25, "block_size": 16, "max_num_seqs": 6,
                          "max_num_batched_tokens": 128, "max_model_len": 512, **changes})


def prompt(group: int, length: int, *, salt: int = 0) -> list[int]:
    """``length`` tokens; prompts of one ``group`` share their prefix up to where ``salt``
    (a distinct suffix token) makes them differ: prefix-cache hits across requests."""
    tokens = [group * 1000 + i % 97 for i in range(length)]
    if salt:
        tokens[-1] = 30000 + salt
    return tokens
