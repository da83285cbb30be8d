"""Fakes for the scheduler's seam objects: vLLM requests and the engine state they read."""

from __future__ import annotations

from typing import Any

import attrs

from integrations.vllm_v1.scheduling.ordering import Tracked
from integrations.vllm_v1.vllm_surface.names import RequestStatus
from policies import LoadSnapshot, RequestMetadata, RequestView


@attrs.define(eq=False, kw_only=True)
class FakeRequest:
    """The members of vLLM's `Request` the seam objects read."""

    request_id: str
    num_prompt_tokens: int = 100
    num_computed_tokens: int = 0
    priority: int = 0
    arrival_time: float = 0.0
    status: Any = RequestStatus.WAITING


def admit(tracked: dict[str, Tracked], request: FakeRequest, *, rank_key: float,
          tenant: str = "t", priority: int = 0,
          deadline_s: float | None = None) -> FakeRequest:
    """Record ``request`` as admitted with ``rank_key`` (as the scheduler's add_request does)."""
    view = RequestView(request_id=request.request_id, arrival_s=request.arrival_time,
                       prompt_tokens=request.num_prompt_tokens, priority=priority,
                       tenant=tenant, deadline_s=deadline_s)
    tracked[request.request_id] = Tracked(RequestMetadata(priority=priority, tenant=tenant),
                                          rank_key, view)
    return request


def view_of(tracked: dict[str, Tracked]):
    """A step's view function over ``tracked``: the admitted view with today's progress."""
    def view(request: FakeRequest) -> RequestView:
        return attrs.evolve(tracked[request.request_id].admitted,
                            computed_tokens=request.num_computed_tokens)
    return view


@attrs.define(eq=False, kw_only=True)
class FakeKVConfig:
    num_blocks: int = 100


@attrs.define(eq=False, kw_only=True)
class FakeKVManager:
    usage: float = 0.0


@attrs.define(eq=False, kw_only=True)
class FakeEngine:
    """`integrations.vllm_v1.scheduling.accounting.EngineState` without vLLM."""

    running: list[FakeRequest] = attrs.field(factory=list)
    requests: dict[str, FakeRequest] = attrs.field(factory=dict)
    block_size: int = 16
    max_num_running_reqs: int = 8
    kv_cache_config: FakeKVConfig = attrs.field(factory=FakeKVConfig)
    kv_cache_manager: FakeKVManager = attrs.field(factory=FakeKVManager)
    waiting_requests: int = 1

    def step_load(self) -> LoadSnapshot:
        return LoadSnapshot(now=0.0, waiting_requests=self.waiting_requests,
                            running_requests=len(self.running),
                            kv_usage=self.kv_cache_manager.usage, token_budget=2048)
