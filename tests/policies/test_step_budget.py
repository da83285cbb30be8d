"""`StepPrefillBudget`: one step's prefill chunks stay within the bound while a protected
request decodes, and only then."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import LoadSnapshot, RequestView, StepPrefillBudget


def load(now=0.0):
    return LoadSnapshot(now=now, waiting_requests=1, running_requests=1, kv_usage=0.2,
                        token_budget=8192)


def view(request_id, prompt_tokens, computed_tokens=0, priority=0):
    return RequestView(request_id=request_id, arrival_s=0.0, prompt_tokens=prompt_tokens,
                       computed_tokens=computed_tokens, priority=priority)


def decoding(budget, request_id="chat", priority=0):
    """Make ``request_id`` a decoding request: its whole prompt in one chunk."""
    budget.on_scheduled(view(request_id, 100, priority=priority), 100, 0.0)


def test_no_bound_while_nothing_protected_decodes():
    budget = StepPrefillBudget(max_prefill_tokens=1024)
    assert budget.token_cap(view("rag", 20000), load()) is None


def test_one_steps_chunks_share_the_bound_and_the_next_step_starts_afresh():
    budget = StepPrefillBudget(max_prefill_tokens=1024, interactive_prompt_tokens=0)
    decoding(budget)
    step = load()
    assert budget.token_cap(view("a", 20000), step) == 1024
    assert budget.token_cap(view("b", 20000), step) == 0, "the bound is spent"
    assert budget.token_cap(view("a", 20000), load(0.05)) == 1024, "a new step"
    assert budget.stats().bounded_steps == 2


def test_a_chunk_smaller_than_the_bound_leaves_the_rest_to_others():
    budget = StepPrefillBudget(max_prefill_tokens=1024, interactive_prompt_tokens=0)
    decoding(budget)
    step = load()
    assert budget.token_cap(view("a", 300), step) == 1024
    assert budget.token_cap(view("b", 20000), step) == 1024 - 300


def test_interactive_prompts_are_never_capped_but_count_against_the_bound():
    budget = StepPrefillBudget(max_prefill_tokens=1024, interactive_prompt_tokens=512)
    decoding(budget)
    step = load()
    assert budget.token_cap(view("chat", 400), step) is None
    assert budget.token_cap(view("rag", 20000), step) == 1024 - 400


def test_only_protected_priorities_turn_the_bound_on():
    budget = StepPrefillBudget(max_prefill_tokens=1024, protected_priority_at_most=-1)
    decoding(budget, "bronze", priority=1)
    assert budget.token_cap(view("rag", 20000), load()) is None
    decoding(budget, "gold", priority=-1)
    assert budget.token_cap(view("rag", 20000), load(1.0)) == 1024
    budget.on_finished(view("gold", 100, priority=-1), 2.0)
    assert budget.token_cap(view("rag", 20000), load(2.0)) is None
    assert budget.stats().protected_decoding == 0


def test_a_prefill_chunk_that_does_not_finish_the_prompt_does_not_start_decoding():
    budget = StepPrefillBudget()
    budget.on_scheduled(view("rag", 20000), 1024, 0.0)
    assert budget.stats().protected_decoding == 0


@settings(max_examples=100, deadline=None)
@given(bound=st.integers(1, 4096), interactive=st.integers(0, 1024),
       prompts=st.lists(st.tuples(st.integers(1, 20000), st.integers(0, 19999)), max_size=30))
def test_capped_grants_of_a_step_never_exceed_the_bound_minus_interactive_grants(
        bound, interactive, prompts):
    budget = StepPrefillBudget(max_prefill_tokens=bound, interactive_prompt_tokens=interactive)
    decoding(budget)
    step = load()
    spent = 0
    for i, (prompt, computed) in enumerate(prompts):
        remaining = max(prompt - computed, 0)
        cap = budget.token_cap(view(f"r{i}", prompt, min(computed, prompt)), step)
        if cap is None:
            assert remaining <= interactive
            spent += remaining
        else:
            assert cap == max(bound - spent, 0)
            spent += min(cap, remaining)
    budget.check_invariants()


def test_bad_configuration_is_rejected():
    with pytest.raises(ValueError, match="max_prefill_tokens must be >= 1"):
        StepPrefillBudget(max_prefill_tokens=0)
    with pytest.raises(ValueError, match="interactive_prompt_tokens must be >= 0"):
        StepPrefillBudget(interactive_prompt_tokens=-1)
