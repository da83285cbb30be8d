# %% [markdown]
# # KV-cache eviction: segmented LRU against vLLM's LRU and Belady's optimum
#
# **What you'll learn**: how `SegmentedLRU` orders a prefix cache's evictable blocks (probation,
# protected, orphans, a ghost list of evicted content), and how much of the gap between vLLM's
# LRU and the offline optimum (Belady) it closes on the real Mooncake conversation trace.

# %% [markdown]
# ## Setup

# %%
import matplotlib.pyplot as plt

from benchmarks.cache_replay.simulate import replay_opt, replay_order
from benchmarks.replay.workloads import load_workload
from policies import LRU, Segment, SegmentedLRU

trace = load_workload("mooncake-conv")  # 12,031 requests, 512-token prefix hashes
chains = [request.block_hashes for request in trace.requests]
print(len(chains), "requests,", sum(map(len, chains)), "prompt blocks")

# %% [markdown]
# ## The policy in Python
#
# An eviction order sees four calls: `release(key, parent)` when a cached block is no longer
# referenced, `acquire(key)` on a prefix hit, `evict()` when a block is needed, and
# `release_uncached(key)` for blocks with no content. A block used twice is protected; a block
# whose parent is evicted becomes an orphan and goes next.

# %%
order = SegmentedLRU()
for key, parent in [("q1", "sys"), ("sys", None)]:     # request 1 frees its chain tail first
    order.release(key, parent)
order.acquire("sys")                                    # request 2 hits the system prompt
for key, parent in [("q2", "sys"), ("sys", None)]:
    order.release(key, parent)
print({key: order.segment_of(key).name for key in order})
print("eviction order:", list(order))
order.check_invariants()
order.stats()

# %% [markdown]
# ## A run on a real trace
#
# Each request hits the longest cached prefix of its block chain (vLLM's semantics), computes
# the rest into blocks taken from the cache, and frees its blocks tail first.

# %%
sizes = [1000, 2000, 4000]
results = []
for size in sizes:
    results.append(replay_order(chains, size, LRU(), "lru"))
    results.append(replay_order(chains, size, SegmentedLRU(), "slru"))
    results.append(replay_opt(chains, size))
rate = {(r.policy, r.cache_blocks): r.hit_rate for r in results}
print(f"{'blocks':>7}{'lru':>8}{'slru':>8}{'opt':>8}{'gap closed':>12}")
for size in sizes:
    lru, slru, opt = (rate[(p, size)] for p in ("lru", "slru", "opt"))
    print(f"{size:>7}{lru:>8.2%}{slru:>8.2%}{opt:>8.2%}{(slru - lru) / (opt - lru):>12.0%}")

# %%
fig, ax = plt.subplots(figsize=(6, 3.5))
for policy in ("lru", "slru", "opt"):
    ax.plot(sizes, [100 * rate[(policy, s)] for s in sizes], marker="o", label=policy)
ax.set_xscale("log")
ax.set_xlabel("cache size (512-token blocks)")
ax.set_ylabel("prefix hit rate (%)")
ax.legend()
ax.grid(True, alpha=0.3)
fig.tight_layout()

# %% tags=["remove-cell"]
for size in sizes:
    assert rate[("lru", size)] < rate[("slru", size)] < rate[("opt", size)], size
assert rate[("slru", 2000)] >= 2 * rate[("lru", 2000)]
assert order.segment_of("sys") is Segment.PROTECTED

# %% [markdown]
# ## Using it in vLLM
#
# `Pipeline(eviction=...)` installs the order as the block pool's free-block queue of our
# scheduler (no vLLM code is patched); `LRU()` there reproduces stock vLLM exactly:
#
# ```python
# from integrations.vllm_v1 import Pipeline, build_llm
# from policies import SegmentedLRU
#
# llm = build_llm(Pipeline(eviction=SegmentedLRU()), model="path/to/model",
#                 enable_prefix_caching=True)
# ```
#
# The full sweep is `python -m benchmarks.cache_replay --trace mooncake-conv --cache-blocks 500
# 1000 2000 4000 8000 --policies lru,slru,opt --out out/cache`; see the *KV-cache eviction*
# guide for the results on the real scheduler.

# %% [markdown]
# ## Tiers behind the GPU cache
#
# `TierPlacement` keeps blocks in CPU DRAM and on disk behind the GPU prefix cache (LRU within
# each tier; a full tier demotes its oldest block one tier down; high-priority blocks never go
# to disk). Below, the same trace runs through a GPU LRU of 2,000 blocks with every computed
# block written through to a CPU tier of 4,000 and a disk tier of 16,000 blocks: a prefix the
# GPU lost is loaded from a tier instead of recomputed.

# %%
from collections import Counter, OrderedDict

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
tiers.stats()

# %%
fig, ax = plt.subplots(figsize=(5, 3))
sources = ["gpu", "cpu", "disk", "computed"]
ax.bar(sources, [100 * blocks_by_source[s] / total for s in sources])
ax.set_ylabel("share of prompt blocks (%)")
ax.set_title("where prompt blocks come from (GPU 2k, CPU 4k, disk 16k blocks)")
fig.tight_layout()

# %% tags=["remove-cell"]
assert blocks_by_source["cpu"] > 0 and blocks_by_source["disk"] > 0
assert abs(blocks_by_source["gpu"] / total - rate[("lru", 2000)]) < 0.01

# %% [markdown]
# In vLLM the tiers run in our KV connector, `KVTierConnector`: every block that fills is
# copied to the CPU tier after its step, so a **preempted request resumes by loading its
# blocks** instead of recomputing them, and a prompt the GPU cache evicted is loaded from CPU
# or disk. Enable it with one engine argument (it composes with `build_llm(pipeline, ...)`):
#
# ```python
# from integrations.vllm_v1.cache.tiers.config import KVTierConfig
#
# tiers = KVTierConfig(cpu_blocks=4096, disk_blocks=65536, disk_path="/mnt/kv")
# llm = LLM(**tiers.engine_kwargs(model="path/to/model", enable_prefix_caching=True))
# ```
#
# `python -m benchmarks.kv_tier --out out/kv_tier` compares it with stock vLLM on a live CPU
# engine (see *Tiered KV storage* in the KV-cache guide).
