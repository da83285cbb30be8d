"""`SLORouter` as the request router of a Ray Serve app on the local 2-node cluster.

Its own app (2 tiny-engine replicas running `tests.ray_serve.policies_for_ray:pipeline`,
whose admission answers class ``probe`` with 503), deployed beside the shared apps without
reserving CPUs, and deleted at the end.
"""

from __future__ import annotations

import os
import sys

import pytest

from tests.ray_serve.client import get, metric, post
from tests.ray_serve.conftest import ENGINE_ARGS, PIPELINE, PROMPTS, REPO

pytestmark = [pytest.mark.engine, pytest.mark.ray]

SLO = {"classes": {"chat": {"ttft_s": 60, "tpot_s": 10}, "probe": {"ttft_s": 60, "tpot_s": 10},
                   "instant": {"ttft_s": 0.001, "tpot_s": 10}}}
"""Targets the router judges by: ``chat`` and ``probe`` fit anywhere, ``instant`` nowhere."""


@pytest.fixture(scope="module")
def slo_app(cluster, model_dir, tmp_path_factory):
    from ray import serve

    from integrations.ray_serve.app import ServeConfig, build_app

    config = ServeConfig(
        model=model_dir, pipeline=PIPELINE, vllm_args=ENGINE_ARGS, replicas=2, router="slo",
        router_kwargs={"slo": SLO}, name="slo-routing", num_cpus_per_replica=0.0,
        runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([str(REPO), *sys.path])}},
        targets_dir=str(tmp_path_factory.mktemp("targets-slo")))
    serve.run(build_app(config), name=config.name, route_prefix="/slo-routing")
    yield f"{cluster.url}/slo-routing"
    serve.delete(config.name)


def _completion(model, slo_class):
    return {"model": model, "prompt": PROMPTS["long"], "max_tokens": 4, "temperature": 0,
            "vllm_xargs": {"tenant": "gold", "slo_class": slo_class}}


def test_slo_router_routes_rejects_and_retries_a_replica_rejection(slo_app, model_dir):
    served = post(f"{slo_app}/v1/completions", _completion(model_dir, "chat"))
    assert served.status == 200, served.body
    assert served.headers["x-served-by"] and served.headers["x-attempts"] == "1"
    page = get(f"{slo_app}/metrics")
    routed = sum(metric(page, "policies:router_decisions_total", deployment="engine",
                        reason=reason) for reason in ("feasible", "cache", "session"))
    assert routed >= 1  # SLORouter decided (the warm-up probes of Serve count too)

    refused = post(f"{slo_app}/v1/completions", _completion(model_dir, "instant"))
    assert refused.status == 503, refused.body
    assert refused.headers["x-rejected-by"] == "router"
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.body["error"]["type"] == "router_no_feasible"

    # Each replica's admission refuses class probe: the first 503 goes once more through the
    # router, which places it on the other replica; its 503 then reaches the client.
    probe = post(f"{slo_app}/v1/completions", _completion(model_dir, "probe"))
    assert probe.status == 503 and probe.headers["x-attempts"] == "2", probe.body
    page = get(f"{slo_app}/metrics")
    assert metric(page, "policies:ingress_rejection_retries_total", deployment="engine",
                  outcome="placed") >= 1
    assert metric(page, "policies:router_decisions_total", deployment="engine",
                  reason="retried") >= 1
    assert metric(page, "policies:router_rejected_with_room_total", deployment="engine") == 0
