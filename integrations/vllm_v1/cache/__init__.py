"""KV cache: prefix-cache eviction order, cache warming, CPU/disk KV tiers and the offload cache policy."""
