"""One tenant resolver on every route of vLLM's real app that reaches the engine: a route is
either checked (the key's tenant written where the engine reads it, or the request refused)
or named here as one that never reaches the scheduler."""

import hashlib
import warnings

import pytest

from integrations.vllm_v1.config.spec import served_slo
from integrations.vllm_v1.serving.http_validation import check_request
from integrations.vllm_v1.serving.routes import RouteTable
from integrations.vllm_v1.serving.tenants import TenantBinding

BRONZE_KEY = "bronze-key-7"
NOT_ENGINE = {"/tokenize", "/detokenize", "/v1/messages/count_tokens",
              "/v1/chat/completions/derender", "/v1/completions/derender"}
"""POST routes of vLLM 0.32 that never start a request in the engine (they render or count)."""
CLAIMS = {"vllm_xargs": {"tenant": "gold"}, "sampling_params": {"extra_args": {"tenant": "gold"}},
          "user": "gold", "metadata": {"tenant": "gold", "user_id": "gold"}}
"""Every field a route has for request metadata, each claiming Gold."""


@pytest.fixture(scope="module")
def vllm_app():
    """vLLM 0.32's real OpenAI app with the scale-out routes (routes only: no engine)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from vllm.entrypoints.launchers.app import build_app
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        args = make_arg_parser(FlexibleArgumentParser()).parse_args(
            ["--model", "x", "--enable-scale-out"])
        return build_app(args, ("generate",))


@pytest.fixture(scope="module")
def binding():
    digest = hashlib.sha256(BRONZE_KEY.encode()).hexdigest()
    return TenantBinding.from_entry({"tenants": {
        "gold": {"api_key_sha256": "0" * 64, "min_priority": -20},
        "bronze": {"api_key_sha256": digest, "min_priority": 0}}})


def post_paths(app):
    return [r.path for r in app.routes if "POST" in (getattr(r, "methods", None) or ())]


def at(payload, path):
    for key in path:
        payload = (payload or {}).get(key)
    return payload


def test_every_post_route_is_checked_or_named_as_not_reaching_the_engine(vllm_app):
    table = RouteTable.from_app(vllm_app)
    paths = post_paths(vllm_app)
    assert "/inference/v1/generate" in paths and set(paths) >= NOT_ENGINE
    unchecked = [p for p in paths if p not in NOT_ENGINE
                 and table.match({"type": "http", "method": "POST", "path": p}) is None]
    assert not unchecked


@pytest.mark.parametrize("key", [BRONZE_KEY, None])
def test_no_route_serves_a_claimed_tenant(vllm_app, binding, key):
    """With a Bronze key (or none), a body claiming Gold anywhere is refused; one claiming
    nothing goes on as the credential's tenant where the route carries one, else is refused."""
    headers = [(b"authorization", f"Bearer {key}".encode())] if key else []
    tenant = "bronze" if key else "default"
    table = RouteTable.from_app(vllm_app)
    for path in post_paths(vllm_app):
        route = table.match({"type": "http", "method": "POST", "path": path})
        if route is None or not route.typed:
            continue
        body = {"prompt": "Hi", "messages": [], "input": "Hi"}
        for field, claim in CLAIMS.items():
            checked = check_request({**body, field: claim}, headers, route, binding=binding)
            if checked.status:
                assert checked.status == 403, (path, field, checked)
            elif route.reads_xargs and field in route.xargs_path:
                raise AssertionError(f"{path}: the claim in {field} went on: {checked}")
            elif checked.payload is not None:
                assert at(checked.payload, route.xargs_path)["tenant"] == tenant, (path, field)
        checked = check_request(body, headers, route, binding=binding)
        if route.reads_xargs:
            assert at(checked.payload, route.xargs_path) == {"tenant": tenant}, path
        elif key:  # the route cannot carry Bronze to the scheduler
            assert checked.status == 403 and "cannot carry a tenant" in checked.message, path


def test_generate_carries_the_tenant_in_its_sampling_params(vllm_app, binding):
    route = RouteTable.from_app(vllm_app).match(
        {"type": "http", "method": "POST", "path": "/inference/v1/generate"})
    body = {"token_ids": [1, 2], "sampling_params": {"max_tokens": 2,
                                                     "extra_args": {"tenant": "gold"}}}
    assert check_request(body, [], route, binding=binding).status == 403
    bronze = [(b"authorization", f"Bearer {BRONZE_KEY}".encode())]
    assert check_request(body, bronze, route, binding=binding).status == 403
    body["sampling_params"]["extra_args"] = {"slo_class": "x"}
    checked = check_request(body, bronze, route, binding=binding, ticket="t1")
    assert checked.payload["sampling_params"] == {
        "max_tokens": 2, "extra_args": {"slo_class": "x", "tenant": "bronze",
                                        "llm_serving_policies_ticket": "t1"}}
    assert body["sampling_params"]["extra_args"] == {"slo_class": "x"}  # the original kept


def test_every_route_that_carries_a_class_checks_it_against_the_slo_preset(vllm_app):
    """With the ``slo`` preset, a class is checked wherever a route carries one to the
    scheduler: undeclared 400, beyond the tenant's allowed classes 403, else it goes on."""
    entry = {"pipeline": "slo",
             "slo": {"classes": {"chat": {"ttft_s": 0.5, "tpot_s": 0.05},
                                 "batch": {"ttft_s": 20.0, "tpot_s": 0.2}},
                     "tenants": {"bronze": "batch"}, "protected": ["chat"]},
             "tenants": {"bronze": {"api_key_sha256": hashlib.sha256(
                 BRONZE_KEY.encode()).hexdigest()}}}
    slo = served_slo(entry)
    binding = TenantBinding.from_entry(entry, slo=slo)
    table = RouteTable.from_app(vllm_app)
    carrying = []
    for path in post_paths(vllm_app):
        route = table.match({"type": "http", "method": "POST", "path": path})
        if route is None or not route.reads_xargs:
            continue
        carrying.append(path)
        for key, slo_class, status in [(None, "chta", 400), (None, "chat", 403),
                                       (BRONZE_KEY, "chat", 403), (None, "batch", 0),
                                       (BRONZE_KEY, "batch", 0)]:
            body = {"prompt": "Hi", "messages": [], "input": "Hi", "token_ids": [1]}
            holder = body
            for field in route.xargs_path[:-1]:
                holder = holder.setdefault(field, {})
            holder[route.xargs_path[-1]] = {"slo_class": slo_class}
            headers = [(b"authorization", f"Bearer {key}".encode())] if key else []
            checked = check_request(body, headers, route, binding=binding, slo=slo)
            assert checked.status == status, (path, key, slo_class, checked)
            if status == 0:
                assert at(checked.payload, route.xargs_path)["slo_class"] == slo_class
    assert {"/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages",
            "/inference/v1/generate"} <= set(carrying)
