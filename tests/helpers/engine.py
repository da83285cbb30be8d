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

PREEMPT_AT_ONCE_SLO = {"classes": {"any": {"ttft_s": 3600.0, "tpot_s": 60.0}},
                       "by_prompt_tokens": [[None, "any"]], "preemption": {"risk_share": 0.0}}
"""An ``slo`` preset declaration that admits everything and, with every slot taken, preempts
for any more urgent (lower ``priority``) waiting request at once."""
