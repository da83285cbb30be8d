# %% [markdown]
# # SLO classes under overload: the `slo` preset
#
# **What you'll learn**: declare two latency classes for the teams you serve, build the `slo`
# preset from that declaration, replay an overloaded slice of a real trace through vLLM's own
# scheduler in virtual time, and read what each client sees: which requests are admitted
# and meet their class's targets, which are refused at once with a reason and a
# `Retry-After`, and how the preset's step-time model learns the engine as it runs.

# %% [markdown]
# ## Setup

# %%
import logging
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
logging.getLogger("vllm").setLevel(logging.ERROR)  # quiet CPU-platform notices

import json
from collections import Counter

import attrs

from benchmarks.replay.cost_model import StepCostModel
from benchmarks.replay.driver import replay
from benchmarks.replay.metrics import SLO, summarize
from benchmarks.replay.workloads import load_workload
from integrations.vllm_v1.config.declarative import PipelineConfigError
from integrations.vllm_v1.config.slo import SLOSpec, slo_pipeline
from integrations.vllm_v1.instruments import EngineShape, SchedulerHarness
from integrations.vllm_v1.rejection import Rejection

# %% [markdown]
# ## The policy in Python
#
# Two teams share one engine: a chat product whose users expect the first token within half a
# second and then a fluent 20 tokens per second, and a retrieval (RAG) service whose long
# prompts may take 2 s to start. Each class is a time to first token (`ttft_s`) and a time
# per output token after it (`tpot_s`). The declaration is the same mapping `vllm serve` takes
# in `--additional-config`; `SLOSpec.parse` validates it and `slo_pipeline` builds the preset:

# %%
DECLARATION = {"classes": {"chat": {"ttft_s": 0.5, "tpot_s": 0.05},
                           "rag": {"ttft_s": 2.0, "tpot_s": 0.1}}}
spec = SLOSpec.parse(DECLARATION)
pipeline = slo_pipeline(spec)
print(spec.classes)
print("ranking:   ", type(pipeline.ranking).__name__, "(earliest first-token deadline first)")
print("admission: ", type(pipeline.admission).__name__, "(EDF feasibility + TPOT check)")
print("step model:", type(pipeline.step_model).__name__, "from", pipeline.step_model.prior)

# %% [markdown]
# A mistake is refused when the server starts, naming the field:

# %%
try:
    SLOSpec.parse({"classes": {"chat": {"ttft_s": "fast", "tpot_s": 0.05}}})
except PipelineConfigError as error:
    print(error)

# %% [markdown]
# ## A run on an overloaded trace
#
# The first 1,000 requests of the Azure LLM inference conversation trace, offered 6x faster
# than recorded, on Llama-3-8B on one H100 (the replay's cost model advances the virtual
# clock; the scheduler and KV-cache manager are vLLM's own). Clients label their requests as
# they would with `vllm_xargs.slo_class`: prompts up to 1,023 tokens come from the chat team,
# longer ones from the RAG service. They do not send their answers' lengths
# (`max_tokens="context"`), so the preset learns output lengths as it would live.
#
# Stock vLLM (`fcfs`) admits everything; the `slo` preset admits a request only if, served
# earliest deadline first, it can still get its first token in time without making an
# admitted request late. Every second
# of virtual time we read the step model's out-of-sample error, as `/metrics` would.

# %%
CHAT_MAX_PROMPT_TOKENS = 1023
trace = load_workload("azure-conv", max_requests=1000).scaled(6.0)
trace = attrs.evolve(trace, requests=tuple(
    attrs.evolve(r, slo_class="chat" if r.prompt_tokens <= CHAT_MAX_PROMPT_TOKENS else "rag")
    for r in trace.requests))
print(len(trace.requests), "requests over", round(trace.duration_s, 1), "s;",
      dict(Counter(r.slo_class for r in trace.requests)))

shape = EngineShape(num_blocks=24800, block_size=16, max_num_seqs=256,
                    max_num_batched_tokens=8192)
cost = StepCostModel.preset("h100")
harness = SchedulerHarness.build(pipeline, shape=shape)
serving = harness.scheduler.pipeline  # the engine's own copy of the pipeline, as it runs
model_points = []


def sample_step_model(_finished: int) -> None:
    now = harness.clock.now()
    if not model_points or now - model_points[-1][0] >= 1.0:
        model_points.append((now, serving.step_model.stats()))


runs = {"fcfs": replay(trace, "fcfs", shape=shape, cost_model=cost, max_tokens="context"),
        "slo": replay(trace, "pipeline:slo", shape=shape, cost_model=cost, harness=harness,
                      max_tokens="context", progress=sample_step_model)}
SLOS = {name: SLO(ttft_s=t.ttft_s, tpot_s=t.tpot_s) for name, t in spec.classes.items()}
summaries = {system: summarize(run, slos=SLOS) for system, run in runs.items()}

# %% [markdown]
# ### What each client saw

# %%
print(f"{'system':<7}{'class':<6}{'offered':>8}{'503':>6}{'admitted':>9}{'in SLO':>8}"
      f"{'of admitted':>12}{'TTFT p99':>10}")
