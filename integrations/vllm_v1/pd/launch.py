"""Start an NP:MD disaggregated deployment on this machine: vLLM servers plus the PD router.

`serve_disaggregated` is the entry point:
it applies the PD-aware role presets (`integrations.vllm_v1.config.pd_roles`) and
returns a ready `PDDeployment`. `PDDeployment.start` spawns ``prefill`` +
``decode`` vLLM OpenAI servers (each a `LocalServer` running a `Pipeline`) wired
with a KV connector, and serves a `PDProxy` in front of them from a background
thread. The connector follows the platform: vLLM's shared-storage
``ExampleConnector`` on CPU, ``NixlConnector`` on GPUs (one GPU per instance,
``CUDA_VISIBLE_DEVICES`` = its index in the deployment; not exercised in CI).
``ExampleConnector`` keys stored KV by the prompt's token ids, so the storage
directory is emptied at start (stale files would be reused) and prompts move
whole blocks only: use a small ``--block-size`` (32 on CPU) so short prompts
transfer anything.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs
from aiohttp import web

from integrations.environment import child_environment
from integrations.vllm_v1.config.pd_roles import PD_ROLES, STOCK, PDRole
from integrations.vllm_v1.pd.proxy import PDProxy
from integrations.vllm_v1.pipeline import Pipeline
from integrations.vllm_v1.serving.server import LocalServer
from policies.pd.router import PDRouter


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def example_connector_config(role: str, storage_dir: str | Path) -> str:
    """``--kv-transfer-config`` for vLLM's shared-storage connector (``kv_producer``/``kv_consumer``)."""
    return json.dumps({"kv_connector": "ExampleConnector", "kv_role": role,
                       "kv_connector_extra_config": {"shared_storage_path": str(storage_dir)}})


NIXL_CONNECTOR_CONFIG = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"})
"""``--kv-transfer-config`` for vLLM's NIXL connector (both pools; GPUs only)."""


def runs_on_cpu() -> bool:
    """Whether vLLM's platform here is the CPU (then ``ExampleConnector``, else NIXL)."""
    from integrations.vllm_v1.vllm_surface.names import platform_is_cpu

    return platform_is_cpu()


@attrs.define(eq=False)
class ProxyServer:
    """A `PDProxy` served by aiohttp on its own event loop in a daemon thread."""

    url: str
    _loop: asyncio.AbstractEventLoop
    _runner: web.AppRunner
    _thread: threading.Thread

    @classmethod
    def start(cls, proxy: PDProxy, *, host: str = "127.0.0.1", port: int = 0) -> ProxyServer:
        """Listen on ``host:port`` (0: a free port) and return once it accepts connections."""
        port = port or free_port(host)
        loop = asyncio.new_event_loop()
        runner = web.AppRunner(proxy.app())
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, host, port).start())
        thread = threading.Thread(target=loop.run_forever, name="pd-proxy", daemon=True)
        thread.start()
        return cls(f"http://{host}:{port}", loop, runner, thread)

    def stop(self) -> None:
        """Close connections, stop the loop and join the thread."""
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()


