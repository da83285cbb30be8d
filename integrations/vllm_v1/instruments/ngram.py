"""vLLM's own n-gram draft kernel, for the speculative-decoding replay's ``ngram`` peer."""

from __future__ import annotations

from typing import Any


def vllm_ngram_kernel() -> Any:
    """``(context, min_n, max_n, max_model_len, k) -> drafts``: the function vLLM's
    ``ngram`` proposer runs per request (numba-compiled on first use)."""
    from integrations.vllm_v1.vllm_surface.names import ngram_propose

    return ngram_propose()
