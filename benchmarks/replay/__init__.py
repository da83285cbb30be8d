"""Trace replay through the real vLLM scheduler in virtual time.

`trace` holds the canonical request-trace model and its JSONL format,
`datasets` the adapters for real traces shipped in ``benchmarks/data``, and
`cost_model` the step-cost model that turns a scheduled batch into seconds.
"""
