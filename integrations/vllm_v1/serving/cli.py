"""``python -m integrations.vllm_v1.serving``: vLLM's OpenAI server with a pipeline.

With no ``--model`` it serves the embedded tiny model (dummy weights), so it
runs offline on a laptop. Arguments after ``--`` go to vLLM unchanged.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys

from integrations.vllm_v1.config.presets import resolve_pipeline
from integrations.vllm_v1.serving.server import (
    API_SERVER_MODULE,
    new_metrics_dir,
    server_args,
    server_env,
)

TINY_MODEL_ARGS = ("--load-format", "dummy", "--dtype", "float32", "--max-model-len", "2048",
                   "--enforce-eager", "--block-size", "32")


def main(argv: list[str] | None = None) -> int:
    """Parse our flags, run vLLM's server as a child until it exits; its exit status.

    A child (not this process) so that `prometheus_client` starts in multiprocess mode
    there, which this process, having imported vLLM already, cannot switch to.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", default="qos",
                        help="preset name, package.module:attr or file.py:attr (default: qos)")
    parser.add_argument("--model", help="model directory (default: the embedded tiny model)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args, vllm_args = parser.parse_known_args(argv)
    vllm_args = [a for a in vllm_args if a != "--"]
    pipeline = resolve_pipeline(args.pipeline)
    model = args.model
    if model is None:
        from integrations.vllm_v1.instruments.tiny_model import tiny_model_dir

        model = str(tiny_model_dir("dummy"))
        vllm_args = [*TINY_MODEL_ARGS, *vllm_args]
    argv = [sys.executable, "-m", API_SERVER_MODULE,
            *server_args(pipeline, model, host=args.host, port=args.port,
                         vllm_args=tuple(vllm_args))]
    metrics_dir = new_metrics_dir()
    try:
        process = subprocess.Popen(argv, env=server_env(metrics_dir))
        try:
            return process.wait()
        except KeyboardInterrupt:  # the child got the same Ctrl-C: let it shut down
            return process.wait()
    finally:
        if metrics_dir:
            shutil.rmtree(metrics_dir, ignore_errors=True)

