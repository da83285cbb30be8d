"""Prefix-cache eviction in vLLM chosen by an `EvictionOrder` (e.g. `SegmentedLRU`).

vLLM keeps every unreferenced block, cached or not, in the block pool's
``free_block_queue`` and always allocates from its front. `PolicyFreeBlockQueue`
replaces that queue on our own scheduler's block pool (`install_eviction`): it
has the same methods and keeps ``num_free_blocks`` exact, and the order decides
what the front is.

Translation (vLLM call -> order):

* ``append``/``append_n`` of a block with a prefix hash -> ``release(hash, parent)``.
  vLLM frees a request's blocks tail first in one ``append_n``, so the next block
  of the batch is the parent when its hash covers exactly one block less.
  A second free block holding a hash another block already holds is a
  duplicate: it is released as uncached (dropping it loses nothing).
* ``append``/``prepend_n`` of a block without a hash -> ``release_uncached(block id)``
  (allocated before any cached block, as in vLLM).
* ``remove`` (a prefix hit, ``touch``) -> ``acquire``; ``popleft``/``popleft_n`` -> ``evict``.
* Blocks a preempted request frees (inside `PolicyFreeBlockQueue.shield`, which
  `EvictionHook` enters around vLLM's ``_preempt_request``) are released with
  ``protect=True``: the preemption cache shield.
* Blocks a cancelled request frees (``shield(cancelled=True)``, entered around
  ``_free_request`` of a ``FINISHED_ABORTED`` request) go to ``release_cancelled``
  when the order implements `RetentionHints` (cancellation-aware retention).
* `PolicyFreeBlockQueue.observe_request` (called on admission) tells such an order
  which root block the request's prompt opens with, and its ``vllm_xargs``
  ``prompt_version`` if any (cache versioning).
* An order that implements `SessionHints` (`DuelingSLRU` with session pins) hears, from
  `EvictionHook`, each admitted request's ``session_id`` and prompt blocks
  and tenant (``turn_started``) and, once a finished request's blocks are free, its end
  (``turn_finished``), both at the step's clock reading: session pins, within each
  tenant's share of the pinned budget.
* An order that implements `WaitingHints` with ``keep_waiting`` (`SegmentedLRU`,
  `DuelingSLRU`) hears, from `EvictionHook`, the prompt blocks of each request that
  starts waiting (``expect``: on admission, and a preempted request again) and that
  stops (``unexpect``: once vLLM scheduled it, as a new or resumed request, after its
  prefix hits were taken; or when it finishes while waiting): waiting-queue awareness.
  O(prompt blocks) per request that starts or stops waiting.

Keys are block hashes, so the order's use counts follow content, not slots.

Differences from vLLM's queue: a duplicate (a second free block holding a hash
another block holds) goes to the front, where vLLM keeps it at the back in LRU
position, so the queue never drops distinct cached content while a duplicate is
free (counted in ``duplicates_released``); a hash-less block given to ``append`` (vLLM's
``unpin_blocks``, used by KV offloading) goes to the front like any other
uncached block rather than to the back; ``iter_blocks_after`` (used by the
simple CPU offloading manager) walks the whole order, O(free blocks) per call.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

from integrations.vllm_v1.cache.eviction_metrics import report_eviction, report_session_pins
from integrations.vllm_v1.hooks import SchedulerHook
from integrations.vllm_v1.metrics import PolicyMetrics
from integrations.vllm_v1.vllm_surface.names import (
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    Request,
    RequestStatus,
    get_group_id,
    make_block_hash_with_group_id,
    swap_free_block_queue,
)
from policies.kv.eviction import (
    EvictionOrder,
    ReportsEvictionStats,
    RetentionHints,
    SessionHints,
    WaitingHints,
)

PROMPT_VERSION_ARG = "prompt_version"
"""The ``vllm_xargs`` key naming the version of a request's system prompt."""


def _is_parent(child: KVCacheBlock, parent: KVCacheBlock) -> bool:
    """Whether ``parent`` is the block right before ``child`` in one prefix chain."""
    c_hash, p_hash = child.block_hash, parent.block_hash
    c_tokens, p_tokens = child.block_hash_num_tokens, parent.block_hash_num_tokens
    if c_hash is None or p_hash is None or not c_tokens or not p_tokens:
        return False
    step = c_tokens - p_tokens
    return (step > 0 and p_tokens % step == 0
            and get_group_id(c_hash) == get_group_id(p_hash))


