"""`PolicyFaults`: a policy that raises inside a step does not take the engine down.

Every place where `PolicyScheduler` asks a policy or a hook for a decision is a
*seam* (``admission``, ``ranking``, ``levels``, ``pre_step``, ``token_cap``,
``fairness``, ``accounting``, ``observers``, ``metrics``, ``eviction``, and each hook
point by its name: ``on_arrival``, ``on_admitted``, ``on_rejected``,
``before_schedule``, ``after_schedule``, ``before_update``, ``releasing``,
``pending``, ``refresh_metrics``, ``shutdown``). An exception there, or an invalid
answer (a rank key or level that is None, NaN or not a number), is caught, counted
(``policies:policy_faults_total{policy,seam,exception}``, and `PolicyFaults.errors` keeps the
last exception of each), logged once per policy and seam with the exception and its
traceback, and the decision falls back to what stock vLLM would do: admit, arrival
order, no cap, no reordering, no accounting, LRU for an eviction. Requests are never
dropped by a fault.

Not contained: vLLM itself.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from integrations.vllm_v1.metrics import PolicyMetrics

_LOG = logging.getLogger("vllm.llm_serving_policies")


class PolicyFaults:
    """Counts, names and logs policy exceptions; the scheduler applies the fallbacks."""

    def __init__(self, policies: Iterable[object], metrics: PolicyMetrics | None = None) -> None:
        self._names = {id(p): type(p).__name__ for p in policies}
        self.metrics = metrics
        self.counts: Counter[tuple[str, str]] = Counter()
        """(policy, seam) -> faults so far."""
        self.errors: dict[tuple[str, str], str] = {}
        """(policy, seam) -> the last exception there (``repr``)."""

    def add(self, objects: Iterable[object]) -> None:
        """Also name these (e.g. the hooks) when they raise."""
        self._names.update((id(o), type(o).__name__) for o in objects)

    def record(self, seam: str, error: BaseException, source: object = None) -> None:
        """``error`` was raised at ``seam``: count it under the policy that raised it
        (``source``, when the traceback cannot show it: an invalid return value)."""
        policy = self.culprit(error)
        if policy == "unknown" and source is not None:
            policy = self._names.get(id(source), type(source).__name__)
        key = (policy, seam)
        self.counts[key] += 1
        self.errors[key] = repr(error)
        if self.counts[key] == 1:
            _LOG.error("policy %s raised at %s: %r; falling back to stock behaviour there "
                       "(logged once, counted in policies:policy_faults_total)", policy, seam,
                       error, exc_info=error)
        if self.metrics is not None:
            self.metrics.policy_fault(policy, seam, type(error).__name__)

    def culprit(self, error: BaseException) -> str:
        """The innermost pipeline object on ``error``'s traceback (``unknown`` if none)."""
        name, tb = "unknown", error.__traceback__
        while tb is not None:
            owner = tb.tb_frame.f_locals.get("self")
            name = self._names.get(id(owner), name)
            tb = tb.tb_next
        return name
