"""Write the tutorial notebooks from plain Python (outputs come from `make notebooks`/nbmake).

Run: ``python notebooks/make_notebooks.py [NAME ...]`` (all notebooks, or only the named
ones, e.g. ``07_pd_disaggregation``); then execute them with
``jupyter nbconvert --to notebook --execute --inplace notebooks/*.ipynb``.
"""

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).parent


def hidden(source: str):
    """A check cell: executed in CI, hidden on the docs site."""
    return new_code_cell(source, metadata={"tags": ["remove-cell"]})


QUICKSTART = [
    new_markdown_cell("""# Quickstart: a QoS pipeline on the real vLLM scheduler

**What you'll learn**: compose a `Pipeline` from policy objects, run a slice of a real
production trace (Azure LLM inference, conversation) through vLLM's own scheduler in virtual
time, and see what QoS ranking does to time-to-first-token (TTFT) compared with stock vLLM."""),
    new_markdown_cell("## Setup"),
    new_code_cell("""import logging
import os
os.environ.setdefault("HF_HUB_OFFLINE", "1")
logging.getLogger("vllm").setLevel(logging.ERROR)  # quiet CPU-platform notices

from benchmarks.replay.cost_model import StepCostModel
from benchmarks.replay.datasets import load_trace
from benchmarks.replay.driver import replay
from benchmarks.replay.metrics import summarize
from integrations.vllm_v1 import EngineShape, Pipeline
from policies import QoSRanker"""),
    new_markdown_cell("""## The policy in Python

`QoSRanker` ranks requests by API priority, prompt-length class and time waited. Its key
does not change while a request waits (linear aging), so vLLM's waiting queue stays a heap."""),
    new_code_cell("""ranker = QoSRanker(priority_step_s=2.0,
                   length_thresholds_tokens=(256, 1024, 4096),
                   length_penalties_s=(0.0, 1.0, 4.0, 16.0))
pipeline = Pipeline(ranking=ranker)
print(pipeline)
print("a request is never overtaken by one arriving more than",
      ranker.max_overtake_s(-1, 1), "s later (priorities -1..1)")"""),
    new_markdown_cell("""## A run on a real trace

The first 600 requests of the Azure conversation trace, offered 5x faster than recorded, on
an engine shaped like Llama-3-8B on one H100 (step times from the built-in cost model).
`replay` drives vLLM's real `Scheduler` and KV-cache manager; only the GPU is simulated."""),
    new_code_cell("""trace = load_trace("azure-conv", max_requests=600).scaled(5.0)
shape = EngineShape(num_blocks=24800, block_size=16, max_num_seqs=256,
                    max_num_batched_tokens=8192)
cost = StepCostModel.preset("h100")
runs = {system: replay(trace, system, shape=shape, cost_model=cost)
        for system in ["fcfs", "pipeline:qos"]}
summaries = {system: summarize(run) for system, run in runs.items()}"""),
    new_code_cell("""rows = []
for system, s in summaries.items():
    for cls in ("short", "long"):
        c = s["by_class"][cls]
        rows.append((system, cls, c["completed"], c["ttft_p50_s"] * 1000, c["ttft_p99_s"] * 1000))
print(f"{'system':<14}{'class':<7}{'done':>6}{'TTFT p50 ms':>13}{'TTFT p99 ms':>13}")
for row in rows:
    print(f"{row[0]:<14}{row[1]:<7}{row[2]:>6}{row[3]:>13.0f}{row[4]:>13.0f}")"""),
    new_code_cell("""import matplotlib.pyplot as plt
import numpy as np

fig, ax = plt.subplots(figsize=(6, 3.5))
for system, run in runs.items():
    ttft = np.sort([r.ttft_s for r in run.records if r.prompt_tokens < 512])
    ax.plot(ttft, np.arange(1, len(ttft) + 1) / len(ttft), label=system)
ax.set_xscale("log"); ax.set_xlabel("TTFT of short requests (s)"); ax.set_ylabel("share")
ax.legend(); ax.grid(alpha=0.3)
plt.show()"""),
    hidden("""fcfs, qos = summaries["fcfs"], summaries["pipeline:qos"]
assert fcfs["overall"]["completed"] == qos["overall"]["completed"] == 600
assert qos["by_class"]["short"]["ttft_p99_s"] < fcfs["by_class"]["short"]["ttft_p99_s"]"""),
    new_markdown_cell("""## Using it in vLLM

The same `pipeline` object runs inside a live engine:

```python
llm = pipeline.llm(model="path/to/model")           # a vllm.LLM with PolicyScheduler
server = pipeline.serve("path/to/model", port=8000)  # vLLM's OpenAI server
server.wait_until_healthy()
```

or from a shell: `python -m integrations.vllm_v1.serving --pipeline qos --model path/to/model`.
Clients set `priority` and `vllm_xargs` (`tenant`, `slo_class`, `deadline_ms`)."""),
]

REPLAY = [
    new_markdown_cell("""# Replay: stock vLLM vs a QoS pipeline on a real trace

**What you'll learn**: load a real trace, give it tenants from real ServeGen client
statistics, replay it through vLLM's scheduler as stock `fcfs`, stock `priority` and the `qos`
pipeline, and read latency, SLO attainment, goodput and fairness side by side."""),
    new_markdown_cell("## Setup"),
    new_code_cell("""import logging
import os
os.environ.setdefault("HF_HUB_OFFLINE", "1")
logging.getLogger("vllm").setLevel(logging.ERROR)  # quiet CPU-platform notices

from benchmarks.replay.__main__ import format_table, with_tenant_priorities
from benchmarks.replay.cost_model import PrefillChunk, StepBatch, StepCostModel
from benchmarks.replay.datasets import assign_servegen_tenants, load_trace
from benchmarks.replay.driver import replay
from benchmarks.replay.metrics import summarize
from integrations.vllm_v1 import EngineShape"""),
    new_markdown_cell("""## The trace and the cost model

Requests get tenants `t0..t6` drawn with the rate mix of the seven busiest ServeGen clients;
`t0, t1` are Gold (priority -1), `t2..t4` Silver (0), `t5, t6` Bronze (1). The step-cost model
prices each scheduled batch (Llama-3-8B bf16 on an H100)."""),
    new_code_cell("""trace = with_tenant_priorities(assign_servegen_tenants(
    load_trace("azure-conv", max_requests=1200))).scaled(5.0)
print(len(trace.requests), "requests over", round(trace.duration_s, 1), "s")
cost = StepCostModel.preset("h100")
for name, batch in [("decode 1 seq, ctx 512", StepBatch(decode_context_tokens=(512,))),
                    ("decode 128 seqs, ctx 2048", StepBatch(decode_context_tokens=(2048,) * 128)),
                    ("prefill 2048 tokens", StepBatch(prefills=(PrefillChunk(tokens=2048),)))]:
    print(f"{name:<28}{cost.step_time_s(batch) * 1000:7.1f} ms")"""),
    new_markdown_cell("## The run"),
    new_code_cell("""shape = EngineShape(num_blocks=24800, block_size=16, max_num_seqs=256,
                    max_num_batched_tokens=8192)
runs = [replay(trace, system, shape=shape, cost_model=cost)
        for system in ["fcfs", "priority", "pipeline:qos"]]
summaries = [summarize(run) for run in runs]
print(format_table(summaries))"""),
    new_code_cell("""import matplotlib.pyplot as plt

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
plt.tight_layout(); plt.show()"""),
    hidden("""by = {s["system"]: s for s in summaries}
for s in summaries:
    o = s["overall"]
    assert o["completed"] + o["rejected"] + o["cancelled"] == o["offered"] == 1200
assert by["pipeline:qos"]["by_class"]["short"]["ttft_p99_s"] < by["fcfs"]["by_class"]["short"]["ttft_p99_s"]"""),
    new_markdown_cell("""## From the command line

```bash
python -m benchmarks.replay --trace azure-conv --tenants servegen --rate-scale 4 \\
    --max-requests 4000 --systems fcfs,priority,pipeline:qos --out out/replay
```

writes `out/replay/summary.json` and `out/replay/ttft.png`. Any JSONL/CSV/Mooncake file works
as `--trace`, and `--cost KEY=VALUE` overrides a cost-model coefficient."""),
]


