"""Shared fixtures: offline mode and the embedded tiny model."""

import os

import pytest
from hypothesis import HealthCheck, settings

# Property tests check guarantees, not speed: on a loaded 2-core machine hypothesis' per-example
# deadline and its slow-generation health check fail tests that are correct.
settings.register_profile("repo", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("repo")

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")



ENGINE_TIMEOUT_S = 900
"""Per-test limit of an engine test (starting a CPU engine takes up to minutes under load)."""
RAY_TIMEOUT_S = 1800
"""Per-test limit of a Ray test (its first test also starts the cluster and the apps)."""


def pytest_collection_modifyitems(items):
    """Engine and Ray tests get their longer timeouts unless they name one themselves."""
    for item in items:
        if item.get_closest_marker("timeout") is not None:
            continue
        if item.get_closest_marker("ray") is not None:
            item.add_marker(pytest.mark.timeout(RAY_TIMEOUT_S))
        elif item.get_closest_marker("engine") is not None:
            item.add_marker(pytest.mark.timeout(ENGINE_TIMEOUT_S))


@pytest.fixture(scope="session")
def random_model_dir():
    """The tiny model with seeded random weights (greedy output depends on the prompt)."""
    from integrations.vllm_v1.instruments.tiny_model import tiny_model_dir

    return str(tiny_model_dir("random"))
