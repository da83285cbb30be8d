"""Agent-session workloads: multi-turn tool-using sessions, generated from published shapes.

An agent session is one task worked through many LLM calls: every call's prompt is the
previous call's prompt plus its output plus a tool's observation, so contexts grow to tens
of thousands of tokens and consecutive calls share ~90 % of their prefix; between calls the
agent runs a tool for seconds. The shapes follow what was published about such traffic:

- Continuum (Li et al., arXiv 2511.02230, on SWE-Bench and BFCL agents with Llama-3.1):
  tool calls pause a program for milliseconds to tens of seconds, between tens of turns
  on SWE-Bench and a few on BFCL function calling;
- the ~90 % prefix reuse between turns and contexts of tens of thousands of tokens of
  coding-agent sessions (the workload kind `../BENCHMARKS.md` names).

No trajectory is copied: each `AgentProfile` holds a few distribution parameters (log-normal
lengths and tool times, a shared system prompt per agent framework), and `agent_trace` draws
sessions from it with a seeded `random.Random`. Arrivals are open-loop, as a recorded trace
is: a turn arrives after the previous one's nominal service time and its tool time.

Every request carries its session's ``session_id`` and 512-token ``block_hashes``: the
shared system prompt's blocks are common to the framework's sessions, a session's full
blocks keep their hash from turn to turn, and a partial last block is new each turn.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from types import MappingProxyType

import attrs

from benchmarks.replay.trace import Trace, TraceRequest

BLOCK_SIZE = 512
"""Tokens per block hash (as in the Mooncake traces)."""


def _positive(_instance: object, attribute: attrs.Attribute, value: float) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise ValueError(f"{attribute.name} must be a positive finite number, got {value!r}")


@attrs.frozen(kw_only=True)
class LogNormal:
    """A log-normal draw with ``median`` and log-space ``sigma``, clipped to ``[low, high]``."""

    median: float = attrs.field(validator=_positive)
    sigma: float = attrs.field(validator=attrs.validators.ge(0.0))
    low: float = attrs.field(validator=_positive)
    high: float = attrs.field(validator=_positive)

    def __attrs_post_init__(self) -> None:
        if self.low > self.high:
            raise ValueError(f"low must be <= high, got {self.low!r} and {self.high!r}")

    def draw(self, rng: random.Random) -> float:
        """One value in ``[low, high]``."""
        return min(max(rng.lognormvariate(math.log(self.median), self.sigma), self.low),
                   self.high)


@attrs.frozen(kw_only=True)
class AgentProfile:
    """The shape of one kind of agent traffic (all lengths in tokens, times in seconds)."""

    sessions_per_s: float = attrs.field(validator=_positive)
    """Poisson rate of new sessions."""
    turns: LogNormal
    """LLM calls per session (rounded; at least 1)."""
    frameworks: int = attrs.field(validator=attrs.validators.ge(1))
    """Distinct agent frameworks, each with its own system prompt shared by its sessions."""
    system_prompt_tokens: int = attrs.field(validator=attrs.validators.ge(1))
    task_tokens: LogNormal
    """The task statement, the first turn's prompt after the system prompt."""
    observation_tokens: LogNormal
    """A tool's output, appended to the context after each call."""
    output_tokens: LogNormal
    """A call's output (reasoning and the tool call)."""
    tool_s: LogNormal
    """The tool's run time between a call's end and the next call."""
    max_context_tokens: int = attrs.field(validator=attrs.validators.ge(BLOCK_SIZE))
    """A session ends before its prompt would exceed this."""
    nominal_s_per_output_token: float = attrs.field(default=0.02, validator=_positive)
    """The service time a call is taken to need per output token when arrivals are laid out
    (the trace's own engine, as a recorded trace would carry it)."""


_SWE = AgentProfile(
    sessions_per_s=0.05, turns=LogNormal(median=24, sigma=0.5, low=4, high=80),
    frameworks=3, system_prompt_tokens=3072,
    task_tokens=LogNormal(median=800, sigma=0.6, low=100, high=6000),
    observation_tokens=LogNormal(median=700, sigma=1.0, low=20, high=8000),
    output_tokens=LogNormal(median=160, sigma=0.7, low=8, high=2000),
    tool_s=LogNormal(median=2.5, sigma=1.0, low=0.05, high=60.0),
    max_context_tokens=40_000)
"""SWE-Bench-style coding agents: tens of turns, file views and test logs as observations,
contexts to tens of thousands of tokens, tool runs of seconds."""

