"""vLLM's OpenAI server with a `Pipeline`: argv builder and a child-process handle."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import attrs

from integrations.vllm_v1.metrics import MULTIPROC_ENV
from integrations.vllm_v1.pipeline import Pipeline
from integrations.vllm_v1.serving.engine import engine_kwargs

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
MIDDLEWARE = ("integrations.vllm_v1.serving.http_validation.SchedulingMetadataValidator",
              "integrations.vllm_v1.serving.http_status.RejectionStatusMiddleware")


def server_args(pipeline: Pipeline, model: str, *, host: str, port: int,
                vllm_args: tuple[str, ...] = ()) -> list[str]:
    """Arguments for ``python -m vllm.entrypoints.openai.api_server`` running ``pipeline``."""
    async_flag = "--async-scheduling" in vllm_args or None
    if "--no-async-scheduling" in vllm_args:
        async_flag = False
    kwargs = engine_kwargs(pipeline, async_scheduling=async_flag)
    return [
        "--model", model, "--host", host, "--port", str(port),
        "--scheduler-cls", kwargs["scheduler_cls"],
        "--additional-config", json.dumps(kwargs["additional_config"]),
        *(arg for path in MIDDLEWARE for arg in ("--middleware", path)),
        *vllm_args,
    ]


def offline_env() -> dict[str, str]:
    """This process's environment for a child server: hub off, our ``sys.path``, sized CPU KV.

    ``VLLM_CPU_KVCACHE_SPACE`` (GiB, CPU builds only) defaults to 1 unless already set,
    since vLLM would otherwise reserve most of the machine's memory.
    """
    return {"VLLM_CPU_KVCACHE_SPACE": "1", **os.environ, "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


def new_metrics_dir() -> str | None:
    """A fresh ``PROMETHEUS_MULTIPROC_DIR`` for a child server, unless the caller set one.

    With it, the server's ``/metrics`` also shows what the pipeline decides (see
    `integrations.vllm_v1.metrics`). The caller removes the directory after the server exits.
    """
    return None if os.environ.get(MULTIPROC_ENV) else tempfile.mkdtemp(prefix="policies-metrics-")


def server_env(metrics_dir: str | None) -> dict[str, str]:
    """`offline_env` plus the metrics directory, if any."""
    return {**offline_env(), **({MULTIPROC_ENV: metrics_dir} if metrics_dir else {})}


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
        argv = [sys.executable, "-m", API_SERVER_MODULE,
                *server_args(pipeline, model, host=host, port=port, vllm_args=vllm_args)]
        metrics_dir = new_metrics_dir()
        with open(log, "wb") as sink:
            process = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT,
                                       env=server_env(metrics_dir), start_new_session=True)
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