SCHEDULING = [
    new_markdown_cell("""# QoS ranking, MLFQ and token buckets on a real trace

**What you'll learn**: what three scheduling policies decide, shown on the objects
themselves: `QoSRanker` (a fixed rank key from priority, prompt length and arrival), `MLFQ`
(levels that worsen with the service a request receives) and `TokenBucket` (a cap on the
prefill tokens of non-urgent requests that tightens with load). Then each runs alone through
vLLM's real scheduler on a slice of the Azure conversation trace, against stock `fcfs`."""),
    new_markdown_cell("## Setup"),
    new_code_cell("""import logging
import os
os.environ.setdefault("HF_HUB_OFFLINE", "1")
logging.getLogger("vllm").setLevel(logging.ERROR)  # quiet CPU-platform notices

from benchmarks.replay.__main__ import with_tenant_priorities
from benchmarks.replay.cost_model import StepCostModel
from benchmarks.replay.datasets import assign_servegen_tenants, load_trace
from benchmarks.replay.driver import replay
from benchmarks.replay.metrics import summarize
from integrations.vllm_v1 import EngineShape
from integrations.vllm_v1.config.presets import TENANT_WEIGHTS
from policies import MLFQ, LoadSnapshot, QoSRanker, RequestView, TokenBucket
from policies.levels import LEVEL_NAMES"""),
    new_markdown_cell("""## The policies in Python

### `QoSRanker`: one key per request, fixed on arrival

`rank_key = arrival_s + priority · priority_step_s + length_penalty_s(prompt_tokens)`, lowest
first. A more urgent priority or a shorter prompt is worth a head start in seconds, so a
request that waits long enough is served whatever arrives after it: `max_overtake_s` bounds
how much later an arrival may still overtake it."""),
    new_code_cell("""ranker = QoSRanker()
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
          f"{ranker.length_penalty_s(r.prompt_tokens):>11.0f}{ranker.rank_key(r):>10.1f}")"""),
    new_markdown_cell("""### `MLFQ`: levels that worsen with service

A request starts at the first level whose quantum holds its whole prompt (skip-join) and
sinks a level each time its service (prefill and decode tokens) passes the next cumulative
quantum; a preemption lifts it one level back. The level comes before the rank key, so long
generations sink below new short requests."""),
    new_code_cell("""levels = MLFQ()
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
levels.check_invariants()"""),
    new_markdown_cell("""### `TokenBucket`: prefill caps that tighten with load

The bucket of the `rate` preset (and of `default`) caps the prefill chunks of requests with
priority above 0 (Bronze); Gold and Silver requests and all decodes pass uncapped. Credits
refill at a rate set each step by the load: the larger of the queue's share of requests and
the KV usage between 50 % and 90 %."""),
    new_code_cell("""def bucket_of_rate_preset() -> TokenBucket:
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
          f"   refill {bucket.refill_per_s_for(load):>6.0f} tokens/s")"""),
    new_markdown_cell("""A 6000-token Bronze prompt under the "long queue" load, one engine step every 50 ms:
the first chunk spends the full bucket, then each step gets what refilled since the last.
A Gold request of the same size is never capped."""),
    new_code_cell("""bucket = bucket_of_rate_preset()
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
bucket.check_invariants()"""),
    new_markdown_cell("""## A run on a real trace

The first 600 requests of the Azure conversation trace with tenants from ServeGen's client
mix (Gold `t0, t1` priority -1, Silver `t2..t4` 0, Bronze `t5, t6` 1), offered 5x faster
than recorded, on an engine shaped like Llama-3-8B on one H100. Each system is stock `fcfs`
or one policy alone in a `Pipeline` (the presets `qos`, `mlfq` and `rate`); `replay` drives
vLLM's real `Scheduler` in virtual time, with step times from the cost model."""),
    new_code_cell("""trace = with_tenant_priorities(assign_servegen_tenants(
    load_trace("azure-conv", max_requests=600))).scaled(5.0)
print(len(trace.requests), "requests over", round(trace.duration_s, 1), "s")
shape = EngineShape(num_blocks=24800, block_size=16, max_num_seqs=256,
                    max_num_batched_tokens=8192)
cost = StepCostModel.preset("h100")
systems = ["fcfs", "pipeline:qos", "pipeline:mlfq", "pipeline:rate"]
runs = {system: replay(trace, system, shape=shape, cost_model=cost) for system in systems}
summaries = {system: summarize(run, weights=TENANT_WEIGHTS) for system, run in runs.items()}"""),
    new_code_cell("""print(f"{'system':<15}{'short TTFT p99':>15}{'long TTFT p99':>15}{'TPOT p99':>10}"
      f"{'goodput':>9}")
print(f"{'':<15}{'ms':>15}{'ms':>15}{'ms':>10}{'req/s':>9}")
for system, s in summaries.items():
    short, long, o = s["by_class"]["short"], s["by_class"]["long"], s["overall"]
    print(f"{system:<15}{short['ttft_p99_s'] * 1000:>15.0f}{long['ttft_p99_s'] * 1000:>15.0f}"
          f"{o['tpot_p99_s'] * 1000:>10.0f}{o['goodput_rps']:>9.2f}")"""),
    new_code_cell("""# benchmarks.replay (its plots module) selects the Agg backend on import: back to inline
%matplotlib inline
import matplotlib.pyplot as plt
import numpy as np

fig, axes = plt.subplots(1, 2, figsize=(10, 3.5), sharey=True)
for ax, (label, short) in zip(axes, [("short (< 512 tokens)", True),
                                     ("long (>= 512 tokens)", False)]):
    for system, run in runs.items():
        ttft = np.sort([r.ttft_s for r in run.records
                        if r.outcome == "completed" and (r.prompt_tokens < 512) == short])
        ax.plot(ttft, np.arange(1, len(ttft) + 1) / len(ttft), label=system)
    ax.set_xscale("log"); ax.set_xlabel(f"TTFT of {label} prompts (s)"); ax.grid(alpha=0.3)
axes[0].set_ylabel("share of requests")
axes[1].legend()
plt.tight_layout(); plt.show()"""),
    new_markdown_cell("""**Reading it.** Ranking and levels both trade long prompts' latency for short ones':
`qos` gives short prompts a lower TTFT p99 than `fcfs` and long ones a higher one (their
length penalty is up to 16 s), `mlfq` gets short prompts through even faster by sinking long
prefills and long generations below them. The token bucket alone barely moves latency here:
it only caps Bronze prefills, which are a small share of this trace, and it is meant to
protect urgent requests inside a pipeline rather than to reorder anything by itself."""),
    hidden("""for system, s in summaries.items():
    o = s["overall"]
    assert o["completed"] + o["rejected"] + o["cancelled"] == o["offered"] == 600, system
    assert o["rejected"] == 0, system  # none of these pipelines has an admission policy
fcfs = summaries["fcfs"]["by_class"]
for system in ("pipeline:qos", "pipeline:mlfq"):
    assert summaries[system]["by_class"]["short"]["ttft_p99_s"] < fcfs["short"]["ttft_p99_s"]
assert (summaries["pipeline:mlfq"]["by_class"]["short"]["ttft_p99_s"]
        < summaries["pipeline:qos"]["by_class"]["short"]["ttft_p99_s"])
assert summaries["pipeline:qos"]["by_class"]["long"]["ttft_p99_s"] > fcfs["long"]["ttft_p99_s"]
assert max(chunks) == 2048 and sum(chunks) == 6000  # the bucket capped the Bronze prefill"""),
    new_markdown_cell("""## Using it in vLLM

The three policies compose in one `Pipeline`; the same object runs inside a live engine:

```python
from integrations.vllm_v1 import Pipeline
from policies import MLFQ, QoSRanker, TokenBucket

pipeline = Pipeline(levels=MLFQ(), ranking=QoSRanker(), rate=TokenBucket())
llm = pipeline.llm(model="path/to/model")            # a vllm.LLM with PolicyScheduler
outputs = llm.generate(prompts, sampling_params, priority=[-1, 0, 1])
```

or behind vLLM's OpenAI server: `python -m integrations.vllm_v1.serving --pipeline mlfq
--model path/to/model` (presets `qos`, `mlfq`, `rate`, or `default` for every layer at
once). Clients set `priority` and `vllm_xargs` (`tenant`, `slo_class`)."""),
]

