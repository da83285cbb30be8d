"""A KV cache size on the command line is the one the server gets: the CPU default
(``VLLM_CPU_KVCACHE_SPACE``, which vLLM's CPU platform lets override the flag) is left out of
the child's environment whenever vLLM reads a size from its arguments, in any spelling."""

import pytest

from integrations.vllm_v1.serving.server import KV_SPACE_ENV, offline_env, server_env

MODEL = ("--model", "m")


@pytest.mark.parametrize("flags", [
    ("--kv-cache-memory-bytes", str(64 << 20)),
    ("--kv_cache_memory_bytes", "64M"),
    (f"--kv-cache-memory-bytes={64 << 20}",),
])
def test_an_explicit_kv_size_drops_the_cpu_default(monkeypatch, flags):
    monkeypatch.setenv(KV_SPACE_ENV, "1")  # as `make` and the test suite export it
    assert KV_SPACE_ENV not in offline_env([*MODEL, *flags])
    assert KV_SPACE_ENV not in server_env("/tmp/metrics", [*MODEL, *flags])


def test_an_explicit_kv_size_in_vllms_config_file_drops_the_cpu_default(monkeypatch, tmp_path):
    monkeypatch.setenv(KV_SPACE_ENV, "1")
    config = tmp_path / "serve.yaml"
    config.write_text(f"kv-cache-memory-bytes: {64 << 20}\n")
    assert KV_SPACE_ENV not in offline_env([*MODEL, "--config", str(config)])


def test_without_a_size_the_cpu_default_applies_unless_set(monkeypatch):
    monkeypatch.delenv(KV_SPACE_ENV, raising=False)
    assert offline_env([*MODEL, "--max-model-len", "512"])[KV_SPACE_ENV] == "1"
    assert offline_env()[KV_SPACE_ENV] == "1"
    monkeypatch.setenv(KV_SPACE_ENV, "4")
    assert offline_env([*MODEL])[KV_SPACE_ENV] == "4"
