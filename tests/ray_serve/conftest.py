"""One local multi-node Ray cluster for every Ray Serve test, with two apps deployed on it.

Shared by every test here (a cluster takes ~20-60 s to come up, an app's engines as long
again); the cluster and apps are package-scoped, so they stop (engines, raylets, memory) once
the last Ray Serve test ran rather than at the end of a whole-suite run:

* ``reference``: greedy outputs of one plain vLLM engine for `PROMPTS` (computed first,
  and the engine freed, before Ray starts);
* ``cluster``: a 2-node `LocalCluster` on 127.0.0.1 (2 logical CPUs a node);
* ``apps``: two Serve apps deployed together: ``colocated`` (2 engine replicas, one a
  node, running `tests.ray_serve.policies_for_ray:pipeline`, behind the ingress with
  `PDRequestRouter`) and ``pd`` (1 prefill + 1 decode replica, `ExampleConnector`).
"""

from __future__ import annotations

import gc
import os
import socket
import sys
from pathlib import Path

import pytest

from integrations.ray_serve import cluster as _cluster  # noqa: F401 - before Ray is imported

pytest.importorskip("ray.serve")

ENGINE_ARGS = ("--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
               "--block-size", "32", "--kv-cache-memory-bytes", str(64 << 20), "--seed", "0")
"""The tiny CPU engine, as ``vllm serve`` flags (the same engine as tests/conftest.py's)."""
PIPELINE = "tests.ray_serve.policies_for_ray:pipeline"
REPO = Path(__file__).resolve().parents[2]
_PREFIX = ("You are a careful assistant. Answer the question below in plain words, with one "
           "example, and say what you are unsure about. ")
PROMPTS = {
    "short": "The capital of France is",
    "long": _PREFIX * 4 + "Why is the sky blue?",
    "other": _PREFIX * 3 + "How do bees find their way home?",
}
CHATS = {"hello": [{"role": "user", "content": _PREFIX * 2 + "Describe a good breakfast."}]}
MAX_TOKENS = 24


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="session")
def model_dir() -> str:
    from integrations.vllm_v1.instruments import tiny_model_dir

    return str(tiny_model_dir("random"))


@pytest.fixture(scope="session")
def reference(model_dir):
    """Token ids one plain vLLM engine generates greedily for `PROMPTS` and `CHATS`."""
    from integrations.vllm_v1.instruments import LLM, SamplingParams

    llm = LLM(model=model_dir, dtype="float32", max_model_len=512, enforce_eager=True,
              block_size=32, kv_cache_memory_bytes=64 << 20, seed=0)
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    out = {name: list(result.outputs[0].token_ids)
           for name, result in zip(PROMPTS, llm.generate(list(PROMPTS.values()), greedy),
                                   strict=True)}
    for name, messages in CHATS.items():
        out[name] = list(llm.chat(messages, greedy)[0].outputs[0].token_ids)
    del llm
    gc.collect()
    return out


@pytest.fixture(scope="package")
def cluster(reference):
    """A 2-node Ray cluster with Serve on 127.0.0.1 (after the reference engine is gone)."""
    from integrations.ray_serve.cluster import LocalCluster

    with LocalCluster(nodes=2, cpus_per_node=2, http_port=free_port()) as local:
        yield local


@pytest.fixture(scope="package")
def apps(cluster, model_dir, tmp_path_factory):
    """Base URLs and configs of the ``colocated`` and ``pd`` apps, deployed together."""
    from ray import serve

    from integrations.ray_serve.app import ServeConfig, build_app

    env = {"env_vars": {"PYTHONPATH": os.pathsep.join([str(REPO), *sys.path])}}
    configs = {
        # at most 4 running requests a replica: a burst queues (the pipeline's queue metrics)
        "colocated": ServeConfig(model=model_dir, pipeline=PIPELINE,
                                 vllm_args=(*ENGINE_ARGS, "--max-num-seqs", "4"), replicas=2,
                                 name="colocated", runtime_env=env,
                                 targets_dir=str(tmp_path_factory.mktemp("targets-colocated"))),
        "pd": ServeConfig(model=model_dir, vllm_args=ENGINE_ARGS, replicas=1,
                          prefill_replicas=1, name="pd", runtime_env=env,
                          kv_storage_dir=str(tmp_path_factory.mktemp("pd-kv")),
                          targets_dir=str(tmp_path_factory.mktemp("targets-pd"))),
    }
    # run_many (a Serve developer API) starts both apps' replicas at once
    serve.run_many([serve.RunTarget(build_app(c), name=c.name, route_prefix=f"/{name}")
                    for name, c in configs.items()])
    return {name: {"url": f"{cluster.url}/{name}", "config": c} for name, c in configs.items()}