FAIRNESS = [
    new_markdown_cell("""# Tenant fairness, deadlines and admission under overload

**What you'll learn**: how `WFQ` shares the engine between tenants by weight (and the bound
it keeps), how `EDFRanker` turns a deadline into slack, how `AdmissionController` and
`KVWatermarks` refuse work with a reason and a Retry-After, and what they do together on an
overloaded slice of a real trace, compared with stock `fcfs` and `priority`."""),
    new_markdown_cell("## Setup"),
    new_code_cell("""import logging
import os
os.environ.setdefault("HF_HUB_OFFLINE", "1")
logging.getLogger("vllm").setLevel(logging.ERROR)  # quiet CPU-platform notices

import random

from benchmarks.replay.__main__ import with_tenant_priorities
from benchmarks.replay.cost_model import StepCostModel
from benchmarks.replay.datasets import assign_servegen_tenants, load_trace
from benchmarks.replay.driver import replay
from benchmarks.replay.metrics import summarize
from integrations.vllm_v1 import EngineShape
from integrations.vllm_v1.serving.http_status import rejection_status
from integrations.vllm_v1.config.presets import TENANT_WEIGHTS, default_pipeline
from policies import WFQ, AdmissionController, EDFRanker, KVWatermarks, LoadSnapshot, RequestView"""),
    new_markdown_cell("""## The policies in Python

### `WFQ`: service in proportion to weight

Each tenant's counter grows by `cost / weight` (a prompt token costs 1, an output token 2);
`select` serves the backlogged tenant with the lowest counter. If each selection is charged
at most `M`, every backlogged tenant's lag behind the lowest counter stays within `M / w`
(the virtual token counter bound of Sheng et al., OSDI '24). Three tenants of weights 4, 2
and 1, always backlogged, each request up to 1024 prompt and 1024 output tokens:"""),
    new_code_cell("""wfq = WFQ(weights=TENANT_WEIGHTS)
print({tenant: wfq.weight(tenant) for tenant in sorted(TENANT_WEIGHTS) if tenant[1:].isdigit()})
toy_tenants = ["t0", "t2", "t5"]
M = 1024 * wfq.input_token_cost + 1024 * wfq.output_token_cost  # largest charge per select
for tenant in toy_tenants:
    wfq.on_backlogged(tenant)
rng = random.Random(0)
worst_lag = dict.fromkeys(toy_tenants, 0.0)
for _ in range(3000):
    tenant = wfq.select()
    wfq.charge(tenant, input_tokens=rng.randint(16, 1024), output_tokens=rng.randint(1, 1024))
    for t in toy_tenants:
        worst_lag[t] = max(worst_lag[t], wfq.lag_tokens(t))
wfq.check_invariants()
stats = wfq.stats()
total = sum(stats.service_cost.values())
print(f"{'tenant':<8}{'weight':>7}{'share':>8}{'worst lag':>11}{'bound M/w':>11}")
for t in toy_tenants:
    print(f"{t:<8}{stats.weights[t]:>7.0f}{stats.service_cost[t] / total:>8.3f}"
          f"{worst_lag[t]:>11.0f}{M / stats.weights[t]:>11.0f}")"""),
    new_markdown_cell("""### `EDFRanker`: deadlines as slack

`slack = deadline − now − estimated remaining work` (30 µs a prompt token, 20 ms an output
token, up to `max_tokens`). The rank key is the latest start time, fixed on arrival; a
waiting request with a deadline whose slack turns negative before its first token is
rejected as `deadline_expired`. Requests without a deadline are ordered as if due 60 s after
arrival but never expire."""),
    new_code_cell("""edf = EDFRanker()
print(edf)
due = RequestView(request_id="due", arrival_s=0.0, prompt_tokens=2000, max_output_tokens=64,
                  deadline_s=3.0)
free = RequestView(request_id="free", arrival_s=0.0, prompt_tokens=2000, max_output_tokens=64)
print(f"estimated remaining {edf.estimated_remaining_s(due):.2f} s,"
      f" latest start (rank key) {edf.rank_key(due):.2f} s")
for now in (0.0, 1.0, 1.6, 1.8):
    print(f"now {now:.1f} s: slack {edf.slack_s(due, now):+.2f} s,"
          f" expired {edf.is_expired(due, now)}")
print(f"without a deadline: key {edf.rank_key(free):.2f} s,"
      f" expired after 1000 s: {edf.is_expired(free, 1000.0)}")"""),
    new_markdown_cell("""### `AdmissionController`: gates, early drop and Retry-After

The `default` pipeline's controller holds the waiting queue under 2048 requests and drops
early (RED-style) from 1024 waiting, more often for less urgent priorities; Gold (-1) is
never dropped early:"""),
    new_code_cell("""admission = default_pipeline().admission
print(f"max_waiting={admission.max_waiting}, early drop from {admission.red_min_waiting}"
      f" to {admission.red_max_waiting} waiting, at most {admission.red_max_drop_probability:.0%}")
print(f"{'waiting':>8}{'p=-1':>7}{'p=0':>7}{'p=1':>7}")
for waiting in (512, 1024, 1536, 2048):
    print(f"{waiting:>8}" + "".join(f"{admission.drop_probability(waiting, p):>7.3f}"
                                    for p in (-1, 0, 1)))"""),
    new_markdown_cell("""A small controller shows each gate's reason, and how Retry-After follows the measured
drain rate (before any request has started it reads the 60 s maximum):"""),
    new_code_cell("""gate = AdmissionController(max_waiting=8, max_waiting_per_class={"bronze": 2},
                           rng=random.Random(0))

def load(now: float, waiting: int) -> LoadSnapshot:
    return LoadSnapshot(now=now, waiting_requests=waiting, running_requests=4, kv_usage=0.3,
                        token_budget=8192)

def show(decision) -> str:
    if decision.admitted:
        return "admitted"
    return f"rejected: {decision.reason}, Retry-After {decision.retry_after_s:.1f} s"

for i in range(3):
    request = RequestView(request_id=f"bronze-{i}", arrival_s=0.0, prompt_tokens=100,
                          priority=1, slo_class="bronze")
    decision = gate.admit(request, load(0.0, waiting=i))
    if decision.admitted:
        gate.on_admitted(request, now=0.0)
    print(f"{request.request_id}: {show(decision)}")
print("8 waiting:", show(gate.admit(RequestView(request_id="x", arrival_s=0.0, prompt_tokens=100),
                                    load(0.0, waiting=8))))
for k in range(80):  # then requests start at 2 per second for 40 s
    started = RequestView(request_id=f"s{k}", arrival_s=0.0, prompt_tokens=100)
    gate.on_admitted(started, now=0.0)
    gate.on_first_scheduled(started, now=0.5 * k)
print(f"8 waiting, drain rate {gate.drain_rate_rps(40.0):.2f} req/s:",
      show(gate.admit(RequestView(request_id="y", arrival_s=40.0, prompt_tokens=100),
                      load(40.0, waiting=8))))
print(gate.stats(now=40.0))
gate.check_invariants()
print({reason: rejection_status(reason) for reason in ("class_full:bronze", "queue_full")})"""),
    new_markdown_cell("""### `KVWatermarks`: admission by KV usage

Green admits everything; yellow (from 70 % of KV blocks in use) refuses priority 1 and
above; red (from 85 %) admits only Gold requests with prompts up to 1024 tokens."""),
    new_code_cell("""marks = KVWatermarks()
print(marks)
cases = [(-1, 500), (-1, 4000), (0, 500), (1, 500)]
print(f"{'KV usage':<16}" + "".join(f"{f'p={p}, {n} tok':>18}" for p, n in cases))
for usage in (0.5, 0.75, 0.9):
    row = []
    for priority, prompt in cases:
        decision = marks.admit(
            RequestView(request_id="r", arrival_s=0.0, prompt_tokens=prompt, priority=priority),
            LoadSnapshot(now=0.0, waiting_requests=0, running_requests=0, kv_usage=usage,
                         token_budget=8192))
        row.append("admit" if decision.admitted
                   else f"{decision.reason} ({decision.retry_after_s:.0f} s)")
    print(f"{usage:.2f} {marks.level(usage).name:<11}" + "".join(f"{c:>18}" for c in row))"""),
    new_markdown_cell("""## A run on an overloaded trace

The first 900 requests of the Azure conversation trace with ServeGen tenants, offered 6x
faster than recorded: more than the engine (Llama-3-8B on one H100, as in the replay
tutorial) can serve, so queues build up. Stock `fcfs` and `priority` against `wfq` (tenant
fairness alone) and `default` (WFQ, QoS ranking, MLFQ, token bucket, admission control and
KV watermarks). Jain's index is computed over weighted tenant service in the 10 s windows
where at least two tenants have requests queued."""),
    new_code_cell("""trace = with_tenant_priorities(assign_servegen_tenants(
    load_trace("azure-conv", max_requests=900))).scaled(6.0)
print(len(trace.requests), "requests over", round(trace.duration_s, 1), "s")
shape = EngineShape(num_blocks=24800, block_size=16, max_num_seqs=256,
                    max_num_batched_tokens=8192)
cost = StepCostModel.preset("h100")
systems = ["fcfs", "priority", "pipeline:wfq", "pipeline:default"]
runs = {system: replay(trace, system, shape=shape, cost_model=cost) for system in systems}
summaries = {system: summarize(run, weights=TENANT_WEIGHTS) for system, run in runs.items()}"""),
    new_code_cell("""import numpy as np

TIERS = {"Gold": ("t0", "t1"), "Bronze": ("t5", "t6")}

def tier_ttft_p99(run, tenants) -> float:
    return float(np.percentile([r.ttft_s for r in run.records
                                if r.outcome == "completed" and r.tenant in tenants], 99))

print(f"{'system':<18}{'Jain':>6}{'Gold p99':>10}{'Bronze p99':>12}{'goodput':>9}  rejections")
print(f"{'':<18}{'':>6}{'s':>10}{'s':>12}{'req/s':>9}")
for system, s in summaries.items():
    rejections = ", ".join(f"{reason}: {n}" for reason, n in s["rejections_by_reason"].items())
    print(f"{system:<18}{s['fairness']['jain_mean']:>6.3f}"
          f"{tier_ttft_p99(runs[system], TIERS['Gold']):>10.2f}"
          f"{tier_ttft_p99(runs[system], TIERS['Bronze']):>12.2f}"
          f"{s['overall']['goodput_rps']:>9.2f}  {rejections or '-'}")"""),
    new_code_cell("""# benchmarks.replay (its plots module) selects the Agg backend on import: back to inline
%matplotlib inline
import matplotlib.pyplot as plt

tenants = sorted(TENANT_WEIGHTS.keys() & summaries["fcfs"]["by_tenant"].keys())
width = 0.8 / len(summaries)
fig, ax = plt.subplots(figsize=(8, 3.5))
for i, (system, s) in enumerate(summaries.items()):
    ax.bar([x + i * width for x in range(len(tenants))],
           [s["by_tenant"][t]["ttft_p99_s"] for t in tenants], width, label=system)
ax.set_xticks([x + 0.4 - width / 2 for x in range(len(tenants))],
              [f"{t} (w={TENANT_WEIGHTS[t]:.0f})" for t in tenants])
ax.set_yscale("log"); ax.set_ylabel("TTFT p99 (s)"); ax.grid(alpha=0.3, axis="y")
ax.legend(fontsize=8, ncols=len(summaries), loc="lower center", bbox_to_anchor=(0.5, 1.0),
          frameon=False)
plt.tight_layout(); plt.show()"""),
    new_markdown_cell("""**Reading it.** `priority` serves Gold first and starves everyone else: the best Gold
latency, the worst Bronze latency and the lowest Jain's index. `wfq` shares the engine by
weight instead, which raises Jain's index well above `fcfs`'s; a tenant that asks for more
than its weighted share (here the busiest Gold tenant, `t0`, with about a third of the
requests for a quarter of the weight) waits behind its own backlog, under `wfq` and `default`
longer than under `fcfs`: weights are a share of service, not a latency guarantee.
`default` adds admission: its KV watermarks turn Bronze requests away while KV usage is above
the yellow mark (over HTTP, 503 with Retry-After), and with QoS ranking and MLFQ inside each
tenant's queue it has the best fairness of the four and the highest goodput."""),
    hidden("""for system, s in summaries.items():
    o = s["overall"]
    assert o["completed"] + o["rejected"] + o["cancelled"] == o["offered"] == 900, system
    assert all(reason.startswith("rejected:") for reason in s["rejections_by_reason"]), system
    assert sum(s["rejections_by_reason"].values()) == o["rejected"], system
    for r in runs[system].records:
        assert r.outcome != "rejected" or r.reason.startswith("rejected:"), r.reason
for system in ("fcfs", "priority", "pipeline:wfq"):
    assert summaries[system]["overall"]["rejected"] == 0, system  # no admission policy
assert summaries["pipeline:default"]["overall"]["rejected"] > 0
assert all(r.priority == 1 for r in runs["pipeline:default"].records if r.outcome == "rejected")
jain = {system: s["fairness"]["jain_mean"] for system, s in summaries.items()}
assert jain["pipeline:default"] > jain["fcfs"] and jain["pipeline:wfq"] > jain["fcfs"]
assert jain["priority"] < jain["fcfs"]
assert jain["pipeline:default"] == max(jain.values())
gold = {system: tier_ttft_p99(run, TIERS["Gold"]) for system, run in runs.items()}
bronze = {system: tier_ttft_p99(run, TIERS["Bronze"]) for system, run in runs.items()}
assert gold["priority"] == min(gold.values()) and bronze["priority"] == max(bronze.values())
goodput = {system: s["overall"]["goodput_rps"] for system, s in summaries.items()}
assert goodput["pipeline:default"] == max(goodput.values())
t0 = {system: s["by_tenant"]["t0"]["ttft_p99_s"] for system, s in summaries.items()}
assert summaries["fcfs"]["by_tenant"]["t0"]["offered"] / 900 > 0.3  # for 4/16 of the weight
assert t0["pipeline:wfq"] > t0["fcfs"] and t0["pipeline:default"] > t0["fcfs"]
for t in toy_tenants:  # the WFQ bound held in the toy run above
    assert 0.0 <= worst_lag[t] <= M / wfq.weight(t)"""),
    new_markdown_cell("""## Serving it over HTTP

```bash
python -m integrations.vllm_v1.serving --pipeline default --model path/to/model
```

starts vLLM's OpenAI server with the `default` pipeline. Clients name their tenant and
class in `vllm_xargs` (and may send `deadline_ms` for an `EDFRanker` pipeline):

```bash
curl -s -i localhost:8000/v1/completions -H 'content-type: application/json' -d '{
  "model": "m", "prompt": "Hello", "max_tokens": 64, "priority": 1,
  "vllm_xargs": {"tenant": "t5", "slo_class": "bronze"}}'
```

A request the scheduler rejects gets no tokens and an error status with a `Retry-After`
header: **429** when the client's own quota is spent (`class_full:<class>`), **503** when
the server is overloaded (`queue_full`, `kv_full`, `early_drop`, `kv_yellow`, `kv_red`,
`deadline_expired`). Clients should back off for Retry-After seconds. Streaming requests
are not mapped (vLLM sends an empty 200 stream); the "Serving over HTTP" guide has the
details."""),
]


