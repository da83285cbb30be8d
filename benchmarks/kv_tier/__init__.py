"""Tiered KV storage on a live CPU engine: stock vLLM vs `KVTierConnector` (see ``__main__``)."""
