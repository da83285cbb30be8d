"""CPU and disk KV tiers behind a vLLM KV connector."""
