"""Block-level prefix-cache replay: eviction orders vs Belady's OPT on a hash trace.

``python -m benchmarks.cache_replay --trace mooncake-conv --cache-blocks 2000 --policies lru,slru,opt --out DIR``
"""
