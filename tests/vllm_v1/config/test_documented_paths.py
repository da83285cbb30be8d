"""Every dotted path the config modules and the vLLM plugin document imports (a stale one, like
a scheduler path that moved, would send a user's ``--scheduler-cls`` nowhere)."""

import importlib
import re
from pathlib import Path

import pytest

import integrations.vllm_v1.config as config

SOURCES = sorted(Path(config.__file__).parent.glob("*.py")) + [
    Path(config.__file__).parents[1] / "plugin.py"]
PATH = re.compile(r"\b(?:integrations|policies)(?:\.[A-Za-z_]\w*)+(?::[A-Za-z_]\w*)?")
DOCUMENTED = sorted({path for source in SOURCES for path in PATH.findall(source.read_text())})


def resolve(path):
    """The object a dotted path (``pkg.mod.attr`` or ``pkg.mod:attr``) names."""
    if ":" in path:
        module, attr = path.split(":")
        return getattr(importlib.import_module(module), attr)
    try:
        return importlib.import_module(path)
    except ModuleNotFoundError:
        module, _, attr = path.rpartition(".")
        return getattr(resolve(module), attr)


def test_the_scan_finds_the_scheduler_and_middleware_paths():
    assert "integrations.vllm_v1.scheduling.scheduler.PolicyScheduler" in DOCUMENTED
    assert "integrations.vllm_v1.serving.middleware.PolicyMiddleware" in DOCUMENTED
    with pytest.raises(AttributeError):
        resolve("integrations.vllm_v1.scheduling.PolicyScheduler")  # the stale one


@pytest.mark.parametrize("path", DOCUMENTED)
def test_a_documented_path_imports(path):
    resolve(path)