SUFFIX_DECODING = [
    new_markdown_cell("""# Suffix decoding: a suffix automaton drafts from real agent, SQL and code outputs

**What you'll learn**: how `SuffixAutomaton` finds the longest repeated suffix of a context in
amortised O(1) per token, how `SuffixDrafter` combines each request's own context with a
`SharedSuffixCache` of earlier outputs, and how its drafts compare with vLLM's `ngram` and
arctic-inference's suffix trees on real GPT-4 outputs (MT-bench, Spider SQL, HumanEval code):
tokens per step (τ) and propose latency."""),
    new_markdown_cell("## Setup"),
    new_code_cell("""import logging
import time

import matplotlib.pyplot as plt
import numpy as np

logging.getLogger("vllm").setLevel(logging.ERROR)

from benchmarks.spec_replay.datasets import load_records, load_tokenizer
from benchmarks.spec_replay.proposers import arctic_available, make_proposers
from benchmarks.spec_replay.replay import replay, tokenize
from benchmarks.spec_replay.sweep import context_sweep
from policies import DraftConfig, SharedSuffixCache, SuffixAutomaton, SuffixDrafter

tokenizer = load_tokenizer("gpt2")  # GPT-2 BPE, bundled
print("arctic-inference installed:", arctic_available())"""),
    new_markdown_cell("""## The policy in Python

A suffix automaton over the tokens seen so far answers "what is the longest suffix of the
context that occurred before, and what followed it?" without rescanning the context. Each
state counts its occurrences, so a draft follows the most frequent continuation and carries
an empirical probability."""),
    new_code_cell("""automaton = SuffixAutomaton()
automaton.extend([5, 6, 7, 8, 9, 1, 2, 5, 6, 7, 3, 5, 6])
state, match_tokens = automaton.repeated_suffix()          # "5 6" occurred before
print("longest repeated suffix:", match_tokens, "tokens")
print("continuations of [5, 6]:", automaton.continuations([5, 6]))
tokens, probs = np.zeros(8, np.int32), np.zeros(8)
n, score = automaton.draft((state, match_tokens), 8, 0.1, tokens, probs)
print("draft:", tokens[:n].tolist(), "cumulative probabilities:", probs[:n].round(2).tolist())
automaton.check_invariants()"""),
    new_markdown_cell("""`SuffixDrafter` keeps one automaton per request (prompt + output so far) and a cursor into
every generation of the shared cache; `finish` moves a request's output into the cache.
Draft length adapts to the match: at most `match_scale * match + match_offset_tokens`
tokens, stopping when the cumulative probability drops below `min_token_prob`."""),
    new_code_cell("""drafter = SuffixDrafter(config=DraftConfig(max_draft_tokens=16),
                        shared=SharedSuffixCache(max_tokens=1_000_000))
sql = tokenizer.encode_ordinary
drafter.start("q1", sql("How many singers are there?"))
drafter.extend("q1", sql("SELECT count(*) FROM singer"))
drafter.finish("q1")
drafter.start("q2", sql("How many concerts are there?"))
drafter.extend("q2", sql("SELECT count("))
draft = drafter.propose("q2")
print(draft.source.value, repr(tokenizer.decode(list(draft.tokens))), round(draft.score, 2))
print(drafter.stats().shared)"""),
    new_markdown_cell("""## A run on real outputs

Each request's real GPT-4 output is replayed: draft (k = 32), accept the longest matching
prefix, emit it plus one token, update, repeat. The shared caches see earlier outputs only,
in arrival order. Peers in the same run: vLLM's own n-gram matcher (defaults 5/5) and, when
installed, arctic-inference's `SuffixDecodingCache` (global cache, spec factor 4)."""),
    new_code_cell("""datasets = {"MT-bench": ("mt_bench", None), "Spider SQL": ("spider", 400),
            "HumanEval": ("humaneval", None)}
requests = {name: tokenize(load_records(data, n), tokenizer)
            for name, (data, n) in datasets.items()}
replay(make_proposers("suffix_automaton", 32)[0], requests["HumanEval"][:3], 32)  # JIT warm-up
peers = {"suffix_automaton", "ngram[5-5]", "arctic[global,factor=4]"}
rows = [(name, replay(proposer, reqs, 32))
        for name, reqs in requests.items()
        for family in ["suffix_automaton", "ngram", "arctic"]
        for proposer in make_proposers(family, 32) if proposer.name in peers]
print(f"{'dataset':12} {'proposer':24} {'tau':>6} {'accept':>7} {'p50 us':>7} {'p99 us':>7} {'B/token':>8}")
for name, r in rows:
    print(f"{name:12} {r.proposer:24} {r.tau:6.2f} {r.acceptance:7.3f} {r.propose_p50_us:7.1f}"
          f" {r.propose_p99_us:7.1f} {r.bytes_per_token:8.0f}")"""),
    new_markdown_cell("""τ is deterministic; latencies depend on the machine (shared CI cores here), so compare
proposers within the run. Next, propose latency against context length: the n-gram matcher
re-reads the whole context every step, the automaton keeps a cursor."""),
    new_code_cell("""sweep = context_sweep(tokenizer, ["suffix_automaton", "ngram"], k=32, steps=60,
                      lengths=(1_024, 4_096, 16_384, 65_536))
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
names = list(datasets)
proposers = sorted({r.proposer for _, r in rows})
width = 0.8 / len(proposers)
for i, p in enumerate(proposers):
    taus = [next(r.tau for n, r in rows if n == name and r.proposer == p) for name in names]
    ax1.bar(np.arange(len(names)) + i * width, taus, width, label=p)
ax1.set_xticks(np.arange(len(names)) + width * (len(proposers) - 1) / 2, names)
ax1.set_ylabel("tokens per step (τ), k = 32")
ax1.legend(fontsize=8)
for p in sorted({row["proposer"] for row in sweep}):
    pts = [(row["context_tokens"], row["propose_p50_us"]) for row in sweep if row["proposer"] == p]
    ax2.plot(*zip(*pts), marker="o", label=p)
ax2.set_xscale("log", base=2)
ax2.set_yscale("log")
ax2.set_xlabel("context tokens")
ax2.set_ylabel("propose p50 (µs)")
ax2.legend(fontsize=8)
fig.tight_layout()"""),
    hidden("""tau = {(n, r.proposer): r.tau for n, r in rows}
for name in ["Spider SQL", "HumanEval"]:
    assert tau[(name, "suffix_automaton")] >= 1.5 * tau[(name, "ngram[5-5]")], name
for name in names:
    assert tau[(name, "suffix_automaton")] > tau[(name, "ngram[5-5]")], name
    if arctic_available():
        assert tau[(name, "suffix_automaton")] >= tau[(name, "arctic[global,factor=4]")], name
lat = {(row["proposer"], row["context_tokens"]): row["propose_p50_us"] for row in sweep}
assert lat[("ngram[5-5]", 65_536)] > 5 * lat[("ngram[5-5]", 1_024)]  # O(context)
assert lat[("suffix_automaton", 65_536)] < 3 * lat[("suffix_automaton", 1_024)] + 5  # flat
drafter.check_invariants()"""),
    new_markdown_cell("""## Using it in vLLM

The proposer is a vLLM `custom_class`; it needs no draft model and no change to vLLM:

```python
from vllm import LLM

llm = LLM(model="path/to/model", speculative_config={
    "method": "custom_class",
    "model": "integrations.vllm_v1.speculative.proposer.SuffixAutomatonProposer",
    "num_speculative_tokens": 32})
```

To change the draft rules or the shared-cache bound, subclass it in an importable module:

```python
from integrations.vllm_v1.speculative.proposer import SuffixAutomatonProposer
from policies import DraftConfig

class SQLProposer(SuffixAutomatonProposer):
    draft_config = DraftConfig(max_draft_tokens=32, match_scale=8.0)
    shared_cache_tokens = 16_000_000
```

vLLM's own `vllm:spec_decode_*` counters on `/metrics` report drafts and accepted tokens; the
proposer adds `policies:spec_*` (τ, coverage, latency, cache sizes) when `PROMETHEUS_MULTIPROC_DIR`
is set. The full benchmark is `python -m benchmarks.spec_replay`; see the *Speculative
decoding* guide."""),
]

