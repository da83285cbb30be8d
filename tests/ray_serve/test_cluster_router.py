"""`ClusterRequestRouter`'s decision, built outside Serve over a fake replica set.

The fakes stand in for Ray's `RunningReplica` (an id and the routing stats `VLLMEngine`
reports); the router is the real class running the real `policies.cluster_routing` routers.
"""

from __future__ import annotations

import asyncio
import time

import attrs
import pytest

from integrations.ray_serve import cluster as _cluster  # noqa: F401 - before Ray is imported

pytest.importorskip("ray.serve")

from ray.serve._private.common import (  # noqa: E402 - after the skip
    DeploymentHandleSource,
    DeploymentID,
    RequestMetadata,
)
from ray.serve.request_router import PendingRequest, ReplicaID  # noqa: E402

from integrations.ray_serve import metrics  # noqa: E402
from integrations.ray_serve.cluster_router import (  # noqa: E402
    ClassTable,
    ClusterRequestRouter,
    class_declaration,
    replica_report,
)
from integrations.ray_serve.engine import EngineRequest  # noqa: E402
from integrations.ray_serve.prefix import RoutingHint  # noqa: E402

DEPLOYMENT = DeploymentID(name="engine", app_name="app")
SLO = {"classes": {"chat": {"ttft_s": 0.5, "tpot_s": 0.5}, "rag": {"ttft_s": 4, "tpot_s": 0.5}}}
MODEL = {"base": 0.005, "decode": 1e-4, "prefill_token": 1e-4}
"""10,000 prefill tokens a second: 0.5 s holds about 4,500 tokens of queued prefill."""


@attrs.define(eq=False)
class FakeReplica:
    """What the router reads of a replica: its id and its routing stats."""

    name: str
    stats: dict = attrs.field(factory=dict)
    max_ongoing_requests: int = 64

    @property
    def replica_id(self) -> ReplicaID:
        return ReplicaID(self.name, DEPLOYMENT)

    @property
    def routing_stats(self) -> dict:
        return self.stats


def stats(queued_tokens: int = 0, **extra) -> dict:
    """A replica's routing stats: one queued request of ``queued_tokens`` (if any)."""
    queued = [[time.time(), "chat", "acme", queued_tokens]] if queued_tokens else []
    return {"running_requests": 0, "waiting_requests": len(queued), "kv_usage": 0.0,
            "queued": queued, "token_budget": 2048, "kv_capacity_tokens": 100_000,
            "step_model": MODEL, "time_s": 0.0, **extra}


def make_router(router: str = "slo", **kwargs) -> ClusterRequestRouter:
    instance = ClusterRequestRouter(deployment_id=DEPLOYMENT,
                                    handle_source=DeploymentHandleSource.UNKNOWN,
                                    use_replica_queue_len_cache=True)
    kwargs.setdefault("slo", SLO)
    instance.initialize_state(router=router, deployment=f"engine-{router}", **kwargs)
    return instance


def pending(request_id: str, slo_class: str = "chat", prompt_tokens: int = 200,
            rejected_by: str | None = None, tenant: str = "acme") -> PendingRequest:
    hint = RoutingHint(prompt_tokens=prompt_tokens, block_keys=(1, 2), slo_class=slo_class,
                       tenant=tenant)
    request = EngineRequest(path="/v1/completions", hint=hint, request_id=f"client-{request_id}",
                            arrival_s=time.time(), rejected_by=rejected_by)
    return PendingRequest(args=[request], kwargs={},
                          metadata=RequestMetadata(request_id=request_id,
                                                   internal_request_id=request_id))


def choose(router: ClusterRequestRouter, replicas, request_id: str, **request
           ) -> tuple[list[str], EngineRequest]:
    """The replicas' names in the order the router ranks them for one request, and the
    request as sent."""
    async def ranked():
        waiting = pending(request_id, **request)  # its future needs a running loop
        return await router.choose_replicas(replicas, waiting), waiting.args[0]

    ranks, sent = asyncio.run(ranked())
    return [replica.name for rank in ranks for replica in rank], sent


def with_room(router: ClusterRequestRouter) -> float:
    return metrics.ROUTER_REJECTED_WITH_ROOM.labels(router._label)._value.get()


def test_replica_reports_carry_the_stats_the_slo_prediction_reads():
    classes = ClassTable.parse(SLO)
    report = replica_report("slot0", stats(3000, ranks_by_deadline=True, ttft_headroom=0.7),
                            classes=classes, sent=((0.0, "rag", "acme", 500),))
    assert report.queued_prefill_tokens == 3500 and report.waiting_requests == 2
    assert report.step_model.prefill_s_per_token == MODEL["prefill_token"]
    assert report.token_budget == 2048 and report.ttft_headroom == 0.7
    assert report.queued_prefill_deadlines[0] == (4.0, 500)  # rag: due 4 s after arrival 0
    assert replica_report("s", {}, classes=classes).step_model is None  # nothing learned yet
    assert report.tpot_bound_s is None
    bound = replica_report("s", {"tpot_bound_s": 0.05}, classes=classes)
    assert bound.tpot_bound_s == 0.05
    idle = replica_report("s", {"tpot_bound_s": float("inf")}, classes=classes)
    assert idle.tpot_bound_s is None, "the gauge reads +Inf while nothing with a class decodes"


