"""The README's command as written: plain ``python -m vllm.entrypoints.openai.api_server`` with
the scheduler, the middleware and the ``slo`` pipeline in ``--additional-config``, and nothing
else of ours (no rejection channel address, no hooks, no ``PROMETHEUS_MULTIPROC_DIR``, no
``VLLM_CPU_KVCACHE_SPACE``). The plugin turns the rest on: a declared class is served, a burst
is answered 503 with its reason and ``Retry-After`` on every route (Responses and Anthropic
Messages included, whose rejections vLLM alone answers 200 with empty output), and the
learned step model shows on ``/metrics``."""

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from integrations.vllm_v1.config.spec import CONFIG_KEY
from integrations.vllm_v1.metrics import MULTIPROC_ENV
from integrations.vllm_v1.scheduling import SCHEDULER_CLS
from integrations.vllm_v1.serving.middleware import PATH as MIDDLEWARE
from tests.helpers.http import free_port, metric
from tests.helpers.serving_client import get_text, model_name, send

pytestmark = pytest.mark.engine

SLO = {"classes": {"chat": {"ttft_s": 0.02, "tpot_s": 1.0},  # tight: a burst cannot make it
                   "batch": {"ttft_s": 60.0, "tpot_s": 5.0}}}
PROMPT = " ".join(["word"] * 300)
BURST = {
    "/v1/completions": {"prompt": PROMPT, "max_tokens": 32, "stream": True},
    "/v1/responses": {"input": PROMPT, "max_output_tokens": 32},
    "/v1/messages": {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 32},
}
BURST_PER_ROUTE = 10


def readme_argv(model, port):
    entry = {CONFIG_KEY: {"pipeline": "slo", "slo": SLO}}
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
            "--host", "127.0.0.1", "--port", str(port),
            "--scheduler-cls", SCHEDULER_CLS, "--middleware", MIDDLEWARE,
            "--additional-config", json.dumps(entry),
            "--kv-cache-memory-bytes", str(16 << 20),
            # CPU test sizing of the tiny model
            "--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
            "--block-size", "32"]


@pytest.fixture(scope="module")
def server(random_model_dir):
    """The server, started with a bare environment (this machine's offline hub settings
    aside) and stopped by its process group."""
    env = {k: v for k, v in os.environ.items()
           if k not in (MULTIPROC_ENV, "VLLM_CPU_KVCACHE_SPACE", "FORWARDED_ALLOW_IPS")}
    port = free_port()
    log = Path(tempfile.mkstemp(suffix=".log")[1])
    with open(log, "wb") as sink:
        process = subprocess.Popen(readme_argv(random_model_dir, port), stdout=sink,
                                   stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 400
        while True:
            assert process.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() < deadline, log.read_text()[-4000:]
            try:
                if send(url, "/health", b"", method="GET", timeout=5).status == 200:
                    break
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.5)
        yield url, model_name(url), log
    finally:
        os.killpg(process.pid, 15)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait()


def test_the_readme_command_serves_rejects_with_reasons_and_exports_metrics(server):
    url, model, log = server
    reply = send(url, "/v1/completions", {"model": model, "prompt": "Hello", "max_tokens": 4,
                                          "vllm_xargs": {"slo_class": "batch"}})
    assert reply.status == 200, reply.text
    assert reply.json["usage"]["completion_tokens"] == 4

    def one(path):
        body = {"model": model, **BURST[path], "vllm_xargs": {"slo_class": "chat"}}
        return path, send(url, path, body)

    with ThreadPoolExecutor(len(BURST) * BURST_PER_ROUTE) as pool:
        replies = list(pool.map(one, [p for _ in range(BURST_PER_ROUTE) for p in BURST]))
    assert {r.status for _, r in replies} <= {200, 503}, [r.text for _, r in replies]
    for path in BURST:
        rejected = [r for p, r in replies if p == path and r.status == 503]
        assert rejected, (path, [r.text[:200] for p, r in replies if p == path])
        for r in rejected:
            assert re.fullmatch(r"request rejected by the scheduler: \w+: chat(: .+)?; "
                                r"retry after \d+ s", r.message or ""), (path, r.text)
            assert int(r.headers["retry-after"]) >= 1, (path, r.headers)

    deadline = time.monotonic() + 60
    while (observed := metric(get_text(url, "/metrics"), "policies:step_model_observations")
           ) <= 0 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert observed > 0, get_text(url, "/metrics")[-3000:]
    text = get_text(url, "/metrics")
    assert metric(text, "policies:step_model_coefficient", term="base") > 0
    assert "vllm:num_requests_running" in text  # vLLM's own metrics stay
    assert "not fully on" not in log.read_text()
