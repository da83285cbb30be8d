"""Benchmarks: trace replay on the real vLLM scheduler, overhead, studies."""
