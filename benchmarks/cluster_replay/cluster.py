"""N colocated replicas behind a cluster router, each a real vLLM scheduler in virtual time.

Each replica is the single-engine replay's loop (`benchmarks.replay.driver`): its own
`SchedulerHarness` (vLLM's ``Scheduler`` and ``KVCacheManager``, stock or our
``PolicyScheduler``), its own virtual clock, steps priced by the step-cost model, exact
fast-forward through pure-decode stretches. A discrete-event loop interleaves them: the
next event is the earliest of the next arrival and the busy replica whose clock is
earliest. On arrival the router gets every replica's `ReplicaReport` and returns a
`ClusterDecision`; a rejection at the router finishes the request there (HTTP 503 with
Retry-After). A replica that rejects a request (its admission, or stock vLLM's queue caps)
reports it after its next step; the router's `retry` may place it once on another
replica, at that step's end, with its original arrival (so the time lost counts).

Approximation: a replica's state is read at the end of the step in progress when a request
arrives (a step is at most tens of milliseconds), and a retried request joins a busy
replica at that replica's clock, which may lie up to one step before the rejection.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import attrs

from benchmarks.replay.cost_model import StepCostModel
from benchmarks.replay.driver import DEFAULT_MAX_IDLE_STEPS, ReplayRun
from benchmarks.replay.fast_forward import FastForward
from benchmarks.replay.metrics import DEFAULT_SLOS, SLO, request_class
from benchmarks.replay.records import RequestRecord, SystemRun
from benchmarks.replay.systems import build_system
from benchmarks.replay.trace import Trace, TraceRequest
from benchmarks.replay.workloads import TENANT_WEIGHTS
from integrations.vllm_v1.config.spec import resolve_pipeline
from integrations.vllm_v1.instruments.harness import EngineShape, SchedulerHarness
from policies import OnlineStepTimeModel, SLOAdmission, TTFTDeadlineRanker
from policies.cluster_routing import ClusterDecision, ClusterRequest, ReplicaReport
from policies.pd.router import chain_keys


class ClusterRouter(Protocol):
    """What the loop needs of a router (every router of `policies.cluster_routing`)."""

    def route(self, request: ClusterRequest, reports: Mapping[str, ReplicaReport],
              now: float) -> ClusterDecision: ...

    def retry(self, request: ClusterRequest, reports: Mapping[str, ReplicaReport], now: float,
              *, rejected_by: str) -> ClusterDecision: ...

    def on_finished(self, request_id: str, output_tokens: int | None, now: float) -> None: ...


@attrs.define(eq=False)
class _Replica:
    name: str
    replay: ReplayRun
    fast: FastForward | None
    fresh: dict[str, None] = attrs.field(factory=dict)
    """Requests admitted here and neither scheduled nor finished yet (a rejection shows here),
    in admission order (retries are routed in it, whatever the hash seed)."""
    live: dict[str, None] = attrs.field(factory=dict)
    """Requests admitted here and not finished (the router hears of each finish)."""

    @property
    def clock(self) -> float:
        return self.replay.harness.clock.now()

    def report(self, slos: Mapping[str, SLO]) -> ReplicaReport:
        """Queued prefill (with each request's first-token deadline where the replica ranks
        by it), running decodes and KV as the scheduler holds them, the learned step model and
        the SLO admission's headrooms in force where the replica's pipeline has them."""
        scheduler = self.replay.harness.scheduler
        queued = prefilling = prefilling_prompt = 0
        deadlines = []
        for r in scheduler.requests.values():
            left = r.num_prompt_tokens - r.num_computed_tokens
            if left > 0:
                queued += left
                prefilling += 1
                prefilling_prompt += r.num_prompt_tokens
                slo = slos.get(request_class(self.replay.records[r.request_id]))
                deadlines.append((r.arrival_time + (slo.ttft_s if slo else math.inf), left))
        running, waiting = scheduler.get_request_counts()
        pipeline = getattr(scheduler, "pipeline", None)
        learned = getattr(pipeline, "step_model", None)
        online = learned if isinstance(learned, OnlineStepTimeModel) else None
        admission = getattr(pipeline, "admission", None)
        view = admission.stats() if isinstance(admission, SLOAdmission) else None
        edf = isinstance(getattr(pipeline, "ranking", None), TTFTDeadlineRanker)
        return ReplicaReport(
            name=self.name, queued_prefill_tokens=queued, running_requests=running,
            waiting_requests=waiting,
            decode_context_tokens=sum(r.num_computed_tokens for r in scheduler.running),
            queued_prefill_deadlines=tuple(sorted(deadlines)) if edf else None,
            prefilling_requests=prefilling, prefilling_prompt_tokens=prefilling_prompt,
            kv_usage=min(1.0, max(0.0, scheduler.get_kv_cache_usage())),
            kv_capacity_tokens=self.replay.harness.kv_capacity_tokens,
            token_budget=scheduler.max_num_scheduled_tokens,
            step_model=online.model if online is not None else None,
            recent_step_s=online.recent_step_s if online is not None else None,
            ttft_headroom=view.headroom if view is not None else None,
            tpot_headroom=view.tpot_headroom if view is not None else None,
            tpot_bound_s=view.tpot_bound_s if view is not None else None)


def replica_harness(engine: str, shape: EngineShape,
                    slo: Mapping[str, object] | None = None) -> SchedulerHarness:
    """A replica running ``engine`` (`build_system`); ``pipeline:slo`` with ``slo`` runs the
    ``slo`` preset built from that declaration (an ``llm_serving_policies.slo`` entry, e.g.
    its ``fairness``), as ``vllm serve`` would."""
    if slo is None or engine != "pipeline:slo":
        return build_system(engine, shape)
    return SchedulerHarness.build(resolve_pipeline("slo", tenant_weights=TENANT_WEIGHTS,
                                                   slo=slo), shape=shape)


def cluster_request(request: TraceRequest, slos: Mapping[str, SLO] = DEFAULT_SLOS
                    ) -> ClusterRequest:
    """The router's view of a trace request, with the targets the replay judges it by."""
    record = RequestRecord.offered(request)
    slo = slos.get(request_class(record))
    return ClusterRequest(request_id=request.request_id, arrival_s=request.arrival_s,
                          prompt_tokens=request.prompt_tokens,
                          block_keys=chain_keys(request.block_hashes),
                          session_id=request.session_id, tenant=record.tenant,
                          slo_class=request_class(record) if slo else None,
                          ttft_s=slo.ttft_s if slo else None, tpot_s=slo.tpot_s if slo else None)


