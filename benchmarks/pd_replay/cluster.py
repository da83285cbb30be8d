"""A prefill/decode cluster replayed in virtual time, each instance a real vLLM scheduler.

Every instance is a `SchedulerHarness` (vLLM's own ``Scheduler`` and
``KVCacheManager``, no model) stepped by a discrete-event loop; each step's
duration comes from the replay's `StepCostModel`. A request's life:

1. On arrival the router picks a prefill and a decode instance from their loads
   (and the request's ``session_id``, when the trace has one).
2. The prefill instance runs the prompt with ``max_tokens=1`` (its token is
   dropped, as in vLLM's PD protocol).
3. The prompt's full blocks (``floor((L - 1) / block)`` of them, as vLLM's
   connectors move) that the decode instance's prefix cache does not already
   hold are sent over the decode instance's ingress link, one transfer at a time:
   ``latency_s + bytes / link_bytes_per_s``.
4. The decode instance then gets the whole request; the transferred tokens cost
   no compute there (they are priced as cached), so only the last partial block
   is computed before the first token. When the router skips the prefill pool,
   the decode instance computes the uncached prompt itself.

TTFT is arrival to the decode instance's first token (the client's first
streamed token); ITL are the gaps between decode tokens. A colocated cluster is
the same loop with no prefill pool.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import attrs

from benchmarks.replay.cost_model import StepCostModel
from benchmarks.replay.driver import prompt_token_ids, work_batch
from benchmarks.replay.records import RequestRecord, SystemRun
from benchmarks.replay.trace import Trace
from integrations.vllm_v1.config.pd_roles import STOCK, PDRole
from integrations.vllm_v1.instruments.harness import EngineShape, SchedulerHarness, scheduled_work
from policies.pd.router import InstanceLoad, RouteDecision, chain_keys

LLAMA3_8B_KV_BYTES_PER_TOKEN = 131072
"""2 (K, V) x 32 layers x 8 KV heads x 128 dims x 2 bytes (bf16)."""
KV_BYTES_PER_TOKEN = {"bf16": LLAMA3_8B_KV_BYTES_PER_TOKEN,
                      "fp8": LLAMA3_8B_KV_BYTES_PER_TOKEN // 2}
"""Llama-3-8B KV bytes per token by KV cache dtype (fp8: one byte per value). Only the
transfer is priced from it; the step-cost model keeps bf16 attention."""


class Router(Protocol):
    """What the cluster needs of a router (`policies.pd.router` implements it)."""

    def route(self, request_id: str, prompt_tokens: int, block_keys: Sequence[int],
              loads: dict[str, InstanceLoad], *,
              session_id: str | None = None) -> RouteDecision: ...


@attrs.frozen(kw_only=True)
class TransferModel:
    """KV transfer between instances: bytes per prompt token and the decode ingress link."""

    kv_bytes_per_token: int = LLAMA3_8B_KV_BYTES_PER_TOKEN
    link_bytes_per_s: float = 50e9
    """Per decode instance, e.g. 400 Gb/s RDMA."""
    latency_s: float = 0.0005
    """Fixed cost of each transfer (handshake, metadata)."""

    def seconds(self, num_bytes: int) -> float:
        """Time on the link for one transfer of ``num_bytes``."""
        return self.latency_s + num_bytes / self.link_bytes_per_s


def role_harness(role: PDRole, shape: EngineShape) -> SchedulerHarness:
    """A harness over the scheduler a live engine of ``role`` would run (stock: vLLM's own)."""
    if role.max_num_batched_tokens is not None:
        shape = attrs.evolve(shape, max_num_batched_tokens=role.max_num_batched_tokens)
    return SchedulerHarness.build(role.pipeline, shape=shape)


@attrs.define(eq=False)
class _Instance:
    """One vLLM scheduler plus what the cluster tracks around it."""

    name: str
    harness: SchedulerHarness
    decodes: bool
    """A decode (or colocated) instance: its waiting requests will decode here."""
    reports_assigned: bool = True
    """Its load counts requests routed here that are still being prefilled."""
    free_tokens: dict[str, int] = attrs.field(factory=dict)
    """Prompt tokens that arrived by transfer, per request (priced as cached)."""
    incoming: int = 0
    """Requests whose KV is on the way here."""
    incoming_tokens: int = 0
    """Prompt tokens of those requests (they will occupy KV here)."""
    assigned: int = 0
    """Requests routed here whose prompt is still on a prefill instance."""
    assigned_tokens: int = 0
    link_free_s: float = 0.0
    stepping: bool = False
    """A step event is queued (the instance is busy until it runs)."""
    busy_s: float = 0.0
    steps: int = 0

    def load(self) -> InstanceLoad:
        """Queued prompt tokens it must compute, decodes, KV usage and ongoing requests.

        On a decode instance, waiting requests (e.g. held back by a `DecodeKVGate`) count
        as decodes and their prompts as KV, as transfers on the way do and requests
        routed here whose prompt is still being prefilled (the router sent them here).
        """
        scheduler = self.harness.scheduler
        capacity_tokens = self.harness.kv_capacity_tokens
        queued = sum(max(0, r.num_prompt_tokens - max(r.num_computed_tokens,
                                                         self.free_tokens.get(r.request_id, 0)))
                     for r in scheduler.requests.values())
        on_the_way = self.incoming + (self.assigned if self.reports_assigned else 0)
        decodes, committed_tokens = (len(scheduler.running) + on_the_way, self.incoming_tokens
                                     + (self.assigned_tokens if self.reports_assigned else 0))
        if self.decodes:
            decodes += len(scheduler.waiting)
            committed_tokens += sum(r.num_tokens for r in scheduler.waiting)
        return InstanceLoad(queued_prefill_tokens=queued, running_decodes=decodes,
                            kv_usage=min(1.0, max(0.0, scheduler.get_kv_cache_usage()
                                                  + committed_tokens / capacity_tokens)),
                            ongoing_requests=len(scheduler.requests) + on_the_way)

    def cached_blocks(self, block_hashes: Sequence[object]) -> int:
        """Leading blocks of ``block_hashes`` in this instance's prefix cache."""
        return self.harness.cached_blocks(block_hashes)

    def priced_tokens(self, num_scheduled_tokens: dict[str, int]) -> dict[str, int]:
        """Scheduled tokens minus those that arrived by transfer (requests left with 0 dropped)."""
        requests = self.harness.scheduler.requests
        priced = {}
        for req_id, tokens in num_scheduled_tokens.items():
            before = requests[req_id].num_computed_tokens - tokens
            free = max(0, min(before + tokens, self.free_tokens.get(req_id, 0)) - before)
            if tokens > free:
                priced[req_id] = tokens - free
        return priced


@attrs.frozen(kw_only=True)
class ClusterRun:
    """One cluster replay: per-request records plus transfer and routing counters."""

    system: str
    run: SystemRun
    """All requests as one system (records keep decode-side token times)."""
    kv_bytes_transferred: int
    kv_bytes_full_prompts: int
    """What sending every full block of every prefilled prompt would have cost."""
    transfers: int
    skipped_prefill: int
    busy_s_by_instance: dict[str, float]


@attrs.define(eq=False)
class _Cluster:
    trace: Trace
    router: Router
    cost_model: StepCostModel
    transfer: TransferModel
    prefill: dict[str, _Instance]
    decode: dict[str, _Instance]
    records: dict[str, RequestRecord] = attrs.field(factory=dict)
    _events: list = attrs.field(factory=list)
    _seq: int = 0
    _tokens: dict[str, list[int]] = attrs.field(factory=dict)
    _hashes: dict[str, list] = attrs.field(factory=dict)
    _route: dict[str, RouteDecision] = attrs.field(factory=dict)
    kv_bytes: int = 0
    kv_bytes_full: int = 0
    preemptions: int = 0
    transfers: int = 0
    skipped: int = 0

    def push(self, when: float, kind: str, payload: object) -> None:
        self._seq += 1
        heapq.heappush(self._events, (when, self._seq, kind, payload))

    def instances(self) -> dict[str, _Instance]:
        return {**self.prefill, **self.decode}

    def submit(self, instance: _Instance, now: float, req_id: str, max_tokens: int) -> Any:
        record = self.records[req_id]
        request = instance.harness.add_request(req_id, self._tokens[req_id], max_tokens,
                                               arrival_s=record.arrival_s)
        if not instance.stepping:
            instance.stepping = True
            self.push(max(now, instance.harness.clock.now()), "step", instance.name)
        return request

    def arrive(self, now: float, index: int) -> None:
        request = self.trace.requests[index]
        req_id = request.request_id
        self.records[req_id] = RequestRecord.offered(request)
        self._tokens[req_id] = prompt_token_ids(request, index, self.trace.block_size)
        loads = {name: inst.load() for name, inst in self.instances().items()}
        decision = self.router.route(req_id, request.prompt_tokens,
                                     chain_keys(request.block_hashes), loads,
                                     session_id=request.session_id)
        if decision.decode is None:
            raise RuntimeError(f"{req_id}: no decode instance is healthy in a replay")
        self._route[req_id] = decision
        if decision.prefill is None:
            self.skipped += 1
            self.submit(self.decode[decision.decode], now, req_id, request.output_tokens)
        else:
            sent = self.submit(self.prefill[decision.prefill], now, req_id, 1)
            self._hashes[req_id] = list(sent.block_hashes)
            decode = self.decode[decision.decode]
            decode.assigned += 1
            decode.assigned_tokens += request.prompt_tokens

    def prefilled(self, now: float, req_id: str) -> None:
        decode = self.decode[self._route[req_id].decode]
        block_size = decode.harness.scheduler.block_size
        full = (self.records[req_id].prompt_tokens - 1) // block_size
        sent_blocks = full - decode.cached_blocks(self._hashes.pop(req_id)[:full])
        num_bytes = sent_blocks * block_size * self.transfer.kv_bytes_per_token
        start = max(now, decode.link_free_s)
        decode.link_free_s = start + self.transfer.seconds(num_bytes)
        decode.assigned -= 1
        decode.assigned_tokens -= self.records[req_id].prompt_tokens
        decode.incoming += 1
        decode.incoming_tokens += self.records[req_id].prompt_tokens
        self.kv_bytes += num_bytes
        self.kv_bytes_full += full * block_size * self.transfer.kv_bytes_per_token
        self.transfers += 1
        self.push(decode.link_free_s, "install", (req_id, full * block_size))

    def install(self, now: float, req_id: str, free_tokens: int) -> None:
        decode = self.decode[self._route[req_id].decode]
        decode.incoming -= 1
        decode.incoming_tokens -= self.records[req_id].prompt_tokens
        decode.free_tokens[req_id] = free_tokens
        self.submit(decode, now, req_id, self.records[req_id].output_tokens)

    def step(self, now: float, name: str) -> None:
        instance = self.instances()[name]
        harness = instance.harness
        harness.clock.set(max(now, harness.clock.now()))
        output = harness.scheduler.schedule()
        self.preemptions += len(output.preempted_req_ids or ())
        priced = instance.priced_tokens(output.num_scheduled_tokens)
        duration = (self.cost_model.step_time_s(work_batch(scheduled_work(harness.scheduler,
                                                                          priced)))
                    if priced else self.cost_model.t0_s)
        end = harness.clock.advance(duration)
        instance.busy_s += duration
        instance.steps += 1
        for req_id, tokens in output.num_scheduled_tokens.items():
            record = self.records[req_id]
            if record.first_scheduled_s is None:
                record.first_scheduled_s = now
                computed = harness.scheduler.requests[req_id].num_computed_tokens
                record.cached_tokens = computed - tokens
        result = harness.complete(output)
        for out in result.outputs:
            if name in self.prefill:
                if out.finish_reason is not None:
                    self.push(end, "prefilled", out.request_id)
                continue
            record = self.records[out.request_id]
            if out.new_token_ids:
                record.token_times_s.append(end)
            if out.finish_reason is not None:
                record.finish("completed", end)
                instance.free_tokens.pop(out.request_id, None)
        instance.stepping = harness.has_requests()
        if instance.stepping:
            self.push(end, "step", name)


def run_cluster(trace: Trace, router: Router, system: str, *, prefill: Sequence[str],
                decode: Sequence[str], prefill_shape: EngineShape, decode_shape: EngineShape,
                cost_model: StepCostModel, transfer: TransferModel,
                prefill_role: PDRole = STOCK, decode_role: PDRole = STOCK,
                report_assigned: bool = True,
                progress: Callable[[int], None] | None = None) -> ClusterRun:
    """Replay ``trace`` through the cluster; every request completes or the run fails.

    ``prefill`` may be empty (a colocated cluster: the router must then skip prefill).
    Each instance schedules as its role says (`PDRole`; default vLLM's stock ``fcfs``).
    ``report_assigned``: a decode instance's load counts the requests routed to it whose
    prompt is still on a prefill instance (what a router that picks both at arrival has
    sent there); False counts only what reached it, as `PDProxy`'s in-flight counts do.
    """
    started = time.perf_counter()
    cluster = _Cluster(
        trace, router, cost_model, transfer,
        prefill={n: _Instance(n, role_harness(prefill_role, prefill_shape), decodes=False)
                 for n in prefill},
        decode={n: _Instance(n, role_harness(decode_role, decode_shape), decodes=True,
                             reports_assigned=report_assigned)
                for n in decode})
    for index, request in enumerate(trace.requests):
        cluster.push(request.arrival_s, "arrive", index)
    handlers = {"arrive": cluster.arrive, "step": cluster.step, "prefilled": cluster.prefilled,
                "install": lambda now, payload: cluster.install(now, *payload)}
    makespan = 0.0
    while cluster._events:
        now, _, kind, payload = heapq.heappop(cluster._events)
        makespan = max(makespan, now)
        handlers[kind](now, payload)
        if kind == "arrive" and progress:
            progress(1)
    lost = [r.request_id for r in cluster.records.values() if r.outcome is None]
    if lost or len(cluster.records) != len(trace.requests):
        raise RuntimeError(f"{system}: {len(lost)} requests never completed (e.g. {lost[:5]})")
    instances = cluster.instances().values()
    run = SystemRun(system=system, records=tuple(cluster.records.values()),
                    steps=sum(i.steps for i in instances),
                    busy_s=sum(i.busy_s for i in instances), makespan_s=makespan,
                    preemptions=cluster.preemptions, wall_s=time.perf_counter() - started)
    return ClusterRun(system=system, run=run, kv_bytes_transferred=cluster.kv_bytes,
                      kv_bytes_full_prompts=cluster.kv_bytes_full,
                      transfers=cluster.transfers, skipped_prefill=cluster.skipped,
                      busy_s_by_instance={i.name: i.busy_s for i in instances})
