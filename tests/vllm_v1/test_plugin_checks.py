"""A bad --additional-config under plain vLLM flags fails in the API server's first seconds,
naming the problem (the plugin checks it before the engine starts)."""

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from integrations.vllm_v1.config.declarative import PipelineConfigError
from integrations.vllm_v1.config.slo import SLOSpec, slo_pipeline
from integrations.vllm_v1.config.spec import to_additional_config
from integrations.vllm_v1.plugin import (
    check_command_line,
    complete_server,
    parse_command_line,
    runs_openai_server,
    slo_warnings,
    with_rejection_channel,
)
from integrations.vllm_v1.scheduling import SCHEDULER_CLS
from integrations.vllm_v1.serving.middleware import PATH as MIDDLEWARE
from integrations.vllm_v1.serving.rejection_channel import CHANNEL_KEY

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


@pytest.mark.parametrize(("spelling", "message"), [
    ("hyphen", "unknown pipeline 'no-such-preset'"),
    ("underscore", "llm_serving_policies.pipeline.admission.max_waiting must be an integer, "
                   "got 'ten'"),
    ("config-file", "llm_serving_policies.pipeline.admission.max_waiting must be an integer, "
                    "got 'ten'"),
])
def test_vllm_serve_exits_at_once_naming_the_problem(tmp_path, spelling, message):
    """The real API server entry point, the entry spelled as vLLM accepts it: its last line
    names the problem (it used to start the engine core first and end on vLLM's generic
    'Engine core initialization failed', or, for spellings the check missed, on a
    resource_tracker warning after the engine failed)."""
    entry = {"pipeline": "no-such-preset"} if spelling == "hyphen" else {
        "pipeline": {"admission": {"class": "QueueDepthLimit", "max_waiting": "ten"}}}
    config = tmp_path / "serve.yaml"
    config.write_text(yaml.safe_dump({"additional-config": {KEY: entry}}))
    flags = {"hyphen": ["--additional-config", json.dumps({KEY: entry})],
             "underscore": ["--additional_config", json.dumps({KEY: entry})],
             "config-file": ["--config", str(config)]}[spelling]
    result = subprocess.run(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tmp_path),
         *flags], capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert message in last, result.stderr[-2000:]


BAD_TYPE = {"pipeline": {"admission": {"class": "QueueDepthLimit", "max_waiting": "ten"}}}
TYPE_ERROR = "llm_serving_policies.pipeline.admission.max_waiting must be an integer, got 'ten'"


def spellings(entry, tmp_path):
    """The command lines vLLM reads the same ``--additional-config`` from."""
    text = json.dumps({KEY: entry})
    config = tmp_path / "serve.yaml"
    config.write_text(yaml.safe_dump({"additional-config": {KEY: entry}}))
    dotted = [f"--additional-config.{KEY}.pipeline.admission.{key}={value}"
              for key, value in entry["pipeline"]["admission"].items()]
    return {
        "serve": ["vllm", "serve", "m", "--additional-config", text],
        "module": ["api_server.py", "--model", "m", "--additional-config", text],
        "underscore": ["api_server.py", "--model", "m", "--additional_config", text],
        "equals": ["api_server.py", "--model", "m", f"--additional-config={text}"],
        "config-file": ["vllm", "serve", "m", "--config", str(config)],
        "dotted": ["api_server.py", "--model", "m", *dotted],
    }


@pytest.mark.parametrize("spelling", ["serve", "module", "underscore", "equals", "config-file",
                                      "dotted"])
def test_every_spelling_vllm_reads_is_checked_and_a_type_error_names_the_field(
        spelling, tmp_path):
    with pytest.raises(PipelineConfigError) as error:
        check_command_line(spellings(BAD_TYPE, tmp_path)[spelling])
    assert str(error.value) == TYPE_ERROR


@pytest.mark.parametrize("flag", [["--scheduling_policy", "priority"],
                                  ["--scheduling-policy=priority"]])
def test_the_scheduling_policy_is_read_in_every_spelling(flag):
    with pytest.raises(PipelineConfigError, match="--scheduling-policy priority cannot"):
        check_command_line(argv({"pipeline": "qos"}, *flag))


def test_every_problem_is_reported_at_once_each_naming_its_field():
    entry = {"pipeline": {"fairnes": "WFQ", "ranking": "QoSRankr",
                          "admission": {"class": "QueueDepthLimit", "max_waiting": "ten"}},
             "hooks": ["no_such_module:Hook"], "drain_grace_s": -1,
             "rejection_channel": "http://x"}
    with pytest.raises(PipelineConfigError) as error:
        check_command_line(argv(entry))
    problems = str(error.value).splitlines()
    assert len(problems) == 6, problems
    for expected in ("llm_serving_policies.pipeline: unknown pipeline slot 'fairnes'",
                     "llm_serving_policies.pipeline.ranking: unknown policy class 'QoSRankr'",
                     TYPE_ERROR, "llm_serving_policies.hooks: cannot import",
                     "llm_serving_policies.drain_grace_s", "llm_serving_policies.rejection_channel"):
        assert any(p.startswith(expected) for p in problems), (expected, problems)