@attrs.define(eq=False)
class PDDeployment:
    """Prefill and decode vLLM servers with the PD router in front; a context manager."""

    servers: dict[str, LocalServer]
    """Instance name (``prefill0``, ``decode0``, ...) -> its server."""
    proxy: PDProxy
    proxy_server: ProxyServer
    storage_dir: Path

    @property
    def url(self) -> str:
        """The router's base URL (OpenAI endpoints under ``/v1``)."""
        return self.proxy_server.url

    @classmethod
    def start(cls, model: str, *, prefill: int = 1, decode: int = 1,
              pipeline: Pipeline | None = None, roles: Mapping[str, PDRole] | None = None,
              router: object | None = None, host: str = "127.0.0.1", port: int = 0,
              storage_dir: str | Path | None = None, vllm_args: Sequence[str] = (),
              log_dir: str | Path | None = None, on_cpu: bool | None = None) -> PDDeployment:
        """Spawn the servers and the router; call `wait_until_healthy` before sending requests.

        Each pool runs ``roles[pool].applied_to(pipeline)`` with that role's engine
        arguments (default: ``pipeline`` unchanged, default identity, on both pools).
        ``router`` defaults to a `PDRouter` over ``prefill0..`` and ``decode0..`` that
        never skips the prefill pool. ``vllm_args`` go to every server after the role's
        (e.g. ``--block-size 32 --max-model-len 512``). ``on_cpu`` (default: vLLM's
        platform here) picks ``ExampleConnector`` over ``NixlConnector``.
        """
        on_cpu = runs_on_cpu() if on_cpu is None else on_cpu
        storage = Path(storage_dir or tempfile.mkdtemp(prefix="pd-kv-"))
        shutil.rmtree(storage, ignore_errors=True)
        storage.mkdir(parents=True)
        logs = Path(log_dir or tempfile.mkdtemp(prefix="pd-logs-"))
        logs.mkdir(parents=True, exist_ok=True)
        pools = {"prefill": [f"prefill{i}" for i in range(prefill)],
                 "decode": [f"decode{i}" for i in range(decode)]}
        connector_roles = {"prefill": "kv_producer", "decode": "kv_consumer"}
        servers: dict[str, LocalServer] = {}
        try:
            for pool, names in pools.items():
                role = (roles or {}).get(pool, STOCK)
                for name in names:
                    connector = (example_connector_config(connector_roles[pool], storage)
                                 if on_cpu else NIXL_CONNECTOR_CONFIG)
                    environment = {} if on_cpu else {
                        "CUDA_VISIBLE_DEVICES": str(len(servers)),
                        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port(host))}
                    with child_environment(environment):
                        servers[name] = LocalServer.start(
                            role.applied_to(pipeline or Pipeline()), model, host=host,
                            port=free_port(host),
                            vllm_args=(*role.vllm_args(), *vllm_args, "--kv-transfer-config",
                                       connector),
                            log_path=str(logs / f"{name}.log"))
            router = router or PDRouter(prefill=pools["prefill"], decode=pools["decode"],
                                        block_size_tokens=16, skip_prefill_max_tokens=0)
            proxy = PDProxy(prefill_urls={n: servers[n].url for n in pools["prefill"]},
                            decode_urls={n: servers[n].url for n in pools["decode"]},
                            router=router)
            proxy_server = ProxyServer.start(proxy, host=host, port=port)
        except BaseException:
            for server in servers.values():
                server.stop()
            raise
        return cls(servers, proxy, proxy_server, storage)

    def wait_until_healthy(self, timeout_s: float = 300.0) -> None:
        """Block until every vLLM server answers ``/health``, then the router's too (its
        health checks may still hold a server down that just came up).

        Raises:
            TimeoutError: if the router is not healthy within ``timeout_s`` of the servers.
        """
        for server in self.servers.values():
            server.wait_until_healthy(timeout_s)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=10) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"the PD router at {self.url} is not healthy after "
                                   f"{timeout_s:.0f} s")
            time.sleep(0.5)

    def stop(self) -> None:
        """Stop the router, then every server; remove the KV storage directory."""
        try:
            self.proxy_server.stop()
        finally:
            for server in self.servers.values():
                server.stop()
            shutil.rmtree(self.storage_dir, ignore_errors=True)

    def __enter__(self) -> PDDeployment:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def serve_disaggregated(pipeline: Pipeline, model: str, *, prefill: int = 1, decode: int = 1,
                        roles: Mapping[str, PDRole] = PD_ROLES, timeout_s: float = 300.0,
                        **options: object) -> PDDeployment:
    """``prefill`` + ``decode`` vLLM servers running ``pipeline`` with the PD-aware role
    presets, and the PD router in front; returns once every server and the router are healthy.

    ``roles`` maps ``"prefill"``/``"decode"`` to a `PDRole` (default `PD_ROLES`); the
    other ``options`` go to `PDDeployment.start` (``vllm_args``, ``port``, ``router``,
    ``storage_dir``, ``log_dir``, ...). Use the result as a context manager, or call
    ``stop()``; if the deployment does not become healthy it is stopped and the error raised.
    """
    deployment = PDDeployment.start(model, prefill=prefill, decode=decode, pipeline=pipeline,
                                    roles=roles, **options)
    try:
        deployment.wait_until_healthy(timeout_s)
    except BaseException:
        deployment.stop()
        raise
    return deployment
