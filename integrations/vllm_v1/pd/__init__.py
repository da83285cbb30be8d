"""Prefill/decode disaggregation: role pipelines, the development router and its launcher."""
