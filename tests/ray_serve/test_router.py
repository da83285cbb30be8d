"""`PDRequestRouter`'s routing decision, built outside Serve over a fake replica set.

The fakes stand in for Ray's `RunningReplica` (an id, routing stats, a queue-length RPC);
the router is the real class with Ray's real queue-length cache, no cluster.
"""

from __future__ import annotations

import asyncio

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

from integrations.ray_serve.engine import EngineRequest  # noqa: E402
from integrations.ray_serve.prefix import RoutingHint  # noqa: E402
from integrations.ray_serve.router import PDRequestRouter  # noqa: E402

DEPLOYMENT = DeploymentID(name="engine", app_name="app")
FAMILY = tuple(range(100, 110))  # ten 32-token blocks of one prompt family


@attrs.define(eq=False)
class FakeReplica:
    """What the router reads of a replica: its id, routing stats and live queue length."""

    name: str
    queue_len: int = 0
    stats: dict = attrs.field(factory=dict)
    max_ongoing_requests: int = 64
    probes: int = 0

    @property
    def replica_id(self) -> ReplicaID:
        return ReplicaID(self.name, DEPLOYMENT)

    @property
    def routing_stats(self) -> dict:
        return self.stats

    async def get_queue_len(self, *, deadline_s: float) -> int:
        self.probes += 1
        return self.queue_len


def make_router(**kwargs) -> PDRequestRouter:
    router = PDRequestRouter(deployment_id=DEPLOYMENT,
                             handle_source=DeploymentHandleSource.UNKNOWN,
                             use_replica_queue_len_cache=True)
    router.initialize_state(deployment="engine", **kwargs)
    return router


def request(request_id: str, keys=FAMILY, session_id: str | None = None) -> PendingRequest:
    hint = RoutingHint(prompt_tokens=32 * len(keys) + 5, block_keys=keys, session_id=session_id)
    return PendingRequest(args=[EngineRequest(path="/v1/completions", hint=hint)], kwargs={},
                          metadata=RequestMetadata(request_id=request_id,
                                                   internal_request_id=request_id))


def choose(router: PDRequestRouter, replicas, request_id: str, **hint) -> list[str]:
    """The replicas' names in the order the router ranks them for one request."""
    async def ranked():
        return await router.choose_replicas(replicas, request(request_id, **hint))

    return [replica.name for rank in asyncio.run(ranked()) for replica in rank]


def finish(router: PDRequestRouter, name: str, request_id: str) -> None:
    """Ray's end of a request's life (it completed, or was dropped before dispatch)."""
    router.on_request_completed(ReplicaID(name, DEPLOYMENT), request_id)


def test_affinity_holds_while_the_live_queues_are_even_and_yields_to_a_long_one():
    a, b = FakeReplica("a"), FakeReplica("b")
    router = make_router(load_slack_tokens=512)
    home = choose(router, [a, b], "r1")[0]
    assert (a, b)[home == "b"].probes == 1  # no fresh cache entry: probed, as pow2 does
    assert choose(router, [a, b], "r2")[0] == home  # r1 not sent yet: counted
    assert router.stats()["router"].decode_reasons == {"affinity": 1, "least_loaded": 1}
    # Ray's cache now says the home replica runs 6 requests (its stats say nothing):
    # 6 x 256 > 1.1 x 768 + 512, so the family spills over to the idle replica.
    replicas = {"a": a, "b": b}
    router.replica_queue_len_cache.update(replicas[home].replica_id, 6)
    router.replica_queue_len_cache.update(replicas[{"a": "b", "b": "a"}[home]].replica_id, 0)
    finish(router, home, "r1")
    finish(router, home, "r2")
    spilled = choose(router, [a, b], "r3")
    assert spilled[0] != home and spilled[1] == home
    assert router.stats()["router"].decode_reasons["spillover"] == 1


def test_a_replica_that_does_not_answer_the_probe_counts_by_its_stats():
    class Silent(FakeReplica):
        async def get_queue_len(self, *, deadline_s: float) -> int:
            await asyncio.sleep(10 * deadline_s)
            return 0

    slow = Silent("slow", stats={"running_requests": 9, "time_s": 0.0})
    fast = FakeReplica("fast", queue_len=3)
    # counted as 0 requests, the silent replica would win (0 < 3 x 256); by its stats
    # it runs 9, so the replica with the live queue of 3 does
    assert choose(make_router(), [slow, fast], "r") == ["fast", "slow"]


def test_a_session_goes_home_past_the_plain_bound_within_the_session_slack():
    a, b = FakeReplica("a"), FakeReplica("b")
    router = make_router(load_slack_tokens=0, session_slack_tokens=2048)
    context = tuple(range(200, 264))  # 64 blocks: 2,048 tokens held, the slack's cap
    home = choose(router, [a, b], "t1", keys=context, session_id="agent-7")[0]
    replicas = {"a": a, "b": b}
    other = {"a": "b", "b": "a"}[home]
    finish(router, home, "t1")
    router.replica_queue_len_cache.update(replicas[home].replica_id, 6)  # 845 < 1536 < 845 + 2048
    router.replica_queue_len_cache.update(replicas[other].replica_id, 0)
    assert choose(router, [a, b], "t2", keys=context + (1,), session_id="agent-7")[0] == home
    finish(router, home, "t2")
    assert choose(router, [a, b], "x", keys=(3,))[0] == other  # no session
    finish(router, other, "x")
    router.replica_queue_len_cache.update(replicas[home].replica_id, 20)  # past the slack
    assert choose(router, [a, b], "t3", keys=context + (2,), session_id="agent-7")[0] == other
    assert router.stats()["router"].decode_reasons["session"] == 1
