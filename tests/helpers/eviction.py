"""Checks any `EvictionOrder` must pass (pure: no vLLM)."""

import pytest


def assert_misuse_raises_precise_errors(order):
    """Evicting from an empty ``order``, acquiring an unknown key and releasing a key twice
    raise errors that say what went wrong."""
    with pytest.raises(IndexError, match="empty eviction order"):
        order.evict()
    with pytest.raises(KeyError, match="not evictable"):
        order.acquire("a")
    order.release("a")
    with pytest.raises(ValueError, match="'a' is already evictable"):
        order.release("a")
    with pytest.raises(ValueError, match="'a' is already evictable"):
        order.release_uncached("a")
