"""The workloads the benchmarks replay by name, and the tenant weights they assume.

The library knows no tenant names: presets that weigh tenants take their weights
as an argument. These are the weights of the built-in workloads' tenants.
"""

from __future__ import annotations

import os
import re

from benchmarks.replay.agent_sessions import PROFILES, agent_trace
from benchmarks.replay.datasets import BUILTIN_TRACES, _read_trace
from benchmarks.replay.enterprise import enterprise_trace
from benchmarks.replay.reasoning import reasoning_trace
from benchmarks.replay.trace import Trace

TENANT_WEIGHTS = {
    # `--tenants servegen` tiers (`assign_servegen_tenants`): Gold t0-t1, Silver t2-t4, Bronze t5-t6
    "t0": 4.0, "t1": 4.0, "t2": 2.0, "t3": 2.0, "t4": 2.0, "t5": 1.0, "t6": 1.0,
    # the `enterprise` workload's tenants
    "acme-bank": 4.0, "globex-health": 4.0, "initech": 2.0, "umbrella": 2.0, "hooli": 2.0,
    "piedpiper": 1.0, "vandelay": 1.0,
}
"""Gold 4, Silver 2, Bronze 1 for the tenants of the built-in workloads; others weigh 1."""

AGENT_WORKLOADS = {f"agent-{name}": name for name in PROFILES}
"""Generated agent-session workloads (`benchmarks.replay.agent_sessions`), seed 0, 3,000 calls
unless ``max_requests`` says otherwise."""
WORKLOADS = (*BUILTIN_TRACES, "enterprise", "reasoning", *AGENT_WORKLOADS)
"""Names `load_workload` accepts besides file paths (and ``agent-<profile>-seed<N>``)."""
_AGENT_SEEDED = re.compile(r"(?P<name>agent-[a-z-]+)-seed(?P<seed>[0-9]+)")
"""A generated agent-session workload with another seed, e.g. ``agent-swe-seed4``."""


def load_workload(name_or_path: str | os.PathLike[str], *, format: str = "auto",
                  max_requests: int | None = None) -> Trace:
    """The one way to load a trace: a built-in trace (`BUILTIN_TRACES`), the synthetic
    ``enterprise`` workload, a generated agent-session workload (``agent-swe``,
    ``agent-bfcl``; ``agent-swe-seed4`` for another seed than 0), the ServeGen ``reasoning``
    workload (`reasoning_trace`, seed 0, 3,000 requests unless ``max_requests`` says
    otherwise), or a trace file in any supported format.

    Args:
        name_or_path: one of `WORKLOADS` or a file path.
        format: for a file or built-in trace: "auto" (sniff it), "jsonl" (canonical),
            "azure" or "mooncake".
        max_requests: keep only the first this many requests by arrival.

    Raises:
        ValueError: for an unknown name or missing file (listing the built-in names), a
            bad ``format`` or ``max_requests``, or a bad file (`TraceFormatError`).
    """
    if name_or_path in AGENT_WORKLOADS:
        return agent_trace(AGENT_WORKLOADS[name_or_path], num_requests=max_requests or 3000)
    if (seeded := _AGENT_SEEDED.fullmatch(str(name_or_path))) and (
            seeded["name"] in AGENT_WORKLOADS):
        return agent_trace(AGENT_WORKLOADS[seeded["name"]], num_requests=max_requests or 3000,
                           seed=int(seeded["seed"]))
    if name_or_path == "reasoning":
        return reasoning_trace(max_requests or 3000)
    if name_or_path == "enterprise":
        trace = enterprise_trace()
        return trace if max_requests is None else trace.head(max_requests)
    return _read_trace(name_or_path, format=format, max_requests=max_requests)
