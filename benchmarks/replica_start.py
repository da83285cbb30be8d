"""How long one replica of the live Ray Serve comparison takes to start, alone.

Starts ``vllm serve`` with the live comparison's model (the dummy-weight Llama of
`benchmarks.ray_serve_live`, built locally) and engine flags on 127.0.0.1, times it from
the process start to the first ``/health`` 200, stops it by its process group, and repeats.
The live comparison deploys four such engines at once; this is the start of one.

    python -m benchmarks.replica_start --runs 3 --out docs/results/ray_serve_live/replica_start.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from benchmarks.ray_serve_live import MODEL_SPEC, engine_args
from integrations.vllm_v1.pd.launch import free_port

KV_BLOCKS = 400
MAX_NUM_SEQS = 2
"""The live comparison's replica settings (its ``--kv-blocks`` and ``--max-num-seqs`` defaults)."""


def time_start(model: str, timeout_s: float) -> float:
    """Seconds from starting ``vllm serve`` to its first healthy ``/health`` (the server is
    stopped before returning; raises `TimeoutError` past ``timeout_s``)."""
    port = free_port()
    start = time.monotonic()
    server = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
         "--host", "127.0.0.1", "--port", str(port), *engine_args(KV_BLOCKS, MAX_NUM_SEQS)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        while time.monotonic() - start < timeout_s:
            if server.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {server.returncode} before /health")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    if r.status == 200:
                        return time.monotonic() - start
            except OSError:
                time.sleep(0.25)
        raise TimeoutError(f"vllm serve not healthy within {timeout_s} s")
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(60)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--timeout-s", type=float, default=300.0)
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    args = parser.parse_args(argv)
    from integrations.vllm_v1.instruments.tiny_model import TinyModelSpec, tiny_model_dir

    model = str(tiny_model_dir("dummy", spec=TinyModelSpec(**MODEL_SPEC)))
    starts = []
    for run in range(args.runs):
        starts.append(time_start(model, args.timeout_s))
        print(f"run {run}: healthy after {starts[-1]:.1f} s", flush=True)
    load = os.getloadavg()[0]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"model_spec": MODEL_SPEC, "start_s": starts,
                                    "load_average_1m_at_end": load}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
