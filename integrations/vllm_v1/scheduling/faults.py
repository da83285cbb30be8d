"""`PolicyFaults`: a policy that raises inside a step does not take the engine down.

Every place where `PolicyScheduler` asks a policy or a hook for a decision is a
*seam* (``admission``, ``ranking``, ``levels``, ``pre_step``, ``token_cap``,
``fairness``, ``accounting``, ``observers``, ``hooks``, ``metrics``). An exception
there is caught, counted (``policies:policy_faults_total{policy,seam}``), logged
once per policy and seam with its traceback, and the decision falls back to what
stock vLLM would do: admit, arrival order, no cap, no reordering, no accounting.
Requests are never dropped by a fault.

Not contained: an eviction order (`PolicyFreeBlockQueue` must keep exact block
counts inside vLLM's allocator, so its failure is vLLM's failure) and vLLM itself.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from typing import Any

_LOG = logging.getLogger("vllm.llm_serving_policies")


class PolicyFaults:
    """Counts, names and logs policy exceptions; the scheduler applies the fallbacks."""

    def __init__(self, policies: Iterable[object], metrics: Any = None) -> None:
        self._names = {id(p): type(p).__name__ for p in policies}
        self.metrics = metrics
        self.counts: Counter[tuple[str, str]] = Counter()
        """(policy, seam) -> faults so far."""

    def add(self, objects: Iterable[object]) -> None:
        """Also name these (e.g. the hooks) when they raise."""
        self._names.update((id(o), type(o).__name__) for o in objects)

    def record(self, seam: str, error: BaseException) -> None:
        """``error`` was raised at ``seam``: count it under the policy that raised it."""
        policy = self.culprit(error)
        key = (policy, seam)
        self.counts[key] += 1
        if self.counts[key] == 1:
            _LOG.error("policy %s raised at %s; falling back to stock behaviour there (logged "
                       "once, counted in policies:policy_faults_total)", policy, seam,
                       exc_info=error)
        if self.metrics is not None:
            self.metrics.policy_fault(policy, seam)

    def culprit(self, error: BaseException) -> str:
        """The innermost pipeline object on ``error``'s traceback (``unknown`` if none)."""
        name, tb = "unknown", error.__traceback__
        while tb is not None:
            owner = tb.tb_frame.f_locals.get("self")
            name = self._names.get(id(owner), name)
            tb = tb.tb_next
        return name
