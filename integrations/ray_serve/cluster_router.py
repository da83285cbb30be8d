"""`ClusterRequestRouter`: any `policies.cluster_routing` router as a Ray Serve request router.

The same router objects the cluster replay runs (`policies.cluster_routing.make_router`:
``slo``, ``slo-keep-sessions``, ``pow2``, ``round-robin``, ``kv_overlap``, ``session-sticky``,
``sticky-until-saturated``) decide here, per request, from one `ReplicaReport` per replica:

- **Reports** come from each replica's ``record_routing_stats`` (`VLLMEngine`, pulled by the
  Serve controller every ``request_routing_stats_period_s``): vLLM's running and waiting
  requests and KV usage, the requests still waiting for their first bytes (prompt tokens,
  and their first-token deadlines on a replica that serves prefill earliest deadline first),
  the step budget and KV capacity, and where the pipeline learns them the step model's
  coefficients and the SLO admission's headrooms in force. Requests this router sent a
  replica after its stats were taken are added, so requests arriving together see each other.
- **Requests** (`ClusterRequest`) carry the ingress's `RoutingHint` (prompt tokens, chained
  block keys, session, tenant, class) and, with an SLO declaration (``slo``, the form of the
  ``llm_serving_policies.slo`` entry), the targets of the class the request is judged in.
- **Fairness**: where the declaration has ``fairness``, `SLORouter` weighs tenants across
  the replicas (`SLORouter.fairness`): each routed request is charged to its tenant, and the
  charge settled when Ray reports the request done (its output length unknown here, the
  expected decode stays charged).
- **Rejection**: Ray Serve's router can only rank replicas, so a refusal travels in the request
  (`RouterRejection`): the replica it reaches answers 503 without its engine, and the ingress
  answers the client 503 with ``Retry-After`` and the reason.
- **A replica's 503**: the ingress sends the request once more, naming the replica
  (``EngineRequest.rejected_by``); this router asks the policy's ``retry``: `SLORouter` places
  it on another replica predicted to meet the deadline, the peers pass it on. A rejection
  passed on while another replica had room is counted
  (``policies:router_rejected_with_room_total``).

Replicas hold slots (``slot0``, ...) of the policy's replica set: a replica that left Ray
Serve's candidate set is reported not accepting, and its replacement takes its slot.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import attrs
from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from integrations.ray_serve import metrics
from integrations.ray_serve.engine import EngineRequest, RouterRejection
from integrations.ray_serve.router import not_yet_in_stats
from policies.cluster_routing import (
    ClusterDecision,
    ClusterRequest,
    ClusterRouter,
    ReplicaReport,
    RouteCause,
    SLORouter,
    make_router,
)
from policies.slo.classes import SLOTarget, resolve_class
from policies.slo.fairness import DEFAULT_HALF_LIFE_S
from policies.step_model import StepTimeModel
from policies.views import DEFAULT_TENANT, RequestView

_MAX_REMEMBERED = 10_000
"""Decisions kept until Ray dispatches their request (a cancelled one leaves one behind)."""
_DEFAULT_KV_TOKENS = 1 << 20
_DEFAULT_TOKEN_BUDGET = 8192


@attrs.frozen(kw_only=True)
class ClassTable:
    """Which SLO class (and targets) a request is judged in, from an SLO declaration."""

    classes: Mapping[str, SLOTarget] = attrs.field(factory=dict)
    tenants: Mapping[str, str] = attrs.field(factory=dict)
    lengths: tuple[tuple[int, str], ...] = ()
    demotions: Mapping[str, str] = attrs.field(factory=dict)
    grants: Any = None
    fairness_weights: Mapping[str, float] | None = None
    """The declaration's ``fairness`` weights (`SLOSpec.fairness_weights`); None: none."""
    fairness_half_life_s: float = DEFAULT_HALF_LIFE_S

    @classmethod
    def parse(cls, declaration: Mapping[str, Any] | None) -> ClassTable:
        """The table of an ``llm_serving_policies.slo`` mapping (None: no classes, no
        targets: every request is feasible everywhere)."""
        if declaration is None:
            return cls()
        from integrations.vllm_v1.config.slo import SLOSpec

        spec = SLOSpec.parse(dict(declaration))
        return cls(classes=dict(spec.classes), tenants=dict(spec.tenants),
                   lengths=tuple((2**31 if bound is None else bound, name)
                                 for bound, name in spec.by_prompt_tokens),
                   demotions=dict(spec.demotions), grants=spec.grants(),
                   fairness_weights=spec.fairness_weights,
                   fairness_half_life_s=spec.fairness_half_life_s)

    def resolve(self, tenant: str, slo_class: str | None, prompt_tokens: int) -> str | None:
        """The class the request is judged in (None: none)."""
        if not self.classes:
            return None
        view = RequestView(request_id="", arrival_s=0.0, prompt_tokens=prompt_tokens,
                           tenant=tenant, slo_class=slo_class)
        return resolve_class(view, self.classes, self.tenants, self.lengths, self.grants)

    def targets(self, tenant: str, slo_class: str | None, prompt_tokens: int
                ) -> tuple[SLOTarget | None, SLOTarget | None]:
        """The request's class targets and its declared lower class's (None: none)."""
        name = self.resolve(tenant, slo_class, prompt_tokens)
        if name is None:
            return None, None
        lower = self.demotions.get(name)
        return self.classes[name], self.classes.get(lower) if lower else None


