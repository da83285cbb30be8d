"""The CLI's flags: ``--model`` is required, so a production command never serves a test model;
a preset travels by name, so its declaration in ``--additional-config`` applies."""

import json

import pytest

from integrations.vllm_v1.config.spec import CONFIG_KEY, resolve_pipeline
from integrations.vllm_v1.serving.cli import main, server_command


def test_without_model_it_exits_with_usage_naming_the_flag(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--pipeline", "qos", "--port", "8000"])
    assert exited.value.code == 2
    assert "the following arguments are required: --model" in capsys.readouterr().err


def entry_of(command):
    return json.loads(command[command.index("--additional-config") + 1])[CONFIG_KEY]


def test_a_preset_is_named_so_its_declaration_applies():
    slo = {"classes": {"chat": {"ttft_s": 1.0, "tpot_s": 0.1}}}
    command = server_command(["--pipeline", "slo", "--model", "m", "--",
                              "--additional-config", json.dumps({CONFIG_KEY: {"slo": slo}})])
    entry = entry_of(command)
    assert entry["pipeline"] == "slo" and entry["slo"] == slo
    assert resolve_pipeline(entry["pipeline"], slo=entry["slo"]).admission is not None


def test_a_pipeline_from_a_file_travels_pickled(tmp_path):
    (tmp_path / "site_pipe.py").write_text(
        "from integrations.vllm_v1 import Pipeline\nPIPE = Pipeline()\n")
    command = server_command(["--pipeline", f"{tmp_path / 'site_pipe.py'}:PIPE", "--model", "m"])
    assert entry_of(command)["pipeline"].startswith("pickle:")