@attrs.define(eq=False)
class _Cluster:
    trace: Trace
    router: ClusterRouter
    replicas: dict[str, _Replica]
    slos: Mapping[str, SLO]
    max_idle_steps: int
    index_of: dict[str, int]
    """Request id -> its position in the trace (its prompt's unique token ids derive from it)."""
    at_router: dict[str, RequestRecord] = attrs.field(factory=dict)
    """Requests the router rejected (they reached no replica)."""
    owner: dict[str, str] = attrs.field(factory=dict)
    retries_placed: int = 0

    def reports(self) -> dict[str, ReplicaReport]:
        return {name: replica.report(self.slos) for name, replica in self.replicas.items()}

    def admit(self, replica: _Replica, index: int, now: float) -> None:
        harness = replica.replay.harness
        if not harness.has_requests():
            harness.clock.set(max(harness.clock.now(), now))
        request = self.trace.requests[index]
        replica.replay.admit(index, request)
        replica.fresh[request.request_id] = None
        replica.live[request.request_id] = None
        self.owner[request.request_id] = replica.name

    def reject_at_router(self, request: TraceRequest, decision: ClusterDecision,
                         now: float) -> None:
        record = self.at_router[request.request_id] = RequestRecord.offered(request)
        retry = ("" if decision.retry_after_s is None
                 else f";retry_after_s={decision.retry_after_s:.3f}")
        record.finish("rejected", now, reason=f"rejected:router_{decision.cause.value}{retry}")

    def arrive(self, index: int) -> None:
        request = self.trace.requests[index]
        now = request.arrival_s
        decision = self.router.route(cluster_request(request, self.slos), self.reports(), now)
        if decision.replica is None:
            self.reject_at_router(request, decision, now)
        else:
            self.admit(self.replicas[decision.replica], index, now)

    def step(self, replica: _Replica, next_arrival_s: float) -> None:
        run = replica.replay
        run.cancel_due(replica.clock)
        if replica.fast is not None and run.stable is not None and not run.touched:
            until = min(next_arrival_s, run.next_cancel_s())
            if run.fast_forward(replica.fast, until):
                self.release(replica)
                return
        run.step()
        if run.idle_run >= self.max_idle_steps:
            raise run.stalled(replica.name)
        self.settle(replica)
        self.release(replica)

    def release(self, replica: _Replica) -> None:
        """Tell the router of every request ``replica`` finished (any outcome), with the
        tokens it generated, at the replica's clock."""
        if len(replica.live) == len(replica.replay.harness.scheduler.requests):
            return  # nothing left the scheduler since the last look
        records = replica.replay.records
        for req_id in [r for r in replica.live if records[r].outcome is not None]:
            del replica.live[req_id]
            self.router.on_finished(req_id, len(records[req_id].token_times_s), replica.clock)

    def settle(self, replica: _Replica) -> None:
        """Retry what ``replica`` rejected since its last step; forget what it started."""
        records = replica.replay.records
        for req_id in list(replica.fresh):
            record = records[req_id]
            if record.outcome is None and record.first_scheduled_s is None:
                continue
            del replica.fresh[req_id]
            if record.outcome != "rejected":
                continue
            index = self.index_of[req_id]
            now = replica.clock
            decision = self.router.retry(cluster_request(self.trace.requests[index], self.slos),
                                         self.reports(), now, rejected_by=replica.name)
            if decision.replica is not None:
                replica.replay.forget(req_id)
                del replica.live[req_id]
                self.retries_placed += 1
                self.admit(self.replicas[decision.replica], index, now)


