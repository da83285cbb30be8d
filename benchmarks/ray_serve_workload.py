"""The live Ray Serve comparison's requests: prompt families and agent sessions, as token ids.

Both kinds share long prefixes, so where a request lands decides how much of its prompt
a replica's prefix cache already holds:

- **prompt families**: ``families`` prefixes of ``prefix_tokens`` tokens each (the
  MT-bench prompts embedded with the tiny tokenizer, a seeded sample per family), each
  request one family's prefix plus a question of its own (``question_tokens``), families
  drawn uniformly in a seeded order;
- **agent sessions** (the shape of `benchmarks.replay.agent_sessions`, scaled to a CPU
  engine): one system prompt shared by every session, then a task of the session's own;
  each turn's prompt is the previous turn's plus that turn's output and a tool's
  observation, and the next turn is sent a tool time after the previous one completed.
  Every turn carries its session's ``session_id``.

Prompts are token ids (sent as the completions ``prompt`` list), so their lengths are
exact and the router's prefix keys are the engine's tokens. Deterministic given the seed.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import attrs


@attrs.frozen(kw_only=True)
class Call:
    """One request: which family or session it belongs to, and its prompt."""

    group: str
    """``family-N`` or ``session-N``."""
    prompt: tuple[int, ...]
    session_id: str | None = None
    tool_s: float = 0.0
    """Seconds the agent's tool runs before this turn is sent (after the previous turn)."""

    @property
    def kind(self) -> str:
        """``family`` or ``session``."""
        return self.group.split("-")[0]


@attrs.frozen(kw_only=True)
class LiveWorkload:
    """The family requests (sent in order, a bounded number in flight) and the sessions."""

    families: tuple[Call, ...]
    sessions: tuple[tuple[Call, ...], ...]
    """Each session's turns, in order."""

    def calls(self) -> list[Call]:
        """Every request, families first, then each session's turns."""
        return [*self.families, *(turn for session in self.sessions for turn in session)]


def corpus_tokens(tokenizer) -> list[int]:
    """The embedded MT-bench prompts, one after the other, as token ids of ``tokenizer``."""
    import integrations.vllm_v1.instruments as instruments

    corpus = Path(instruments.__file__).parent / "tiny_model_data" / "corpus.jsonl"
    lines = [json.loads(line) for line in corpus.read_text().splitlines() if line.strip()]
    return list(tokenizer.encode(" ".join(lines), add_special_tokens=False))


def build_workload(tokens: list[int], *, seed: int, families: int, requests: int,
                   prefix_tokens: int, question_tokens: int, sessions: int, turns: int,
                   system_tokens: int, task_tokens: int, step_tokens: int,
                   tool_s: tuple[float, float]) -> LiveWorkload:
    """Families and sessions cut from ``tokens`` at seeded offsets (see the module doc).

    A session's turn ``t`` has ``system_tokens + task_tokens + t * step_tokens`` prompt
    tokens (``step_tokens``: the previous turn's output plus the tool's observation).
    """
    rng = random.Random(seed)

    def span(length: int) -> tuple[int, ...]:
        if length > len(tokens):
            raise ValueError(f"a {length}-token span is longer than the corpus ({len(tokens)})")
        start = rng.randrange(len(tokens) - length + 1)
        return tuple(tokens[start:start + length])

    prefixes = [span(prefix_tokens) for _ in range(families)]
    family_calls = []
    for _ in range(requests):
        family = rng.randrange(families)
        family_calls.append(Call(group=f"family-{family}",
                                 prompt=prefixes[family] + span(question_tokens)))
    system = span(system_tokens)
    session_calls = []
    for number in range(sessions):
        context, session = system + span(task_tokens), []
        for turn in range(turns):
            if turn:
                context += span(step_tokens)
            session.append(Call(group=f"session-{number}", prompt=context,
                                session_id=f"s{seed}-{number}",
                                tool_s=rng.uniform(*tool_s) if turn else number * tool_s[0]))
        session_calls.append(tuple(session))
    return LiveWorkload(families=tuple(family_calls), sessions=tuple(session_calls))
