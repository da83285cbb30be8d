# %% [markdown]
# # Tenant fairness, deadlines and admission under overload
#
# **What you'll learn**: how `WFQ` shares the engine between tenants by weight (and the bound
# it keeps), how `EDFRanker` turns a deadline into slack, how `AdmissionController` and
# `KVWatermarks` refuse work with a reason and a Retry-After, and what they do together on an
# overloaded slice of a real trace, compared with stock `fcfs` and `priority`.

# %% [markdown]
# ## Setup

# %%
import logging
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
logging.getLogger("vllm").setLevel(logging.ERROR)  # quiet CPU-platform notices

import random

from benchmarks.replay.__main__ import with_tenant_priorities
from benchmarks.replay.cost_model import StepCostModel
from benchmarks.replay.datasets import assign_servegen_tenants
from benchmarks.replay.driver import replay
from benchmarks.replay.metrics import summarize
from benchmarks.replay.workloads import TENANT_WEIGHTS, load_workload
from integrations.vllm_v1.config.presets import default_pipeline
from integrations.vllm_v1.instruments import EngineShape
from integrations.vllm_v1.rejection import Rejection
from policies import (
    WFQ,
    AdmissionController,
    AdmissionDecision,
    EDFRanker,
    KVWatermarks,
    LoadSnapshot,
    RequestView,
)

# %% [markdown]
# ## The policies in Python
#
# ### `WFQ`: service in proportion to weight
#
# Each tenant's counter grows by `cost / weight` (a prompt token costs 1, an output token 2);
# `select` serves the backlogged tenant with the lowest counter. If each selection is charged
# at most `M`, every backlogged tenant's lag behind the lowest counter stays within `M / w`
# (the virtual token counter bound of Sheng et al., OSDI '24). Three tenants of weights 4, 2
# and 1, always backlogged, each request up to 1024 prompt and 1024 output tokens:

# %%
wfq = WFQ(weights=TENANT_WEIGHTS)
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
          f"{worst_lag[t]:>11.0f}{M / stats.weights[t]:>11.0f}")

# %% [markdown]
# ### `EDFRanker`: deadlines as slack
#
# `slack = deadline − now − estimated remaining work` (30 µs a prompt token, 20 ms an output
# token, up to `max_tokens`). The rank key is the latest start time, fixed on arrival; a
# waiting request with a deadline whose slack turns negative before its first token is
# rejected as `deadline_expired`. Requests without a deadline are ordered as if due 60 s after
# arrival but never expire.

# %%
edf = EDFRanker()
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
      f" expired after 1000 s: {edf.is_expired(free, 1000.0)}")

# %% [markdown]
# ### `AdmissionController`: gates, early drop and Retry-After
#
# The `default` pipeline's controller holds the waiting queue under 2048 requests and drops
# early (RED-style) from 1024 waiting, more often for less urgent priorities; Gold (-1) is
# never dropped early:

# %%
admission = default_pipeline(TENANT_WEIGHTS).admission
print(f"max_waiting={admission.max_waiting}, early drop from {admission.red_min_waiting}"
      f" to {admission.red_max_waiting} waiting, at most {admission.red_max_drop_probability:.0%}")
print(f"{'waiting':>8}{'p=-1':>7}{'p=0':>7}{'p=1':>7}")
for waiting in (512, 1024, 1536, 2048):
    print(f"{waiting:>8}" + "".join(f"{admission.drop_probability(waiting, p):>7.3f}"
                                    for p in (-1, 0, 1)))

# %% [markdown]
# A small controller shows each gate's reason, and how Retry-After follows the measured
# drain rate (before any request has started it reads the 60 s maximum):

