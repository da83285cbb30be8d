"""Offline generation with a QoS pipeline: urgent and short requests are served first.

Run: ``python examples/offline_priorities.py`` (CPU, embedded tiny model, no hub).
"""

import os

from integrations.vllm_v1 import Pipeline, build_llm
from integrations.vllm_v1.instruments import tiny_model_dir
from policies import QoSRanker, QueueDepthLimit


def main() -> None:
    from vllm import SamplingParams

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    pipeline = Pipeline(ranking=QoSRanker(), admission=QueueDepthLimit(max_waiting=64))
    llm = build_llm(pipeline, model=str(tiny_model_dir("random")), dtype="float32", max_model_len=512,
                       enforce_eager=True, kv_cache_memory_bytes=64 << 20, block_size=32,
                       max_num_seqs=1)
    prompts = ["Summarise this report: " + "lorem ipsum " * 60, "Hi!", "What is 2+2?"]
    params = [SamplingParams(max_tokens=16, temperature=0,
                             extra_args={"tenant": tenant, "slo_class": cls})
              for tenant, cls in [("batch-co", "bronze"), ("acme", "gold"), ("acme", "gold")]]
    outputs = llm.generate(prompts, params, priority=[5, -5, 0])
    for output in outputs:
        print(repr(output.prompt[:30]), "->", repr(output.outputs[0].text))


if __name__ == "__main__":
    main()
