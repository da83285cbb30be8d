"""Graceful drain on a live server: streams in flight at SIGTERM finish with a normal finish
reason while new requests and /health get 503, then the server stops by itself. The streams are
held in the queue (`HoldHook`) until after SIGTERM, so they are in flight whatever the speed."""

import http.client
import json
import signal
import urllib.request

import pytest

from integrations.vllm_v1 import Pipeline, serve
from integrations.vllm_v1.config.spec import CONFIG_KEY
from tests.helpers.http import free_port
from tests.helpers.serving_client import model_name, send

pytestmark = pytest.mark.engine
STREAMS = 3


def open_stream(port, model):
    """A completions stream, sent (its answer not read yet)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    body = {"model": model, "prompt": "Once upon a time", "max_tokens": 20, "stream": True,
            "ignore_eos": True}
    connection.request("POST", "/v1/completions", json.dumps(body),
                       {"content-type": "application/json"})
    return connection


def waiting(url):
    """Requests waiting in the engine, from vLLM's /metrics."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("vllm:num_requests_waiting{"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def finish_reason(connection):
    """The stream's finish reason, read to its end."""
    response = connection.getresponse()
    assert response.status == 200
    reasons = []
    for line in response.read().decode().splitlines():
        if line.startswith("data:") and line[5:].strip() != "[DONE]":
            reasons += [c.get("finish_reason") for c in json.loads(line[5:])["choices"]]
    return [r for r in reasons if r][-1]


def test_streams_in_flight_at_sigterm_finish_and_new_requests_get_503(random_model_dir,
                                                                    tmp_path):
    port = free_port()
    hold = tmp_path / "hold"
    hold.touch()
    args = ("--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
            "--block-size", "32", "--kv-cache-memory-bytes", str(64 << 20),
            "--additional-config", json.dumps({CONFIG_KEY: {"hold_path": str(hold)}}))
    with serve(Pipeline(), random_model_dir, port=port, vllm_args=args,
               log_path=str(tmp_path / "server.log")) as handle:
        handle.wait_until_healthy(timeout_s=400)
        model = model_name(handle.url)
        streams = [open_stream(port, model) for _ in range(STREAMS)]
        while waiting(handle.url) < STREAMS:  # all three reached the engine and wait there
            pass
        handle.process.send_signal(signal.SIGTERM)  # the API server, as Kubernetes does
        reply = send(handle.url, "/v1/completions", {"model": model, "prompt": "Hi",
                                                     "max_tokens": 2})
        assert reply.status == 503 and reply.headers["retry-after"] == "1", reply.text
        assert "shutting down" in reply.message
        assert send(handle.url, "/health", b"", method="GET").status == 503
        hold.unlink()  # the held streams start now, after SIGTERM
        assert [finish_reason(s) for s in streams] == ["length"] * STREAMS
        assert handle.process.wait(timeout=120) == 0
        assert "drained (0 request(s) still in flight)" in handle.log_path.read_text()