KV_CACHE = [
    new_markdown_cell("""# KV-cache eviction: segmented LRU against vLLM's LRU and Belady's optimum

**What you'll learn**: how `SegmentedLRU` orders a prefix cache's evictable blocks (probation,
protected, orphans, a ghost list of evicted content), and how much of the gap between vLLM's
LRU and the offline optimum (Belady) it closes on the real Mooncake conversation trace."""),
    new_markdown_cell("## Setup"),
    new_code_cell("""import matplotlib.pyplot as plt

from benchmarks.cache_replay.simulate import replay_opt, replay_order
from benchmarks.replay.datasets import load_trace
from policies import LRU, Segment, SegmentedLRU

trace = load_trace("mooncake-conv")  # 12,031 requests, 512-token prefix hashes
chains = [request.block_hashes for request in trace.requests]
print(len(chains), "requests,", sum(map(len, chains)), "prompt blocks")"""),
    new_markdown_cell("""## The policy in Python

An eviction order sees four calls: `release(key, parent)` when a cached block is no longer
referenced, `acquire(key)` on a prefix hit, `evict()` when a block is needed, and
`release_uncached(key)` for blocks with no content. A block used twice is protected; a block
whose parent is evicted becomes an orphan and goes next."""),
    new_code_cell("""order = SegmentedLRU()
for key, parent in [("q1", "sys"), ("sys", None)]:     # request 1 frees its chain tail first
    order.release(key, parent)
order.acquire("sys")                                    # request 2 hits the system prompt
for key, parent in [("q2", "sys"), ("sys", None)]:
    order.release(key, parent)
print({key: order.segment_of(key).name for key in order})
print("eviction order:", list(order))
order.check_invariants()
order.stats()"""),
    new_markdown_cell("""## A run on a real trace

Each request hits the longest cached prefix of its block chain (vLLM's semantics), computes
the rest into blocks taken from the cache, and frees its blocks tail first."""),
    new_code_cell("""sizes = [1000, 2000, 4000]
results = []
for size in sizes:
    results.append(replay_order(chains, size, LRU(), "lru"))
    results.append(replay_order(chains, size, SegmentedLRU(), "slru"))
    results.append(replay_opt(chains, size))
rate = {(r.policy, r.cache_blocks): r.hit_rate for r in results}
print(f"{'blocks':>7}{'lru':>8}{'slru':>8}{'opt':>8}{'gap closed':>12}")
for size in sizes:
    lru, slru, opt = (rate[(p, size)] for p in ("lru", "slru", "opt"))
    print(f"{size:>7}{lru:>8.2%}{slru:>8.2%}{opt:>8.2%}{(slru - lru) / (opt - lru):>12.0%}")"""),
    new_code_cell("""fig, ax = plt.subplots(figsize=(6, 3.5))
for policy in ("lru", "slru", "opt"):
    ax.plot(sizes, [100 * rate[(policy, s)] for s in sizes], marker="o", label=policy)
ax.set_xscale("log")
ax.set_xlabel("cache size (512-token blocks)")
ax.set_ylabel("prefix hit rate (%)")
ax.legend()
ax.grid(True, alpha=0.3)
fig.tight_layout()"""),
    hidden("""for size in sizes:
    assert rate[("lru", size)] < rate[("slru", size)] < rate[("opt", size)], size
assert rate[("slru", 2000)] >= 2 * rate[("lru", 2000)]
assert order.segment_of("sys") is Segment.PROTECTED"""),
    new_markdown_cell("""## Using it in vLLM

`Pipeline(eviction=...)` installs the order as the block pool's free-block queue of our
scheduler (no vLLM code is patched); `LRU()` there reproduces stock vLLM exactly:

```python
from integrations.vllm_v1 import Pipeline
from policies import SegmentedLRU

llm = Pipeline(eviction=SegmentedLRU()).llm(model="path/to/model", enable_prefix_caching=True)
```

The full sweep is `python -m benchmarks.cache_replay --trace mooncake-conv --cache-blocks 500
1000 2000 4000 8000 --policies lru,slru,opt --out out/cache`; see the *KV-cache eviction*
guide for the results on the real scheduler."""),
    new_markdown_cell("""## Tiers behind the GPU cache

`TierPlacement` keeps blocks in CPU DRAM and on disk behind the GPU prefix cache (LRU within
each tier; a full tier demotes its oldest block one tier down; high-priority blocks never go
to disk). Below, the same trace runs through a GPU LRU of 2,000 blocks with every computed
block written through to a CPU tier of 4,000 and a disk tier of 16,000 blocks: a prefix the
GPU lost is loaded from a tier instead of recomputed."""),
    new_code_cell("""from collections import Counter, OrderedDict

from policies import Tier, TierPlacement

gpu_blocks = 2000
gpu = OrderedDict()
tiers = TierPlacement(tiers=[Tier(name="cpu", capacity_blocks=4000),
                             Tier(name="disk", capacity_blocks=16000)])
blocks_by_source = Counter()
for chain in chains:
    source = "gpu"
    for key in chain:  # the longest available prefix hits; the rest is computed
        if source == "gpu" and key not in gpu:
            source = "cpu/disk" if key in tiers else "computed"
        elif source == "cpu/disk" and key not in tiers:
            source = "computed"
        if source == "cpu/disk":
            blocks_by_source[tiers.use(key)] += 1
        else:
            blocks_by_source[source] += 1
        if source == "computed":
            tiers.store(key)  # write-through of every computed block
        gpu[key] = None
        gpu.move_to_end(key)
        while len(gpu) > gpu_blocks:
            gpu.popitem(last=False)
tiers.check_invariants()
total = sum(blocks_by_source.values())
for source in ("gpu", "cpu", "disk", "computed"):
    print(f"{source:>9}: {blocks_by_source[source] / total:6.2%} of prompt blocks")
tiers.stats()"""),
    new_code_cell("""fig, ax = plt.subplots(figsize=(5, 3))
sources = ["gpu", "cpu", "disk", "computed"]
ax.bar(sources, [100 * blocks_by_source[s] / total for s in sources])
ax.set_ylabel("share of prompt blocks (%)")
ax.set_title("where prompt blocks come from (GPU 2k, CPU 4k, disk 16k blocks)")
fig.tight_layout()"""),
    hidden("""assert blocks_by_source["cpu"] > 0 and blocks_by_source["disk"] > 0
assert abs(blocks_by_source["gpu"] / total - rate[("lru", 2000)]) < 0.01"""),
    new_markdown_cell("""In vLLM the tiers run in our KV connector, `KVTierConnector`: every block that fills is
copied to the CPU tier after its step, so a **preempted request resumes by loading its
blocks** instead of recomputing them, and a prompt the GPU cache evicted is loaded from CPU
or disk. Enable it with one engine argument (it composes with `Pipeline.llm`):

```python
from integrations.vllm_v1.cache.tiers.config import KVTierConfig

tiers = KVTierConfig(cpu_blocks=4096, disk_blocks=65536, disk_path="/mnt/kv")
llm = LLM(**tiers.engine_kwargs(model="path/to/model", enable_prefix_caching=True))
```

`python -m benchmarks.kv_tier --out out/kv_tier` compares it with stock vLLM on a live CPU
engine (see *Tiered KV storage* in the KV-cache guide)."""),
]