def run_cluster(trace: Trace, router: ClusterRouter, system: str, *, replicas: Sequence[str],
                engine: str, shape: EngineShape, cost_model: StepCostModel,
                slos: Mapping[str, SLO] = DEFAULT_SLOS,
                progress: Callable[[int], None] | None = None,
                max_idle_steps: int = DEFAULT_MAX_IDLE_STEPS,
                slo: Mapping[str, object] | None = None,
                build: Callable[[str, EngineShape], SchedulerHarness] | None = None
                ) -> SystemRun:
    """Replay ``trace`` through ``router`` and one ``engine`` per name in ``replicas``
    (``fcfs``, ``pipeline:slo``, a ``stock+queue-caps:...`` setting: `build_system`;
    ``pipeline:slo`` built from the ``slo`` declaration where one is given:
    `replica_harness`; or whatever ``build`` makes of ``engine``, where given).

    Every request ends completed, rejected (at the router or a replica) or cancelled; the
    records are merged into one `SystemRun` (``samples`` empty).

    Raises:
        ReplayStalled: when a replica schedules nothing for ``max_idle_steps`` steps in a row.
        RuntimeError: when a request is lost.
    """
    started = time.perf_counter()
    members = {}
    for name in replicas:
        harness = replica_harness(engine, shape, slo) if build is None else build(engine, shape)
        fast = FastForward(harness, cost_model)
        members[name] = _Replica(name, ReplayRun(harness, trace, cost_model), fast if (
            fast.supported) else None)
        members[name].replay.fast = members[name].fast
    cluster = _Cluster(trace, router, members, slos, max_idle_steps,
                       {r.request_id: i for i, r in enumerate(trace.requests)})
    requests = trace.requests
    next_index = 0
    while True:
        next_arrival = requests[next_index].arrival_s if next_index < len(requests) else math.inf
        busy = [r for r in members.values() if r.replay.harness.has_requests()]
        earliest = min(busy, key=lambda r: r.clock, default=None)
        if earliest is None and next_index >= len(requests):
            break
        if earliest is None or next_arrival <= earliest.clock:
            cluster.arrive(next_index)
            next_index += 1
            if progress:
                progress(1)
            continue
        cluster.step(earliest, next_arrival)
    records = list(cluster.at_router.values())
    for replica in members.values():
        records.extend(replica.replay.records.values())
    lost = [r.request_id for r in records if r.outcome is None]
    if lost or len(records) != len(requests):
        raise RuntimeError(f"{system}: {len(lost)} requests never finished (e.g. {lost[:5]}); "
                           f"offered {len(requests)}, recorded {len(records)}")
    runs = [r.replay for r in members.values()]
    return SystemRun(system=system, records=tuple(records), steps=sum(r.steps for r in runs),
                     idle_steps=sum(r.idle_steps for r in runs),
                     busy_s=sum(r.busy_s for r in runs),
                     makespan_s=max(r.clock for r in members.values()),
                     preemptions=sum(r.preemptions for r in runs),
                     wall_s=time.perf_counter() - started,
                     fast_forwarded_steps=sum(r.fast.steps for r in members.values()
                                              if r.fast is not None))
