# %% [markdown]
# # QoS ranking, MLFQ and token buckets on a real trace
#
# **What you'll learn**: what three scheduling policies decide, shown on the objects
# themselves: `QoSRanker` (a fixed rank key from priority, prompt length and arrival), `MLFQ`
# (levels that worsen with the service a request receives) and `TokenBucket` (a cap on the
# prefill tokens of non-urgent requests that tightens with load). Then each runs alone through
# vLLM's real scheduler on a slice of the Azure conversation trace, against stock `fcfs`.

# %% [markdown]
# ## Setup

# %%
import logging
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
logging.getLogger("vllm").setLevel(logging.ERROR)  # quiet CPU-platform notices

from benchmarks.replay.__main__ import with_tenant_priorities
from benchmarks.replay.cost_model import StepCostModel
from benchmarks.replay.datasets import assign_servegen_tenants
from benchmarks.replay.driver import replay
from benchmarks.replay.metrics import summarize
from benchmarks.replay.workloads import TENANT_WEIGHTS, load_workload
from integrations.vllm_v1.instruments import EngineShape
from policies import MLFQ, LoadSnapshot, QoSRanker, RequestView, TokenBucket
from policies.ordering.levels import LEVEL_NAMES

# %% [markdown]
# ## The policies in Python
#
# ### `QoSRanker`: one key per request, fixed on arrival
#
# `rank_key = arrival_s + priority · priority_step_s + length_penalty_s(prompt_tokens)`, lowest
# first. A more urgent priority or a shorter prompt is worth a head start in seconds, so a
# request that waits long enough is served whatever arrives after it: `max_overtake_s` bounds
# how much later an arrival may still overtake it.

# %%
ranker = QoSRanker()
print(ranker)
print("never overtaken by a request arriving more than", ranker.max_overtake_s(-1, 1),
      "s later (priorities -1..1)")
requests = [
    RequestView(request_id="gold-chat", arrival_s=0.0, prompt_tokens=120, priority=-1),
    RequestView(request_id="silver-doc", arrival_s=0.0, prompt_tokens=3000, priority=0),
    RequestView(request_id="bronze-chat", arrival_s=1.0, prompt_tokens=200, priority=1),
    RequestView(request_id="bronze-long", arrival_s=0.0, prompt_tokens=9000, priority=1),
]
print(f"{'request':<13}{'priority':>9}{'prompt':>8}{'penalty s':>11}{'rank key':>10}")
for r in sorted(requests, key=ranker.rank_key):
    print(f"{r.request_id:<13}{r.priority:>9}{r.prompt_tokens:>8}"
          f"{ranker.length_penalty_s(r.prompt_tokens):>11.0f}{ranker.rank_key(r):>10.1f}")

# %% [markdown]
# ### `MLFQ`: levels that worsen with service
#
# A request starts at the first level whose quantum holds its whole prompt (skip-join) and
# sinks a level each time its service (prefill and decode tokens) passes the next cumulative
# quantum; a preemption lifts it one level back. The level comes before the rank key, so long
# generations sink below new short requests.

# %%
levels = MLFQ()
print(levels)
for prompt in (100, 300, 1500, 6000):
    start = levels.start_level(prompt)
    print(f"a {prompt:>4}-token prompt starts at level {start} ({LEVEL_NAMES[start]})")

chat = RequestView(request_id="chat", arrival_s=0.0, prompt_tokens=100)
levels.on_admitted(chat, now=0.0)
levels.on_scheduled(chat, 100, now=0.0)  # its prefill
service, changes = 100, [(100, levels.level(chat))]
for step in range(700):                   # then one output token a step
    levels.on_scheduled(chat, 1, now=0.02 * step)
    service += 1
    if levels.level(chat) != changes[-1][1]:
        changes.append((service, levels.level(chat)))
print("(service tokens, level) at each change:", changes)
levels.on_preempted(chat)
print("after a preemption it is back at level", levels.level(chat))
print(levels.stats())
levels.check_invariants()


