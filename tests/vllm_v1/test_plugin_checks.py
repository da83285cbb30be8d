"""A bad --additional-config under plain vLLM flags fails in the API server's first seconds,
naming the problem (the plugin checks it before the engine starts)."""

import json
import subprocess
import sys

import pytest

from integrations.vllm_v1.config.declarative import PipelineConfigError
from integrations.vllm_v1.plugin import check_command_line

KEY = "llm_serving_policies"


def argv(entry, *more):
    return ["vllm", "serve", "m", "--additional-config", json.dumps({KEY: entry}), *more]


@pytest.mark.parametrize(("entry", "more", "message"), [
    ({"pipeline": "no-such-preset"}, (), "unknown pipeline 'no-such-preset'"),
    ({"pipeline": {"fairnes": "WFQ"}}, (), "unknown pipeline slot 'fairnes'"),
    ({"pipeline": {"fairness": {"class": "WFQ", "weight": 1}}}, (),
     "unexpected keyword argument 'weight'"),
    ({"pipeline": "/nonexistent/pipeline.yaml"}, (), "pipeline file not found"),
    ({"pipeline": "qos", "hooks": ["no_such_module:Hook"]}, (), "cannot import"),
    ({"pipeline": "qos"}, ("--scheduling-policy", "priority"),
     "--scheduling-policy priority cannot be combined"),
    ({"pipeline": "qos", "tenants": {"gold": {"api_key_env": "LSP_UNSET_VAR"}}}, (),
     "LSP_UNSET_VAR is not set"),
    ({"pipeline": "qos", "drain_grace_s": -1}, (), "drain_grace_s must be a number"),
])
def test_each_mistake_is_named(entry, more, message):
    with pytest.raises((PipelineConfigError, ValueError), match=None) as error:
        check_command_line(argv(entry, *more))
    assert message in str(error.value)


def test_a_good_entry_or_none_passes():
    check_command_line(argv({"pipeline": "qos"}, "--scheduling-policy=fcfs"))
    check_command_line(["vllm", "serve", "m"])
    check_command_line(["vllm", "serve", "m", "--additional-config", "{}"])


def test_vllm_serve_exits_at_once_naming_the_problem(tmp_path):
    """The real API server entry point: its last line names the unknown preset (it used to
    start the engine core first and end on vLLM's generic 'Engine core initialization
    failed')."""
    result = subprocess.run(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tmp_path),
         "--additional-config", json.dumps({KEY: {"pipeline": "no-such-preset"}})],
        capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert "unknown pipeline 'no-such-preset'" in last, result.stderr[-2000:]
