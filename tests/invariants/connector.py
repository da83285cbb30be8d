"""`ScriptedConnector`: a scheduler-side KV connector whose remote cache is scripted by
request id, so the invariant tests can drive vLLM's remote-KV paths with no worker.

* ``remote-*`` requests: every full block of the prompt but the last token is offered
  as an *asynchronous* load, once per request (the request waits in
  ``WAITING_FOR_REMOTE_KVS`` holding its blocks until the test reports the load);
* ``syncload-*`` requests: the same prefix offered as a *synchronous* load (the blocks
  count as computed in the step that allocates them; a failure is reported as
  ``invalid_block_ids`` after that step);
* anything else: no external tokens.

The test plays the worker: it reads `ScriptedConnector.loading` and reports
``finished_recving`` / ``failed_recving`` / ``invalid_block_ids`` in the model output.
"""

from __future__ import annotations

from typing import Any

from integrations.vllm_v1.vllm_surface.names import KVConnectorBase_V1, KVConnectorMetadata

NAME = "InvariantsScriptedConnector"
ASYNC_PREFIX = "remote-"
SYNC_PREFIX = "syncload-"


def register() -> None:
    """Make ``kv_connector: InvariantsScriptedConnector`` load this class."""
    from integrations.vllm_v1.vllm_surface.names import register_kv_connector

    register_kv_connector(NAME, __name__, "ScriptedConnector")


class ScriptedConnector(KVConnectorBase_V1):
    """Offers each ``remote-``/``syncload-`` request its block-aligned prompt prefix once."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self.block_size = vllm_config.cache_config.block_size
        self.offered: set[str] = set()
        self.loading: dict[str, list[int]] = {}
        """Asynchronous loads in flight: request id -> the block ids being loaded into."""
        self.sync_loaded: dict[str, list[int]] = {}
        """Synchronous loads of the last step: request id -> block ids loaded into."""
        self.finished: list[str] = []
        """Requests `request_finished` was called for, in order."""

    # -- scheduler side ---------------------------------------------------------

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int
                                   ) -> tuple[int, bool]:
        request_id = request.request_id
        is_async = request_id.startswith(ASYNC_PREFIX)
        if request_id in self.offered or not (is_async or request_id.startswith(SYNC_PREFIX)):
            return 0, False
        prefix = (request.num_prompt_tokens - 1) // self.block_size * self.block_size
        tokens = prefix - num_computed_tokens
        if tokens <= 0:
            return 0, False
        self.offered.add(request_id)
        return tokens, is_async

    def update_state_after_alloc(self, request: Any, blocks: Any,
                                 num_external_tokens: int) -> None:
        if num_external_tokens <= 0:
            return
        (block_ids,) = blocks.get_block_ids()
        if request.request_id.startswith(ASYNC_PREFIX):
            self.loading[request.request_id] = list(block_ids)
        else:
            self.sync_loaded[request.request_id] = list(block_ids)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        return KVConnectorMetadata()

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, None]:
        self.finished.append(request.request_id)
        return False, None

    # -- worker side (never called: there is no worker) -------------------------

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        raise AssertionError("no worker in the invariant tests")

    def wait_for_layer_load(self, layer_name: str) -> None:
        raise AssertionError("no worker in the invariant tests")

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any,
                      **kwargs: Any) -> None:
        raise AssertionError("no worker in the invariant tests")

    def wait_for_save(self) -> None:
        raise AssertionError("no worker in the invariant tests")
