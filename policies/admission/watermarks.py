"""KV-cache watermarks: admission, per-request block quotas and reclaim by KV usage.

KV usage (the fraction of KV-cache blocks in use, ``LoadSnapshot.kv_usage``) is
split into three levels:

    GREEN   usage <  yellow_usage             admit everything
    YELLOW  yellow_usage <= usage < red_usage reject low-priority new work
    RED     red_usage <= usage                admit only high-priority short requests

Levels reject only while requests wait (``LoadSnapshot.waiting_requests > 0``): usage alone
is no sign of overload.

Above the yellow mark the integration should also evict unreferenced cached
blocks proactively (`KVWatermarks.should_reclaim`), and each request's KV
growth is held to a quota that shrinks as usage grows (`KVWatermarks.block_quota`).
"""

from __future__ import annotations

import enum
import math
from typing import ClassVar

import attrs

from policies.admission.controller import AdmissionDecision
from policies.needs import Needs
from policies.validators import at_least, finite_non_negative, finite_positive
from policies.views import LoadSnapshot, RequestView


class WatermarkLevel(enum.IntEnum):
    """KV pressure, ordered: ``GREEN < YELLOW < RED`` (the value is a gauge for metrics)."""

    GREEN = 0
    YELLOW = 1
    RED = 2


def _check_usage(kv_usage: float) -> float:
    if not 0.0 <= kv_usage <= 1.0:  # also rejects NaN
        raise ValueError(f"kv_usage must be in [0, 1], got {kv_usage!r}")
    return kv_usage



@attrs.frozen(kw_only=True)
class KVWatermarks:
    """Admission is monotone in KV usage and in urgency; quotas shrink with usage.

    Guarantees:
        * With no request waiting, every request is admitted.
        * A request rejected at usage ``u`` is rejected at every usage above
          ``u`` (the admitted set only shrinks: GREEN admits all, YELLOW admits
          priority ``< low_priority_from``, RED admits priority
          ``<= high_priority_at_most`` (which is ``< low_priority_from``) with a
          prompt of at most ``red_max_prompt_tokens``).
        * A request admitted at priority ``p`` is admitted at any more urgent
          (lower) priority, everything else equal.
        * ``block_quota`` never increases with usage nor with the priority value,
          and is never below ``min_quota_blocks``.

    Retry-After is a fixed hint per level (``yellow_retry_after_s``,
    ``red_retry_after_s``): KV pressure drains as running requests finish, and
    a RED cache takes longer to drain back under the marks than a YELLOW one.
    """

    needs: ClassVar[Needs] = Needs(block_quota=True)

    yellow_usage: float = 0.70
    """KV usage at and above which the level is YELLOW."""
    red_usage: float = 0.85
    """KV usage at and above which the level is RED."""
    low_priority_from: int = 1
    """In YELLOW, new requests with priority ``>=`` this are rejected (``kv_yellow``)."""
    high_priority_at_most: int = -1
    """In RED, only requests with priority ``<=`` this (and a short prompt) are admitted."""
    red_max_prompt_tokens: int = attrs.field(default=1024, validator=at_least(0))
    """In RED, only prompts of at most this many tokens are admitted."""
    yellow_retry_after_s: float = attrs.field(default=2.0, validator=finite_non_negative)
    """Retry-After of a ``kv_yellow`` rejection."""
    red_retry_after_s: float = attrs.field(default=5.0, validator=finite_non_negative)
    """Retry-After of a ``kv_red`` rejection."""
    base_quota_blocks: int | None = attrs.field(
        default=2048, validator=attrs.validators.optional(at_least(1)))
    """Quota of a priority-0 request on an empty cache (2048 blocks = 32k tokens at block 16);
    ``None``: no request's blocks are bounded (the bands alone), for pipelines whose admission
    weighs the KV cache itself. A fixed quota does not scale with the cache: on the
    ``reasoning`` trace it stalled a 28k-token prompt at 40 % usage for 5 s."""
    min_quota_blocks: int = attrs.field(default=16, validator=at_least(1))
    """No request's quota falls below this many blocks."""
    quota_halving_priority_steps: float = attrs.field(default=5.0, validator=finite_positive)
    """Each this many priority steps less urgent halve the quota (see `priority_factor`)."""

    def __attrs_post_init__(self) -> None:
        if not 0.0 < self.yellow_usage < self.red_usage <= 1.0:  # also rejects NaN
            raise ValueError(
                "watermarks need 0 < yellow_usage < red_usage <= 1, got "
                f"yellow_usage={self.yellow_usage!r}, red_usage={self.red_usage!r}"
            )
        if self.high_priority_at_most >= self.low_priority_from:
            raise ValueError(
                "high_priority_at_most must be below low_priority_from, got "
                f"high_priority_at_most={self.high_priority_at_most!r}, "
                f"low_priority_from={self.low_priority_from!r}"
            )

    def level(self, kv_usage: float) -> WatermarkLevel:
        """The level of ``kv_usage``, which never decreases as usage grows.

        Raises:
            ValueError: if ``kv_usage`` is outside [0, 1].
        """
        _check_usage(kv_usage)
        if kv_usage >= self.red_usage:
            return WatermarkLevel.RED
        if kv_usage >= self.yellow_usage:
            return WatermarkLevel.YELLOW
        return WatermarkLevel.GREEN

    def admit(self, request: RequestView, load: LoadSnapshot) -> AdmissionDecision:
        """Admit by the level of ``load.kv_usage`` while requests wait; reject with
        ``kv_yellow`` or ``kv_red``.

        With nothing waiting every request is admitted whatever the usage: a cache full of
        running work (long agent contexts keep it so) is the engine at work, not overload,
        and stock vLLM would start the request as soon as blocks free up.
        """
        if load.waiting_requests == 0:
            return AdmissionDecision.accept()
        level = self.level(load.kv_usage)
        if level is WatermarkLevel.YELLOW and request.priority >= self.low_priority_from:
            return AdmissionDecision.reject("kv_yellow", self.yellow_retry_after_s)
        if level is WatermarkLevel.RED and not (
            request.priority <= self.high_priority_at_most
            and request.prompt_tokens <= self.red_max_prompt_tokens
        ):
            return AdmissionDecision.reject("kv_red", self.red_retry_after_s)
        return AdmissionDecision.accept()

    def priority_factor(self, priority: int) -> float:
        """``2 ** (-priority / quota_halving_priority_steps)``: 1 at priority 0, lower is larger.

        With the default 5 steps, priority -20 gets 16x the base quota and
        priority 20 gets 1/16 of it.
        """
        return 2.0 ** (-priority / self.quota_halving_priority_steps)

    def block_quota(self, request: RequestView, kv_usage: float) -> int | None:
        """KV blocks ``request`` may hold at ``kv_usage``; never below ``min_quota_blocks``;
        ``None`` (unbounded) without ``base_quota_blocks``.

        ``max(min_quota_blocks, floor(base_quota_blocks * priority_factor(priority) * (1 - kv_usage)))``

        Raises:
            ValueError: if ``kv_usage`` is outside [0, 1].
        """
        free = 1.0 - _check_usage(kv_usage)
        if self.base_quota_blocks is None:
            return None
        quota = math.floor(self.base_quota_blocks * self.priority_factor(request.priority) * free)
        return max(self.min_quota_blocks, quota)

    def should_reclaim(self, kv_usage: float) -> bool:
        """Whether to evict unreferenced cached blocks now: at and above the yellow mark.

        Raises:
            ValueError: if ``kv_usage`` is outside [0, 1].
        """
        return self.level(kv_usage) is not WatermarkLevel.GREEN
