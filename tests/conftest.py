"""Shared fixtures: offline mode and the embedded tiny model."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

ENGINE_KWARGS = {
    "dtype": "float32",
    "max_model_len": 512,
    "enforce_eager": True,
    "kv_cache_memory_bytes": 64 << 20,
    "block_size": 32,
    "seed": 0,
}
"""A tiny CPU engine: float32 for exact comparisons, 64 MiB of KV cache."""


@pytest.fixture(scope="session")
def random_model_dir():
    """The tiny model with seeded random weights (greedy output depends on the prompt)."""
    from integrations.vllm_v1.instruments.tiny_model import tiny_model_dir

    return str(tiny_model_dir("random"))
