"""Serving: vLLM's OpenAI server with a pipeline, HTTP validation and status mapping, the CLI."""
