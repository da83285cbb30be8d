"""Serving a pipeline with vLLM's own flags only: the Kubernetes / llm-d examples parse, and
the Deployment's container command line, run as written against the tiny CPU model, starts
vLLM's own server with the pipeline deciding (``/metrics``), the middlewares answering,
and KV events published for a prefix-cache scorer."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from integrations.vllm_v1.serving.server import LocalServer, offline_env
from tests.helpers.http import free_port, get_text, metric, post, server_model

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "kubernetes"
CPU_OVERRIDES = ("--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
                 "--block-size", "32", "--kv-cache-memory-bytes", str(64 << 20),
                 "--load-format", "auto")
"""Appended after the manifest's flags (the last value wins): a tiny model on CPU."""


def documents(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


def vllm_container() -> tuple[dict, dict]:
    """The Deployment's vLLM container and the ConfigMap it mounts."""
    docs = {d["kind"]: d for d in documents("vllm-policies.yaml")}
    container = docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    return container, docs["ConfigMap"]


def flag(args: list[str], name: str) -> list[str]:
    return [a.split("=", 1)[1] for a in args if a.startswith(f"{name}=")]


def test_every_manifest_parses_and_is_well_formed():
    for doc in documents("vllm-policies.yaml"):
        assert {"apiVersion", "kind", "metadata"} <= doc.keys(), doc
    container, config_map = vllm_container()
    assert container["command"] == ["vllm", "serve"]
    assert yaml.safe_load(config_map["data"]["pipeline.yaml"])["ranking"] == "QoSRanker"
    values = yaml.safe_load((EXAMPLES / "llm-d-values.yaml").read_text())
    decode = values["decode"]["containers"][0]
    for name in ("--scheduler-cls", "--middleware", "--kv-events-config"):
        assert flag(decode["args"], name) and flag(decode["args"], name)[0].startswith(
            flag(container["args"], name)[0][:20]), name
    events = json.loads(flag(decode["args"], "--kv-events-config")[0].replace("$(POD_IP)", "x"))
    assert events["enable_kv_cache_events"] and events["publisher"] == "zmq"


def container_argv(container: dict, config_map: dict, folder: Path, port: int,
                   events: str, model: str) -> list[str]:
    """The container's command line, runnable here: ``vllm serve MODEL`` is vLLM's own
    server module (the CPU wheel's console script is broken), and the pod's paths,
    POD_IP, port and KV-event endpoint become local ones (vLLM binds a wildcard or
    ``ipc://`` endpoint, so the events stay on this machine)."""
    pipeline_file = folder / "pipeline.yaml"
    pipeline_file.write_text(config_map["data"]["pipeline.yaml"])
    _, *flags = container["args"]  # the positional model
    local = []
    for arg in flags:
        arg = arg.replace("/etc/policies/pipeline.yaml", str(pipeline_file))
        arg = arg.replace("$(POD_IP)", "127.0.0.1").replace("tcp://*:5557", events)
        arg = arg.replace("--port=8000", f"--port={port}")
        local.append(arg)
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
            "--host", "127.0.0.1", *local, *CPU_OVERRIDES]


@pytest.fixture(scope="module")
def pod(random_model_dir, tmp_path_factory):
    container, config_map = vllm_container()
    folder = tmp_path_factory.mktemp("pod")
    port, events = free_port(), f"ipc://{folder}/kv-events"
    argv = container_argv(container, config_map, folder, port, events, random_model_dir)
    metrics_dir = tempfile.mkdtemp(prefix="pod-prometheus-")
    env = {**offline_env(), "PROMETHEUS_MULTIPROC_DIR": metrics_dir}
    log = folder / "server.log"
    with open(log, "wb") as sink:
        process = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)
    server = LocalServer(process, f"http://127.0.0.1:{port}", log, metrics_dir)
    with server:
        server.wait_until_healthy(timeout_s=400)
        yield SimpleNamespace(url=server.url, log=log, events=events, argv=argv)



@pytest.mark.engine
def test_the_command_line_is_only_vllm_flags(pod):
    assert pod.argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert not any("integrations.vllm_v1.serving.cli" in a for a in pod.argv)


@pytest.mark.engine
def test_the_pipeline_decides_in_vllms_own_server(pod):
    model = server_model(pod)
    for tenant in ("gold", "bronze"):
        status, body = post(pod, "/v1/completions", {
            "model": model, "prompt": "Hello there", "max_tokens": 3,
            "vllm_xargs": {"tenant": tenant}})
        assert status == 200, body
    text = get_text(pod, "/metrics")
    # tenants exist only in the pipeline's scheduler: these are its decisions and counts
    assert metric(text, "policies:prefix_cache_prompt_tokens_total", tenant="gold") > 0
    assert metric(text, "policies:prefix_cache_prompt_tokens_total", tenant="bronze") > 0
    assert "QoSRanker" in pod.log.read_text(errors="replace")  # the scheduler's start-up line


@pytest.mark.engine
def test_the_middlewares_answer_bad_metadata_with_400(pod):
    status, body = post(pod, "/v1/completions", {"model": server_model(pod), "prompt": "Hi",
                                                 "max_tokens": 2, "priority": 999})
    assert status == 400 and "priority must be between -20 and 20" in body["error"]["message"]


@pytest.mark.engine
def test_kv_events_reach_a_prefix_cache_scorer(pod):
    """What llm-d's prefix-cache scorer subscribes to: vLLM's block events over ZMQ."""
    import zmq

    context = zmq.Context.instance()
    socket = context.socket(zmq.SUB)
    socket.setsockopt(zmq.SUBSCRIBE, b"kv@127.0.0.1@")
    socket.connect(pod.events)
    try:
        prompt = "a fairly long shared system prompt " * 12  # a few full blocks
        frames = []
        for _ in range(5):  # a SUB socket joins asynchronously: send until events arrive
            post(pod, "/v1/completions", {"model": server_model(pod), "prompt": prompt,
                                          "max_tokens": 2})
            if socket.poll(timeout=3000):
                frames = socket.recv_multipart()
                break
        assert frames and frames[0].startswith(b"kv@127.0.0.1@"), frames
    finally:
        socket.close(linger=0)
