# %% [markdown]
# # Replay: stock vLLM vs a QoS pipeline on a real trace
#
# **What you'll learn**: load a real trace, give it tenants from real ServeGen client
# statistics, replay it through vLLM's scheduler as stock `fcfs`, stock `priority` and the `qos`
# pipeline, and read latency, SLO attainment, goodput and fairness side by side.

# %% [markdown]
# ## Setup

# %%
import logging
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
logging.getLogger("vllm").setLevel(logging.ERROR)  # quiet CPU-platform notices

from benchmarks.replay.__main__ import format_table, with_tenant_priorities
from benchmarks.replay.cost_model import PrefillChunk, StepBatch, StepCostModel
from benchmarks.replay.datasets import assign_servegen_tenants
from benchmarks.replay.driver import replay
from benchmarks.replay.metrics import summarize
from benchmarks.replay.workloads import load_workload
from integrations.vllm_v1.instruments import EngineShape

# %% [markdown]
# ## The trace and the cost model
#
# Requests get tenants `t0..t6` drawn with the rate mix of the seven busiest ServeGen clients;
# `t0, t1` are Gold (priority -1), `t2..t4` Silver (0), `t5, t6` Bronze (1). The step-cost model
# prices each scheduled batch (Llama-3-8B bf16 on an H100).

# %%
trace = with_tenant_priorities(assign_servegen_tenants(
    load_workload("azure-conv", max_requests=1200))).scaled(5.0)
print(len(trace.requests), "requests over", round(trace.duration_s, 1), "s")
cost = StepCostModel.preset("h100")
for name, batch in [("decode 1 seq, ctx 512", StepBatch(decode_context_tokens=(512,))),
                    ("decode 128 seqs, ctx 2048", StepBatch(decode_context_tokens=(2048,) * 128)),
                    ("prefill 2048 tokens", StepBatch(prefills=(PrefillChunk(tokens=2048),)))]:
    print(f"{name:<28}{cost.step_time_s(batch) * 1000:7.1f} ms")

# %% [markdown]
# ## The run

# %%
shape = EngineShape(num_blocks=24800, block_size=16, max_num_seqs=256,
                    max_num_batched_tokens=8192)
runs = [replay(trace, system, shape=shape, cost_model=cost)
        for system in ["fcfs", "priority", "pipeline:qos"]]
summaries = [summarize(run) for run in runs]
print(format_table(summaries))

# %%
import matplotlib.pyplot as plt

fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
tenants = sorted(summaries[0]["by_tenant"])
width = 0.8 / len(summaries)
for i, s in enumerate(summaries):
    p99 = [s["by_tenant"][t]["ttft_p99_s"] for t in tenants]
    axes[0].bar([x + i * width for x in range(len(tenants))], p99, width, label=s["system"])
    classes = ["short", "long"]
    axes[1].bar([x + i * width for x in range(2)],
                [s["by_class"][c]["ttft_p99_s"] for c in classes], width, label=s["system"])
axes[0].set_xticks([x + 0.4 - width / 2 for x in range(len(tenants))], tenants)
axes[0].set_title("TTFT p99 by tenant (s)")
axes[1].set_xticks([x + 0.4 - width / 2 for x in range(2)], ["short", "long"])
axes[1].set_title("TTFT p99 by prompt class (s)")
axes[1].legend()
plt.tight_layout()
plt.show()

# %% tags=["remove-cell"]
by = {s["system"]: s for s in summaries}
for s in summaries:
    o = s["overall"]
    assert o["completed"] + o["rejected"] + o["cancelled"] == o["offered"] == 1200
assert by["pipeline:qos"]["by_class"]["short"]["ttft_p99_s"] < by["fcfs"]["by_class"]["short"]["ttft_p99_s"]

# %% [markdown]
# ## From the command line
#
# ```bash
# python -m benchmarks.replay --trace azure-conv --tenants servegen --rate-scale 4 \
#     --max-requests 4000 --systems fcfs,priority,pipeline:qos --out out/replay
# ```
#
# writes `out/replay/summary.json` and `out/replay/ttft.png`. Any JSONL/CSV/Mooncake file works
# as `--trace`, and `--cost KEY=VALUE` overrides a cost-model coefficient.
