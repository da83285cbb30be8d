"""vLLM's OpenAI server with a `Pipeline`: argv builder and a child-process handle."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import attrs

from integrations.vllm_v1.config.declarative import PipelineConfigError
from integrations.vllm_v1.config.spec import CONFIG_KEY
from integrations.vllm_v1.metrics import MULTIPROC_ENV
from integrations.vllm_v1.pipeline import Pipeline
from integrations.vllm_v1.serving.engine import engine_kwargs
from integrations.vllm_v1.serving.rejection_channel import (
    CHANNEL_KEY,
    HOOK_PATH,
    new_channel_address,
)
from integrations.vllm_v1.serving.tenants import TenantBinding

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
MIDDLEWARE = ("integrations.vllm_v1.serving.middleware.PolicyMiddleware",)
"""The ``--middleware`` paths (`integrations.vllm_v1.serving.middleware`: one)."""
_ADDITIONAL = "--additional-config"
METRICS_DIR_PREFIX = "policies-metrics-"
KV_SPACE_ENV = "VLLM_CPU_KVCACHE_SPACE"


def server_args(pipeline: Pipeline, model: str, *, host: str, port: int,
                vllm_args: tuple[str, ...] = ()) -> list[str]:
    """Arguments for ``python -m vllm.entrypoints.openai.api_server`` running ``pipeline``.

    Besides the scheduler and the middleware, our config entry gets the rejection
    channel (a fresh address and its hook, `integrations.vllm_v1.serving.rejection_channel`).
    An ``--additional-config`` in ``vllm_args`` is merged into ours (its keys win, its
    ``hooks`` are added), not left to replace it; the serving keys of the merged entry
    (tenants, gateway) are checked here, so a bad one fails before the server starts.

    Raises:
        PipelineConfigError: a bad ``--additional-config`` or serving configuration.
    """
    async_flag = "--async-scheduling" in vllm_args or None
    if "--no-async-scheduling" in vllm_args:
        async_flag = False
    theirs, vllm_args = _pop_additional_configs(vllm_args)
    kwargs = engine_kwargs(pipeline, async_scheduling=async_flag)
    additional = kwargs["additional_config"]
    for other in theirs:
        additional = _merged(additional, other)
    entry = additional[CONFIG_KEY]
    entry.setdefault(CHANNEL_KEY, new_channel_address())
    entry["hooks"] = list(dict.fromkeys([*entry.get("hooks", ()), HOOK_PATH]))
    TenantBinding.from_entry(additional[CONFIG_KEY])
    return [
        "--model", model, "--host", host, "--port", str(port),
        "--scheduler-cls", kwargs["scheduler_cls"],
        _ADDITIONAL, json.dumps(additional),
        *(arg for path in MIDDLEWARE for arg in ("--middleware", path)),
        *vllm_args,
    ]


def _pop_additional_configs(vllm_args: tuple[str, ...]) -> tuple[list[dict], tuple[str, ...]]:
    """The ``--additional-config`` values in ``vllm_args``, parsed, and the other arguments."""
    found: list[dict] = []
    rest: list[str] = []
    args = iter(vllm_args)
    for arg in args:
        if arg == _ADDITIONAL or arg.startswith(_ADDITIONAL + "="):
            text = arg.partition("=")[2] if "=" in arg else next(args, "")
            try:
                value = json.loads(text)
            except ValueError as error:
                raise PipelineConfigError(f"{_ADDITIONAL} is not JSON ({error})") from None
            if not isinstance(value, dict):
                raise PipelineConfigError(f"{_ADDITIONAL} must be a JSON object")
            found.append(value)
        else:
            rest.append(arg)
    return found, tuple(rest)


def _merged(ours: dict, theirs: dict) -> dict:
    """``theirs`` over ``ours``; our entries merged key by key, their ``hooks`` added."""
    entry = dict(ours[CONFIG_KEY])
    other = theirs.get(CONFIG_KEY) or {}
    if not isinstance(other, dict):
        raise PipelineConfigError(f"{_ADDITIONAL}: {CONFIG_KEY} must be a mapping")
    hooks = [*entry.get("hooks", ()), *other.get("hooks", ())]
    entry.update(other)
    entry["hooks"] = list(dict.fromkeys(hooks))
    return {**ours, **theirs, CONFIG_KEY: entry}


def offline_env(server_argv: Sequence[str] = ()) -> dict[str, str]:
    """This process's environment for a child server: hub off, our ``sys.path``, sized CPU KV.

    ``VLLM_CPU_KVCACHE_SPACE`` (GiB, CPU builds only) defaults to 1 unless already set,
    since vLLM would otherwise reserve most of the machine's memory. When the server's
    arguments ``server_argv`` (those after ``-m vllm.entrypoints.openai.api_server``) size
    the KV cache (``--kv-cache-memory-bytes``, in any spelling vLLM reads) the variable is
    left out, even if set here: vLLM's CPU platform lets it override the flag.
    """
    env = {KV_SPACE_ENV: "1", **os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    if server_argv and _sizes_kv_cache(server_argv):
        env.pop(KV_SPACE_ENV)
    return env


def _sizes_kv_cache(server_argv: Sequence[str]) -> bool:
    """Whether vLLM reads a KV cache size from the server arguments ``server_argv``."""
    from integrations.vllm_v1.vllm_surface.names import parse_serve_args

    quiet = io.StringIO()
    try:
        with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
            return parse_serve_args(list(server_argv)).kv_cache_memory_bytes is not None
    except (SystemExit, Exception):  # noqa: BLE001 - the server reports its own arguments
        return False


def new_metrics_dir() -> str | None:
    """A fresh ``PROMETHEUS_MULTIPROC_DIR`` for a child server, unless the caller set one.

    With it, the server's ``/metrics`` also shows what the pipeline decides (see
    `integrations.vllm_v1.metrics`). The caller removes the directory after the server
    exits; one whose creator died without removing it (``kill -9``) is removed here. The
    creator's process id is in the name (``policies-metrics-<pid>-*``).
    """
    if os.environ.get(MULTIPROC_ENV):
        return None
    for stale in Path(tempfile.gettempdir()).glob(f"{METRICS_DIR_PREFIX}*-*"):
        pid = stale.name.removeprefix(METRICS_DIR_PREFIX).partition("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{METRICS_DIR_PREFIX}{os.getpid()}-")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def server_env(metrics_dir: str | None, server_argv: Sequence[str] = ()) -> dict[str, str]:
    """`offline_env` for ``server_argv`` plus the metrics directory, if any."""
    return {**offline_env(server_argv), **({MULTIPROC_ENV: metrics_dir} if metrics_dir else {})}


@attrs.define(eq=False)
class LocalServer:
    """A vLLM OpenAI server in a child process; a context manager that stops it on exit."""

    process: subprocess.Popen
    url: str
    log_path: Path
    metrics_dir: str | None = None
    """The multiprocess metrics directory this handle created (removed by `stop`)."""

    @classmethod
    def start(cls, pipeline: Pipeline, model: str, *, host: str = "127.0.0.1", port: int = 8000,
              vllm_args: tuple[str, ...] = (), log_path: str | None = None) -> LocalServer:
        """Spawn the server; call `wait_until_healthy` before sending requests."""
        log = Path(log_path) if log_path else Path(tempfile.mkstemp(suffix=".log")[1])
        args = server_args(pipeline, model, host=host, port=port, vllm_args=vllm_args)
        metrics_dir = new_metrics_dir()
        with open(log, "wb") as sink:
            process = subprocess.Popen([sys.executable, "-m", API_SERVER_MODULE, *args],
                                       stdout=sink, stderr=subprocess.STDOUT,
                                       env=server_env(metrics_dir, args), start_new_session=True)
        return cls(process, f"http://{host}:{port}", log, metrics_dir)

    def wait_until_healthy(self, timeout_s: float = 300.0) -> None:
        """Block until ``/health`` answers 200; raise with the log's tail if the server dies."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}:\n"
                                   f"{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)
        raise TimeoutError(f"server not healthy after {timeout_s} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        """The last lines the server printed."""
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout_s: float = 30.0) -> None:
        """Terminate the server (and its engine process), killing it if it lingers."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, 15)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, 9)
                self.process.wait()
        if self.metrics_dir:
            shutil.rmtree(self.metrics_dir, ignore_errors=True)

    def __enter__(self) -> LocalServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def serve(pipeline: Pipeline, model: str, *, host: str = "127.0.0.1", port: int = 8000,
          vllm_args: tuple[str, ...] = (), log_path: str | None = None) -> LocalServer:
    """Start vLLM's OpenAI server with ``pipeline`` in a child process (`LocalServer.start`)."""
    return LocalServer.start(pipeline, model, host=host, port=port, vllm_args=vllm_args,
                             log_path=log_path)
