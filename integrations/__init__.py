"""Adapters that run `policies` inside vLLM engines."""
