"""The live Ray Serve comparison's requests: families share prefixes, sessions grow."""

import pytest

from benchmarks.ray_serve_workload import build_workload

SHAPE = dict(families=3, requests=12, prefix_tokens=40, question_tokens=8, sessions=2, turns=3,
             system_tokens=10, task_tokens=20, step_tokens=5, tool_s=(0.5, 2.0))
TOKENS = list(range(1000))


def test_a_familys_requests_share_its_prefix_and_differ_after_it():
    work = build_workload(TOKENS, seed=1, **SHAPE)
    assert len(work.families) == 12 and all(c.kind == "family" for c in work.families)
    by_family: dict[str, list] = {}
    for call in work.families:
        assert len(call.prompt) == 48 and call.session_id is None
        by_family.setdefault(call.group, []).append(call.prompt)
    for prompts in by_family.values():
        assert len({p[:40] for p in prompts}) == 1


def test_a_sessions_turns_extend_the_previous_turn_and_carry_its_id():
    work = build_workload(TOKENS, seed=1, **SHAPE)
    systems = {turns[0].prompt[:10] for turns in work.sessions}
    assert len(systems) == 1  # one system prompt shared by every session
    for number, turns in enumerate(work.sessions):
        assert [len(t.prompt) for t in turns] == [30, 35, 40]
        assert all(later.prompt[:len(earlier.prompt)] == earlier.prompt
                   for earlier, later in zip(turns, turns[1:], strict=False))
        assert {t.session_id for t in turns} == {f"s1-{number}"}
        assert all(0.5 <= t.tool_s <= 2.0 for t in turns[1:])
    assert len(work.calls()) == 12 + 6


def test_same_seed_same_requests_and_a_too_long_span_is_refused():
    assert build_workload(TOKENS, seed=3, **SHAPE) == build_workload(TOKENS, seed=3, **SHAPE)
    assert build_workload(TOKENS, seed=3, **SHAPE) != build_workload(TOKENS, seed=4, **SHAPE)
    with pytest.raises(ValueError, match="longer than the corpus"):
        build_workload(TOKENS[:30], seed=0, **SHAPE)