BUSINESS_CASE = [
    new_markdown_cell("""# The business case: seven tenants, five phases, stock vLLM vs the fixes

**What you'll learn**: build the seven-tenant, five-phase enterprise workload, compose the
`pipeline+fixes` pipeline (the `default` preset plus prefill budget isolation, deadline
expiry and a non-starving yellow KV band), replay both it and stock vLLM `fcfs` through vLLM's own scheduler in virtual time,
and read the per-phase Gold TTFT, fairness and admission accounting."""),
    new_markdown_cell("## Setup"),
    new_code_cell("""import logging
import os
os.environ.setdefault("HF_HUB_OFFLINE", "1")
logging.getLogger("vllm").setLevel(logging.ERROR)  # quiet CPU-platform notices

from benchmarks.e2e_business_cases.report import headline_rows
from benchmarks.e2e_business_cases.study import run_study
from benchmarks.e2e_business_cases.systems import fixes_pipeline
from benchmarks.e2e_business_cases.workload import PHASES, business_workload"""),
    new_markdown_cell("""## The policies in Python

`fixes_pipeline()` is the `default` preset (tier-weighted WFQ, QoS ranking, MLFQ, a prefill
token bucket, admission control, KV watermarks) with the fixes in their slots: a per-tenant
prefill budget composed with the token bucket (`TokenCaps`), `EDFRanker` as the `deadlines`
policy, which drops a waiting request that can no longer meet its deadline, and KV watermarks
whose yellow band no longer rejects low priorities (it starved the Bronze tenants in the
overload; the red band and queue admission still bound the load)."""),
    new_code_cell("""pipeline = fixes_pipeline()
print("rate:", pipeline.rate)
print("deadlines:", pipeline.deadlines)
print("yellow band rejects priority >=", pipeline.watermarks.low_priority_from)
for phase in PHASES:
    print(f"{phase.name:<14} tenants x{dict(phase.tenant_multipliers) or 1}  "
          f"kinds x{dict(phase.kind_multipliers) or 1}")"""),
    new_markdown_cell("""## A run

The same workload as `python -m benchmarks.e2e_business_cases`, with 15 s phases instead of
60 s (the same rates, a quarter of the requests) and two systems, so that it runs in well
under a minute. Request lengths come from the real Azure 2023 traces; step times from the
H100 cost model; the scheduler and KV-cache manager are vLLM's own."""),
    new_code_cell("""workload = business_workload(seed=0, phase_s=15.0)
summary = run_study(workload, systems=["fcfs", "pipeline+fixes"])
print(len(workload.trace.requests), "requests offered")"""),
    new_code_cell("""header, rows = headline_rows(summary)
print("Gold short-request TTFT p99 (ms)")
print("".join(f"{h:>16}" if i else f"{h:<28}" for i, h in enumerate(header)))
for row in rows:
    print("".join(f"{c:>16}" if i else f"{c:<28}" for i, c in enumerate(row)))
last = summary["phases"][-1]["systems"]["pipeline+fixes"]
print(f"\\nphase 5, pipeline+fixes: {last['offered']} offered = {last['admitted']} admitted + "
      f"{last['rejected']} rejected ({last['rejections_with_retry_after']} with Retry-After)")"""),
    new_code_cell("""import matplotlib.pyplot as plt
import numpy as np

fig, ax = plt.subplots(figsize=(8, 3.5))
x = np.arange(len(summary["phases"]))
for i, system in enumerate(["fcfs", "pipeline+fixes"]):
    values = [p["systems"][system]["gold_short_ttft_p99_s"] * 1000 for p in summary["phases"]]
    ax.bar(x + (i - 0.5) * 0.4, values, 0.4, label=system)
ax.axhline(500, color="k", ls="--", label="Gold TTFT SLO")
ax.set_xticks(x, [p["name"] for p in summary["phases"]])
ax.set_yscale("log")
ax.set_ylabel("Gold short TTFT p99 (ms)")
ax.legend()
fig.tight_layout()"""),
    hidden("""phases = summary["phases"]
for p in phases:
    for m in p["systems"].values():
        assert m["admitted"] + m["rejected"] == m["offered"]
fcfs = [p["systems"]["fcfs"]["gold_short_ttft_p99_s"] for p in phases]
fixed = [p["systems"]["pipeline+fixes"]["gold_short_ttft_p99_s"] for p in phases]
assert fixed[-1] < fcfs[-1] / 2, (fixed, fcfs)
assert phases[-1]["systems"]["pipeline+fixes"]["all_rejections_have_retry_after"]
assert pipeline.deadlines is not None"""),
    new_markdown_cell("""## Using it in vLLM

The same pipeline serves over HTTP; clients send their tier as `priority` and their tenant,
SLO class and deadline in `vllm_xargs`:

```python
from benchmarks.e2e_business_cases.systems import fixes_pipeline

server = fixes_pipeline().serve("path/to/model", port=8000)
server.wait_until_healthy()
```

`python -m benchmarks.e2e_business_cases --live --quick --out out/live` plays a scaled-down
version of this workload through a real CPU vLLM server (stock `fcfs`, then
`pipeline+fixes`) and measures TTFT and TPOT client-side; see the *Business case* page."""),
]

