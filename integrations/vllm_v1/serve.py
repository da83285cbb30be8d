"""``python -m integrations.vllm_v1.serve``: vLLM's OpenAI server with a pipeline.

With no ``--model`` it serves the embedded tiny model (dummy weights), so it
runs offline on a laptop. Arguments after ``--`` go to vLLM unchanged.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys

from integrations.vllm_v1.presets import resolve_pipeline
from integrations.vllm_v1.server import API_SERVER_MODULE, offline_env, server_args

TINY_MODEL_ARGS = ("--load-format", "dummy", "--dtype", "float32", "--max-model-len", "2048",
                   "--enforce-eager", "--block-size", "32")


def main(argv: list[str] | None = None) -> None:
    """Parse our flags, then hand over to vLLM's server in this process."""
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
        from integrations.vllm_v1.tiny_model import tiny_model_dir

        model = str(tiny_model_dir("dummy"))
        vllm_args = [*TINY_MODEL_ARGS, *vllm_args]
    os.environ.update(offline_env())
    sys.argv = [API_SERVER_MODULE, *server_args(pipeline, model, host=args.host, port=args.port,
                                                vllm_args=tuple(vllm_args))]
    runpy.run_module(API_SERVER_MODULE, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
