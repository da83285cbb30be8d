# %% [markdown]
# # Quickstart: a QoS pipeline on the real vLLM scheduler
#
# **What you'll learn**: compose a `Pipeline` from policy objects, run a slice of a real
# production trace (Azure LLM inference, conversation) through vLLM's own scheduler in virtual
# time, and see what QoS ranking does to time-to-first-token (TTFT) compared with stock vLLM.

# %% [markdown]
# ## Setup

# %%
import logging
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
logging.getLogger("vllm").setLevel(logging.ERROR)  # quiet CPU-platform notices

from benchmarks.replay.cost_model import StepCostModel
from benchmarks.replay.driver import replay
from benchmarks.replay.metrics import summarize
from benchmarks.replay.workloads import load_workload
from integrations.vllm_v1 import Pipeline
from integrations.vllm_v1.instruments import EngineShape
from policies import QoSRanker

# %% [markdown]
# ## The policy in Python
#
# `QoSRanker` ranks requests by API priority, prompt-length class and time waited. Its key
# does not change while a request waits (linear aging), so vLLM's waiting queue stays a heap.

# %%
ranker = QoSRanker(priority_step_s=2.0,
                   length_thresholds_tokens=(256, 1024, 4096),
                   length_penalties_s=(0.0, 1.0, 4.0, 16.0))
pipeline = Pipeline(ranking=ranker)
print(pipeline)
print("a request is never overtaken by one arriving more than",
      ranker.max_overtake_s(-1, 1), "s later (priorities -1..1)")

# %% [markdown]
# ## A run on a real trace
#
# The first 600 requests of the Azure conversation trace, offered 5x faster than recorded, on
# an engine shaped like Llama-3-8B on one H100 (step times from the built-in cost model).
# `replay` drives vLLM's real `Scheduler` and KV-cache manager; only the GPU is simulated.

# %%
trace = load_workload("azure-conv", max_requests=600).scaled(5.0)
shape = EngineShape(num_blocks=24800, block_size=16, max_num_seqs=256,
                    max_num_batched_tokens=8192)
cost = StepCostModel.preset("h100")
runs = {system: replay(trace, system, shape=shape, cost_model=cost)
        for system in ["fcfs", "pipeline:qos"]}
summaries = {system: summarize(run) for system, run in runs.items()}

# %%
rows = []
for system, s in summaries.items():
    for cls in ("short", "long"):
        c = s["by_class"][cls]
        rows.append((system, cls, c["completed"], c["ttft_p50_s"] * 1000, c["ttft_p99_s"] * 1000))
print(f"{'system':<14}{'class':<7}{'done':>6}{'TTFT p50 ms':>13}{'TTFT p99 ms':>13}")
for row in rows:
    print(f"{row[0]:<14}{row[1]:<7}{row[2]:>6}{row[3]:>13.0f}{row[4]:>13.0f}")

# %%
import matplotlib.pyplot as plt
import numpy as np

fig, ax = plt.subplots(figsize=(6, 3.5))
for system, run in runs.items():
    ttft = np.sort([r.ttft_s for r in run.records if r.prompt_tokens < 512])
    ax.plot(ttft, np.arange(1, len(ttft) + 1) / len(ttft), label=system)
ax.set_xscale("log")
ax.set_xlabel("TTFT of short requests (s)")
ax.set_ylabel("share")
ax.legend()
ax.grid(alpha=0.3)
plt.show()

# %% tags=["remove-cell"]
fcfs, qos = summaries["fcfs"], summaries["pipeline:qos"]
assert fcfs["overall"]["completed"] == qos["overall"]["completed"] == 600
assert qos["by_class"]["short"]["ttft_p99_s"] < fcfs["by_class"]["short"]["ttft_p99_s"]

# %% [markdown]
# ## Using it in vLLM
#
# The same `pipeline` object runs inside a live engine:
#
# ```python
# from integrations.vllm_v1 import build_llm, serve
#
# llm = build_llm(pipeline, model="path/to/model")      # a vllm.LLM with PolicyScheduler
# server = serve(pipeline, "path/to/model", port=8000)  # vLLM's OpenAI server
# server.wait_until_healthy()
# ```
#
# or from a shell: `python -m integrations.vllm_v1.serving --pipeline qos --model path/to/model`.
# Clients set `priority` and `vllm_xargs` (`tenant`, `slo_class`, `deadline_ms`).
