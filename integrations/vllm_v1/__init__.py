"""vLLM V1 integration: adapters that run `policies` inside a real vLLM engine."""
