"""`PDRequestRouter`: our `policies.pd.router.PDRouter` as a Ray Serve request router.

Ray Serve asks a deployment's request router, in the process that holds the
deployment handle (here the ingress), which replicas may take each request
(``choose_replicas``); it then probes the first rank's queue lengths and sends the
request to one that accepts it, falling back to the next rank. This router answers
with one replica, the `PDRouter`'s choice, then the rest by load:

- **Prefix affinity**: the request's `RoutingHint` (prompt length and chained block
  keys, computed by the ingress the same way for every replica) is matched against the
  router's prefix index, which remembers where each prompt went.
- **Load**: each replica's live queue length, read the way Ray Serve's default
  power-of-two-choices router reads it (Ray's queue-length cache, which Ray updates on
  every send, completion and replica answer; a replica without a fresh entry is probed
  with ``get_queue_len``, the same RPC, and the cache updated), plus the requests this
  router decided for it that Ray has not sent yet, is its request count. Beside it, the
  replica's ``record_routing_stats`` (queued prefill tokens, KV usage; pulled by the
  Serve controller every ``request_routing_stats_period_s``) plus the prompt tokens
  this router sent it since those stats were taken. They feed `PDRouter`'s
  bounded-load rule. A request counts from the moment it is decided, not once Ray has
  dispatched it: requests arriving together then see each other. A replica whose
  queue length cannot be read in time counts by its stats as before.
- **Sessions**: a request whose body names an agent session (``session_id``) goes back
  to the replica of the session's previous turn unless that replica is past the load
  bound by more than ``session_slack_tokens`` (`PDRouter`'s session rule).
- **Failover**: a replica that left Ray Serve's candidate set (dead, draining) is marked
  down, so it is never chosen while another is up; prompts whose longest prefix it held
  spill over (counted as failovers). Its replacement takes its slot with an empty index
  (``mark_up(cache_lost=True)``), so the other replicas keep their affinity.

Decisions are made once per request (Ray may call ``choose_replicas`` again while it
backs off) and counted in `integrations.ray_serve.metrics`. Configure it with
``RequestRouterConfig(request_router_class=PDRequestRouter, request_router_kwargs=...)``;
the kwargs are `initialize_state`'s.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, TypeVar

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from integrations.ray_serve import metrics
from integrations.ray_serve.prefix import RoutingHint
from policies.pd.router import InstanceLoad, PDRouter

T = TypeVar("T")

_MAX_REMEMBERED = 10_000
"""Undispatched decisions kept (a request cancelled before dispatch leaves one behind)."""


def routing_hint(pending_request: PendingRequest | None) -> RoutingHint:
    """The `RoutingHint` carried by a request's first argument, or an empty one."""
    if pending_request is None or not pending_request.args:
        return RoutingHint()
    hint = getattr(pending_request.args[0], "hint", None)
    return hint if isinstance(hint, RoutingHint) else RoutingHint()


def replica_load(stats: Mapping[str, Any], unseen_requests: int = 0,
                 unseen_tokens: int = 0, live_requests: int | None = None) -> InstanceLoad:
    """`InstanceLoad` from a replica's routing stats plus requests sent after they were taken.

    ``live_requests`` (its live queue length plus undispatched decisions), when known,
    is the request count; otherwise the stats' running requests plus ``unseen_requests``.
    """
    count = (live_requests if live_requests is not None
             else max(0, int(stats.get("running_requests", 0))) + unseen_requests)
    return InstanceLoad(
        queued_prefill_tokens=max(0, int(stats.get("queued_prefill_tokens", 0))) + unseen_tokens,
        running_decodes=count, ongoing_requests=count,
        kv_usage=min(1.0, max(0.0, float(stats.get("kv_usage", 0.0)))))



def not_yet_in_stats(sent: dict[str, tuple[float, T]], taken_at: float) -> list[T]:
    """What was sent to a replica after its routing stats were taken at ``taken_at``; the
    entries sent before are dropped from ``sent`` (in the stats now, or never dispatched)."""
    for stale in [rid for rid, (at, _) in sent.items() if at < taken_at]:
        del sent[stale]
    return [entry for _, entry in sent.values()]