# %% [markdown]
# ### `TokenBucket`: prefill caps that tighten with load
#
# The bucket of the `rate` preset (and of `default`) caps the prefill chunks of requests with
# priority above 0 (Bronze); Gold and Silver requests and all decodes pass uncapped. Credits
# refill at a rate set each step by the load: the larger of the queue's share of requests and
# the KV usage between 50 % and 90 %.

# %%
def bucket_of_rate_preset() -> TokenBucket:
    return TokenBucket(capacity_tokens=2048, min_refill_per_s=2048.0,
                       max_refill_per_s=16384.0, unlimited_priority_at_most=0)

bucket = bucket_of_rate_preset()
print(bucket)
loads = {
    "idle": LoadSnapshot(now=0.0, waiting_requests=0, running_requests=0, kv_usage=0.0,
                         token_budget=8192),
    "busy, short queue": LoadSnapshot(now=0.0, waiting_requests=8, running_requests=56,
                                      kv_usage=0.4, token_budget=8192),
    "long queue": LoadSnapshot(now=0.0, waiting_requests=192, running_requests=64,
                               kv_usage=0.6, token_budget=8192),
    "KV nearly full": LoadSnapshot(now=0.0, waiting_requests=4, running_requests=256,
                                   kv_usage=0.88, token_budget=8192),
}
for label, load in loads.items():
    print(f"{label:<19} pressure {bucket.pressure(load):.2f}"
          f"   refill {bucket.refill_per_s_for(load):>6.0f} tokens/s")

# %% [markdown]
# A 6000-token Bronze prompt under the "long queue" load, one engine step every 50 ms:
# the first chunk spends the full bucket, then each step gets what refilled since the last.
# A Gold request of the same size is never capped.

# %%
bucket = bucket_of_rate_preset()
gold = RequestView(request_id="gold", arrival_s=0.0, prompt_tokens=6000, priority=-1,
                   tenant="t0")
print("Gold cap:", bucket.token_cap(gold, loads["long queue"]))
computed, chunks, now = 0, [], 0.0
while computed < 6000:
    load = LoadSnapshot(now=now, waiting_requests=192, running_requests=64, kv_usage=0.6,
                        token_budget=8192)  # one snapshot per step
    bronze = RequestView(request_id="bronze", arrival_s=0.0, prompt_tokens=6000, priority=1,
                         tenant="t5", computed_tokens=computed)
    chunk = min(bucket.token_cap(bronze, load), 6000 - computed)
    bucket.on_scheduled(bronze, chunk, now)
    computed += chunk
    chunks.append(chunk)
    now += 0.05
print(f"Bronze prefill chunks: {chunks}")
print(f"{len(chunks)} steps ({now:.2f} s) instead of 1")
print(bucket.stats())
bucket.check_invariants()

# %% [markdown]
# ## A run on a real trace
#
# The first 600 requests of the Azure conversation trace with tenants from ServeGen's client
# mix (Gold `t0, t1` priority -1, Silver `t2..t4` 0, Bronze `t5, t6` 1), offered 5x faster
# than recorded, on an engine shaped like Llama-3-8B on one H100. Each system is stock `fcfs`
# or one policy alone in a `Pipeline` (the presets `qos`, `mlfq` and `rate`); `replay` drives
# vLLM's real `Scheduler` in virtual time, with step times from the cost model.

# %%
trace = with_tenant_priorities(assign_servegen_tenants(
    load_workload("azure-conv", max_requests=600))).scaled(5.0)
print(len(trace.requests), "requests over", round(trace.duration_s, 1), "s")
shape = EngineShape(num_blocks=24800, block_size=16, max_num_seqs=256,
                    max_num_batched_tokens=8192)
cost = StepCostModel.preset("h100")
systems = ["fcfs", "pipeline:qos", "pipeline:mlfq", "pipeline:rate"]
runs = {system: replay(trace, system, shape=shape, cost_model=cost) for system in systems}
summaries = {system: summarize(run, weights=TENANT_WEIGHTS) for system, run in runs.items()}

