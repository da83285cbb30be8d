"""Frozen views: what a policy may see of a request, of the engine's load or of one step."""

from __future__ import annotations

import attrs

DEFAULT_TENANT = "default"


def _non_negative(_instance: object, attribute: attrs.Attribute, value: float) -> None:
    if value < 0:
        raise ValueError(f"{attribute.name} must be >= 0, got {value!r}")


@attrs.frozen(kw_only=True)
class RequestView:
    """An immutable snapshot of one request, in policy terms.

    Times are seconds on the caller's clock (the same clock as the ``now`` the
    caller passes to policies). ``priority`` follows vLLM: lower is more urgent.
    """

    request_id: str
    arrival_s: float
    prompt_tokens: int = attrs.field(validator=_non_negative)
    priority: int = 0
    computed_tokens: int = attrs.field(default=0, validator=_non_negative)
    output_tokens: int = attrs.field(default=0, validator=_non_negative)
    max_output_tokens: int | None = None
    tenant: str = DEFAULT_TENANT
    slo_class: str | None = None
    deadline_s: float | None = None
    num_preemptions: int = attrs.field(default=0, validator=_non_negative)
    cached_tokens: int = attrs.field(default=0, validator=_non_negative)
    """Prompt tokens found in the prefix cache when the request was admitted; looked up
    only for policies that use it (`CacheAwareRanker`, `SLOAdmission`), else 0."""
    session_id: str | None = None
    """The agent session the request is one call of (a hint; None when the client sent none)."""


@attrs.frozen(kw_only=True)
class LoadSnapshot:
    """The engine's load at the start of one scheduler step."""

    now: float
    waiting_requests: int = attrs.field(validator=_non_negative)
    running_requests: int = attrs.field(validator=_non_negative)
    kv_usage: float = attrs.field(validator=_non_negative)
    """Fraction of KV-cache blocks in use, in [0, 1]."""
    token_budget: int = attrs.field(validator=_non_negative)
    """Tokens the engine may schedule in one step (``max_num_batched_tokens``)."""
    kv_capacity_tokens: int | None = None
    """Tokens the KV cache holds in all (blocks times block size); None where unknown."""
    max_running_requests: int | None = None
    """Requests the engine runs at once at most (``max_num_seqs``); None where unknown."""


@attrs.frozen(kw_only=True)
class StepFeatures:
    """What one engine step ran."""

    decodes: int = 0
    """Sequences decoding one token."""
    decode_context_tokens: int = 0
    """Their context tokens in all (what decode attention reads)."""
    prefill_tokens: int = 0
    """Prompt tokens computed (prefix-cache hits excluded)."""
    prefill_pairs: int = 0
    """Query-key pairs of the prefill chunks' attention, ``Σ c · (k + (c + 1) / 2)``."""

    @classmethod
    def of(cls, prefills: tuple[tuple[int, int], ...] = (),
           decode_contexts: tuple[int, ...] = ()) -> StepFeatures:
        """The features of ``(new tokens, tokens already in KV)`` chunks and decode contexts."""
        return cls(decodes=len(decode_contexts), decode_context_tokens=sum(decode_contexts),
                   prefill_tokens=sum(c for c, _ in prefills),
                   prefill_pairs=sum(c * (2 * k + c + 1) // 2 for c, k in prefills))

    def vector(self) -> tuple[float, ...]:
        """``(1, decodes, decode context, prefill tokens, pairs)``, the model's regressors."""
        return (1.0, float(self.decodes), float(self.decode_context_tokens),
                float(self.prefill_tokens), float(self.prefill_pairs))