def test_the_pipeline_declaration_reaches_the_router_as_json_with_the_same_classes():
    import json

    from integrations.vllm_v1.config.slo import SLOSpec

    declared = {**SLO, "tenants": {"acme": "chat"}, "by_prompt_tokens": [[100, "chat"],
                                                                         [None, "rag"]],
                "protected": ["chat"], "demotions": {"chat": "rag"}}
    spec = SLOSpec.parse(declared)
    table = ClassTable.parse(json.loads(json.dumps(class_declaration(spec))))
    assert table.targets("acme", None, 5000)[0] == spec.classes["chat"]  # the tenant's class
    assert table.targets("other", None, 50) == (spec.classes["rag"], None)  # chat: protected
    assert table.targets("other", "rag", 50)[0] == spec.classes["rag"]
    assert table.targets("acme", "chat", 50)[1] == spec.classes["rag"]  # demoted to rag


def test_slo_router_sends_a_request_where_its_deadline_is_predicted_met():
    busy, idle = FakeReplica("busy", stats(9000)), FakeReplica("idle", stats())
    router = make_router()
    assert choose(router, [busy, idle], "r1")[0] == ["idle", "busy"]
    # a loose class fits behind the busy replica's queue too: the earliest first token wins
    assert choose(router, [busy, idle], "r2", slo_class="rag")[0][0] == "idle"
    assert router.stats()["router"].by_cause == {"cache": 1, "feasible": 1}  # same prefix


def test_a_refusal_travels_in_the_request_with_its_retry_after():
    replicas = [FakeReplica("a", stats(9000)), FakeReplica("b", stats(12000))]
    router = make_router()
    ranked, sent = choose(router, replicas, "r1")
    assert ranked  # any replica answers the refusal, without its engine
    rejection = sent.rejection
    assert rejection.reason == "router_no_feasible" and rejection.retry_after_s >= 0.5
    choose(router, replicas, "r1")  # Ray asks again while backing off: the same decision
    assert router.stats()["router"].rejected == 1


def test_a_replica_rejection_is_retried_once_elsewhere_by_slo_and_passed_on_by_peers():
    a, b = FakeReplica("a", stats()), FakeReplica("b", stats())
    slo = make_router()
    assert choose(slo, [a, b], "r1", rejected_by="a")[0][0] == "b"
    assert slo.stats()["router"].by_cause == {"retried": 1} and with_room(slo) == 0
    sticky = make_router("session-sticky")
    assert choose(sticky, [a, b], "r2", rejected_by="a")[1].rejection.reason == \
        "router_no_retry"
    assert with_room(sticky) == 1  # b had room: the client saw a rejection it need not have
    full = make_router("kv_overlap")
    choose(full, [a, FakeReplica("b", stats(20000))], "r3", rejected_by="a")
    assert with_room(full) == 0


def test_declared_tenants_share_the_cluster_by_weight():
    import json

    from integrations.vllm_v1.config.slo import SLOSpec

    declared = {**SLO, "fairness": {"weights": {"acme": 1, "globex": 1}, "half_life_s": 20}}
    table = ClassTable.parse(json.loads(json.dumps(class_declaration(SLOSpec.parse(declared)))))
    assert table.fairness_weights == {"acme": 1.0, "globex": 1.0}
    assert table.fairness_half_life_s == 20
    router = make_router(slo=declared)
    empty = [FakeReplica("a", stats()), FakeReplica("b", stats())]
    for rid, tenant in (("a1", "acme"), ("a2", "acme"), ("g1", "globex")):
        assert not choose(router, empty, rid, tenant=tenant)[1].rejection
    # acme was sent twice globex's work: with ~0.3 s of prefill queued everywhere, acme is
    # planned on 2/3 of the rate and refused; globex, under its share, is placed.
    loaded = [FakeReplica("a", stats(3000)), FakeReplica("b", stats(3000))]
    assert choose(router, loaded, "a3", tenant="acme")[1].rejection.reason == \
        "router_no_feasible"
    assert not choose(router, loaded, "g2", tenant="globex")[1].rejection
    assert router.stats()["router"].over_share_rejected == 1
    # Ray reports a request done: its charge is settled.
    in_flight = router.stats()["fairness"].in_flight
    router.on_request_completed(ReplicaID("a", DEPLOYMENT), "a1")
    assert router.stats()["fairness"].in_flight == in_flight - 1
    assert make_router().stats()["fairness"] is None