PROFILES: Mapping[str, AgentProfile] = MappingProxyType({
    "swe": _SWE,
    # Held-out variants of the coding agent, never tuned on: long sessions whose contexts
    # grow to 80k tokens with longer tool runs, and a busy fleet of short sessions with
    # quick tools of wide spread (checks that what was built on ``swe`` carries over).
    "swe-long": attrs.evolve(
        _SWE, sessions_per_s=0.03, turns=LogNormal(median=40, sigma=0.5, low=8, high=120),
        observation_tokens=LogNormal(median=1200, sigma=1.0, low=20, high=12000),
        tool_s=LogNormal(median=5.0, sigma=0.8, low=0.1, high=120.0),
        max_context_tokens=80_000),
    "swe-busy": attrs.evolve(
        _SWE, sessions_per_s=0.12, turns=LogNormal(median=12, sigma=0.6, low=2, high=60),
        tool_s=LogNormal(median=1.0, sigma=1.2, low=0.02, high=30.0),
        max_context_tokens=32_000),
    # BFCL-style function calling: a few turns, long tool schemas in the system prompt,
    # short observations and calls, sub-second tools.
    "bfcl": AgentProfile(
        sessions_per_s=0.4, turns=LogNormal(median=4, sigma=0.5, low=1, high=16),
        frameworks=12, system_prompt_tokens=1800,
        task_tokens=LogNormal(median=150, sigma=0.6, low=10, high=2000),
        observation_tokens=LogNormal(median=180, sigma=0.8, low=5, high=3000),
        output_tokens=LogNormal(median=60, sigma=0.6, low=4, high=800),
        tool_s=LogNormal(median=0.6, sigma=0.9, low=0.01, high=20.0),
        max_context_tokens=16_000),
})
"""Built-in profiles: ``swe`` (coding agents), its held-out variants ``swe-long`` and
``swe-busy``, and ``bfcl`` (function calling)."""


@attrs.define(eq=False)
class _HashIds:
    """Fresh block hash ids; framework system prompts get their own fixed ranges."""

    next_id: int = 1 << 40

    def fresh(self) -> int:
        self.next_id += 1
        return self.next_id


def _system_blocks(framework: int, tokens: int) -> list[int]:
    return [(framework << 20) + j for j in range(tokens // BLOCK_SIZE)]


def _session(index: int, start_s: float, profile: AgentProfile, rng: random.Random,
             ids: _HashIds) -> list[TraceRequest]:
    """The calls of one session, in order."""
    framework = rng.randrange(profile.frameworks)
    session_id = f"session-{index}"
    full_blocks = _system_blocks(framework, profile.system_prompt_tokens)
    context = profile.system_prompt_tokens + round(profile.task_tokens.draw(rng))
    turns = max(1, round(profile.turns.draw(rng)))
    requests, now = [], start_s
    for turn in range(turns):
        if context + 1 >= profile.max_context_tokens:
            break
        while len(full_blocks) < context // BLOCK_SIZE:  # blocks filled since the last call
            full_blocks.append(ids.fresh())
        hashes = list(full_blocks)
        if context % BLOCK_SIZE:
            hashes.append(ids.fresh())  # the partial last block differs from turn to turn
        output = max(1, min(round(profile.output_tokens.draw(rng)),
                            profile.max_context_tokens - context - 1))
        requests.append(TraceRequest(
            request_id=f"{session_id}-turn-{turn}", arrival_s=now, prompt_tokens=context,
            output_tokens=output, session_id=session_id, block_hashes=tuple(hashes)))
        now += output * profile.nominal_s_per_output_token + profile.tool_s.draw(rng)
        context += output + round(profile.observation_tokens.draw(rng))
    return requests


def agent_trace(profile: str | AgentProfile = "swe", *, num_requests: int = 3000,
                seed: int = 0) -> Trace:
    """``num_requests`` calls of agent sessions drawn from ``profile`` (a `PROFILES` name).

    Sessions start as a Poisson process; the trace is cut at ``num_requests`` calls by
    arrival, so the last sessions may be cut short. Deterministic in ``seed``.

    Raises:
        ValueError: for an unknown profile name or ``num_requests`` < 1.
    """
    if isinstance(profile, str):
        if profile not in PROFILES:
            raise ValueError(f"unknown agent profile {profile!r}: use one of {sorted(PROFILES)}")
        name, profile = f"agent-{profile}", PROFILES[profile]
    else:
        name = "agent-custom"
    if isinstance(num_requests, bool) or not isinstance(num_requests, int) or num_requests < 1:
        raise ValueError(f"num_requests must be a positive integer, got {num_requests!r}")
    rng, ids = random.Random(seed), _HashIds()
    requests: list[TraceRequest] = []
    start, index = 0.0, 0
    # Sessions that start after the num_requests-th call so far cannot change the cut.
    while len(requests) < num_requests or start <= sorted(
            r.arrival_s for r in requests)[num_requests - 1]:
        requests.extend(_session(index, start, profile, rng, ids))
        index += 1
        start += rng.expovariate(profile.sessions_per_s)
    requests.sort(key=lambda r: r.arrival_s)
    return Trace(name=f"{name}-seed{seed}", requests=tuple(requests[:num_requests]),
                 block_size=BLOCK_SIZE)
