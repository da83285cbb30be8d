"""Engine arguments shared by the engine tests."""

ENGINE_KWARGS = {
    "dtype": "float32",
    "max_model_len": 512,
    "enforce_eager": True,
    "kv_cache_memory_bytes": 64 << 20,
    "block_size": 32,
    "seed": 0,
}
"""A tiny CPU engine: float32 for exact comparisons, 64 MiB of KV cache."""
