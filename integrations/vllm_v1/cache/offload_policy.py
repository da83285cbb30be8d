"""vLLM's CPU offloading tier evicting in `SegmentedLRU` order (a `CachePolicy` for vLLM).

vLLM's ``OffloadingConnector`` copies KV blocks from the GPU into a CPU tier of
fixed-size chunks and asks a pluggable ``CachePolicy`` which chunks to drop when
the tier is full. `SegmentedLRUCachePolicy` is such a policy: vLLM loads it by
name from this module (``eviction_policy`` + ``cache_policy_module_path`` in
``kv_connector_extra_config``) and constructs it with the tier's capacity.

Translation (vLLM call -> `SegmentedLRU`), as in `integrations.vllm_v1.cache.eviction`:
the order holds exactly the *idle* chunks (ready, ``ref_cnt == 0``).

* ``mark_evictable`` (a store or the last load finished), or ``insert`` of an
  idle chunk -> ``release(key, parent)``.
* ``mark_non_evictable`` (a load pins an idle chunk: a CPU-tier hit) -> ``acquire``.
* ``evict(n, protected)`` -> ``n`` calls to ``evict``; ``remove`` (a failed
  store) and ``clear`` -> ``discard`` / a fresh order.
* ``on_request_finished`` -> one use per chunk the request reused (loaded, or
  offered again while resident), applied tail first as ``acquire`` + ``release``.

Keys are ``OffloadKey``s (a block hash plus KV-group index), so use counts and the
ghost list follow content. A chunk's *parent* is the chunk of the same group
ending one chunk earlier in the same request; it is learned from the token
positions vLLM records in the ``ReqContext`` (``on_store_miss`` before a chunk is
inserted, ``on_request_finished`` for the rest) and passed on the next release.

What `SegmentedLRU`'s public API cannot express, and how the adapter handles it:

* No way to take a key out of eviction without counting a use: ``acquire`` is
  it. So a pin counts its use at once and leaves a *credit*; the request's
  reuse report at ``on_request_finished`` consumes the credit instead of
  counting again. A chunk reused by two requests counts two uses.
* No way to skip a key while evicting: an idle chunk in ``protected`` (the
  manager protects the keys of the offer being stored, so these are resident
  chunks the storing request reused) is held out with ``acquire`` (its use,
  plus a credit) and released again after the victims are taken.
* ``touch`` (not called by vLLM's CPU manager) counts one use per idle chunk.

Unlike vLLM's ``LRUCachePolicy``, a chunk that was only inserted is not made
more recent when its request finishes: order within a segment is release order.
Stores complete head to tail, so a chain stored once and never reused is evicted
head first, its other chunks following as orphans (``LRUCachePolicy`` evicts tails
first). vLLM's CPU build refuses this connector (``CPUOffloadingSpec.get_worker``
needs a CUDA-alike or XPU platform): the policy runs on GPU hosts only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import attrs

from integrations.vllm_v1.vllm_surface.names import (
    CachePolicy,
    ChunkStatus,
    OffloadKey,
    ReqContext,
    get_offload_group_idx,
    order_request_keys,
)
from policies.kv.eviction import SegmentedLRU


@attrs.define(eq=False)
class _RequestChain:
    """The keys one request observed, by ``(group, end token)``; lives in its ``ReqContext``."""

    owner: object
    keys: dict[tuple[int, int], OffloadKey] = attrs.field(factory=dict)


class SegmentedLRUCachePolicy(CachePolicy):
    """vLLM's CPU offload tier evicts only idle, unprotected chunks, in `SegmentedLRU` order.

    Guarantees:
        * ``evict(n, protected)`` returns exactly ``n`` chunks with ``ref_cnt == 0``
          and keys not in ``protected``, or ``None`` and changes nothing.
        * Victims come in the order `SegmentedLRU` chooses among the idle chunks:
          orphans (parent gone) first, then chunks not reused yet, then reused ones.
        * Every chunk inserted and not evicted, removed or cleared is returned by
          ``get`` with its ``ChunkStatus``.

    Evictions cost O(n + |protected|), plus one scan of the idle chunks when an
    idle chunk is protected. To tune `SegmentedLRU`, subclass and override
    `new_order` (vLLM constructs the policy with ``cache_capacity`` only).
    """

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.order: SegmentedLRU = self.new_order()
        """The eviction order; its ``stats()`` describe this tier's segments."""
        self._chunks: dict[OffloadKey, ChunkStatus] = {}
        self._parents: dict[OffloadKey, OffloadKey] = {}
        """Key -> the key right before it in a prefix chain (learned, maybe not resident)."""
        self._credits: dict[OffloadKey, int] = {}
        """Uses counted at a pin or hold-out and not yet matched by a reuse report."""
        self._step_tokens: dict[int, int] = {}
        """Group -> GCD of its end positions seen: its chunk size once a first chunk is seen."""

    def new_order(self) -> SegmentedLRU:
        """The eviction order for an empty tier (at construction and after ``clear``)."""
        return SegmentedLRU()

    # -- CachePolicy -------------------------------------------------------------

    def get(self, key: OffloadKey) -> ChunkStatus | None:
        """The chunk stored under ``key``, or None."""
        return self._chunks.get(key)

    def insert(self, key: OffloadKey, chunk: ChunkStatus) -> None:
        """Track a new chunk; it becomes evictable now if idle, else at ``mark_evictable``.

        Raises:
            ValueError: if ``key`` is already cached.
        """
        if key in self._chunks:
            raise ValueError(f"key {key!r} is already cached")
        self._chunks[key] = chunk
        if chunk.ref_cnt == 0:
            self._release(key)

    def remove(self, key: OffloadKey) -> None:
        """Forget ``key`` (a failed store) without counting an eviction.

        Raises:
            KeyError: if ``key`` is not cached.
        """
        del self._chunks[key]
        self.order.discard(key)
        self._forget(key)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        """Count one use of each idle chunk of ``keys``, tail first (given head to tail)."""
        keys = list(keys)
        self._learn_chain(keys, req_context)
        for key in reversed(keys):
            if key in self.order:
                self.order.acquire(key)
                self._release(key)

    def on_store_miss(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        """Learn the chain links of chunks about to be stored (no use is counted)."""
        self._learn_chain(list(keys), req_context)

    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[OffloadKey]],
        insertion_only_keys: set[OffloadKey],
        reused_keys: set[OffloadKey],
        req_context: ReqContext,
    ) -> None:
        """Count one use per reused chunk (a credit stands for one), tail first; learn links."""
        keys = order_request_keys(key_groups, req_context)
        self._learn_chain(keys, req_context)
        chain = req_context.get_state(_RequestChain)
        if chain is not None and chain.owner is self:
            for key in chain.keys.values():  # links of chunks never inserted
                if key not in self._chunks:
                    self._parents.pop(key, None)
        for key in reversed(keys):
            if key not in reused_keys or key not in self._chunks:
                continue
            if self._credits.get(key):
                self._spend_credit(key)
            elif key in self.order:
                self.order.acquire(key)
                self._release(key)

    def evict(
        self, n: int, protected: set[OffloadKey]
    ) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        """Evict exactly ``n`` idle chunks not in ``protected``, or return None and change nothing."""
        if n <= 0:
            return []
        num_held = sum(1 for key in protected if key in self.order)
        if len(self.order) - num_held < n:
            return None
        # Idle protected chunks wait outside the order (a reuse: see the module docstring),
        # then go back in their current order, so the result does not depend on set order.
        held = [key for key in self.order if key in protected] if num_held else []
        for key in held:
            self._pin(key)
        victims = []
        for _ in range(n):
            key = self.order.evict()
            victims.append((key, self._chunks.pop(key)))
            self._forget(key)
        for key in held:
            self._release(key)
        return victims

    def clear(self) -> None:
        """Drop every chunk, the ghost list and the learned links."""
        self.order = self.new_order()
        self._chunks.clear()
        self._parents.clear()
        self._credits.clear()
        self._step_tokens.clear()

    def mark_evictable(self, key: OffloadKey) -> None:
        """``key``'s ``ref_cnt`` became 0: it joins the order (``release``)."""
        self._release(key)

    def mark_non_evictable(self, key: OffloadKey) -> None:
        """``key``'s ``ref_cnt`` left 0 (a load pins it): a use, and a credit for its report."""
        self._pin(key)

    # -- helpers -------------------------------------------------------------------

    def _pin(self, key: OffloadKey) -> None:
        self.order.acquire(key)
        self._credits[key] = self._credits.get(key, 0) + 1

    def _spend_credit(self, key: OffloadKey) -> None:
        if self._credits[key] == 1:
            del self._credits[key]
        else:
            self._credits[key] -= 1

    def _release(self, key: OffloadKey) -> None:
        parent = self._parents.get(key)
        self.order.release(key, parent if parent in self._chunks else None)

    def _forget(self, key: OffloadKey) -> None:
        self._parents.pop(key, None)
        self._credits.pop(key, None)

    def _learn_chain(self, keys: list[OffloadKey], req_context: ReqContext) -> None:
        """Record ``keys``' positions for this request; link each to the chunk one step before."""
        chain = req_context.get_state(_RequestChain)
        if chain is None or chain.owner is not self:
            chain = _RequestChain(self)
            req_context.set_state(chain)
        placed = []
        for key in keys:
            end = req_context.get_offload_key_position(key)
            if end is not None and end > 0:
                group = get_offload_group_idx(key)
                chain.keys[(group, end)] = key
                self._step_tokens[group] = math.gcd(self._step_tokens.get(group, 0), end)
                placed.append((key, group, end))
        for key, group, end in placed:
            parent = chain.keys.get((group, end - self._step_tokens[group]))
            if parent is not None and parent != key:
                self._parents[key] = parent

    def check_invariants(self) -> None:
        """Assert that the order holds exactly the idle chunks and the order is consistent."""
        idle = {key for key, chunk in self._chunks.items() if chunk.ref_cnt == 0}
        assert set(self.order) == idle, (set(self.order) ^ idle)
        assert set(self._credits) <= set(self._chunks)
        assert all(count > 0 for count in self._credits.values())
        self.order.check_invariants()