def class_declaration(spec: Any) -> dict[str, Any]:
    """The class part of a parsed `SLOSpec` as an ``slo`` mapping (JSON, as Ray Serve wants a
    request router's arguments): classes, tenants' classes, classes by prompt length,
    protected classes, demotions, allowed classes and the tenants' fairness weights."""
    declared = {"classes": {name: {"ttft_s": t.ttft_s, "tpot_s": t.tpot_s}
                            for name, t in spec.classes.items()},
                "tenants": dict(spec.tenants),
                "by_prompt_tokens": [[bound, name] for bound, name in spec.by_prompt_tokens],
                "protected": sorted(spec.protected), "demotions": dict(spec.demotions),
                "allowed_classes": {who: sorted(names) for who, names in spec.allowed.items()}}
    if spec.fairness_weights is not None:
        declared["fairness"] = {"weights": dict(spec.fairness_weights),
                                "half_life_s": spec.fairness_half_life_s}
    return declared


def step_model(coefficients: Mapping[str, float] | None) -> StepTimeModel | None:
    """The replica's learned step model from its reported coefficients (None: none, or not
    yet a valid model)."""
    if not coefficients:
        return None
    try:
        return StepTimeModel(
            base_s=coefficients["base"], decode_s_per_seq=coefficients["decode"],
            prefill_s_per_token=coefficients["prefill_token"],
            decode_s_per_context_token=coefficients.get("decode_context_token", 0.0),
            prefill_s_per_pair=coefficients.get("prefill_pair", 0.0))
    except (KeyError, ValueError):
        return None


def replica_report(slot: str, stats: Mapping[str, Any], *, classes: ClassTable,
                   sent: tuple[tuple[float, str | None, str | None, int], ...] = (),
                   accepting: bool = True) -> ReplicaReport:
    """A `ReplicaReport` from a replica's routing stats (`VLLMEngine.record_routing_stats`)
    plus the requests sent there since (``sent``: like the stats' ``queued``, arrival, class,
    tenant and prompt tokens of each)."""
    queued = [(float(a), c, t, int(n)) for a, c, t, n in (*stats.get("queued", ()), *sent)]
    deadlines = None
    if stats.get("ranks_by_deadline"):
        deadlines = []
        for arrival, slo_class, tenant, tokens in queued:
            target, _ = classes.targets(tenant or DEFAULT_TENANT, slo_class, max(1, tokens))
            deadlines.append((arrival + (target.ttft_s if target else float("inf")), tokens))
    kv_tokens = int(stats.get("kv_capacity_tokens") or _DEFAULT_KV_TOKENS)
    kv_usage = min(1.0, max(0.0, float(stats.get("kv_usage", 0.0))))
    headroom = stats.get("ttft_headroom")
    tpot_headroom = stats.get("tpot_headroom")
    tpot_bound = float(stats.get("tpot_bound_s") or math.inf)
    return ReplicaReport(
        name=slot, queued_prefill_tokens=sum(q[3] for q in queued),
        running_requests=max(0, int(stats.get("running_requests", 0))),
        waiting_requests=max(0, int(stats.get("waiting_requests", 0))) + len(sent),
        decode_context_tokens=int(kv_usage * kv_tokens),
        queued_prefill_deadlines=None if deadlines is None else tuple(sorted(deadlines)),
        prefilling_requests=len(queued), prefilling_prompt_tokens=sum(q[3] for q in queued),
        kv_usage=kv_usage, kv_capacity_tokens=max(1, kv_tokens),
        token_budget=max(1, int(stats.get("token_budget") or _DEFAULT_TOKEN_BUDGET)),
        step_model=step_model(stats.get("step_model")),
        ttft_headroom=float(headroom) if headroom else None,
        tpot_headroom=float(tpot_headroom) if tpot_headroom else None,
        tpot_bound_s=tpot_bound if 0 < tpot_bound < math.inf else None, accepting=accepting)


