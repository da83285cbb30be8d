"""Shared fixtures: offline mode and the embedded tiny model."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")



@pytest.fixture(scope="session")
def random_model_dir():
    """The tiny model with seeded random weights (greedy output depends on the prompt)."""
    from integrations.vllm_v1.instruments.tiny_model import tiny_model_dir

    return str(tiny_model_dir("random"))
