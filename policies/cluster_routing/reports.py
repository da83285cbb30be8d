"""What a cluster router reads and returns: replica reports, requests, decisions, stats."""

from __future__ import annotations

import enum
from collections.abc import Hashable, Mapping

import attrs

from policies.step_model import StepTimeModel
from policies.validators import finite_non_negative, finite_positive, fraction, int_at_least
from policies.views import DEFAULT_TENANT

positive_int = int_at_least(1)
non_negative_int = int_at_least(0)


class RouteCause(enum.Enum):
    """Why a replica was chosen, or why none was."""

    ROUND_ROBIN = "round_robin"
    LEAST_LOADED = "least_loaded"
    CACHE = "cache"
    """The longest cached prefix (or lowest cost counting it)."""
    SESSION = "session"
    """The replica the request's session is on."""
    FEASIBLE = "feasible"
    """`SLORouter`: a replica predicted to meet the deadline (no session or cache preference)."""
    DEMOTED = "demoted"
    """`SLORouter`: none meets the request's class; one meets its declared lower class."""
    DEFERRED = "deferred"
    """`SLORouter` with ``keep_sessions``: no replica is predicted on time; sent all the same
    (to the session's replica, else the earliest), where the replica's own admission
    decides."""
    RETRIED = "retried"
    """`SLORouter.retry`: placed on another replica after one rejected it."""
    NO_FEASIBLE = "no_feasible"
    """Rejected: no accepting replica is predicted to meet the deadline."""
    NO_REPLICA = "no_replica"
    """Rejected: no replica is accepting."""
    NO_RETRY = "no_retry"
    """Rejected after a replica's rejection: this router does not retry, or did once already."""


@attrs.frozen(kw_only=True)
class ReplicaReport:
    """What one replica reports to the router before a decision."""

    name: str
    queued_prefill_tokens: int = attrs.field(validator=non_negative_int)
    """Prompt tokens admitted and not computed yet."""
    running_requests: int = attrs.field(validator=non_negative_int)
    waiting_requests: int = attrs.field(default=0, validator=non_negative_int)
    decode_context_tokens: int = attrs.field(default=0, validator=non_negative_int)
    """KV tokens of the running requests (what each decode step reads)."""
    queued_prefill_deadlines: tuple[tuple[float, int], ...] | None = attrs.field(
        default=None, converter=attrs.converters.optional(tuple))
    """``(first-token deadline, prefill tokens left)`` of each queued request, where the
    replica serves prefill earliest deadline first; None: first come, first served (all of
    ``queued_prefill_tokens`` is ahead of a new request)."""
    prefilling_requests: int = attrs.field(default=0, validator=non_negative_int)
    """Admitted requests with prefill left (they join the decode batch when it is done)."""
    prefilling_prompt_tokens: int = attrs.field(default=0, validator=non_negative_int)
    """Their prompt tokens (the context their decodes will read)."""
    kv_usage: float = attrs.field(default=0.0, validator=fraction)
    kv_capacity_tokens: int = attrs.field(validator=positive_int)
    token_budget: int = attrs.field(validator=positive_int)
    """Tokens one engine step schedules at most (``max_num_batched_tokens``)."""
    step_model: StepTimeModel | None = None
    """The replica's learned step model (`OnlineStepTimeModel.model`); None: it learns none."""
    recent_step_s: float | None = None
    """The replica's recent step time (`OnlineStepTimeModel.recent_step_s`)."""
    ttft_headroom: float | None = attrs.field(
        default=None, validator=attrs.validators.optional(finite_positive))
    """Share of a TTFT target the replica's own admission lets a prediction use now
    (`SLOAdmissionStats.headroom`); None: it reports none."""
    tpot_headroom: float | None = attrs.field(
        default=None, validator=attrs.validators.optional(finite_positive))
    """The same for TPOT targets (`SLOAdmissionStats.tpot_headroom`)."""
    tpot_bound_s: float | None = attrs.field(
        default=None, validator=attrs.validators.optional(finite_positive))
    """The tightest TPOT target of the classes decoding there, which the replica's own
    admission holds a classed request's predicted TPOT to beside its own target
    (`SLOAdmissionStats.tpot_bound_s`); None: it reports none."""
    accepting: bool = True
    """False while draining or unhealthy: nothing is routed there."""

    @property
    def ongoing_requests(self) -> int:
        """Requests waiting or running."""
        return self.running_requests + self.waiting_requests


@attrs.frozen(kw_only=True)
class ClusterRequest:
    """One request as the router sees it (times in seconds on the router's clock)."""

    request_id: str
    arrival_s: float = attrs.field(validator=finite_non_negative)
    prompt_tokens: int = attrs.field(validator=positive_int)
    block_keys: tuple[Hashable, ...] = attrs.field(default=(), converter=tuple)
    """Chained keys of the prompt's full blocks (`chain_keys`)."""
    session_id: str | None = None
    tenant: str = DEFAULT_TENANT
    slo_class: str | None = None
    """The class the request is judged in: its tenants share it by weight under
    `SLORouter.fairness` (None: one pool of every request without a class)."""
    ttft_s: float | None = None
    """First-token target of the request's class (None: no target, always feasible)."""
    tpot_s: float | None = None
    demote_ttft_s: float | None = None
    """First-token target of the lower class its tenant accepts instead of a rejection."""


@attrs.frozen(kw_only=True)
class ClusterDecision:
    """A routing decision: the replica (None: rejected at the router) and why."""

    request_id: str
    replica: str | None
    cause: RouteCause
    cached_tokens: int = 0
    """Prompt tokens the router expects the replica to hold already."""
    predicted_ttft_s: float | None = None
    """`SLORouter`: the predicted first token, from arrival."""
    retry_after_s: float | None = None
    """Set on a rejection: when the client may try again."""

    @property
    def accepted(self) -> bool:
        """Whether the request goes to a replica."""
        return self.replica is not None


@attrs.frozen(kw_only=True)
class ClusterRouterStats:
    """Counters of one router.

    ``routed`` + ``rejected`` = calls to `route` and `retry`; ``by_cause`` splits them.
    ``retries`` counts `retry` calls, ``retries_placed`` those that found a replica, and
    ``rejected_with_room`` those that found none while another replica than the one that
    rejected had room (`ClusterRouter.replica_with_room`): a replica's rejection the client
    saw although the cluster could have served the request.
    """

    routed: int
    rejected: int
    by_cause: Mapping[str, int]
    retries: int
    retries_placed: int
    rejected_with_room: int = 0
    sessions: int
    by_replica: Mapping[str, int]
    over_share_routed: int = 0
    """`SLORouter` with ``fairness``: requests routed while their tenant was over its weighted
    share of their class (planned on part of the prefill rate)."""
    over_share_rejected: int = 0
    """Those rejected at the router (no replica met the deadline on that part of the rate)."""
