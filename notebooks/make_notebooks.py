"""Write the tutorial notebooks from plain Python (outputs come from `make notebooks`/nbmake).

Run: ``python notebooks/make_notebooks.py``; then execute them with
``jupyter nbconvert --to notebook --execute --inplace notebooks/*.ipynb``.
"""

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

or from a shell: `python -m integrations.vllm_v1.serve --pipeline qos --model path/to/model`.
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


def main() -> None:
    for name, cells in [("01_quickstart", QUICKSTART), ("02_replay", REPLAY)]:
        notebook = new_notebook(cells=cells, metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
        nbformat.write(notebook, HERE / f"{name}.ipynb")


if __name__ == "__main__":
    main()