# %%
print(f"{'system':<15}{'short TTFT p99':>15}{'long TTFT p99':>15}{'TPOT p99':>10}"
      f"{'goodput':>9}")
print(f"{'':<15}{'ms':>15}{'ms':>15}{'ms':>10}{'req/s':>9}")
for system, s in summaries.items():
    short, long, o = s["by_class"]["short"], s["by_class"]["long"], s["overall"]
    print(f"{system:<15}{short['ttft_p99_s'] * 1000:>15.0f}{long['ttft_p99_s'] * 1000:>15.0f}"
          f"{o['tpot_p99_s'] * 1000:>10.0f}{o['goodput_rps']:>9.2f}")

# %%
# benchmarks.replay (its plots module) selects the Agg backend on import: back to inline
# %matplotlib inline
import matplotlib.pyplot as plt
import numpy as np

fig, axes = plt.subplots(1, 2, figsize=(10, 3.5), sharey=True)
for ax, (label, short) in zip(axes, [("short (< 512 tokens)", True),
                                     ("long (>= 512 tokens)", False)], strict=True):
    for system, run in runs.items():
        ttft = np.sort([r.ttft_s for r in run.records
                        if r.outcome == "completed" and (r.prompt_tokens < 512) == short])
        ax.plot(ttft, np.arange(1, len(ttft) + 1) / len(ttft), label=system)
    ax.set_xscale("log")
    ax.set_xlabel(f"TTFT of {label} prompts (s)")
    ax.grid(alpha=0.3)
axes[0].set_ylabel("share of requests")
axes[1].legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# **Reading it.** Ranking and levels both trade long prompts' latency for short ones':
# `qos` gives short prompts a lower TTFT p99 than `fcfs` and long ones a higher one (their
# length penalty is up to 16 s), `mlfq` gets short prompts through even faster by sinking long
# prefills and long generations below them. The token bucket alone barely moves latency here:
# it only caps Bronze prefills, which are a small share of this trace, and it is meant to
# protect urgent requests inside a pipeline rather than to reorder anything by itself.

# %% tags=["remove-cell"]
for system, s in summaries.items():
    o = s["overall"]
    assert o["completed"] + o["rejected"] + o["cancelled"] == o["offered"] == 600, system
    assert o["rejected"] == 0, system  # none of these pipelines has an admission policy
fcfs = summaries["fcfs"]["by_class"]
for system in ("pipeline:qos", "pipeline:mlfq"):
    assert summaries[system]["by_class"]["short"]["ttft_p99_s"] < fcfs["short"]["ttft_p99_s"]
assert (summaries["pipeline:mlfq"]["by_class"]["short"]["ttft_p99_s"]
        < summaries["pipeline:qos"]["by_class"]["short"]["ttft_p99_s"])
assert summaries["pipeline:qos"]["by_class"]["long"]["ttft_p99_s"] > fcfs["long"]["ttft_p99_s"]
assert max(chunks) == 2048 and sum(chunks) == 6000  # the bucket capped the Bronze prefill

# %% [markdown]
# ## Using it in vLLM
#
# The three policies compose in one `Pipeline`; the same object runs inside a live engine:
#
# ```python
# from integrations.vllm_v1 import Pipeline, build_llm
# from policies import MLFQ, QoSRanker, TokenBucket
#
# pipeline = Pipeline(levels=MLFQ(), ranking=QoSRanker(), rate=TokenBucket())
# llm = build_llm(pipeline, model="path/to/model")      # a vllm.LLM with PolicyScheduler
# outputs = llm.generate(prompts, sampling_params, priority=[-1, 0, 1])
# ```
#
# or behind vLLM's OpenAI server: `python -m integrations.vllm_v1.serving --pipeline mlfq
# --model path/to/model` (presets `qos`, `mlfq`, `rate`, or `default` for every layer at
# once). Clients set `priority` and `vllm_xargs` (`tenant`, `slo_class`).
