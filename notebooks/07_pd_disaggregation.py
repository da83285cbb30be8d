# %% [markdown]
# # Prefill/decode disaggregation: routing and PD-aware scheduling
#
# **What you'll learn**: route requests over a prefill pool and a decode pool with `PDRouter`
# (load, prefix affinity, bounded load, failover), give each pool its PD-aware scheduling
# preset, replay a real conversation trace through a cluster of vLLM schedulers in virtual
# time, compare against round robin and a colocated cluster of the same size, and launch a
# real NP:MD deployment with `serve_disaggregated(pipeline, ...)`.

# %% [markdown]
# ## Setup

# %%
import logging
import os
import random

os.environ.setdefault("HF_HUB_OFFLINE", "1")
logging.getLogger("vllm").setLevel(logging.ERROR)  # quiet CPU-platform notices

import attrs

from benchmarks.pd_replay.__main__ import SCHEDULING, format_table, make_router, row
from benchmarks.pd_replay.cluster import TransferModel, run_cluster
from benchmarks.pd_replay.goodput import DEFAULT_ITL_SLO_S
from benchmarks.replay.cost_model import StepCostModel
from benchmarks.replay.workloads import load_workload
from integrations.vllm_v1.config.pd_roles import PD_DECODE, PD_PREFILL
from integrations.vllm_v1.instruments import EngineShape
from policies import InstanceLoad, LeastLoadedRouter, PDRouter, chain_keys

# %% [markdown]
# ## The router in Python
#
# `route(request_id, prompt_tokens, block_keys, loads)` picks a decode instance, then a
# prefill instance unless the decode instance already holds all but a short suffix. The
# second turn of a conversation goes where its first turn's blocks are; when that instance
# is marked down, the next best one takes it (`spillover`).

# %%
router = PDRouter(prefill=["p0", "p1"], decode=["d0", "d1"], block_size_tokens=512,
                  rng=random.Random(0))
idle = {name: InstanceLoad() for name in ["p0", "p1", "d0", "d1"]}
first = router.route("turn-1", 2100, chain_keys([11, 12, 13, 14]), idle)
second = router.route("turn-2", 2400, chain_keys([11, 12, 13, 14, 15]), idle)
router.mark_down(second.decode)
third = router.route("turn-3", 2400, chain_keys([11, 12, 13, 14, 15]), idle)
for d in (first, second, third):
    print(f"{d.request_id}: prefill {d.prefill} ({d.prefill_reason.value}), decode {d.decode} "
          f"({d.decode_reason.value}), {d.decode_cached_blocks} blocks already there")

# %% [markdown]
# ## PD-aware scheduling presets
#
# A prefill-only instance generates one token per request: it should batch prompts and put
# cached ones first. A decode-only instance should keep inter-token latency flat: each
# decode step reads the KV of every sequence in the batch, so `DecodeStepGate` starts a
# request only while the decode step the batch would then run, predicted by a step model
# learned from the instance's own steps, takes at most twice a step's fixed cost, and the
# KV it holds stays under half the cache (requests wait, they are not rejected).

# %%
print("prefill:", PD_PREFILL.pipeline.ranking, PD_PREFILL.pipeline.eviction,
      PD_PREFILL.vllm_args())
print("decode: ", PD_DECODE.pipeline.start_gate)

# %% [markdown]
# ## A cluster replay on a real trace
#
# The first 200 requests of the Mooncake conversation trace (prompts of 1k to 120k tokens),
# 3 prefill + 2 decode H100s against 5 colocated H100s. Every instance is vLLM's own
# scheduler and KV-cache manager with no model; step times come from the Llama-3-8B H100
# cost model, KV moves over a 50 GB/s link per decode instance.

# %%
trace = load_workload("mooncake-conv", max_requests=200)
shape = EngineShape(num_blocks=24800, block_size=16, max_num_batched_tokens=8192,
                    max_model_len=131072)
decode_shape = attrs.evolve(shape, max_num_batched_tokens=131072)  # a KV load in one step
prefill, decode = ["prefill0", "prefill1", "prefill2"], ["decode0", "decode1"]
kv_blocks = 24800 * 16 // trace.block_size

def cluster(router_name, scheduling="stock"):
    router = make_router(router_name, prefill, decode, block_size=trace.block_size,
                         kv_blocks=kv_blocks, seed=0)
    prefill_role, decode_role = SCHEDULING[scheduling]
    name = router_name if scheduling == "stock" else f"{router_name}+{scheduling}"
    return run_cluster(trace, router, name, prefill=prefill, decode=decode,
                       prefill_shape=shape, decode_shape=decode_shape,
                       cost_model=StepCostModel.preset("h100"), transfer=TransferModel(),
                       prefill_role=prefill_role, decode_role=decode_role)