# %%
gate = AdmissionController(max_waiting=8, max_waiting_per_class={"bronze": 2},
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
print({reason: Rejection.from_decision(AdmissionDecision.reject(reason, 1.0)).http_status
       for reason in ("class_full:bronze", "queue_full")})

# %% [markdown]
# ### `KVWatermarks`: admission by KV usage
#
# Green admits everything; yellow (from 70 % of KV blocks in use) refuses priority 1 and
# above; red (from 85 %) admits only Gold requests with prompts up to 1024 tokens.

# %%
marks = KVWatermarks()
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
    print(f"{usage:.2f} {marks.level(usage).name:<11}" + "".join(f"{c:>18}" for c in row))

# %% [markdown]
# ## A run on an overloaded trace
#
# The first 900 requests of the Azure conversation trace with ServeGen tenants, offered 6x
# faster than recorded: more than the engine (Llama-3-8B on one H100, as in the replay
# tutorial) can serve, so queues build up. Stock `fcfs` and `priority` against `wfq` (tenant
# fairness alone) and `default` (WFQ, QoS ranking, MLFQ, token bucket, admission control and
# KV watermarks). Jain's index is computed over weighted tenant service in the 10 s windows
# where at least two tenants have requests queued.

# %%
trace = with_tenant_priorities(assign_servegen_tenants(
    load_workload("azure-conv", max_requests=900))).scaled(6.0)
print(len(trace.requests), "requests over", round(trace.duration_s, 1), "s")
shape = EngineShape(num_blocks=24800, block_size=16, max_num_seqs=256,
                    max_num_batched_tokens=8192)
cost = StepCostModel.preset("h100")
systems = ["fcfs", "priority", "pipeline:wfq", "pipeline:default"]
runs = {system: replay(trace, system, shape=shape, cost_model=cost) for system in systems}
summaries = {system: summarize(run, weights=TENANT_WEIGHTS) for system, run in runs.items()}

# %%
from policies.percentile import percentile

TIERS = {"Gold": ("t0", "t1"), "Bronze": ("t5", "t6")}

def tier_ttft_p99(run, tenants) -> float:
    return percentile([r.ttft_s for r in run.records
                       if r.outcome == "completed" and r.tenant in tenants], 99)

print(f"{'system':<18}{'Jain':>6}{'Gold p99':>10}{'Bronze p99':>12}{'goodput':>9}  rejections")
print(f"{'':<18}{'':>6}{'s':>10}{'s':>12}{'req/s':>9}")
for system, s in summaries.items():
    rejections = ", ".join(f"{reason}: {n}" for reason, n in s["rejections_by_reason"].items())
    print(f"{system:<18}{s['fairness']['jain_mean']:>6.3f}"
          f"{tier_ttft_p99(runs[system], TIERS['Gold']):>10.2f}"
          f"{tier_ttft_p99(runs[system], TIERS['Bronze']):>12.2f}"
          f"{s['overall']['goodput_rps']:>9.2f}  {rejections or '-'}")

# %%
# benchmarks.replay (its plots module) selects the Agg backend on import: back to inline
# %matplotlib inline
import matplotlib.pyplot as plt

tenants = sorted(TENANT_WEIGHTS.keys() & summaries["fcfs"]["by_tenant"].keys())
width = 0.8 / len(summaries)
fig, ax = plt.subplots(figsize=(8, 3.5))
for i, (system, s) in enumerate(summaries.items()):
    ax.bar([x + i * width for x in range(len(tenants))],
           [s["by_tenant"][t]["ttft_p99_s"] for t in tenants], width, label=system)
ax.set_xticks([x + 0.4 - width / 2 for x in range(len(tenants))],
              [f"{t} (w={TENANT_WEIGHTS[t]:.0f})" for t in tenants])
ax.set_yscale("log")
ax.set_ylabel("TTFT p99 (s)")
ax.grid(alpha=0.3, axis="y")
ax.legend(fontsize=8, ncols=len(summaries), loc="lower center", bbox_to_anchor=(0.5, 1.0),
          frameon=False)
plt.tight_layout()
plt.show()

# %% [markdown]
# **Reading it.** `priority` serves Gold first and starves everyone else: the best Gold
# latency, the worst Bronze latency and the lowest Jain's index. `wfq` shares the engine by
# weight instead, which raises Jain's index well above `fcfs`'s; a tenant that asks for more
# than its weighted share (here the busiest Gold tenant, `t0`, with about a third of the
# requests for a quarter of the weight) waits behind its own backlog, under `wfq` and `default`
# longer than under `fcfs`: weights are a share of service, not a latency guarantee.
# `default` adds admission: its KV watermarks turn Bronze requests away while KV usage is above
# the yellow mark (over HTTP, 503 with Retry-After), and with QoS ranking and MLFQ inside each
# tenant's queue it has the best fairness of the four and the highest goodput.

# %% tags=["remove-cell"]
for system, s in summaries.items():
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
    assert 0.0 <= worst_lag[t] <= M / wfq.weight(t)

# %% [markdown]
# ## Serving it over HTTP
#
# ```bash
# python -m integrations.vllm_v1.serving --pipeline default --model path/to/model
# ```
#
# starts vLLM's OpenAI server with the `default` pipeline. Clients name their tenant and
# class in `vllm_xargs` (and may send `deadline_ms` for an `EDFRanker` pipeline):
#
# ```bash
# curl -s -i localhost:8000/v1/completions -H 'content-type: application/json' -d '{
#   "model": "m", "prompt": "Hello", "max_tokens": 64, "priority": 1,
#   "vllm_xargs": {"tenant": "t5", "slo_class": "bronze"}}'
# ```
#
# A request the scheduler rejects gets no tokens and an error status with a `Retry-After`
# header: **429** when the client's own quota is spent (`class_full:<class>`), **503** when
# the server is overloaded (`queue_full`, `kv_full`, `early_drop`, `kv_yellow`, `kv_red`,
# `deadline_expired`). Clients should back off for Retry-After seconds. Streaming requests
# are not mapped (vLLM sends an empty 200 stream); the "Serving over HTTP" guide has the
# details.
