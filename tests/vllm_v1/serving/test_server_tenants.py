"""Tenants over HTTP on a real CPU engine: WFQ shares by weight, overload answers 503 with
Retry-After while every accepted request completes, and /metrics shows the pipeline.

The server runs one request at a time. While a hold file exists its scheduler starts no
waiting request (the step log's test seam), so every contender queues (or is rejected)
first and the queue alone decides the service order; the engine's step log (not
client-side timing, which the API process can batch) says in which order requests were
first scheduled.
"""

import random
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from integrations.vllm_v1 import Pipeline, serve
from integrations.vllm_v1.instruments.hold import HOLD_HOOK
from integrations.vllm_v1.instruments.step_log import read_step_log, step_log_server_args
from policies import WFQ, AdmissionController
from tests.helpers.http import free_port, get_text, metric, post, server_model

pytestmark = pytest.mark.engine

WEIGHTS = {"gold": 3.0, "bronze": 1.0}
MAX_WAITING = 12


@pytest.fixture(scope="module")
def server(random_model_dir, tmp_path_factory):
    pipeline = Pipeline(fairness=WFQ(weights=WEIGHTS),
                        admission=AdmissionController(rng=random.Random(0),
                                                      max_waiting=MAX_WAITING))
    folder = tmp_path_factory.mktemp("server")
    logged = step_log_server_args(pipeline, folder / "steps.jsonl", hooks=(HOLD_HOOK,),
                                  entry={"hold_path": str(folder / "hold")})
    args = ("--dtype", "float32", "--max-model-len", "2048", "--enforce-eager",
            "--block-size", "32", "--kv-cache-memory-bytes", str(64 << 20),
            "--max-num-seqs", "1", *logged)
    with serve(pipeline, random_model_dir, port=free_port(), vllm_args=args,
               log_path=str(folder / "server.log")) as handle:
        handle.wait_until_healthy(timeout_s=400)
        yield SimpleNamespace(url=handle.url, step_log=folder / "steps.jsonl",
                              hold=folder / "hold")


def completion(server, tenant, max_tokens):
    """(status, body, headers) of one non-streaming request of ``tenant``."""
    return post(server, "/v1/completions",
                {"model": server_model(server), "prompt": f"Request of {tenant}",
                 "ignore_eos": True, "max_tokens": max_tokens, "vllm_xargs": {"tenant": tenant}},
                with_headers=True)


def queued_or_rejected(server, rejected_before):
    text = get_text(server, "/metrics")
    waiting = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                  if line.startswith("policies:waiting_requests{"))
    rejected = metric(text, "policies:rejections_total", reason="queue_full")
    return waiting + rejected - rejected_before


def contend(server, tenants, max_tokens):
    """Queue ``tenants``' requests behind the hold, then release them; their replies and
    the tenants in the order the engine first scheduled them."""
    events = len(read_step_log(server.step_log))
    rejected_before = metric(get_text(server, "/metrics"), "policies:rejections_total",
                             reason="queue_full")
    server.hold.touch()
    try:
        with ThreadPoolExecutor(max_workers=len(tenants)) as pool:
            replies = [pool.submit(completion, server, t, max_tokens) for t in tenants]
            deadline = time.monotonic() + 120
            while queued_or_rejected(server, rejected_before) < len(tenants):
                assert time.monotonic() < deadline, "requests never queued"
                time.sleep(0.05)
            server.hold.unlink()  # the queue drains in the pipeline's order
            replies = [reply.result() for reply in replies]
    finally:
        server.hold.unlink(missing_ok=True)
    log = read_step_log(server.step_log)[events:]
    tenant_of = {e["request_id"]: e["extra_args"]["tenant"] for e in log if e["event"] == "add"}
    added = {e["request_id"]: e["step"] for e in log if e["event"] == "add"}
    first = {}
    for event in log:
        for request_id in event.get("scheduled", ()):
            first.setdefault(request_id, event["step"])
    assert first and max(added.values()) <= min(first.values()), "a request started early"
    order = [tenant_of[r] for r in sorted(first, key=first.get)]
    return replies, order


def test_two_tenants_are_served_within_the_wfq_bound_of_their_weights(server):
    # Bronze asks first; arrival order alone (stock FCFS) would serve all six bronze first.
    replies, order = contend(server, ["bronze"] * 6 + ["gold"] * 6, max_tokens=16)
    assert all(status == 200 for status, *_ in replies)
    assert sorted(order) == ["bronze"] * 6 + ["gold"] * 6
    # Equal requests, so per-request service is the unit: while both tenants wait,
    # served/weight may differ by at most one request's worth per tenant.
    served = {"gold": 0, "bronze": 0}
    for tenant in order:
        if min(order.count(t) - served[t] for t in served) == 0:
            break  # one tenant has nothing left: the other may take it all (work conserving)
        served[tenant] += 1
        lead = served["gold"] / WEIGHTS["gold"] - served["bronze"] / WEIGHTS["bronze"]
        assert abs(lead) <= 1 / WEIGHTS["gold"] + 1 / WEIGHTS["bronze"], order
    assert order[:8].count("gold") >= 5, order


def test_overload_is_503_with_retry_after_and_every_accepted_request_completes(server):
    before = metric(get_text(server, "/metrics"), "policies:rejections_total",
                    reason="queue_full")
    replies, order = contend(server, ["gold"] * 10 + ["bronze"] * 10, max_tokens=4)
    accepted = [body for status, body, _ in replies if status == 200]
    rejected = [(body, headers) for status, body, headers in replies if status == 503]
    assert len(accepted) == MAX_WAITING and len(rejected) == len(replies) - MAX_WAITING
    assert len(order) == MAX_WAITING  # only accepted requests were ever scheduled
    for body in accepted:
        assert body["choices"][0]["finish_reason"] == "length"
        assert body["usage"]["completion_tokens"] == 4
    for body, headers in rejected:
        assert int(headers["Retry-After"]) >= 1
        assert "queue_full" in body["error"]["message"]
    text = get_text(server, "/metrics")
    assert metric(text, "policies:rejections_total", reason="queue_full") - before == len(
        rejected)
    assert "vllm:num_requests_running" in text  # vLLM's own metrics are still there
    # The engine is idle now: its last step set every queue gauge back to zero.
    assert not [line for line in text.splitlines() if line.startswith(
        ("policies:waiting_requests{", "policies:running_requests{"))
        and float(line.rsplit(" ", 1)[1]) != 0]
