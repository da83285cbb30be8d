"""``python -m integrations.vllm_v1.serving``: vLLM's OpenAI server with a pipeline.

``--model`` is required: a production command never falls back to a test model (``make
serve`` names the embedded tiny model explicitly). Arguments after ``--`` go to vLLM
unchanged. A KV cache size given there (``--kv-cache-memory-bytes``) is the one used; without
one, CPU builds get ``VLLM_CPU_KVCACHE_SPACE=1`` (GiB) unless it is set
(`integrations.vllm_v1.serving.server.offline_env`).

Exit status and signals, for supervisors (systemd, Docker, Kubernetes):

* ``SIGTERM`` or ``SIGINT`` stops the server: vLLM's API server (a child leading
  its own process group, with its engine and workers) gets ``SIGTERM`` and drains
  (`integrations.vllm_v1.serving.drain`: new requests 503, those in flight finish
  within ``drain_grace_s``), then the group gets ``SIGKILL`` after `STOP_GRACE_S`;
  the port is released and the metrics directory removed (one a hard-killed run
  left behind is removed by the next run).
  Status 0 when it stopped within the grace period, 1 if it had to be killed.
* vLLM's server stopping by itself is a failure: its status if non-zero, else 1.
  vLLM exits with 0 when its engine dies (its watchdog sets uvicorn's
  ``should_exit`` and the server returns normally), which would tell a supervisor
  configured to restart on failure that all is well.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

from integrations.vllm_v1.config.presets import PRESETS
from integrations.vllm_v1.config.spec import CONFIG_KEY, resolve_pipeline
from integrations.vllm_v1.serving.server import (
    API_SERVER_MODULE,
    new_metrics_dir,
    server_args,
    server_env,
)

STOP_GRACE_S = 60.0
"""How long vLLM's server may take to stop after ``SIGTERM`` (its drain, default 30 s,
then the engine's shutdown) before it is killed."""
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def main(argv: list[str] | None = None) -> int:
    """Parse our flags, run vLLM's server as a child until it exits or we are told to stop.

    A child (not this process) so that `prometheus_client` starts in multiprocess mode
    there, which this process, having imported vLLM already, cannot switch to.
    """
    return run_child(server_command(argv))


def server_command(argv: list[str] | None = None) -> list[str]:
    """The command line of vLLM's server for our flags ``argv``.

    A preset is named in the server's ``--additional-config`` (so its declaration there,
    e.g. the ``slo`` preset's ``slo``, applies, and the serving layer knows the preset);
    another pipeline travels pickled.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", default="qos",
                        help="preset name, package.module:attr or file.py:attr (default: qos)")
    parser.add_argument("--model", required=True, help="model directory or Hugging Face id")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--tenants", help="JSON/YAML/TOML file of tenants and their API keys "
                        "(see docs/serving.md, 'Tenants and credentials')")
    args, vllm_args = parser.parse_known_args(argv)
    vllm_args = [a for a in vllm_args if a != "--"]
    pipeline = resolve_pipeline(args.pipeline)
    ours: dict[str, Any] = {}
    if args.pipeline in PRESETS:
        ours["pipeline"] = args.pipeline
    if args.tenants:
        ours["tenants"] = os.path.abspath(args.tenants)
    if ours:
        vllm_args = ["--additional-config", _json({CONFIG_KEY: ours}), *vllm_args]
    return [sys.executable, "-m", API_SERVER_MODULE,
            *server_args(pipeline, args.model, host=args.host, port=args.port,
                         vllm_args=tuple(vllm_args))]


def run_child(argv: list[str]) -> int:
    """Run vLLM's server ``argv`` (``python -m MODULE ARGS...``) with a fresh metrics
    directory; the exit status (above)."""
    metrics_dir = new_metrics_dir()
    stop: dict[str, Any] = {"deadline": None, "process": None}

    def on_signal(signum: int, _frame: object) -> None:
        if stop["deadline"] is None:
            stop["deadline"] = time.monotonic() + STOP_GRACE_S
            if stop["process"] is not None:
                stop["process"].send_signal(signal.SIGTERM)  # the API server: it drains

    previous = {s: signal.signal(s, on_signal) for s in _STOP_SIGNALS}
    try:
        process = stop["process"] = subprocess.Popen(
            argv, env=server_env(metrics_dir, argv[3:]), start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        if stop["deadline"] is not None:  # told to stop while it was being started
            process.send_signal(signal.SIGTERM)
        status, killed = _wait(process, stop)
        _signal_group(process, signal.SIGKILL)  # its engine and workers, if any linger
        if stop["deadline"] is not None:
            return 1 if killed else 0
        if status == 0:
            print("vLLM's server exited by itself with status 0 (its engine died?)",
                  file=sys.stderr)
            return 1
        return status if status > 0 else 128 - status  # killed by signal N: 128 + N
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if metrics_dir:
            shutil.rmtree(metrics_dir, ignore_errors=True)


def _wait(process: subprocess.Popen, stop: dict[str, Any]) -> tuple[int, bool]:
    """The child's exit status, and whether it had to be killed after a stop request."""
    while True:
        try:
            return process.wait(timeout=0.5), False
        except subprocess.TimeoutExpired:
            deadline = stop["deadline"]
            if deadline is not None and time.monotonic() > deadline:
                _signal_group(process, signal.SIGKILL)
                return process.wait(), True


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)  # the child leads its own process group


def _die_with_parent() -> None:
    """In the child: get SIGTERM if this process dies without stopping it (Linux)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _json(value: object) -> str:
    return json.dumps(value)
