"""The CLI's flags: ``--model`` is required, so a production command never serves a test model."""

import pytest

from integrations.vllm_v1.serving.cli import main


def test_without_model_it_exits_with_usage_naming_the_flag(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--pipeline", "qos", "--port", "8000"])
    assert exited.value.code == 2
    assert "the following arguments are required: --model" in capsys.readouterr().err
