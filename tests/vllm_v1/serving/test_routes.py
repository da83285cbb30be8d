"""The engine routes are read from the app's own routes: vLLM's real app, and a new route."""

import warnings

import pytest
from fastapi import FastAPI
from pydantic import BaseModel

from integrations.vllm_v1.serving.routes import RouteTable


@pytest.fixture(scope="module")
def vllm_app():
    """vLLM 0.32's real OpenAI app (routes only: no engine is started)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from vllm.entrypoints.launchers.app import build_app
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", "x"])
        return build_app(args, ("generate",))


def route(table, path, method="POST"):
    return table.match({"type": "http", "method": method, "path": path})


def test_every_generation_route_of_vllm_is_found(vllm_app):
    table = RouteTable.from_app(vllm_app)
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/chat/completions/batch",
                 "/v1/responses", "/v1/messages", "/invocations", "/v1/systemone",
                 "/generative_scoring"):
        assert route(table, path) is not None, path
    for path in ("/tokenize", "/detokenize", "/v1/messages/count_tokens", "/health"):
        assert route(table, path) is None, path
    assert route(table, "/v1/completions", method="GET") is None


def test_each_route_reads_the_fields_its_body_model_declares(vllm_app):
    table = RouteTable.from_app(vllm_app)
    messages, batch = route(table, "/v1/messages"), route(table, "/v1/chat/completions/batch")
    assert (messages.reads_priority, messages.reads_xargs, messages.anthropic_errors) == (
        False, True, True)
    assert (batch.reads_priority, batch.reads_xargs, batch.anthropic_errors) == (
        True, False, False)
    invocations = route(table, "/invocations")  # no body model: judged by its body
    assert not invocations.typed
    assert invocations.accepts({"prompt": "Hi"}) and invocations.accepts({"messages": []})
    assert not invocations.accepts({"new_data_parallel_size": 2}) and not invocations.accepts([])


class FutureRequest(BaseModel):
    prompt: str
    priority: int = 0


class Unrelated(BaseModel):
    text: str


def test_a_route_added_later_with_a_priority_field_is_found_without_a_list():
    app = FastAPI()

    @app.post("/v2/generate")
    async def generate(request: FutureRequest):
        return {}

    @app.post("/v2/tokenize")
    async def tokenize(request: Unrelated):
        return {}

    table = RouteTable.from_app(app)
    assert table.paths == ("/v2/generate",)
    assert route(table, "/v2/generate").reads_priority
    assert not route(table, "/v2/generate").reads_xargs


def test_the_root_path_is_removed_before_matching():
    app = FastAPI()

    @app.post("/v1/completions")
    async def completions(request: FutureRequest):
        return {}

    table = RouteTable.from_app(app)
    scope = {"type": "http", "method": "POST", "path": "/api/v1/completions",
             "root_path": "/api"}
    assert table.match(scope).path == "/v1/completions"
    assert RouteTable.from_app(object()).paths == ()