PD_DISAGGREGATION = [
    new_markdown_cell("""# Prefill/decode disaggregation: routing and PD-aware scheduling

**What you'll learn**: route requests over a prefill pool and a decode pool with `PDRouter`
(load, prefix affinity, bounded load, failover), give each pool its PD-aware scheduling
preset, replay a real conversation trace through a cluster of vLLM schedulers in virtual
time, compare against round robin and a colocated cluster of the same size, and launch a
real NP:MD deployment with `pipeline.serve_disaggregated`."""),
    new_markdown_cell("## Setup"),
    new_code_cell("""import logging
import os
import random
os.environ.setdefault("HF_HUB_OFFLINE", "1")
logging.getLogger("vllm").setLevel(logging.ERROR)  # quiet CPU-platform notices

import attrs

from benchmarks.pd_replay.__main__ import SCHEDULING, format_table, make_router, row
from benchmarks.pd_replay.cluster import TransferModel, run_cluster
from benchmarks.replay.cost_model import StepCostModel
from benchmarks.replay.datasets import load_trace
from integrations.vllm_v1 import EngineShape
from integrations.vllm_v1.pd.roles import PD_DECODE, PD_PREFILL
from policies import InstanceLoad, LeastLoadedRouter, PDRouter, chain_keys"""),
    new_markdown_cell("""## The router in Python

`route(request_id, prompt_tokens, block_keys, loads)` picks a decode instance, then a
prefill instance unless the decode instance already holds all but a short suffix. The
second turn of a conversation goes where its first turn's blocks are; when that instance
is marked down, the next best one takes it (`spillover`)."""),
    new_code_cell("""router = PDRouter(prefill=["p0", "p1"], decode=["d0", "d1"], block_size_tokens=512,
                  rng=random.Random(0))
idle = {name: InstanceLoad() for name in ["p0", "p1", "d0", "d1"]}
first = router.route("turn-1", 2100, chain_keys([11, 12, 13, 14]), idle)
second = router.route("turn-2", 2400, chain_keys([11, 12, 13, 14, 15]), idle)
router.mark_down(second.decode)
third = router.route("turn-3", 2400, chain_keys([11, 12, 13, 14, 15]), idle)
for d in (first, second, third):
    print(f"{d.request_id}: prefill {d.prefill} ({d.prefill_reason.value}), decode {d.decode} "
          f"({d.decode_reason.value}), {d.decode_cached_blocks} blocks already there")"""),
    new_markdown_cell("""## PD-aware scheduling presets

A prefill-only instance generates one token per request: it should batch prompts and put
cached ones first. A decode-only instance should keep inter-token latency flat: each
decode step reads the KV of every sequence in the batch, so `DecodeKVGate` starts a
request only while the KV the batch holds stays under half the cache (requests wait,
they are not rejected)."""),
    new_code_cell("""print("prefill:", PD_PREFILL.pipeline.ranking, PD_PREFILL.pipeline.eviction,
      PD_PREFILL.vllm_args())
print("decode: ", PD_DECODE.pipeline.start_gate)"""),
    new_markdown_cell("""## A cluster replay on a real trace

The first 200 requests of the Mooncake conversation trace (prompts of 1k to 120k tokens),
3 prefill + 2 decode H100s against 5 colocated H100s. Every instance is vLLM's own
scheduler and KV-cache manager with no model; step times come from the Llama-3-8B H100
cost model, KV moves over a 50 GB/s link per decode instance."""),
    new_code_cell("""trace = load_trace("mooncake-conv", max_requests=200)
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
rows = {run.system: row(run, run.system) for run in runs}
print(format_table(list(rows.values())))"""),
    new_code_cell("""import matplotlib.pyplot as plt
import numpy as np

fig, (ttft_ax, itl_ax) = plt.subplots(1, 2, figsize=(11, 3.6))
for run in runs:
    records = run.run.records
    ttft = np.sort([r.ttft_s for r in records])
    gaps = np.sort(np.concatenate([np.diff(r.token_times_s) for r in records]))
    for ax, values in ((ttft_ax, ttft), (itl_ax, gaps * 1000)):
        ax.plot(values, np.arange(1, len(values) + 1) / len(values), label=run.system)
ttft_ax.set_xscale("log"); ttft_ax.set_title("TTFT CDF (s)")
itl_ax.set_xscale("log"); itl_ax.set_title("inter-token latency CDF (ms)")
itl_ax.legend(fontsize=8)
for ax in (ttft_ax, itl_ax):
    ax.grid(alpha=0.3)
fig.tight_layout()"""),
    new_markdown_cell("""Colocated, long prefills stall the decodes sharing their steps: ITL p99 is tens of
times its median. Disaggregated, the remaining ITL spread comes from how much context the
decode batch reads; the decode preset bounds it (ITL p99/p50 near 1.3 or below) and pays
for it in TTFT, since requests wait for room on the decode instances. `pd_router`
balances queued prefill tokens and follows cached prefixes, which keeps its TTFT tail below
round robin's."""),
    hidden("""assert all(r.outcome == "completed" for run in runs for r in run.run.records)
jitter = {name: r["itl_jitter"] for name, r in rows.items()}
assert jitter["colocated"] > 5 * jitter["pd_router"], jitter
assert jitter["pd_router+pd"] < jitter["pd_router"], jitter
assert rows["pd_router"]["ttft_p99_s"] < rows["round_robin"]["ttft_p99_s"]
assert rows["colocated"]["kv_bytes_transferred"] == 0 < rows["pd_router"]["kv_bytes_transferred"]
router.check_invariants()
assert third.decode != second.decode and third.decode_reason.value == "spillover"
"""),
    new_markdown_cell("""## Using it in vLLM

`pipeline.serve_disaggregated` starts N prefill and M decode vLLM OpenAI servers on this
machine, each running the pipeline with its role's preset (slots you set are kept), wires
them with a KV connector (vLLM's shared-storage `ExampleConnector` on CPU, `NixlConnector`
on GPUs) and serves the PD router in front. It returns once everything is healthy; the
handle is a context manager that stops all of it.

```python
import httpx
from integrations.vllm_v1 import Pipeline, tiny_model_dir

if __name__ == "__main__":
    model = str(tiny_model_dir("random"))
    args = ("--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
            "--block-size", "32", "--kv-cache-memory-bytes", str(64 << 20))
    with Pipeline().serve_disaggregated(model, prefill=1, decode=2, vllm_args=args) as pd:
        answer = httpx.post(f"{pd.url}/v1/completions", timeout=120,
                            json={"model": model, "prompt": "Once upon a time " * 20,
                                  "max_tokens": 12, "temperature": 0.0})
        print(answer.json()["choices"][0]["text"])
```

Three tiny engines take 35–60 s to become healthy on 2 CPU cores, so this notebook does not
start them; the same path runs in the engine tests (`tests/pd/test_pd_engine.py`). From
the command line, `python -m benchmarks.pd_replay --trace mooncake-conv --scheduling stock,pd
--out out/pd` runs the full comparison (see the *PD disaggregation* page)."""),
]

def main(only: list[str]) -> None:
    """Write every notebook, or only those named in ``only`` (e.g. ``07_pd_disaggregation``)."""
    for name, cells in [("01_quickstart", QUICKSTART), ("02_replay", REPLAY),
                        ("03_scheduling", SCHEDULING),
                        ("04_fairness_admission", FAIRNESS),
                        ("05_kv_cache", KV_CACHE),
                        ("06_suffix_decoding", SUFFIX_DECODING),
                        ("07_pd_disaggregation", PD_DISAGGREGATION),
                        ("08_business_case", BUSINESS_CASE)]:
        if only and name not in only:
            continue
        notebook = new_notebook(cells=cells, metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
        nbformat.write(notebook, HERE / f"{name}.ipynb")


if __name__ == "__main__":
    main(sys.argv[1:])
