"""The colocated Ray Serve app on a 2-node local cluster: 2 vLLM replicas, our request router.

The replica kill runs last (it leaves one replica while Serve restarts the other).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from benchmarks import ray_serve_dashboard as dashboard
from integrations.ray_serve.metrics import TargetsDirectory
from tests.ray_serve.client import get, metric, post
from tests.ray_serve.conftest import CHATS, MAX_TOKENS, PROMPTS

pytestmark = [pytest.mark.engine, pytest.mark.ray]


def _completion(model, prompt, stream, **extra):
    return {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
            "stream": stream, "return_token_ids": True, **extra}


def _outcomes(url):
    text = get(f"{url}/metrics")
    return {o: metric(text, "policies:ingress_requests_total", outcome=o)
            for o in ("completed", "rejected", "cancelled")}


def test_outputs_are_token_identical_to_a_single_engine(apps, model_dir, reference):
    url = apps["colocated"]["url"]
    for name, prompt in PROMPTS.items():
        for stream in (False, True):
            reply = post(f"{url}/v1/completions", _completion(model_dir, prompt, stream))
            assert reply.status == 200, reply.body
            assert reply.token_ids() == reference[name], (name, stream)
            assert reply.headers["x-served-by"] and reply.headers["x-served-on-node"]
    for name, messages in CHATS.items():
        for stream in (False, True):
            reply = post(f"{url}/v1/chat/completions", {
                "model": model_dir, "messages": messages, "max_tokens": MAX_TOKENS,
                "temperature": 0, "stream": stream, "return_token_ids": True})
            assert reply.status == 200, reply.body
            assert reply.token_ids() == reference[name], (name, stream)


def test_same_prefix_requests_land_on_the_same_replica(apps, model_dir):
    url = apps["colocated"]["url"]
    before = get(f"{url}/metrics")
    landed = {}
    for round_ in range(3):
        for name in ("long", "other"):
            reply = post(f"{url}/v1/completions", _completion(
                model_dir, PROMPTS[name] + f" Variant {round_}.", stream=round_ == 1))
            assert reply.status == 200, reply.body
            landed.setdefault(name, []).append(reply.headers["x-served-by"])
    assert all(len(set(replicas)) == 1 for replicas in landed.values()), landed
    after = get(f"{url}/metrics")
    affinity = (metric(after, "policies:router_decisions_total", reason="affinity")
                - metric(before, "policies:router_decisions_total", reason="affinity"))
    assert affinity >= 4  # rounds 2 and 3 of both families at least


def test_each_replica_serves_vllm_and_pipeline_metrics_and_the_dashboard_reads_only_those(
        apps, model_dir):
    app = apps["colocated"]
    url = app["url"]
    burst = [_completion(model_dir, PROMPTS["long"], False, max_tokens=160,
                         vllm_xargs={"tenant": ("gold", "bronze")[i % 2]}) for i in range(10)]
    with ThreadPoolExecutor(10) as pool:  # more than 4 a replica: some wait in the queue
        assert [r.status for r in pool.map(lambda b: post(f"{url}/v1/completions", b), burst)
                ] == [200] * 10
    probe = post(f"{url}/v1/completions", _completion(
        model_dir, PROMPTS["short"], False, vllm_xargs={"tenant": "gold", "slo_class": "probe"}))
    assert probe.status == 503, probe.body
    targets = TargetsDirectory(app["config"].targets_dir).targets()
    assert len(targets) == 2 and {t["labels"]["role"] for t in targets} == {"engine"}
    scraped = {name for name, _, _ in dashboard.scrape(f"{url}/metrics")}
    for target in targets:
        names = {name for name, _, _ in dashboard.scrape(target["targets"][0])}
        assert {"vllm:prefix_cache_queries_total", "vllm:num_requests_running"} <= names
        scraped |= names
    assert {"policies:waiting_requests", "policies:prefix_cache_prompt_tokens_total"} <= scraped
    used = {n for _, expr, _ in dashboard.queries(dashboard.load_dashboard())
            for n in dashboard.metric_names(expr)}
    assert used and used <= scraped, sorted(used - scraped)
    text = get(f"{url}/metrics")
    assert metric(text, "policies:ingress_rejections_total", reason="early_drop") >= 1


def test_offered_requests_all_end_completed_or_rejected(apps, model_dir):
    url = apps["colocated"]["url"]
    before = _outcomes(url)
    bodies = [_completion(model_dir, PROMPTS["short"], stream=i % 2 == 0) for i in range(4)]
    bodies += [_completion(model_dir, PROMPTS["short"], False,
                           vllm_xargs={"tenant": "bronze", "slo_class": "probe"})] * 2
    bodies += [b"{not json", {"model": model_dir, "prompt": "x", "max_tokens": -3}]
    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(lambda b: post(f"{url}/v1/completions", b), bodies))
    assert [r.status for r in replies] == [200] * 4 + [503] * 2 + [400] * 2
    after = _outcomes(url)
    completed = after["completed"] - before["completed"]
    rejected = after["rejected"] - before["rejected"]
    assert (completed, rejected) == (4, 4)
    assert completed + rejected == len(bodies)


def test_a_killed_replica_fails_over_and_no_request_is_lost(apps, model_dir):
    """Kill the replica serving a prefix family while 6 of its requests run."""
    import ray

    url = apps["colocated"]["url"]
    prompt = PROMPTS["other"] + " Tell me more."
    first = post(f"{url}/v1/completions", _completion(model_dir, prompt, False))
    victim, actor = first.headers["x-served-by"], first.headers["x-served-by-actor"]
    before = _outcomes(url)
    streaming = threading.Event()
    long = dict(max_tokens=360)
    bodies = [_completion(model_dir, prompt, stream=i % 2 == 0, **long) for i in range(6)]
    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(post, f"{url}/v1/completions", body,
                               on_first_event=streaming.set) for body in bodies]
        assert streaming.wait(120), "no stream started"
        ray.kill(ray.get_actor(actor, namespace="serve"), no_restart=True)
        replies = [f.result() for f in futures]
    after = _outcomes(url)  # the transcript first (shown with pytest -rP), then the checks
    print(f"killed replica {victim} (actor {actor}) once the first stream had its first event")
    for body, reply in zip(bodies, replies, strict=True):
        print(f"stream={body['stream']} status={reply.status} "
              f"attempts={reply.headers.get('x-attempts')} "
              f"served_by={reply.headers.get('x-served-by')} "
              f"events={len(reply.events)} stream_error={bool(reply.stream_error)} "
              f"finish={reply.finish_reason() if reply.status == 200 else None} "
              f"error={reply.error}")
    print("ingress outcomes: " + ", ".join(f"{o} +{after[o] - before[o]:.0f}" for o in after))
    for body, reply in zip(bodies, replies, strict=True):
        assert reply.error is None, reply.error  # the connection never just broke
        if body["stream"] and reply.status == 200:
            assert reply.done, "a stream ended without [DONE]"
            failure = reply.stream_error
            assert failure is None or failure["type"] == "replica_failed", failure
            if failure is None:
                assert reply.finish_reason() == "length"
        elif reply.status == 200:
            assert reply.finish_reason() == "length"
        else:
            assert reply.status == 502 and reply.body["error"]["type"] == "replica_failed"
    affected = [r for r in replies if r.status != 200 or r.stream_error
                or r.headers.get("x-attempts", "1") != "1"]
    assert affected, "the kill hit no request: it came too late to test failover"
    done = sum(after[o] - before[o] for o in ("completed", "rejected"))
    assert done == len(bodies) and after["cancelled"] == before["cancelled"]
    for _ in range(3):  # new requests go elsewhere (until Serve has replaced the victim)
        reply = post(f"{url}/v1/completions", _completion(model_dir, prompt, False))
        print(f"new request: status={reply.status} served_by={reply.headers.get('x-served-by')}"
              f" attempts={reply.headers.get('x-attempts')}")
        assert reply.status == 200, reply.body
        assert reply.headers["x-served-by"] != victim