everyone = prefill + decode
runs = [cluster("round_robin"), cluster("pd_router"), cluster("pd_router", "pd"),
        run_cluster(trace, LeastLoadedRouter(prefill=(), decode=everyone), "colocated",
                    prefill=[], decode=everyone, prefill_shape=shape, decode_shape=shape,
                    cost_model=StepCostModel.preset("h100"), transfer=TransferModel())]
rows = {run.system: row(run, run.system, DEFAULT_ITL_SLO_S) for run in runs}
print(format_table(list(rows.values())))

# %%
import matplotlib.pyplot as plt
import numpy as np

fig, (ttft_ax, itl_ax) = plt.subplots(1, 2, figsize=(11, 3.6))
for run in runs:
    records = run.run.records
    ttft = np.sort([r.ttft_s for r in records])
    gaps = np.sort(np.concatenate([np.diff(r.token_times_s) for r in records]))
    for ax, values in ((ttft_ax, ttft), (itl_ax, gaps * 1000)):
        ax.plot(values, np.arange(1, len(values) + 1) / len(values), label=run.system)
ttft_ax.set_xscale("log")
ttft_ax.set_title("TTFT CDF (s)")
itl_ax.set_xscale("log")
itl_ax.set_title("inter-token latency CDF (ms)")
itl_ax.legend(fontsize=8)
for ax in (ttft_ax, itl_ax):
    ax.grid(alpha=0.3)
fig.tight_layout()

# %% [markdown]
# Colocated, long prefills stall the decodes sharing their steps: ITL p99 is tens of
# times its median. Disaggregated, the remaining ITL spread comes from how much context the
# decode batch reads; the decode preset bounds it (ITL p99/p50 near 1.3 or below) and pays
# for it in TTFT, since requests wait for room on the decode instances. `pd_router`
# balances queued prefill tokens and follows cached prefixes, which keeps its TTFT tail below
# round robin's.

# %% tags=["remove-cell"]
assert all(r.outcome == "completed" for run in runs for r in run.run.records)
jitter = {name: r["itl_jitter"] for name, r in rows.items()}
assert jitter["colocated"] > 5 * jitter["pd_router"], jitter
assert jitter["pd_router+pd"] < jitter["pd_router"], jitter
assert rows["pd_router"]["ttft_p99_s"] < rows["round_robin"]["ttft_p99_s"]
assert rows["colocated"]["kv_bytes_transferred"] == 0 < rows["pd_router"]["kv_bytes_transferred"]
router.check_invariants()
assert third.decode != second.decode and third.decode_reason.value == "spillover"

# %% [markdown]
# ## Using it in vLLM
#
# `serve_disaggregated(pipeline, model)` starts N prefill and M decode vLLM OpenAI servers on this
# machine, each running the pipeline with its role's preset (slots you set are kept), wires
# them with a KV connector (vLLM's shared-storage `ExampleConnector` on CPU, `NixlConnector`
# on GPUs) and serves the PD router in front. It returns once everything is healthy; the
# handle is a context manager that stops all of it.
#
# ```python
# import httpx
# from integrations.vllm_v1 import Pipeline, serve_disaggregated
# from integrations.vllm_v1.instruments import tiny_model_dir
#
# if __name__ == "__main__":
#     model = str(tiny_model_dir("random"))
#     args = ("--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
#             "--block-size", "32", "--kv-cache-memory-bytes", str(64 << 20))
#     with serve_disaggregated(Pipeline(), model, prefill=1, decode=2, vllm_args=args) as pd:
#         answer = httpx.post(f"{pd.url}/v1/completions", timeout=120,
#                             json={"model": model, "prompt": "Once upon a time " * 20,
#                                   "max_tokens": 12, "temperature": 0.0})
#         print(answer.json()["choices"][0]["text"])
# ```
#
# Three tiny engines take 35–60 s to become healthy on 2 CPU cores, so this notebook does not
# start them; the same path runs in the engine tests (`tests/vllm_v1/pd/test_pd_engine.py`). From
# the command line, `python -m benchmarks.pd_replay --trace mooncake-conv --scheduling stock,pd
# --out out/pd` runs the full comparison (see the *PD disaggregation* page).
