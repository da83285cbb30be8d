"""``python -m integrations.ray_serve.demo``: the multi-node Ray Serve app on one machine.

Starts a local Ray cluster of ``--nodes`` nodes (`LocalCluster`), deploys ``--replicas``
vLLM engine replicas running a pipeline behind the OpenAI ingress with our request
router (``--pd``: one prefill and one decode replica instead), sends a few requests
whose prompts share prefixes (``--rounds`` rounds, the families of a round at once, so
the router spreads them), prints where each one landed (replica, node, prefill
replica), the router's decisions, and shuts everything down. Uses the embedded tiny
model with random weights (no download).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from integrations.ray_serve import cluster as _cluster  # noqa: F401 - first: before Ray

TINY_MODEL_ARGS = ("--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
                   "--block-size", "32", "--kv-cache-memory-bytes", str(64 << 20),
                   "--seed", "0")
"""``vllm serve`` flags for the tiny CPU model (float32, 512 tokens, 32-token blocks, 64 MiB KV)."""

_FAMILIES = {
    "travel": "You are a travel writer. Describe the islands, the food and the music of "
              "Hawaii for a reader planning a first trip, with practical advice. ",
    "email": "You are an assistant that drafts short professional emails. The user asks for "
             "feedback on a quarterly financial report, its data analysis and its charts. ",
    "code": "You are a senior Python reviewer. Explain what the following function does, "
            "point out its bugs and suggest a cleaner version with type hints. ",
}


def _post(url: str, body: dict, timeout_s: float = 120.0) -> tuple[dict, dict, float]:
    """POST ``body``; (parsed answer or the stream's last event, response headers, TTFT s)."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    started = time.monotonic()
    with urllib.request.urlopen(request, timeout=timeout_s) as answer:
        headers = dict(answer.headers.items())
        if not body.get("stream"):
            return json.loads(answer.read()), headers, time.monotonic() - started
        first, text = None, ""
        for line in answer:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            first = first or time.monotonic() - started
            event = json.loads(line[len("data: "):])
            choices = event.get("choices") or [{}]
            text += choices[0].get("text") or choices[0].get("delta", {}).get("content") or ""
        return {"text": text}, headers, first or 0.0


def _attempt(url: str, body: dict) -> tuple[dict, dict, float, OSError | None]:
    """`_post` to ``url``'s completions; the error instead of raising it."""
    try:
        return (*_post(f"{url}/v1/completions", body), None)
    except OSError as error:
        return {}, {}, 0.0, error


def requests_for(model: str, rounds: int) -> list[tuple[str, dict]]:
    """``rounds`` requests per prompt family, alternating streamed and not."""
    out = []
    for i in range(rounds):
        for family, prefix in _FAMILIES.items():
            out.append((family, {"model": model, "prompt": prefix * 3 + f"Question {i}: why?",
                                 "max_tokens": 12, "temperature": 0, "stream": i % 2 == 1}))
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the demo; 0 when every request succeeded."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--pd", action="store_true", help="1 prefill + --replicas decode")
    parser.add_argument("--pipeline", default="default", help="a preset name or import path")
    parser.add_argument("--rounds", type=int, default=2, help="requests per prompt family")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)

    from integrations.ray_serve.app import ServeConfig, deploy
    from integrations.ray_serve.cluster import LocalCluster
    from integrations.vllm_v1.instruments import tiny_model_dir

    model = str(tiny_model_dir("random"))
    config = ServeConfig(model=model, pipeline=args.pipeline, vllm_args=TINY_MODEL_ARGS,
                         replicas=args.replicas, prefill_replicas=1 if args.pd else 0,
                         name="demo")
    failures = 0
    with LocalCluster(nodes=args.nodes, http_port=args.port) as cluster:
        print(f"Ray cluster of {args.nodes} nodes up in {cluster.startup_s:.0f} s; "
              f"deploying {args.replicas} {'decode + 1 prefill' if args.pd else 'engine'} "
              f"replicas (pipeline {args.pipeline!r}) ...", flush=True)
        started = time.monotonic()
        deploy(config)
        print(f"app ready in {time.monotonic() - started:.0f} s at {cluster.url}/v1\n")
        nodes = {node: f"node{i}" for i, node in enumerate(cluster.node_ids())}
        print(f"{'#':>2}  {'family':8} {'stream':6} {'replica':10} {'node':6} "
              f"{'prefill':10} {'TTFT ms':>8}  text")
        planned = requests_for(model, args.rounds)
        rounds = [planned[at:at + len(_FAMILIES)] for at in range(0, len(planned), len(_FAMILIES))]
        with ThreadPoolExecutor(len(_FAMILIES)) as pool:
            for round_index, batch in enumerate(rounds):  # a round's families at once
                answers = list(pool.map(lambda item: _attempt(cluster.url, item[1]), batch))
                for j, ((family, body), (answer, headers, ttft_s, error)) in enumerate(
                        zip(batch, answers, strict=True)):
                    i = round_index * len(_FAMILIES) + j
                    if error is not None:
                        failures += 1
                        print(f"{i:>2}  {family:8} failed: {error}")
                        continue
                    text = answer.get("text") or answer["choices"][0]["text"]
                    print(f"{i:>2}  {family:8} {str(body['stream']):6} "
                          f"{headers.get('x-served-by', '?'):10} "
                          f"{nodes.get(headers.get('x-served-on-node', ''), '?'):6} "
                          f"{headers.get('x-prefilled-by', '-'):10} {ttft_s * 1000:8.0f}  "
                          f"{text!r:.40}")
        with urllib.request.urlopen(f"{cluster.url}/metrics", timeout=30) as page:
            decisions = [line for line in page.read().decode().splitlines()
                         if line.startswith("policies:router_decisions_total")
                         and not line.endswith(" 0.0")]
        print("\nrouter decisions:\n  " + "\n  ".join(decisions))
    print("cluster shut down")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