class PolicyFreeBlockQueue(FreeKVCacheBlockQueue):
    """vLLM's free-block queue with victims chosen by ``order``; every count stays exact.

    Guarantees: ``num_free_blocks`` equals the blocks the queue holds, each free
    block is held exactly once, ``popleft`` never returns a block that is not
    free, and blocks without a hash are handed out before any cached block.
    The linked-list fields of `KVCacheBlock` are not used.

    An order that raises (or evicts a key that is not free) is contained: that one
    eviction takes the least recently released free block (uncached first), other
    calls are skipped, each counted in ``faults`` and reported to ``on_fault``; the
    queue's own counts stay exact.
    """

    def __init__(self, blocks: list[KVCacheBlock], order: EvictionOrder,
                 on_fault: Callable[[str, BaseException, object], None] | None = None) -> None:
        # Not calling super().__init__: it would link the blocks into its own list.
        self.order = order
        self.num_free_blocks = 0
        self.duplicates_released = 0
        """Cached blocks released as uncached because another block holds their hash."""
        self.faults = 0
        """Order calls that raised (or evicted a key not free), contained."""
        self.on_fault = on_fault
        """Told ``("eviction", error, order)`` of each (the scheduler's `PolicyFaults`)."""
        self._free: dict[Hashable, KVCacheBlock] = {}
        """Order key -> free block."""
        self._key_of: dict[int, Hashable] = {}
        """Free block id -> its order key."""
        self._owner: dict[Hashable, int] = {}
        """Hash -> id of the block the order tracks it for (free or referenced)."""
        self._hash_of: dict[int, Hashable] = {}
        """Inverse of ``_owner``."""
        self._protect = False
        self._cancelled = False
        self._hints = order if isinstance(order, RetentionHints) else None
        for block in blocks:
            block.prev_free_block = block.next_free_block = None
        uncached = [b for b in blocks if b.block_hash is None]
        self.prepend_n(uncached)
        for block in blocks:
            if block.block_hash is not None:
                self.append(block)

    # -- FreeKVCacheBlockQueue ------------------------------------------------

    def popleft(self) -> KVCacheBlock:
        if not self.num_free_blocks:
            raise ValueError("No free blocks available")
        try:
            key = self.order.evict()
            if key not in self._free:
                raise KeyError(f"evict() returned {key!r}, which is not a free block")
        except Exception as error:  # noqa: BLE001 - contained: LRU for this eviction
            self._fault(error)
            key = next((k for k in self._free if isinstance(k, int)), next(iter(self._free)))
            with suppress(Exception):  # the order may not know it; it is gone either way
                self.order.discard(key)
        block = self._free.pop(key)  # `_take`, inlined: the hottest path but one
        block_id = block.block_id
        del self._key_of[block_id]
        old = self._hash_of.pop(block_id, None)
        if old is not None:
            del self._owner[old]
        self.num_free_blocks -= 1
        return block

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        assert self.num_free_blocks >= n
        popleft = self.popleft
        return [popleft() for _ in range(n)]

    def remove(self, block: KVCacheBlock) -> None:
        key = self._key_of.get(block.block_id)
        if key is None:
            raise RuntimeError(f"remove() called on an invalid block: {block}")
        self._tell(self.order.acquire, key)
        del self._free[key], self._key_of[block.block_id]
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        self.append_n([block])

    def append_n(self, blocks: list[KVCacheBlock]) -> None:
        # The hottest call of all, so `_release` is inlined, and a block claimed as the
        # parent of the one before keeps that claim (nothing between changes it).
        claim, order, last = self._claim, self.order, len(blocks) - 1
        hints = self._hints if self._cancelled else None
        key: Hashable | None = None
        claimed = False
        for i, block in enumerate(blocks):
            if not claimed:  # else ``key`` is the one claimed for it as the last parent
                key = claim(block) if block.block_hash is not None else None
            if key is None:
                self.duplicates_released += block.block_hash is not None
                self.prepend_n([block])
                claimed = False
                continue
            parent = blocks[i + 1] if i < last else None
            claimed = parent is not None and _is_parent(block, parent)
            parent_key = claim(parent) if claimed else None
            self._add(block, key)
            try:  # as `_tell`, without its frame
                if hints is not None:
                    hints.release_cancelled(key, parent_key)
                else:
                    order.release(key, parent_key, protect=self._protect)
            except Exception as error:  # noqa: BLE001 - contained
                self._fault(error)
            key = parent_key

    def prepend_n(self, blocks: list[KVCacheBlock]) -> None:
        for block in reversed(blocks):  # the first block ends up at the very front
            self._forget_hash(block.block_id)
            self._add(block, block.block_id)
            self._tell(self.order.release_uncached, block.block_id)

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        return [self._free[key] for key in self.order]

    def iter_blocks_after(self, cursor: KVCacheBlock | None) -> Iterator[KVCacheBlock]:
        blocks = iter(self.get_all_free_blocks())
        if cursor is not None:
            for block in blocks:
                if block is cursor:
                    break
        yield from blocks

    # -- bookkeeping ------------------------------------------------------------

    def _add(self, block: KVCacheBlock, key: Hashable) -> None:
        if block.block_id in self._key_of:
            raise RuntimeError(f"block {block.block_id} is already free")
        self._free[key] = block
        self._key_of[block.block_id] = key
        self.num_free_blocks += 1

    def _forget_hash(self, block_id: int) -> None:
        """Stop tracking the hash the order knew ``block_id`` by (if any); the order forgets it."""
        old = self._hash_of.pop(block_id, None)
        if old is not None:
            del self._owner[old]
            self._tell(self.order.discard, old)

    def _claim(self, block: KVCacheBlock) -> Hashable | None:
        """The order key of cached ``block``, or None if another block holds its hash."""
        block_hash = block.block_hash
        owner = self._owner.get(block_hash)
        if owner is not None and owner != block.block_id:
            return None
        if self._hash_of.get(block.block_id, block_hash) != block_hash:
            self._forget_hash(block.block_id)  # the block's hash changed while in use
        self._owner[block_hash] = block.block_id
        self._hash_of[block.block_id] = block_hash
        return block_hash

    def _tell(self, call: Callable[..., object], *args: object, **kwargs: object) -> None:
        """``call`` the order; an exception is contained (counted, the call skipped)."""
        try:
            call(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - contained
            self._fault(error)

    def _fault(self, error: BaseException) -> None:
        self.faults += 1
        if self.on_fault is not None:
            self.on_fault("eviction", error, self.order)

    @contextmanager
    def shield(self, *, cancelled: bool = False) -> Iterator[None]:
        """Blocks freed inside are a preempted request's (``protect=True``), or with
        ``cancelled`` a cancelled request's (``release_cancelled``)."""
        self._protect, self._cancelled = not cancelled, cancelled
        try:
            yield
        finally:
            self._protect = self._cancelled = False

    def observe_request(self, request: Request, tenant: str) -> int:
        """Tell the order which root block ``request``'s prompt opens with (and its
        ``prompt_version``); returns the blocks it demoted as stale (0 without hints)."""
        if self._hints is None or not request.block_hashes:
            return 0
        params = request.sampling_params
        version = (params.extra_args or {}).get(PROMPT_VERSION_ARG) if params else None
        root = make_block_hash_with_group_id(request.block_hashes[0], 0)
        return self._hints.observe_prompt(tenant, root, None if version is None
                                          else str(version)[:128])

    # -- checks -----------------------------------------------------------------

    def check_invariants(self) -> None:
        """Assert that the queue, the order and the counters agree."""
        assert self.num_free_blocks == len(self._free) == len(self._key_of) == len(self.order)
        for key, block in self._free.items():
            assert self._key_of[block.block_id] == key, block
            assert block.ref_cnt == 0, block
            assert key in self.order, key
        for block_hash, block_id in self._owner.items():
            assert self._hash_of[block_id] == block_hash
        if hasattr(self.order, "check_invariants"):
            self.order.check_invariants()


def install_eviction(scheduler: Any, order: EvictionOrder,
                     on_fault: Callable[[str, BaseException, object], None] | None = None
                     ) -> PolicyFreeBlockQueue:
    """Replace ``scheduler``'s free-block queue by one evicting in ``order``; returns it.

    Call on a scheduler with no request yet (or between requests): the free
    blocks move over in their current order, cached ones with no known parent.
    """
    return swap_free_block_queue(scheduler.kv_cache_manager,
                                 lambda blocks: PolicyFreeBlockQueue(blocks, order, on_fault))


class EvictionHook(SchedulerHook):
    """The pipeline's ``eviction`` slot: installs `PolicyFreeBlockQueue`, tells it each
    admitted prompt, shields blocks of preempted and cancelled requests, tells an order with
    waiting-queue awareness which prompts wait, reports stats."""

    observes_decode_steps = False
    """`after_schedule` only reads requests that started or resumed."""

    def __init__(self, scheduler: Any, order: EvictionOrder) -> None:
        self.queue = install_eviction(scheduler, order, scheduler.faults.record)
        self._stats = order.stats if isinstance(order, ReportsEvictionStats) else None
        self._scheduler = scheduler
        self._turns = order if isinstance(order, SessionHints) else None
        self._session_of: dict[str, Hashable] = {}
        """Request id -> its session (session pins), from admission to its finish."""
        self._waiting = (order if isinstance(order, WaitingHints) and order.keep_waiting
                         else None)
        self._expected: dict[str, list[Hashable]] = {}
        """Request id -> the block keys ``_waiting`` expects for it, while it waits."""

    def on_admitted(self, request: Any, tenant: str) -> None:
        self.queue.observe_request(request, tenant)  # cache versioning: the prompt's root
        keys = _block_keys(request) if self._waiting is not None else None
        if keys is not None:  # waiting-queue awareness: its prompt's blocks are wanted
            self._expect(request.request_id, keys)
        if self._turns is not None:  # session pins: the turn of a session arrived
            session_id = (request.session_id
                          or self._scheduler.tracked_metadata(request).session_id)
            if self._turns.wants_turn(session_id):
                session = self._turns.turn_started(
                    session_id, _block_keys(request) if keys is None else keys,
                    self._scheduler.clock(), tenant)
                if session is not None:
                    self._session_of[request.request_id] = session

    def after_schedule(self, scheduler_output: Any) -> None:
        if not self._expected:
            return
        for new in scheduler_output.scheduled_new_reqs:  # hits taken: no longer waiting
            self._unexpect(new.req_id)
        for request_id in scheduler_output.scheduled_cached_reqs.resumed_req_ids:
            self._unexpect(request_id)

    def _expect(self, request_id: str, keys: list[Hashable]) -> None:
        self._unexpect(request_id)
        self._waiting.expect(keys)
        self._expected[request_id] = keys

    def _unexpect(self, request_id: str) -> None:
        keys = self._expected.pop(request_id, None)
        if keys is not None:
            self._waiting.unexpect(keys)

    @contextmanager
    def releasing(self, request: Any, *, preempted: bool) -> Iterator[None]:
        if self._waiting is not None:  # a preempted request waits again; a finished one not
            if preempted:
                self._expect(request.request_id, _block_keys(request))
            else:
                self._unexpect(request.request_id)
        if preempted:  # the preemption cache shield: blocks freed protected
            with self.queue.shield():
                yield
        elif request.status == RequestStatus.FINISHED_ABORTED:  # cancelled by its client
            self._session_of.pop(request.request_id, None)
            with self.queue.shield(cancelled=True):
                yield
        else:
            yield
            session = self._session_of.pop(request.request_id, None)
            if session is not None:  # session pins: keep the turn's blocks for the next one
                self._turns.turn_finished(session, _block_keys(request), self._scheduler.clock())

    def refresh_metrics(self, metrics: PolicyMetrics) -> None:
        if self._stats is not None:
            report_eviction(metrics, self._stats())
        if self._turns is not None:
            report_session_pins(metrics, self._turns.pins_by_tenant())


def _block_keys(request: Any) -> list[Hashable]:
    """The order keys of ``request``'s full prompt blocks (kv cache group 0), in chain order."""
    return [make_block_hash_with_group_id(block_hash, 0) for block_hash in request.block_hashes]
