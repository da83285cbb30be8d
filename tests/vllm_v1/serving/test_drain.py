"""Graceful drain on a live server, one SIGTERM: new requests and /health get 503; short streams
in flight finish with their normal finish reason; streams longer than the grace period end
with ``finish_reason: "abort"`` and ``data: [DONE]`` once it is over, a non-streaming request
still running gets 503 naming the shutdown, and the server exits a few seconds after the grace
period, whatever its clients do. The requests are held in the queue (`HoldHook`) until after
SIGTERM and every step is paced, so they are in flight and the long ones outlast the grace
period whatever the machine's speed."""

import http.client
import json
import signal
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from integrations.vllm_v1 import Pipeline, serve
from integrations.vllm_v1.config.spec import CONFIG_KEY
from integrations.vllm_v1.serving.drain import DRAIN_KEY
from tests.helpers.http import free_port
from tests.helpers.serving_client import model_name, send

pytestmark = pytest.mark.engine
GRACE_S = 6
SHORT_TOKENS = 10
"""A short stream: done well within the grace period even on a loaded machine."""
LONG_TOKENS = 1900
"""A long stream: hundreds of engine steps more than the grace period allows."""
STEP_S = 0.01
"""Each engine step waits this long (`HoldHook`), so a long stream takes at least 19 s
(three times the grace period) on a machine of any speed."""
STALL_S = 60
"""A response silent this long has stalled (the client gives up: the test fails)."""
EXIT_MARGIN_S = 15
"""The engine's own shutdown after the grace period, on a loaded machine."""


def open_request(port, model, max_tokens, *, stream=True):
    """A completions request, sent (its answer not read yet)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=STALL_S)
    body = {"model": model, "prompt": "Once upon a time", "max_tokens": max_tokens,
            "stream": stream, "ignore_eos": True}
    connection.request("POST", "/v1/completions", json.dumps(body),
                       {"content-type": "application/json"})
    return connection


def metric(url, name):
    """A gauge of vLLM's /metrics (0 if absent)."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def poll(check, timeout_s, what):
    """Wait (bounded) until ``check()`` is true."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"waited {timeout_s} s for {what}"
        time.sleep(0.1)


def read(connection):
    """Status, ``data:`` lines (in order) and body of a response read to its end."""
    response = connection.getresponse()
    body = response.read().decode()
    data = [line[5:].strip() for line in body.splitlines() if line.startswith("data:")]
    return response.status, data, body


def finish_reasons(data):
    return [c.get("finish_reason") for line in data if line != "[DONE]"
            for c in json.loads(line)["choices"] if c.get("finish_reason")]


def test_sigterm_drains_for_the_grace_period_then_ends_what_is_left_and_exits(
        random_model_dir, tmp_path):
    port = free_port()
    hold = tmp_path / "hold"
    hold.touch()
    args = ("--dtype", "float32", "--max-model-len", "2048", "--enforce-eager",
            "--block-size", "32", "--kv-cache-memory-bytes", str(64 << 20),
            "--additional-config", json.dumps({CONFIG_KEY: {"hold_path": str(hold),
                                                            "hold_step_s": STEP_S,
                                                            DRAIN_KEY: GRACE_S}}))
    with serve(Pipeline(), random_model_dir, port=port, vllm_args=args,
               log_path=str(tmp_path / "server.log")) as handle:
        handle.wait_until_healthy(timeout_s=400)
        model = model_name(handle.url)
        short = [open_request(port, model, SHORT_TOKENS) for _ in range(2)]
        long = [open_request(port, model, LONG_TOKENS) for _ in range(2)]
        whole = open_request(port, model, LONG_TOKENS, stream=False)
        poll(lambda: metric(handle.url, "vllm:num_requests_waiting") >= 5, 120,
             "the five requests to wait in the engine")
        handle.process.send_signal(signal.SIGTERM)  # the API server, as Kubernetes does
        sigterm = time.monotonic()
        reply = send(handle.url, "/v1/completions", {"model": model, "prompt": "Hi",
                                                     "max_tokens": 2})
        assert reply.status == 503 and reply.headers["retry-after"] == "1", reply.text
        assert "shutting down" in reply.message
        assert send(handle.url, "/health", b"", method="GET").status == 503
        hold.unlink()  # the held requests start now, after SIGTERM
        with ThreadPoolExecutor(5) as pool:
            replies = list(pool.map(read, short + long + [whole]))
        for status, data, _ in replies[:2]:
            assert status == 200 and finish_reasons(data) == ["length"] and data[-1] == "[DONE]"
        for status, data, body in replies[2:4]:  # started, then aborted: a final event
            assert status == 200 and data[-1] == "[DONE]", body[-500:]
            assert finish_reasons(data) == ["abort"], body[-500:]
            assert len(data) > 2  # tokens came before the end
        status, _, body = replies[4]
        assert status == 503 and "shut down before the request finished" in body, body
        assert handle.process.wait(timeout=GRACE_S + STALL_S) == 0
        exited_s = time.monotonic() - sigterm
        assert GRACE_S <= exited_s <= GRACE_S + EXIT_MARGIN_S, exited_s
        log = handle.log_path.read_text()
        assert "drain grace period over: ending 3 request(s) in flight" in log