def engine_request(pending_request: PendingRequest | None) -> EngineRequest | None:
    """The `EngineRequest` a pending request carries, if any."""
    if pending_request is None or not pending_request.args:
        return None
    first = pending_request.args[0]
    return first if isinstance(first, EngineRequest) else None


class ClusterRequestRouter(RequestRouter):
    """Ray Serve request router running a `policies.cluster_routing` router (module doc)."""

    def initialize_state(self, *, router: str = "slo", deployment: str = "",
                         block_size_tokens: int = 16, index_capacity_blocks: int = 100_000,
                         saturation_tokens: int = 8192, seed: int = 0,
                         slo: Mapping[str, Any] | None = None) -> None:
        """Ray Serve calls this with ``request_router_kwargs``: the policy's name and
        `make_router` arguments, ``deployment`` (the metrics' label) and ``slo`` (the SLO
        declaration mapping whose classes give requests their targets)."""
        self._label = deployment or self.app_name
        self._name = router
        self._classes = ClassTable.parse(slo)
        self._settings = dict(block_size_tokens=block_size_tokens,
                              index_capacity_blocks=index_capacity_blocks,
                              saturation_tokens=saturation_tokens, seed=seed,
                              fairness_weights=self._classes.fairness_weights,
                              fairness_half_life_s=self._classes.fairness_half_life_s)
        self._policy = self._new_policy(1)
        self._slots: dict[str, str] = {}
        """Replica unique id -> its slot in the policy's replica set."""
        self._decided: OrderedDict[str, ClusterDecision] = OrderedDict()
        """Internal request id -> the decision, until Ray dispatches it."""
        self._sent: dict[str, dict[str, tuple[float, tuple[float, str | None, str, int]]]] = {}
        """Replica -> internal request id -> (decided at, what it adds to the queue)."""
        self._routed: OrderedDict[str, str] = OrderedDict()
        """Internal request id -> the policy's request id, until the request ends (the
        policy settles what it charged the tenant)."""
        self._with_room_seen = 0
        metrics.declare((self._label,))

    def _new_policy(self, size: int) -> ClusterRouter:
        return make_router(self._name, tuple(f"slot{i}" for i in range(size)), **self._settings)

    def _sync_slots(self, candidates: list[RunningReplica]) -> None:
        """Give every candidate a slot (a larger set: a fresh policy); forget gone replicas."""
        present = {r.replica_id.unique_id for r in candidates}
        for gone in [name for name in self._slots if name not in present]:
            del self._slots[gone]
            self._sent.pop(gone, None)
        new = sorted(present - self._slots.keys())
        free = [s for s in self._policy.replicas if s not in self._slots.values()]
        if len(new) > len(free):
            self._policy = self._new_policy(len(present))
            self._slots = dict(zip(sorted(present), self._policy.replicas, strict=False))
        else:
            self._slots.update(zip(new, free, strict=False))
        metrics.ROUTER_REPLICAS.labels(self._label, "up").set(len(self._slots))
        metrics.ROUTER_REPLICAS.labels(self._label, "down").set(
            len(self._policy.replicas) - len(self._slots))

    def _reports(self, candidates: list[RunningReplica]) -> dict[str, ReplicaReport]:
        by_slot = {}
        for replica in candidates:
            name = replica.replica_id.unique_id
            stats = replica.routing_stats or {}
            taken_at = float(stats.get("time_s", 0.0))
            by_slot[self._slots[name]] = replica_report(
                self._slots[name], stats, classes=self._classes,
                sent=tuple(not_yet_in_stats(self._sent.get(name, {}), taken_at)))
        for slot in self._policy.replicas:
            if slot not in by_slot:
                by_slot[slot] = ReplicaReport(name=slot, queued_prefill_tokens=0,
                                              running_requests=0, kv_capacity_tokens=1,
                                              token_budget=1, accepting=False)
        return by_slot

    def cluster_request(self, request: EngineRequest, request_id: str) -> ClusterRequest:
        """The policy's view of ``request``, with its class's targets."""
        hint = request.hint
        tenant = hint.tenant or DEFAULT_TENANT
        prompt = max(1, hint.prompt_tokens)
        target, lower = self._classes.targets(tenant, hint.slo_class, prompt)
        return ClusterRequest(
            request_id=request.request_id or request_id,
            arrival_s=request.arrival_s or time.time(), prompt_tokens=prompt,
            block_keys=hint.block_keys, session_id=hint.session_id, tenant=tenant,
            slo_class=self._classes.resolve(tenant, hint.slo_class, prompt),
            ttft_s=target.ttft_s if target else None, tpot_s=target.tpot_s if target else None,
            demote_ttft_s=lower.ttft_s if lower else None)

    # -- Ray Serve's interface ------------------------------------------------------
    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None,
                              ) -> list[list[RunningReplica]]:
        """The policy's replica first, then the rest by queued prefill; on a rejection, the
        refusal is put in the request and any replica answers it."""
        if not candidate_replicas:
            return []
        self._sync_slots(candidate_replicas)
        by_slot = {self._slots[r.replica_id.unique_id]: r for r in candidate_replicas}
        request_id = pending_request.metadata.internal_request_id if pending_request else ""
        decision = self._decided.get(request_id) if request_id else None
        request = engine_request(pending_request)
        reports = self._reports(candidate_replicas)
        if decision is None or (decision.replica is not None and decision.replica not in by_slot):
            decision = self._decide(pending_request, request, request_id, reports)
        if decision.replica is None and request is not None and request.rejection is None:
            pending_request.args[0] = attrs.evolve(request, rejection=RouterRejection(
                reason=f"router_{decision.cause.value}", retry_after_s=decision.retry_after_s))
        rest = sorted((s for s in by_slot if s != decision.replica),
                      key=lambda s: (reports[s].queued_prefill_tokens, s))
        ranked = [[by_slot[decision.replica]]] if decision.replica in by_slot else []
        return ranked + ([[by_slot[s] for s in rest]] if rest else [])

    def _decide(self, pending_request: PendingRequest | None, request: EngineRequest | None,
                request_id: str, reports: Mapping[str, ReplicaReport]) -> ClusterDecision:
        now = time.time()
        if request is None:  # not an engine request (e.g. a health probe): the emptiest
            return ClusterDecision(request_id=request_id, replica=min(
                (s for s, r in reports.items() if r.accepting),
                key=lambda s: reports[s].queued_prefill_tokens, default=None),
                cause=RouteCause.LEAST_LOADED)
        cluster = self.cluster_request(request, request_id)
        rejected_by = self._slots.get(request.rejected_by or "")
        if request.rejected_by is not None and rejected_by is not None:
            decision = self._policy.retry(cluster, reports, now, rejected_by=rejected_by)
            if isinstance(self._policy, SLORouter):
                self._policy.forget(cluster.request_id)  # the ingress retries only once
        else:
            decision = self._policy.route(cluster, reports, now)
        metrics.ROUTER_DECISIONS.labels(self._label, decision.cause.value).inc()
        with_room = self._policy.stats().rejected_with_room
        if with_room > self._with_room_seen:
            metrics.ROUTER_REJECTED_WITH_ROOM.labels(self._label).inc(
                with_room - self._with_room_seen)
            self._with_room_seen = with_room
        if request_id:
            self._decided[request_id] = decision
            while len(self._decided) > _MAX_REMEMBERED:
                self._decided.popitem(last=False)
            if decision.replica is not None:
                self._routed[request_id] = cluster.request_id
                while len(self._routed) > _MAX_REMEMBERED:
                    self._routed.popitem(last=False)
                chosen = next(n for n, s in self._slots.items() if s == decision.replica)
                self._sent.setdefault(chosen, {})[request_id] = (now, (
                    cluster.arrival_s, request.hint.slo_class, cluster.tenant,
                    cluster.prompt_tokens))
        return decision

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID,
                          result: Any) -> None:
        """Ray sent the request: its decision is done; count a ``fallback`` when Ray sent it
        elsewhere than decided (the chosen replica was full or had just died)."""
        request_id = pending_request.metadata.internal_request_id
        decision = self._decided.pop(request_id, None)
        name = replica_id.unique_id
        if decision is not None and decision.replica is not None and \
                self._slots.get(name) != decision.replica:
            metrics.ROUTER_DECISIONS.labels(self._label, "fallback").inc()
            for sent in self._sent.values():
                moved = sent.pop(request_id, None)
                if moved is not None:
                    self._sent.setdefault(name, {})[request_id] = moved
                    break

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        """The request ended (any outcome): no longer counted as sent; the policy settles it
        (its output length is not known here: the expected decode stays charged)."""
        self._sent.get(replica_id.unique_id, {}).pop(internal_request_id, None)
        self._decided.pop(internal_request_id, None)
        routed = self._routed.pop(internal_request_id, None)
        if routed is not None:
            self._policy.on_finished(routed, None, time.time())

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        """Ray saw the replica die: free its slot before the controller says so."""
        super().on_replica_actor_died(replica_id)
        self._slots.pop(replica_id.unique_id, None)
        self._sent.pop(replica_id.unique_id, None)

    def stats(self) -> dict[str, Any]:
        """The policy's counters, its tenants' charges (`ClassFairShareStats`, None without
        fairness) and which replica holds which slot (for tests, demos)."""
        fairness = getattr(self._policy, "fairness", None)
        return {"router": self._policy.stats(), "slots": dict(self._slots),
                "fairness": None if fairness is None else fairness.stats()}


