"""Model-free speculative decoding with suffix automata (pure Python + numba kernels).

- `SuffixAutomaton`: online automaton over token ids, amortised O(1) per token.
- `SharedSuffixCache`: cross-request automata bounded by tokens, generation eviction.
- `SuffixDrafter`: per-request drafting from both, adaptive length, best score wins.
- `SpeculationBudget`: per-class draft caps; `SpecMetrics`: tau, acceptance, coverage.
"""

from policies.speculative.automaton import AutomatonStats, SuffixAutomaton
from policies.speculative.budget import (
    SpeculationBudget,
    SpeculationBudgetStats,
    SpeculationPolicy,
)
from policies.speculative.drafter import (
    Draft,
    DraftConfig,
    DrafterStats,
    DraftSource,
    SuffixDrafter,
)
from policies.speculative.metrics import SpecMetrics, SpecMetricsStats
from policies.speculative.shared import SharedCacheStats, SharedSuffixCache

__all__ = [
    "AutomatonStats",
    "Draft",
    "DraftConfig",
    "DraftSource",
    "DrafterStats",
    "SharedCacheStats",
    "SharedSuffixCache",
    "SpecMetrics",
    "SpecMetricsStats",
    "SpeculationBudget",
    "SpeculationBudgetStats",
    "SpeculationPolicy",
    "SuffixAutomaton",
    "SuffixDrafter",
]