def test_slo_targets_that_look_like_milliseconds_are_warned_about():
    entry = {"pipeline": "slo", "slo": {"classes": {"chat": {"ttft_s": 500, "tpot_s": 0.0005},
                                                    "batch": {"ttft_s": 20, "tpot_s": 0.2}}}}
    assert slo_warnings(entry) == [
        "llm_serving_policies.slo.classes.chat.ttft_s is 500 s, over 60 s: did you mean "
        "milliseconds? (seconds go here: 0.5)",
        "llm_serving_policies.slo.classes.chat.tpot_s is 0.0005 s, under 1 ms: is it in "
        "seconds?"]
    assert slo_warnings({"pipeline": "slo"}) == []  # the default classes are sane


def test_a_pipeline_built_in_python_has_its_slo_targets_checked_too():
    spec = SLOSpec.parse({"classes": {"chat": {"ttft_s": 500, "tpot_s": 0.05}}})
    entry = to_additional_config(slo_pipeline(spec))[KEY]
    assert slo_warnings(entry) == [
        "Pipeline.slo class 'chat' ttft_s is 500 s, over 60 s: did you mean milliseconds? "
        "(seconds go here: 0.5)"]


@pytest.mark.parametrize("spelling", ["serve", "underscore", "config-file", "dotted"])
def test_the_rejection_channel_is_added_where_vllm_reads_it(spelling, tmp_path):
    entry = {"pipeline": {"admission": {"class": "QueueDepthLimit", "max_waiting": 4}}}
    command = spellings(entry, tmp_path)[spelling]
    args = parse_command_line(command)
    completed = with_rejection_channel(command, args.additional_config)
    flags = [arg.partition("=")[0] for arg in completed if arg.startswith("--additional")]
    assert len(flags) == len(set(flags))  # vLLM is never given the same flag twice
    read = parse_command_line(completed).additional_config
    address = read[KEY].pop(CHANNEL_KEY)
    assert address.startswith("ipc://")
    assert read == args.additional_config  # nothing else changed


def test_only_vllms_server_commands_are_checked():
    assert runs_openai_server(["/usr/bin/vllm", "serve", "m"])
    assert not runs_openai_server(["/usr/bin/vllm", "bench", "serve"])
    assert not runs_openai_server(["pytest", "serve"])


@pytest.mark.slow
def test_multiprocess_metrics_are_turned_on_in_a_fresh_server_process(tmp_path):
    """In a process that imported prometheus_client in plain mode (as vLLM's API server has
    when the plugin runs), metrics made afterwards write to the new folder."""
    script = (
        "import os, prometheus_client\n"
        "from integrations.vllm_v1.plugin import multiprocess_metrics\n"
        "os.environ.pop('PROMETHEUS_MULTIPROC_DIR', None)\n"
        "assert multiprocess_metrics() is None\n"
        "folder = os.environ['PROMETHEUS_MULTIPROC_DIR']\n"
        "prometheus_client.Counter('probe', 'probe', registry=None).inc()\n"
        "print(folder, sorted(os.listdir(folder)))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120, env={k: v for k, v in os.environ.items()
                                              if k != "PROMETHEUS_MULTIPROC_DIR"})
    assert result.returncode == 0, result.stderr[-2000:]
    folder, files = result.stdout.split(" ", 1)
    assert "counter_" in files
    assert not Path(folder).exists()  # removed at exit


@pytest.mark.slow
def test_register_in_a_server_completes_it_and_names_what_is_missing_in_one_line(tmp_path):
    """``vllm serve`` with our entry and middleware but not our scheduler: the plugin adds the
    channel to the command line vLLM is about to read, warns about the SLO target, and
    says in one line what it could not turn on and how."""
    entry = {"pipeline": "slo", "slo": {"classes": {"chat": {"ttft_s": 500, "tpot_s": 0.05}}}}
    script = (
        "import json, sys\n"
        "from integrations.vllm_v1.plugin import register, parse_command_line\n"
        f"sys.argv = ['vllm', 'serve', 'm', '--additional-config', {json.dumps({KEY: entry})!r},"
        f" '--middleware', {MIDDLEWARE!r}]\n"
        "register()\n"
        "print(json.dumps(parse_command_line(sys.argv).additional_config))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=300, env={**os.environ,
                                              "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr[-3000:]
    read = json.loads(result.stdout.strip().splitlines()[-1])[KEY]
    assert read["rejection_channel"].startswith("ipc://") and read["pipeline"] == "slo"
    lines = [line for line in result.stderr.splitlines() if "llm_serving_policies: " in line]
    assert len(lines) == 2, result.stderr[-3000:]
    assert "slo.classes.chat.ttft_s is 500 s, over 60 s: did you mean milliseconds?" in lines[0]
    assert "not fully on: the pipeline does not run: add --scheduler-cls" in lines[1]
    assert "middleware" not in lines[1] and "rejection channel" not in lines[1]
    assert "metrics" not in lines[1]


def test_without_our_middleware_no_channel_is_added_and_the_line_says_so(monkeypatch, caplog):
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "/set-by-the-operator")  # left alone
    command = argv({"pipeline": "qos"}, "--scheduler-cls", SCHEDULER_CLS)
    completed = list(command)
    with caplog.at_level(logging.WARNING, logger="vllm.llm_serving_policies"):
        complete_server(completed, parse_command_line(command))
    assert completed == command
    assert [r.getMessage() for r in caplog.records
            if r.name == "vllm.llm_serving_policies"] == [
        "llm_serving_policies: not fully on: rejections are not answered 503 with their "
        f"reason: add --middleware {MIDDLEWARE}"]
