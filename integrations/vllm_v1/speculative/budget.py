"""Applying a `SpeculationBudget` to vLLM's running requests before a step.

vLLM schedules ``request.spec_token_ids`` (the drafts, or under async scheduling the
placeholders for drafts still being made) with the request's decode token; trimming that list
before `Scheduler.schedule` is how the pipeline turns speculation down per class. It changes
which tokens are verified in a step, never the output (drafts are verified by the target model).

Metrics: ``policies:spec_draft_tokens_withheld_total{slo_class}`` (draft tokens the budget
trimmed; ``default`` for requests without a class).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from integrations.vllm_v1.hooks import SchedulerAccess, SchedulerHook
from integrations.vllm_v1.metrics import Series
from policies import LoadSnapshot
from policies.speculative import SpeculationPolicy

DRAFTS_WITHHELD = Series("policies:spec_draft_tokens_withheld",
                         "Draft tokens trimmed by the speculation budget, by SLO class",
                         ("slo_class",), counter=True)


def cap_drafts(running: Iterable[Any], budget: SpeculationPolicy,
               slo_class_of: Callable[[Any], str | None], load: LoadSnapshot | None
               ) -> Counter[str]:
    """Trim each running request's drafts to ``budget.limit(class, load)`` (``load`` None:
    the class caps alone).

    Returns the draft tokens withheld, by class. A trimmed request gets a new list: the async
    scheduler shares one placeholder list between requests, so it is never mutated in place.
    """
    withheld: Counter[str] = Counter()
    for request in running:
        drafts = request.spec_token_ids
        if not drafts:
            continue
        slo_class = slo_class_of(request)
        cap = budget.limit(slo_class, load)
        if len(drafts) > cap:
            withheld[slo_class or ""] += len(drafts) - cap
            request.spec_token_ids = drafts[:cap]
    return withheld


class DraftBudgetHook(SchedulerHook):
    """The pipeline's ``speculation`` slot: `cap_drafts` before every step, withheld tokens
    counted on ``/metrics``."""

    def __init__(self, scheduler: SchedulerAccess, budget: SpeculationPolicy) -> None:
        self.scheduler = scheduler
        self.budget = budget

    def before_schedule(self, now: float) -> None:
        scheduler = self.scheduler
        load = scheduler.step_load() if self.budget.reads_load else None
        withheld = cap_drafts(scheduler.running, self.budget,
                              lambda r: scheduler.tracked_metadata(r).slo_class, load)
        if scheduler.metrics is not None:
            for slo_class, tokens in withheld.items():
                scheduler.metrics.count(DRAFTS_WITHHELD, tokens, slo_class=slo_class or "default")
