"""``python -m benchmarks.spec_replay``: model-free drafters replayed on real model outputs."""
