"""Prefix-cache eviction: policy, vLLM free-block queue, cache replay."""
