"""`SuffixDrafter`, `DraftConfig`, `SpeculationBudget` and `SpecMetrics`."""

import pytest

from policies.speculative import (
    DraftConfig,
    DraftSource,
    SharedSuffixCache,
    SpecMetrics,
    SpeculationBudget,
    SuffixDrafter,
)

LOOP = [5, 6, 7, 8, 9, 10, 11, 12]


def test_drafts_the_continuation_of_a_repeat_in_the_request():
    drafter = SuffixDrafter(config=DraftConfig(max_draft_tokens=16))
    drafter.start("r", LOOP + [1, 2])
    drafter.extend("r", [5, 6, 7])
    draft = drafter.propose("r")
    assert draft.source is DraftSource.REQUEST
    assert draft.match_tokens == 3
    # The earlier occurrence's continuation, up to where the text ends ("... 1 2 5 6 7").
    assert draft.tokens == (8, 9, 10, 11, 12, 1, 2, 5, 6, 7)
    assert draft.score == pytest.approx(10.0)
    drafter.check_invariants()


def test_adaptive_length_and_minimum_match_gate():
    config = DraftConfig(max_draft_tokens=32, match_scale=1.0, match_offset_tokens=1.0,
                         min_match_tokens=2)
    assert config.length_cap(1, 32) == 0
    assert config.length_cap(2, 32) == 3
    assert config.length_cap(100, 5) == 5
    drafter = SuffixDrafter(config=config)
    drafter.start("r", LOOP + [5, 6])
    assert drafter.propose("r").tokens == (7, 8, 9)


def test_finished_outputs_feed_other_requests_through_the_shared_cache():
    drafter = SuffixDrafter(shared=SharedSuffixCache(max_tokens=1000))
    drafter.start("a", [1, 2, 3])
    drafter.extend("a", LOOP)
    drafter.finish("a")
    drafter.start("b", [40, 41, 5, 6, 7])
    draft = drafter.propose("b")
    assert draft.source is DraftSource.SHARED
    assert draft.tokens[:5] == (8, 9, 10, 11, 12)
    stats = drafter.stats()
    assert stats.shared.outputs_added == 1 and stats.shared.tokens == len(LOOP) + 1
    assert stats.drafts_from_shared == 1 and stats.active_requests == 1
    drafter.check_invariants()


def test_the_prompt_is_not_shared_and_abort_shares_nothing():
    drafter = SuffixDrafter(shared=SharedSuffixCache(max_tokens=1000))
    drafter.start("a", LOOP)
    drafter.finish("a")
    drafter.start("b", LOOP)
    drafter.extend("b", [1])
    drafter.abort("b")
    assert drafter.stats().shared.outputs_added == 0


def test_budget_caps_drafts_per_class():
    budget = SpeculationBudget(default_max_draft_tokens=4)
    drafter = SuffixDrafter(budget=budget)
    drafter.start("gold", LOOP + [5, 6], slo_class="gold")
    drafter.start("bronze", LOOP + [5, 6], slo_class="bronze")
    budget.set_limit("bronze", 0)
    assert len(drafter.propose("gold").tokens) == 4
    assert drafter.propose("bronze").tokens == ()
    budget.clear("bronze")
    assert len(drafter.propose("bronze", max_tokens=2).tokens) == 2
    assert budget.stats().limits == ()
    with pytest.raises(ValueError, match="max_draft_tokens must be >= 0"):
        budget.set_limit("gold", -1)


def test_lifecycle_misuse_raises_precise_errors():
    drafter = SuffixDrafter()
    drafter.start("r", [1])
    with pytest.raises(KeyError, match="already active"):
        drafter.start("r", [1])
    with pytest.raises(KeyError, match="not active"):
        drafter.propose("x")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"max_draft_tokens": 0}, "max_draft_tokens must be >= 1"),
    ({"min_token_prob": 1.5}, "min_token_prob must be in \\[0, 1\\]"),
    ({"match_scale": -1.0}, "match_scale must be >= 0"),
])
def test_config_validates(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DraftConfig(**kwargs)


def test_spec_metrics_definitions():
    metrics = SpecMetrics(max_positions=4)
    metrics.record(4, 2)   # 3 emitted
    metrics.record(0, 0)   # no draft, 1 emitted
    metrics.record(2, 2, emitted_tokens=2)  # end of sequence: no bonus token
    stats = metrics.stats()
    assert (stats.steps, stats.draft_steps, stats.emitted_tokens) == (3, 2, 6)
    assert stats.tau == pytest.approx(2.0)
    assert stats.tau_d == pytest.approx(1 + 4 / 2)
    assert stats.acceptance_rate == pytest.approx(4 / 6)
    assert stats.coverage == pytest.approx(2 / 3)
    assert stats.accepted_by_position == (1.0, 1.0, 0.0, 0.0)
    metrics.check_invariants()
    with pytest.raises(ValueError, match="accepted_tokens <= drafted_tokens"):
        metrics.record(1, 2)
