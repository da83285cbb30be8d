"""Prefill/decode disaggregation on Ray Serve: 1 prefill + 1 decode replica, ExampleConnector."""

from __future__ import annotations

import pytest

from integrations.ray_serve.metrics import TargetsDirectory
from tests.ray_serve.client import get, metric, post
from tests.ray_serve.conftest import MAX_TOKENS, PROMPTS

pytestmark = [pytest.mark.engine, pytest.mark.ray]


def test_decode_replicas_load_the_prompt_kv_and_outputs_equal_a_single_engine(
        apps, model_dir, reference):
    app = apps["pd"]
    targets = {t["labels"]["role"]: t["targets"][0]
               for t in TargetsDirectory(app["config"].targets_dir).targets()}
    assert set(targets) == {"prefill", "decode"}
    loaded_before = metric(get(f"http://{targets['decode']}/metrics"),
                           "vllm:prompt_tokens_by_source_total", source="external_kv_transfer")
    for stream in (False, True):
        reply = post(f"{app['url']}/v1/completions", {
            "model": model_dir, "prompt": PROMPTS["long"], "max_tokens": MAX_TOKENS,
            "temperature": 0, "stream": stream, "return_token_ids": True})
        assert reply.status == 200, reply.body
        assert reply.token_ids() == reference["long"], stream
        assert reply.headers["x-prefilled-by"] != reply.headers["x-served-by"]
    loaded = metric(get(f"http://{targets['decode']}/metrics"),
                    "vllm:prompt_tokens_by_source_total",
                    source="external_kv_transfer") - loaded_before
    assert loaded >= 32  # at least one 32-token block came from the prefill replica
    decisions = get(f"{app['url']}/metrics")
    for deployment in ("prefill", "decode"):
        assert metric(decisions, "policies:router_decisions_total", deployment=deployment) >= 2
