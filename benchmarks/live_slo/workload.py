"""The live overload workload: open-loop Poisson arrivals or bursts of a mixed request kind.

Every request streams from ``/v1/completions`` with token-id prompts (the client of
`benchmarks.e2e_business_cases.live_client`). Three kinds, two tenants:

- ``chat``: short prompts (`CHAT_PROMPT_TOKENS`), ``vllm_xargs.slo_class = "chat"``;
- ``rag``: long prompts (`RAG_PROMPT_TOKENS`), ``slo_class = "rag"``;
- unclassed: medium prompts (`PLAIN_PROMPT_TOKENS`), no ``slo_class`` at all.

Each tenant's prompts open with its own system prompt (`SYSTEM_PROMPT_TOKENS`, a cacheable
prefix). Everything is drawn from one ``random.Random(seed)``: a seed fixes the schedule.
"""

from __future__ import annotations

import random
import zlib

import attrs

from benchmarks.e2e_business_cases.live import VOCAB
from benchmarks.e2e_business_cases.live_client import LiveRequest
from benchmarks.replay.trace import TraceRequest

TENANTS = ("acme", "globex")
KIND_SHARES = (("chat", 0.6), ("rag", 0.2), (None, 0.2))
"""Kind (its ``slo_class``; None: the request names none) and its share of requests."""
CHAT_PROMPT_TOKENS = (64, 256)
RAG_PROMPT_TOKENS = (1024, 1536)
PLAIN_PROMPT_TOKENS = (128, 512)
SYSTEM_PROMPT_TOKENS = 32
OUTPUT_TOKENS = (16, 48)
"""Answer lengths (``max_tokens``, ``ignore_eos``): bounded, uniform in this range."""
PRIORITY = {"chat": 0, "rag": 1, None: 1}
"""The ``priority`` sent with each kind (stock ``--scheduling-policy priority`` serves chat
first; ``fcfs`` servers get none)."""


@attrs.frozen(kw_only=True)
class Scenario:
    """One load level: Poisson arrivals at ``load`` times capacity for ``duration_s``, or a
    burst sent all at once of ``burst`` requests or of ``burst_s`` seconds of capacity;
    ``contention`` adds a busy CPU beside the server."""

    name: str
    load: float | None = None
    burst: int | None = None
    burst_s: float | None = None
    duration_s: float = 0.0
    contention: bool = False
    tenant_shares: tuple[float, ...] | None = None
    """Each of `TENANTS`' share of the requests (None: equal), e.g. ``(0.25, 0.75)``: the
    second tenant sends three times the first's."""

    def __attrs_post_init__(self) -> None:
        given = [k for k in ("load", "burst", "burst_s") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"scenario {self.name!r}: give exactly one of load, burst and "
                             f"burst_s, got {given or 'none'}")
        if self.load is not None and not (self.load > 0 and self.duration_s > 0):
            raise ValueError(f"scenario {self.name!r}: load and duration_s must be > 0")
        if self.burst is not None and self.burst < 1:
            raise ValueError(f"scenario {self.name!r}: burst must be >= 1")
        if self.burst_s is not None and not self.burst_s > 0:
            raise ValueError(f"scenario {self.name!r}: burst_s must be > 0")
        shares = self.tenant_shares
        if shares is not None and (len(shares) != len(TENANTS) or min(shares) <= 0
                                   or abs(sum(shares) - 1) > 1e-9):
            raise ValueError(f"scenario {self.name!r}: tenant_shares must give each of "
                             f"{TENANTS} a share > 0, summing to 1, got {shares}")

    @property
    def is_burst(self) -> bool:
        """All requests at once (``burst`` or ``burst_s``)."""
        return self.load is None

    def arrivals(self, capacity_rps: float, rng: random.Random) -> list[float]:
        """Arrival times (s from the run's start) of this scenario on an engine of
        ``capacity_rps``."""
        if self.burst_s is not None:
            return [0.0] * max(1, round(self.burst_s * capacity_rps))
        if self.burst is not None:
            return [0.0] * self.burst
        return poisson_arrivals(self.load * capacity_rps, self.duration_s, rng)

    def window_s(self, arrivals: list[float]) -> float:
        """The seconds goodput divides by: the arrival window, at least one second (a burst's
        window is its one instant, so its goodput reads as requests in SLO)."""
        return max(self.duration_s, max(arrivals, default=0.0), 1.0)


def poisson_arrivals(rate_rps: float, duration_s: float, rng: random.Random) -> list[float]:
    """Open-loop Poisson arrival times in ``[0, duration_s)`` at ``rate_rps``, ascending."""
    if not (rate_rps > 0 and duration_s > 0):
        raise ValueError(f"rate_rps and duration_s must be > 0, got {rate_rps}, {duration_s}")
    times, now = [], rng.expovariate(rate_rps)
    while now < duration_s:
        times.append(now)
        now += rng.expovariate(rate_rps)
    return times


def _tokens(seed: int, count: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(*VOCAB) for _ in range(count)]


def _kind(rng: random.Random) -> str | None:
    draw, total = rng.random(), 0.0
    for kind, share in KIND_SHARES:
        total += share
        if draw < total:
            return kind
    return KIND_SHARES[-1][0]


def build_requests(arrivals: list[float], *, seed: int, prefix: str = "r",
                   tenant_shares: tuple[float, ...] | None = None) -> list[LiveRequest]:
    """One request per arrival time: kind, tenant (by ``tenant_shares``, else equally),
    lengths and prompt drawn from ``seed``."""
    rng = random.Random(seed)
    requests = []
    for index, arrival_s in enumerate(arrivals):
        kind = _kind(rng)
        tenant = (TENANTS[rng.randrange(len(TENANTS))] if tenant_shares is None
                  else rng.choices(TENANTS, weights=tenant_shares)[0])
        low, high = {"chat": CHAT_PROMPT_TOKENS, "rag": RAG_PROMPT_TOKENS}.get(
            kind, PLAIN_PROMPT_TOKENS)
        length = rng.randint(low, high)
        output = rng.randint(*OUTPUT_TOKENS)
        request_id = f"{prefix}{index}"
        prompt = (_tokens(zlib.crc32(tenant.encode()), SYSTEM_PROMPT_TOKENS)
                  + _tokens(zlib.crc32(f"{seed}:{request_id}".encode()),
                            length - SYSTEM_PROMPT_TOKENS))
        requests.append(LiveRequest(
            request=TraceRequest(request_id=request_id, arrival_s=arrival_s,
                                 prompt_tokens=length, output_tokens=output, tenant=tenant,
                                 priority=PRIORITY[kind], slo_class=kind),
            prompt_token_ids=tuple(prompt), max_tokens=output))
    return requests
