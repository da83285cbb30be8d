"""Prefill/decode disaggregation: where a request runs and when a decode instance starts it.

The router and its prefix index, the prefill/decode planner and the decode instance's start
gates. Modules: `index`, `planner`, `router`, `scheduling`. Every name here is also exported by
`policies`.
"""

from policies.pd.planner import PDPlan, PDPlanner
from policies.pd.router import (
    InstanceLoad,
    LeastLoadedRouter,
    PDRouter,
    PDRouterStats,
    PrefixIndex,
    RoundRobinRouter,
    RouteDecision,
    RouteReason,
    chain_keys,
)
from policies.pd.scheduling import DecodeKVGate, DecodeStepGate, DecodeStepGateStats, StartGate

__all__ = [
    "DecodeKVGate",
    "DecodeStepGate",
    "DecodeStepGateStats",
    "InstanceLoad",
    "LeastLoadedRouter",
    "PDPlan",
    "PDPlanner",
    "PDRouter",
    "PDRouterStats",
    "PrefixIndex",
    "RoundRobinRouter",
    "RouteDecision",
    "RouteReason",
    "StartGate",
    "chain_keys",
]
