"""The SLO signals on a live server running an SLO pipeline built in Python (`slo_pipeline`,
served by `serve`; the door reads the declaration the pipeline carries): responses name the
class they were judged in (and the one a demoted request asked for), streams' first tokens reach
admission, and a burst the frontend cannot pass in time gets fast 503s (frontend_busy)."""

import http.client
import json
import re
import statistics
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from integrations.vllm_v1 import serve
from integrations.vllm_v1.config.slo import SLOSpec, slo_pipeline
from tests.helpers.http import free_port, metric
from tests.helpers.serving_client import get_text, model_name, send

pytestmark = pytest.mark.engine

SLO = {"classes": {"batch": {"ttft_s": 120.0, "tpot_s": 60.0},  # loose: a CPU engine meets it
                   "tight": {"ttft_s": 60.0, "tpot_s": 1e-6},  # no step is that short
                   "snappy": {"ttft_s": 1e-4, "tpot_s": 60.0}},  # no frontend is that fast
       "demotions": {"tight": "batch"}}
BURST = 200


@pytest.fixture(scope="module")
def server(random_model_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("slo_signals")
    args = ("--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
            "--block-size", "32", "--kv-cache-memory-bytes", str(64 << 20))
    with serve(slo_pipeline(SLOSpec.parse(SLO)), random_model_dir, port=free_port(),
               vllm_args=args,
               log_path=str(folder / "server.log")) as handle:
        handle.wait_until_healthy(timeout_s=400)
        yield SimpleNamespace(url=handle.url, model=model_name(handle.url), log=handle.log_tail)


def complete(server, slo_class, stream=False, max_tokens=3):
    body = {"model": server.model, "prompt": "Hello", "max_tokens": max_tokens,
            "stream": stream, "vllm_xargs": {"slo_class": slo_class}}
    started = time.monotonic()
    reply = send(server.url, "/v1/completions", body)
    return reply, time.monotonic() - started


def while_streaming(server, body, then):
    """``then()``, called once ``body``'s stream has sent its first token (it runs on)."""
    parts = urllib.parse.urlsplit(server.url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=300)
    try:
        connection.request("POST", "/v1/completions", json.dumps(body),
                           {"content-type": "application/json"})
        response = connection.getresponse()
        first = response.readline().decode()
        result = then()
        response.read()
    finally:
        connection.close()
    return first, result


def served(reply):
    return reply.status == 200 and "choices" in reply.text


def is_busy(reply):
    return reply.status == 503 and "frontend_busy" in (reply.message or "")


def test_responses_name_the_class_judged_and_demoted_streams_report_first_tokens(server):
    for stream in (False, True):
        reply, _ = complete(server, "batch", stream)
        assert served(reply), reply.text
        assert reply.headers.get("x-slo-class") == "batch", reply.headers
        assert "x-slo-demoted-from" not in reply.headers
    long = {"model": server.model, "prompt": "Hello", "max_tokens": 400, "ignore_eos": True,
            "stream": True, "vllm_xargs": {"slo_class": "batch"}}
    first, (reply, _) = while_streaming(server, long, lambda: complete(server, "tight", True))
    assert first.startswith("data:") and served(reply), (first, reply.text, server.log())
    assert (reply.headers.get("x-slo-class"), reply.headers.get("x-slo-demoted-from")) == (
        "batch", "tight"), reply.headers
    reports = 0.0
    for _ in range(60):  # bounded: the engine reads reports as it steps, and exports each second
        reports = metric(get_text(server.url, "/metrics"),
                         "policies:slo_path_client_reports_total")
        if reports >= 3:
            break
        complete(server, "batch", max_tokens=1)
    assert reports >= 3, server.log()  # the three streams' first tokens reached admission
    text = get_text(server.url, "/metrics")
    assert metric(text, "policies:slo_path_seconds", term="egress") > 0
    assert metric(text, "policies:slo_channel_lost_total", what="dropped") == 0


def test_a_burst_the_frontend_cannot_pass_in_time_gets_fast_503s(server):
    with ThreadPoolExecutor(4) as pool:  # the frontend learns its rate
        assert all(served(r) for r, _ in pool.map(lambda _: complete(server, "batch", False, 1),
                                                   range(16)))
    before = metric(get_text(server.url, "/metrics"), "policies:frontend_gate_rejections_total",
                    slo_class="snappy")
    with ThreadPoolExecutor(BURST) as pool:
        replies = list(pool.map(lambda _: complete(server, "snappy", False, 1), range(BURST)))
    busy, avoided = [], []
    for reply, seconds in replies:
        if is_busy(reply):
            assert int(reply.headers["retry-after"]) >= 1
            assert reply.headers["x-slo-class"] == "snappy"
            busy.append(seconds)
            avoided.append(float(re.search(r"predicted wait before the engine ([0-9.]+) s",
                                           reply.message)[1]))
        else:
            assert reply.status in (200, 503), reply.text
    done = [s for r, s in replies if served(r)]
    assert busy, [r.text for r, _ in replies[:5]]
    print(f"burst of {BURST}: {len(busy)} frontend_busy 503 in {statistics.median(busy):.3f} s "
          f"(median; max {max(busy):.3f} s) instead of a predicted wait of "
          f"{statistics.median(avoided):.3f} s (median) before the engine; {len(done)} served "
          f"(median {statistics.median(done or [0]):.3f} s), "
          f"{BURST - len(busy) - len(done)} refused by the engine")
    assert statistics.median(busy) < 1.0  # answered before the client may retry (1 s at least)
    after = metric(get_text(server.url, "/metrics"), "policies:frontend_gate_rejections_total",
                   slo_class="snappy")
    assert after - before == len(busy)
