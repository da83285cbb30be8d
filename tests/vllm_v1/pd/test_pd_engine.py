"""Real CPU engines: 1 prefill + 2 decode vLLM behind the PD router, against one instance.

One module, one set of four tiny engines (about a minute to start on 2 cores), the
PD deployment started with `serve_disaggregated` (PD-aware role presets,
ExampleConnector). The last two tests stop the decode instances, so they run last,
in this order.
"""

import re
import time

import httpx
import pytest

from integrations.vllm_v1 import Pipeline, serve, serve_disaggregated
from integrations.vllm_v1.pd.launch import free_port

pytestmark = pytest.mark.engine

ARGS = ("--dtype", "float32", "--max-model-len", "512", "--enforce-eager", "--block-size", "32",
        "--kv-cache-memory-bytes", str(64 << 20), "--seed", "0")
PROMPTS = ["The quick brown fox " * 30, "Once upon a time there was a model. " * 12,
           "1 2 3 4 5 6 7 8 9 10 " * 15]


@pytest.fixture(scope="module")
def cluster(random_model_dir, tmp_path_factory):
    logs = tmp_path_factory.mktemp("pd-logs")
    single = serve(Pipeline(), random_model_dir, port=free_port(), vllm_args=ARGS,
                              log_path=str(logs / "single.log"))
    try:
        with serve_disaggregated(Pipeline(), random_model_dir, prefill=1, decode=2,
                                            vllm_args=ARGS, timeout_s=400, log_dir=logs,
                                            storage_dir=tmp_path_factory.mktemp("pd-kv"),
                                            ) as deployment:
            single.wait_until_healthy(timeout_s=400)
            yield deployment, single
    finally:
        single.stop()


def complete(base_url: str, model: str, prompt: str, **fields) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": 12, "temperature": 0.0, **fields}
    answer = httpx.post(f"{base_url}/v1/completions", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    return answer.json()


def external_kv_tokens(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    found = re.findall(r'prompt_tokens_by_source_total\{[^}]*source="external_kv_transfer"[^}]*\}'
                       r" ([0-9.e+]+)", text)
    return sum(float(value) for value in found)


def wait_for_metric(url: str, line: str, timeout_s: float = 30.0) -> str:
    """The router's metrics page once it holds ``line``; fails after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while line not in (metrics := httpx.get(f"{url}/metrics", timeout=10).text):
        assert time.monotonic() < deadline, f"{line!r} not in metrics after {timeout_s} s"
        time.sleep(0.2)
    return metrics


def test_greedy_outputs_through_the_router_equal_a_single_instance(cluster, random_model_dir):
    deployment, single = cluster
    for prompt in PROMPTS:
        expected = complete(single.url, random_model_dir, prompt)["choices"][0]["text"]
        got = complete(deployment.url, random_model_dir, prompt)["choices"][0]["text"]
        assert got == expected, prompt
    # The decode instances loaded KV written by the prefill instance, not recomputed it.
    loaded = sum(external_kv_tokens(deployment.servers[n].url) for n in ("decode0", "decode1"))
    assert loaded >= 32 * len(PROMPTS)


def test_streaming_through_the_router_gives_the_same_text(cluster, random_model_dir):
    deployment, single = cluster
    prompt = PROMPTS[1] + " again"
    expected = complete(single.url, random_model_dir, prompt)["choices"][0]["text"]
    body = {"model": random_model_dir, "prompt": prompt, "max_tokens": 12, "temperature": 0.0,
            "stream": True}
    with httpx.stream("POST", f"{deployment.url}/v1/completions", json=body,
                      timeout=120) as answer:
        lines = [line for line in answer.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    text = "".join(httpx.Response(200, content=line[6:]).json()["choices"][0]["text"]
                   for line in lines[:-1])
    assert text == expected


def test_each_role_runs_its_pd_preset(cluster):
    deployment, _ = cluster
    logs = {name: server.log_path.read_text(errors="replace")
            for name, server in deployment.servers.items()}
    assert "StartGateHook" in logs["decode0"] and "StartGateHook" in logs["decode1"]
    assert "StartGateHook" not in logs["prefill0"] and "EvictionHook" in logs["prefill0"]
    assert "max_num_batched_tokens=16384" in logs["prefill0"]


def test_router_metrics_and_bad_input(cluster, random_model_dir):
    deployment, _ = cluster
    answer = httpx.post(f"{deployment.url}/v1/completions", json={"prompt": 42}, timeout=10)
    assert answer.status_code == 400
    metrics = httpx.get(f"{deployment.url}/metrics", timeout=10).text
    assert 'pd_router_requests_total{endpoint="completions",outcome="invalid"} 1.0' in metrics
    assert 'pd_router_instance_up{instance="decode0",pool="decode"} 1.0' in metrics


def test_killing_a_decode_instance_fails_over_to_the_other(cluster, random_model_dir):
    deployment, single = cluster
    deployment.servers["decode1"].stop()
    for prompt in PROMPTS:  # each would have gone to either decode instance before
        expected = complete(single.url, random_model_dir, prompt)["choices"][0]["text"]
        assert complete(deployment.url, random_model_dir, prompt)["choices"][0]["text"] == expected
    # Marked down by a failed request or, when every request went to decode0, by the next
    # health probe (every 2 s), which may come after the requests finished.
    wait_for_metric(deployment.url, 'pd_router_instance_up{instance="decode1",pool="decode"} 0.0')
    assert httpx.get(f"{deployment.url}/health", timeout=10).status_code == 200


def test_with_no_decode_instance_left_requests_get_a_clear_error(cluster, random_model_dir):
    deployment, _ = cluster
    deployment.servers["decode0"].stop()
    body = {"model": random_model_dir, "prompt": PROMPTS[0], "max_tokens": 4}
    answer = httpx.post(f"{deployment.url}/v1/completions", json=body, timeout=120)
    assert answer.status_code in (502, 503)
    assert "decode" in answer.json()["error"]["message"]
    assert httpx.get(f"{deployment.url}/health", timeout=10).status_code == 503