for system, s in summaries.items():
    for name in spec.classes:
        c = s["by_class"][name]
        admitted = c["offered"] - c["rejected"]
        met = round(c["slo_attainment"] * c["offered"])
        print(f"{system:<7}{name:<6}{c['offered']:>8}{c['rejected']:>6}{admitted:>9}{met:>8}"
              f"{c['admitted_slo_attainment']:>12.1%}{c['ttft_p99_s']:>9.2f}s")

rejections = [Rejection.parse(r.reason) for r in runs["slo"].records if r.outcome == "rejected"]
print("\n503s by reason and class:", dict(Counter(f"{r.reason} ({r.detail})" for r in rejections)))
print("Retry-After (s, rounded up as the server sends it):",
      dict(sorted(Counter(max(1, -(-r.retry_after_s // 1)) for r in rejections).items())))
print("first-token headroom in force, by class:",
      {name: round(value, 2) for name, value in serving.admission.stats().class_headrooms.items()})

# %% [markdown]
# **Reading it.** Under `fcfs` every request is admitted and most are served late: with the
# queue seconds long, a chat user's 200 arrives long after the half second it was promised.
# The `slo` preset refuses about a quarter of the requests on arrival, at once, with a 503,
# a reason and a `Retry-After`; almost every request it admits meets its class's targets
# (at least 95 % of each class's admitted requests), and more requests meet their SLO in
# total than under `fcfs`. Both classes are refused, mostly `slo_ttft`: a chat request's
# first token could not come within 0.5 s behind the work due before it, a RAG request's
# not within 2 s behind that work and the chat requests that will arrive while it waits
# (the engine serves them first). The `slo_tpot` refusals are decodes that would slow every
# step past the 50 ms per token promised to the chat requests decoding beside them (a long
# RAG context costs most). The last line
# is what the preset learned from lateness: each class's share of its TTFT target it admits
# against, corrected by its own first tokens (`policies:slo_class_headroom{slo_class}` on
# `/metrics`); a class whose first tokens come later than predicted is admitted more
# carefully, without making the other class pay for it.

# %%
# benchmarks.replay (its plots module) selects the Agg backend on import: back to inline
# %matplotlib inline
import matplotlib.pyplot as plt

BIN_S = 2.0
bins = int(trace.duration_s // BIN_S) + 1
counts = {key: [0] * bins for key in ("in SLO", "admitted, late", "rejected (503)")}
for r in runs["slo"].records:
    key = ("rejected (503)" if r.outcome == "rejected"
           else "in SLO" if r.ttft_s is not None and r.ttft_s <= SLOS[r.slo_class].ttft_s
           and (r.tpot_s or 0.0) <= SLOS[r.slo_class].tpot_s else "admitted, late")
    counts[key][int(r.arrival_s // BIN_S)] += 1
starts = [i * BIN_S for i in range(bins)]

fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True)
below = [0] * bins
for (key, values), color in zip(counts.items(), ("tab:green", "tab:orange", "tab:red"),
                                strict=True):
    top.bar(starts, [v / BIN_S for v in values], BIN_S * 0.9, bottom=[b / BIN_S for b in below],
            align="edge", label=key, color=color)
    below = [b + v for b, v in zip(below, values, strict=True)]
top.set_ylabel("requests/s (by arrival)")
top.set_title("slo preset: what the clients got", fontsize=9)
top.legend(fontsize=8, loc="upper left")
top.grid(alpha=0.3, axis="y")
shown = [(t, s) for t, s in model_points if s.relative_error_p50 is not None]
for field, label in (("relative_error_p50", "p50"), ("relative_error_p99", "p99")):
    bottom.plot([t for t, _ in shown], [getattr(s, field) for _, s in shown], label=label)
bottom.set_yscale("log")
bottom.set_xlabel("virtual time (s)")
bottom.set_ylabel("step model error\n|predicted - measured| / measured")
bottom.grid(True, which="both", alpha=0.3)
bottom.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# **Reading it.** While the engine keeps up (the first seconds), everything is admitted.
# Once the offered load exceeds what the engine can serve within the targets, part of every
# second's arrivals is refused on arrival, and the admitted part stays green: the 503s
# replace the late 200s that `fcfs` would have sent. Below, the step model starts from a
# deliberately slow prior (its first predictions are off by more than 100 % at p99) and learns
# this engine's steps as they run: its median error falls to a few percent, its p99 to tens
# of percent, which is what lets admission plan each deadline closely.

# %% tags=["remove-cell"]
for system, s in summaries.items():
    assert s["offered"] == s["completed"] + s["rejected"] + s["cancelled"] == 1000, system
assert summaries["fcfs"]["rejected"] == 0
slo_run = summaries["slo"]
assert slo_run["rejected"] > 50, slo_run["rejected"]
assert slo_run["rejections_with_retry_after"] == slo_run["rejected"]
assert {(r.reason, r.detail) for r in rejections} <= {
    (reason, name) for reason in ("slo_ttft", "slo_tpot") for name in spec.classes}
assert all(r.retry_after_s > 0 for r in rejections)
assert slo_run["overall"]["admitted_slo_attainment"] >= 0.95, slo_run["overall"]
assert 0.1 < slo_run["rejected"] / slo_run["offered"] < 0.4  # "about a quarter"
for name, target in spec.classes.items():  # each class's admitted requests in SLO >= 95 %
    assert slo_run["by_class"][name]["admitted_slo_attainment"] >= 0.95, name
    assert summaries["fcfs"]["by_class"][name]["ttft_p99_s"] > 5 * target.ttft_s, name
assert slo_run["met_slo"] > 1.5 * summaries["fcfs"]["met_slo"], (
    slo_run["met_slo"], summaries["fcfs"]["met_slo"])
assert summaries["fcfs"]["overall"]["slo_attainment"] < 0.5
assert counts["rejected (503)"][0] == 0  # nothing refused before the queue builds up
first, last = shown[0][1], shown[-1][1]
assert last.relative_error_p50 < 0.1 and last.relative_error_p99 < 0.5 * first.relative_error_p99
assert last.observations > 1000
stats = serving.admission.stats()
assert sum(stats.rejected.values()) == slo_run["rejected"]
assert stats.admitted + stats.unclassified == 1000 - slo_run["rejected"], stats
serving.admission.check_invariants()
serving.step_model.check_invariants()

# %% [markdown]
# ## The door in front of the engine
#
# Served over HTTP, a request the engine refuses has already cost the API server its parsing
# and tokenizing, and under a real overload that work is what makes the admitted requests
# late. So the API server also keeps a door, `ClassConcurrencyLimits`: one limit per TTFT
# target on the requests in flight, learned from their lateness the way TCP learns its
# window, and nested as the engine serves (earliest first-token deadline first): a class's
# limit counts its own requests and the tighter classes'. Below, a toy server on which `chat`
# first tokens run late once 12 `chat` requests are in flight, and `rag` is never late; one
# request of each class arrives every 10 ms and holds its place 0.4 s:

# %%
from policies import ClassConcurrencyLimits

door = ClassConcurrencyLimits(ttft_s={name: t.ttft_s for name, t in spec.classes.items()})
HOLD_S, CHAT_ROOM = 0.4, 12
in_flight, door_refused = [], Counter()
for tick in range(1000):
    now = tick * 0.01
    for entered, name in [r for r in in_flight if now - r[0] >= HOLD_S]:
        in_flight.remove((entered, name))
        door.release(name, now - entered)
        chats = sum(n == "chat" for _, n in in_flight)
        door.report(name, late=name == "chat" and chats >= CHAT_ROOM, entered_s=entered,
                    now=now)
    for name in ("chat", "rag"):
        if door.acquire(name).admitted:
            in_flight.append((now, name))
        else:
            door_refused[name] += 1
print("learned limits:", {name: stats.limit for name, stats in door.stats().items()})
print("refused at the door:", dict(door_refused))

# %% [markdown]
# `chat`'s limit settled at the room the toy server has for it; `rag`'s never fell (4,096:
# no limit), so `rag` requests kept the places `chat` left. On a real server the reports come
# from the streams themselves (a first token later than 80 % of its class's target is late),
# and `policies:frontend_concurrency_limit{slo_class}` shows each class's limit.

# %% tags=["remove-cell"]
chat_limit = door.stats()["chat"].limit
assert CHAT_ROOM - 3 <= chat_limit <= CHAT_ROOM + 1, chat_limit
assert door.stats()["rag"].limit == 4096 and door_refused["rag"] == 0
door.check_invariants()

# %% [markdown]
# ## Using it in vLLM
#
# The same declaration goes to vLLM's own server (`vllm serve MODEL` on a GPU, with
# `AsyncPolicyScheduler`; on the CPU build, `python -m vllm.entrypoints.openai.api_server
# --model MODEL` with `PolicyScheduler`):

# %%
print(f"""vllm serve MODEL \\
  --scheduler-cls integrations.vllm_v1.scheduling.scheduler.AsyncPolicyScheduler \\
  --middleware integrations.vllm_v1.serving.middleware.PolicyMiddleware \\
  --additional-config '{json.dumps({"llm_serving_policies": {"pipeline": "slo",
                                                            "slo": DECLARATION}})}'""")

# %% [markdown]
# Clients name their class in `vllm_xargs`, and should turn the `openai` client's retries
# off to see the 503s (it retries them twice by default):
#
# ```python
# import openai
#
# client = openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none", max_retries=0)
# try:
#     reply = client.chat.completions.create(
#         model="MODEL", messages=[{"role": "user", "content": "Hello!"}], max_tokens=64,
#         extra_body={"vllm_xargs": {"slo_class": "chat"}})
# except openai.APIStatusError as e:  # 503: refused, e.message names the reason
#     print(e.status_code, e.response.headers.get("retry-after"), e.message)
# ```
#
# The tutorial *Serve with SLOs in 5 minutes* does this end to end on a CPU
# (`make serve-slo`), and the *SLO serving* page lists every key of the declaration.
