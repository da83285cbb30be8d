"""Block chains for traces that carry no prefix hashes (the Azure traces), by a stated model.

``enterprise``: the prefix model of the synthetic ``enterprise`` workload
(`benchmarks.replay.enterprise`) applied to every request of a real trace. Each request
gets one of seven tenants with the rate mix of real ServeGen clients
(`benchmarks.replay.datasets.assign_servegen_tenants`, seeded) and opens with its tenant's
512-token system prompt; the rest of its prompt (the trace's ``prompt_tokens``) is its own.
Blocks are the replay's 16-token blocks, so every prompt block is in the chain and the
hit rate counts all of them.
"""

from __future__ import annotations

from benchmarks.replay.datasets import assign_servegen_tenants
from benchmarks.replay.enterprise import BLOCK_SIZE, SYSTEM_PROMPT_BLOCKS
from benchmarks.replay.trace import Trace

PREFIX_MODELS = ("enterprise",)


def enterprise_chains(trace: Trace, *, seed: int = 0) -> list[tuple[int, ...]]:
    """One block chain per request: its tenant's system prompt, then blocks of its own.

    Keys of the system prompts are positive, a request's own blocks negative, so they
    never collide.
    """
    tenants = assign_servegen_tenants(trace, seed=seed)
    names = sorted({request.tenant for request in tenants.requests})
    chains = []
    for index, request in enumerate(tenants.requests):
        first = (names.index(request.tenant) + 1) * 1_000_000
        system = tuple(range(first, first + SYSTEM_PROMPT_BLOCKS))
        own_blocks = -(-request.prompt_tokens // BLOCK_SIZE)
        start = -(index + 1) * 1_000_000
        chains.append(system + tuple(range(start, start - own_blocks, -1)))
    return chains
