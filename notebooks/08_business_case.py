# %% [markdown]
# # The business case: seven tenants, five phases, stock vLLM vs the fixes
#
# **What you'll learn**: build the seven-tenant, five-phase enterprise workload, compose the
# `pipeline+fixes` pipeline (the `default` preset plus prefill budget isolation, deadline
# expiry and a non-starving yellow KV band), replay both it and stock vLLM `fcfs` through vLLM's own scheduler in virtual time,
# and read the per-phase Gold TTFT, fairness and admission accounting.

# %% [markdown]
# ## Setup

# %%
import logging
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
logging.getLogger("vllm").setLevel(logging.ERROR)  # quiet CPU-platform notices

from benchmarks.e2e_business_cases.report import headline_rows
from benchmarks.e2e_business_cases.study import run_study
from benchmarks.e2e_business_cases.systems import fixes_pipeline
from benchmarks.e2e_business_cases.workload import PHASES, business_workload

# %% [markdown]
# ## The policies in Python
#
# `fixes_pipeline()` is the `default` preset (tier-weighted WFQ, QoS ranking, MLFQ, a prefill
# token bucket, admission control, KV watermarks) with the fixes in their slots: a per-tenant
# prefill budget composed with the token bucket (`TokenCaps`), `EDFRanker` as the `deadlines`
# policy, which drops a waiting request that can no longer meet its deadline, and KV watermarks
# whose yellow band no longer rejects low priorities (it starved the Bronze tenants in the
# overload; the red band and queue admission still bound the load).

# %%
pipeline = fixes_pipeline()
print("rate:", pipeline.rate)
print("deadlines:", pipeline.deadlines)
print("yellow band rejects priority >=", pipeline.watermarks.low_priority_from)
for phase in PHASES:
    print(f"{phase.name:<14} tenants x{dict(phase.tenant_multipliers) or 1}  "
          f"kinds x{dict(phase.kind_multipliers) or 1}")

# %% [markdown]
# ## A run
#
# The same workload as `python -m benchmarks.e2e_business_cases`, with 15 s phases instead of
# 60 s (the same rates, a quarter of the requests) and two systems, so that it runs in well
# under a minute. Request lengths come from the real Azure 2023 traces; step times from the
# H100 cost model; the scheduler and KV-cache manager are vLLM's own.

# %%
workload = business_workload(seed=0, phase_s=15.0)
summary = run_study(workload, systems=["fcfs", "pipeline+fixes"])
print(len(workload.trace.requests), "requests offered")

# %%
header, rows = headline_rows(summary)
print("Gold short-request TTFT p99 (ms)")
print("".join(f"{h:>16}" if i else f"{h:<28}" for i, h in enumerate(header)))
for row in rows:
    print("".join(f"{c:>16}" if i else f"{c:<28}" for i, c in enumerate(row)))
last = summary["phases"][-1]["systems"]["pipeline+fixes"]
print(f"\nphase 5, pipeline+fixes: {last['offered']} offered = {last['admitted']} admitted + "
      f"{last['rejected']} rejected ({last['rejections_with_retry_after']} with Retry-After)")

# %%
import matplotlib.pyplot as plt
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
fig.tight_layout()

# %% tags=["remove-cell"]
phases = summary["phases"]
for p in phases:
    for m in p["systems"].values():
        assert m["admitted"] + m["rejected"] == m["offered"]
fcfs = [p["systems"]["fcfs"]["gold_short_ttft_p99_s"] for p in phases]
fixed = [p["systems"]["pipeline+fixes"]["gold_short_ttft_p99_s"] for p in phases]
assert fixed[-1] < fcfs[-1] / 2, (fixed, fcfs)
assert phases[-1]["systems"]["pipeline+fixes"]["all_rejections_have_retry_after"]
assert pipeline.deadlines is not None

# %% [markdown]
# ## Using it in vLLM
#
# The same pipeline serves over HTTP; clients send their tier as `priority` and their tenant,
# SLO class and deadline in `vllm_xargs`:
#
# ```python
# from benchmarks.e2e_business_cases.systems import fixes_pipeline
# from integrations.vllm_v1 import serve
#
# server = serve(fixes_pipeline(), "path/to/model", port=8000)
# server.wait_until_healthy()
# ```
#
# `python -m benchmarks.e2e_business_cases --live --quick --out out/live` plays a scaled-down
# version of this workload through a real CPU vLLM server (stock `fcfs`, then
# `pipeline+fixes`) and measures TTFT and TPOT client-side; see the *Business case* page.