class PDRequestRouter(RequestRouter):
    """Ray Serve request router: `PDRouter` (prefix affinity, bounded load, failover)."""

    def initialize_state(self, *, deployment: str = "", block_size_tokens: int = 32,
                         balance_epsilon: float = 0.1, load_slack_tokens: float = 1024.0,
                         decode_weight_tokens: float = 256.0, kv_weight_tokens: float = 8192.0,
                         choices: int | None = None, index_capacity_blocks: int = 100_000,
                         session_slack_tokens: float = 8192.0, seed: int = 0) -> None:
        """Ray Serve calls this with ``request_router_kwargs``; `PDRouter`'s parameters
        (validated by it) plus ``deployment``, the label of this router's metrics."""
        self._label = deployment or self.app_name
        self._settings = dict(block_size_tokens=block_size_tokens,
                              balance_epsilon=balance_epsilon,
                              load_slack_tokens=load_slack_tokens,
                              decode_weight_tokens=decode_weight_tokens,
                              kv_weight_tokens=kv_weight_tokens, choices=choices,
                              index_capacity_blocks=index_capacity_blocks,
                              session_slack_tokens=session_slack_tokens)
        self._seed = seed
        self._router = self._new_router(("slot0",))
        self._slots: dict[str, str] = {}
        """Replica unique id -> its slot name in the router's pool."""
        self._pending: OrderedDict[str, tuple[str, RoutingHint]] = OrderedDict()
        """Internal request id -> (chosen replica, hint), until Ray dispatches it."""
        self._inflight: dict[str, dict[str, tuple[float, int]]] = {}
        """Replica -> internal request id -> (sent at, prompt tokens), until it completes."""
        self._failovers_seen = 0
        metrics.declare((self._label,))

    # -- the pool ---------------------------------------------------------------
    def _new_router(self, slots: tuple[str, ...]) -> PDRouter:
        return PDRouter(prefill=(), decode=slots, rng=random.Random(self._seed),
                        skip_prefill_max_tokens=0, **self._settings)

    def _sync_pool(self, candidates: list[RunningReplica]) -> None:
        """Give every candidate a slot; mark slots whose replica is gone down."""
        present = {r.replica_id.unique_id for r in candidates}
        for gone in [name for name in self._slots if name not in present]:
            self._router.mark_down(self._slots.pop(gone))
            self._inflight.pop(gone, None)
        new = sorted(present - self._slots.keys())
        free = [slot for slot in self._router.decode if slot not in self._slots.values()]
        if len(new) > len(free):  # more replicas than slots: a larger pool, a fresh index
            self._router = self._new_router(tuple(f"slot{i}" for i in range(len(present))))
            self._slots = dict(zip(sorted(present), self._router.decode, strict=True))
        else:
            for name, slot in zip(new, free, strict=False):
                self._slots[name] = slot
                self._router.mark_up(slot, cache_lost=True)
        for slot in self._router.decode:
            if slot not in self._slots.values() and self._router.is_up(slot):
                self._router.mark_down(slot)
        metrics.ROUTER_REPLICAS.labels(self._label, "up").set(len(self._slots))
        metrics.ROUTER_REPLICAS.labels(self._label, "down").set(
            len(self._router.decode) - len(self._slots))

    async def _queue_lens(self, candidates: list[RunningReplica]) -> dict[str, int]:
        """Each candidate's live queue length: Ray's cache, else a probe (as pow2's);
        replicas that did not answer within Ray's probe deadline are left out."""
        cache = self.replica_queue_len_cache
        known = {r.replica_id.unique_id: cache.get(r.replica_id) for r in candidates}
        missing = [r for r in candidates if known[r.replica_id.unique_id] is None]
        if missing:
            deadline_s = self.queue_len_response_deadline_s
            probes = [asyncio.ensure_future(r.get_queue_len(deadline_s=deadline_s))
                      for r in missing]
            done, pending = await asyncio.wait(probes, timeout=deadline_s)
            for probe in pending:
                probe.cancel()
            for replica, probe in zip(missing, probes, strict=True):
                if probe in done and probe.exception() is None:
                    cache.update(replica.replica_id, probe.result())
                    known[replica.replica_id.unique_id] = probe.result()
        return {name: length for name, length in known.items() if length is not None}

    def _loads(self, candidates: list[RunningReplica],
               queue_lens: Mapping[str, int]) -> dict[str, InstanceLoad]:
        loads = {}
        for replica in candidates:
            name = replica.replica_id.unique_id
            stats = replica.routing_stats or {}
            taken_at = float(stats.get("time_s", 0.0))
            inflight = self._inflight.get(name, {})
            unseen = not_yet_in_stats(inflight, taken_at)
            live = queue_lens.get(name)
            if live is not None:  # plus what Ray has not sent yet (decided since the stats)
                live += sum(rid in self._pending for rid in inflight)
            loads[self._slots[name]] = replica_load(stats, len(unseen), sum(unseen), live)
        return loads

    # -- Ray Serve's interface ------------------------------------------------------
    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None,
                              ) -> list[list[RunningReplica]]:
        """The `PDRouter`'s replica first, then every other candidate, least loaded first."""
        if not candidate_replicas:
            return []
        queue_lens = await self._queue_lens(candidate_replicas)  # the only wait: state after it
        self._sync_pool(candidate_replicas)
        by_name = {r.replica_id.unique_id: r for r in candidate_replicas}
        request_id = pending_request.metadata.internal_request_id if pending_request else ""
        remembered = self._pending.pop(request_id, None) if request_id else None
        loads = self._loads(candidate_replicas, queue_lens)  # without this request itself
        if remembered is not None:
            self._pending[request_id] = remembered
        if remembered is not None and remembered[0] in by_name:
            chosen = remembered[0]
        else:
            chosen = self._decide(request_id, routing_hint(pending_request), loads)
        score = self._router.load_score
        rest = sorted((n for n in by_name if n != chosen),
                      key=lambda n: (score(loads[self._slots[n]]), n))
        return [[by_name[chosen]], [by_name[n] for n in rest]] if rest else [[by_name[chosen]]]

    def _decide(self, request_id: str, hint: RoutingHint,
                loads: Mapping[str, InstanceLoad]) -> str:
        decision = self._router.route(request_id, hint.prompt_tokens, hint.block_keys, loads,
                                      session_id=hint.session_id)
        chosen = next(name for name, slot in self._slots.items() if slot == decision.decode)
        metrics.ROUTER_DECISIONS.labels(self._label, decision.decode_reason.value).inc()
        failovers = self._router.stats().failovers
        if failovers > self._failovers_seen:
            metrics.ROUTER_FAILOVERS.labels(self._label).inc(failovers - self._failovers_seen)
            self._failovers_seen = failovers
        if request_id:
            self._pending[request_id] = (chosen, hint)
            while len(self._pending) > _MAX_REMEMBERED:
                self._pending.popitem(last=False)
            self._inflight.setdefault(chosen, {})[request_id] = (time.time(),
                                                                 hint.prompt_tokens)
        return chosen

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID,
                          result: Any) -> None:
        """Ray sent the request to ``replica_id``: count it in flight; if that is not the
        replica chosen, record the prompt there too (count a ``fallback``)."""
        request_id = pending_request.metadata.internal_request_id
        chosen, hint = self._pending.pop(request_id, (None, routing_hint(pending_request)))
        name = replica_id.unique_id
        decided = self._inflight.get(chosen, {}).pop(request_id, None) if chosen else None
        if chosen is not None and chosen != name:
            metrics.ROUTER_DECISIONS.labels(self._label, "fallback").inc()
            if name in self._slots:
                self._router.index.insert((self._slots[name],), hint.block_keys)
        self._inflight.setdefault(name, {})[request_id] = decided or (time.time(),
                                                                      hint.prompt_tokens)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        """The request ended (any outcome): no longer in flight."""
        self._inflight.get(replica_id.unique_id, {}).pop(internal_request_id, None)
        self._pending.pop(internal_request_id, None)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        """Ray saw the replica die: mark its slot down before the controller says so."""
        super().on_replica_actor_died(replica_id)
        slot = self._slots.pop(replica_id.unique_id, None)
        if slot is not None:
            self._router.mark_down(slot)
        self._inflight.pop(replica_id.unique_id, None)

    def stats(self) -> dict[str, Any]:
        """The `PDRouter`'s counters and which replica holds which slot (for tests, demos)."""
        return {"router": self._router.stats(), "slots": dict(self._slots)}
