"""PD-aware scheduling: a decode instance starts new requests only while KV stays bounded.

A decode step's time grows with the context its batch reads (every decoding
sequence's KV is read once per token), so the inter-token latency of a decode
instance follows how much KV it holds. `DecodeKVGate` bounds that: a waiting
request starts only if the blocks it needs keep the instance's KV usage within
``max_kv_usage``. Requests it holds back wait (they are not rejected) and start
as running ones finish. The bound trades TTFT (queueing on the decode side)
for a flatter ITL.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import attrs


def _usage_bound(_instance: object, attribute: attrs.Attribute, value: float) -> None:
    if not 0.0 < value <= 1.0:  # also rejects NaN
        raise ValueError(f"{attribute.name} must be in (0, 1], got {value!r}")


@runtime_checkable
class StartGate(Protocol):
    """How many leading waiting requests may start this step (`DecodeKVGate`); the
    ``start_gate`` slot of a pipeline."""

    def startable(self, needed_blocks: list[int], *, used_blocks: int, total_blocks: int,
                  running_requests: int) -> int:
        """How many leading requests of the queue (``needed_blocks`` each) may start now."""
        ...


@attrs.frozen(kw_only=True)
class DecodeKVGate:
    """Starts waiting requests, in queue order, only while their KV fits under a usage bound.

    Guarantees:
        * While any request runs, the requests `startable` lets start need, together
          with the blocks in use, at most ``max_kv_usage * total_blocks`` blocks.
        * With nothing running, at least the head of the queue starts: the gate
          never stalls an idle engine (a request bigger than the bound runs alone).
        * Monotone: more blocks in use, or bigger requests, never let more start.
    """

    max_kv_usage: float = attrs.field(default=0.5, validator=_usage_bound)
    """Fraction of the KV blocks the running requests may hold after a start."""

    def startable(self, needed_blocks: list[int], *, used_blocks: int, total_blocks: int,
                  running_requests: int) -> int:
        """How many leading requests of the queue (``needed_blocks`` each) may start now."""
        budget = self.max_kv_usage * total_blocks - used_blocks
        count = 0
        for blocks in needed_blocks:
            budget -= blocks
            if budget < 0:
                break
            count += 1
        return count if count or running_requests else min(1, len(needed_blocks))
