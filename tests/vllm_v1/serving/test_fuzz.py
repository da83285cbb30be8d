"""Fuzzing every route of a live server (schemathesis, from its own /openapi.json) and hand-made
malformed bodies: no 5xx, and every 4xx says what is wrong.

The one 5xx allowed is vLLM's 501 for ``/v1/systemone`` on a model without the structured
decision API: a deliberate "not implemented for this model", with a message."""

import contextlib
import json
from collections import Counter
from types import SimpleNamespace

import pytest

from integrations.vllm_v1 import Pipeline, serve
from policies import QoSRanker
from tests.helpers.http import free_port
from tests.helpers.serving_client import model_name, send

pytestmark = pytest.mark.engine

EXAMPLES = 6
"""Hypothesis examples per operation and generation mode (keeps the run near a minute)."""
ENGINE_ROUTES = ["/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages",
                 "/invocations", "/v1/chat/completions/batch"]


@pytest.fixture(scope="module")
def server(random_model_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz")
    args = ("--dtype", "float32", "--max-model-len", "256", "--enforce-eager",
            "--block-size", "32", "--kv-cache-memory-bytes", str(64 << 20))
    with serve(Pipeline(ranking=QoSRanker()), random_model_dir, port=free_port(),
               vllm_args=args, log_path=str(folder / "server.log")) as handle:
        handle.wait_until_healthy(timeout_s=400)
        yield SimpleNamespace(url=handle.url, model=model_name(handle.url),
                              log=handle.log_tail)


def says_why(status, text):
    """A 4xx (or the allowed 501) whose JSON body carries a non-empty message."""
    try:
        body = json.loads(text)
    except ValueError:
        return False
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else (
        body.get("detail") if isinstance(body, dict) else None)
    return bool(message) and (400 <= status < 500 or status == 501)


def test_schema_fuzz_of_every_route_gives_no_5xx_and_4xx_with_messages(server):
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis.errors import Unsatisfiable

    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    outcomes: Counter = Counter()
    failures = []

    def fuzz(operation, mode):
        @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck), phases=[Phase.generate])
        @given(case=operation.as_strategy(generation_mode=mode))
        def probe(case):
            response = case.call(base_url=server.url, timeout=300)
            status = response.status_code
            outcomes[status // 100] += 1
            allowed_5xx = status == 501 and operation.path == "/v1/systemone"
            if (status >= 500 and not allowed_5xx) or (
                    status >= 400 and not says_why(status, response.text)):
                failures.append((operation.method, operation.path, mode, status,
                                 response.text[:300]))

        return probe

    for operation in operations:
        for mode in (schemathesis.GenerationMode.NEGATIVE, schemathesis.GenerationMode.POSITIVE):
            with contextlib.suppress(Unsatisfiable):  # nothing to generate (a bare GET)
                fuzz(operation, mode)()
    assert len(operations) >= 20
    assert outcomes[4] > 0 and outcomes[2] > 0
    print(f"fuzz: {sum(outcomes.values())} requests, by status class {dict(outcomes)}")
    assert failures == [], failures


MALFORMED = {
    "empty": b"",
    "null": b"null",
    "array": b"[]",
    "number": b"5",
    "truncated": b'{"model": "m", "prompt": ',
    "not utf-8": b'{"prompt": "\xff\xfe"}',
    "nested 100,000 deep": b"[" * 100_000 + b"]" * 100_000,
    "object nested 50,000 deep": b'{"prompt": ' + b'{"a":' * 50_000 + b"1" + b"}" * 50_001,
    "NaN": b'{"prompt": "x", "messages": [], "input": "x", "max_tokens": NaN}',
    "priority 10**30": json.dumps({"prompt": "x", "messages": [], "input": "x",
                                   "priority": 10**30}).encode(),
    "max_tokens 10**12": json.dumps({"prompt": "x", "messages": [{"role": "user",
                                     "content": "x"}], "input": "x",
                                     "max_tokens": 10**12}).encode(),
    "vllm_xargs tenant a list": json.dumps({"prompt": "x", "messages": [], "input": "x",
                                            "vllm_xargs": {"tenant": ["a"]}}).encode(),
    "vllm_xargs nested": json.dumps({"prompt": "x", "messages": [], "input": "x",
                                     "vllm_xargs": {"a": {"b": 1}}}).encode(),
    "duplicate priority keys": b'{"prompt": "x", "messages": [], "input": "x", "priority": 0, '
                               b'"priority": 99}',
    "deadline 1e400": b'{"prompt": "x", "messages": [], "input": "x", '
                      b'"vllm_xargs": {"deadline_ms": 1e400}}',
}


@pytest.mark.parametrize("content_type", ["application/json", "text/plain"])
@pytest.mark.parametrize("path", ENGINE_ROUTES)
def test_malformed_bodies_get_4xx_with_a_message_on_every_engine_route(server, path,
                                                                       content_type):
    wrong = {}
    for name, body in MALFORMED.items():
        body = body.replace(b'"prompt"', f'"model": "{server.model}", "prompt"'.encode(), 1)
        reply = send(server.url, path, body, [("content-type", content_type)])
        if not says_why(reply.status, reply.text) or reply.status >= 500:
            wrong[name] = (reply.status, reply.text[:200])
    assert wrong == {}
    assert send(server.url, "/health", b"", method="GET").status == 200
