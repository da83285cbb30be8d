# %% [markdown]
# # KV-cache eviction: segmented LRU against vLLM's LRU and Belady's optimum
#
# **What you'll learn**: how `SegmentedLRU` orders a prefix cache's evictable blocks (probation,
# protected, orphans, a ghost list of evicted content), and how much of the gap between vLLM's
# LRU and the offline optimum (Belady) it closes on the real Mooncake conversation trace; then
# what the `cache` preset ships, `DuelingSLRU` with session pins: `SegmentedLRU` where frequency
# pays, LRU where it does not (agent sessions), so it does not fall below vLLM's LRU.

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
# ## What the `cache` preset ships: `DuelingSLRU` with session pins
#
# `SegmentedLRU` wins where blocks are reused often (the Mooncake conversations above), but it
# loses to LRU where a block is used once per turn and the next turn wants the newest blocks:
# agent sessions whose context grows by a tool result each turn. `DuelingSLRU` runs two
# key-only shadow caches beside the real order, a plain LRU and a `SegmentedLRU`, fed the
# accesses the order sees; while the LRU shadow has more (decayed) hits the real order gives
# `PROTECTED` no room and evicts in release order, which is LRU. Session pins
# (`SessionPins`) keep a finished turn's blocks for 1.5 times its session's predicted gap to
# the next turn (learned online per `session_id`; a pinned block keeps its place and is held
# only once LRU would evict it), at most half the cache, and only while a
# third shadow, an LRU that pins as the order would, out-hits the plain LRU shadow (so LRU is
# the floor until pins prove themselves on the traffic at hand); waiting-queue
# awareness (`keep_waiting`, on by default) keeps the blocks a waiting request will hit. This
# is the order the preset builds:

# %%
from benchmarks.replay.agent_sessions import agent_trace
from integrations.vllm_v1.config.presets import preset
from policies.kv.eviction import DuelingSLRU, SessionPins

print(preset("cache").eviction)

# %% [markdown]
# A generated SWE-Bench-style agent workload (`benchmarks.replay.agent_sessions`, seed 0,
# 3,000 calls, 512-token blocks, each request with its `session_id`), and the first 3,000
# requests of the Mooncake conversation trace. The replay tells an order with session hints
# each request's session and arrival time; `dueling` is the order without pins.

# %%
agent = agent_trace("swe", num_requests=3000, seed=0)
agent_chains = [request.block_hashes for request in agent.requests]
turns = [(request.session_id, request.arrival_s) for request in agent.requests]
orders = {"lru": LRU, "slru": SegmentedLRU, "dueling": DuelingSLRU,
          "dueling+pins": lambda: DuelingSLRU(session_pins=SessionPins())}
runs = {"agent-swe": (agent_chains, turns, [125, 250, 500, 1000]),
        "mooncake-conv[:3000]": (chains[:3000], None, [1000, 2000])}
duel = {}
for trace_name, (trace_chains, trace_turns, trace_sizes) in runs.items():
    for size in trace_sizes:
        for name, make in orders.items():
            if trace_turns is None and name == "dueling+pins":
                continue  # no session_id in the Mooncake trace: pins would not change it
            result = replay_order(trace_chains, size, make(), name, turns=trace_turns)
            duel[(trace_name, size, name)] = result.hit_rate
        duel[(trace_name, size, "opt")] = replay_opt(trace_chains, size).hit_rate
columns = [*orders, "opt"]
print(f"{'trace':>21}{'blocks':>7}" + "".join(f"{name:>13}" for name in columns))
for trace_name, (_, _, trace_sizes) in runs.items():
    for size in trace_sizes:
        cells = [duel.get((trace_name, size, name)) for name in columns]
        print(f"{trace_name:>21}{size:>7}" + "".join(
            f"{'-':>13}" if cell is None else f"{cell:>13.2%}" for cell in cells))

# %% [markdown]
# The points each order is above (or below) LRU: `SegmentedLRU` falls up to about 5 points
# below LRU on the agent sessions once the cache holds most of their contexts; the dueling
# order stays within about a tenth of a point of LRU there, pins or not and matches `SegmentedLRU` on Mooncake. Pins buy most where the cache is smallest
# (125 blocks: a subset of the sessions stays cached instead of all of them taking turns to
# miss); on Mooncake, with no `session_id`, pins change nothing. Neither closes the whole
# gap to OPT, which knows which session returns next.

# %%
labels = [f"{trace_name.split('[')[0]}\n{size}" for trace_name, (_, _, trace_sizes) in runs.items()
          for size in trace_sizes]
keys = [(trace_name, size) for trace_name, (_, _, trace_sizes) in runs.items()
        for size in trace_sizes]
fig, ax = plt.subplots(figsize=(8, 3.5))
width = 0.27
for offset, name in enumerate(["slru", "dueling", "dueling+pins"]):
    delta = [100 * (duel.get((*key, name), duel[(*key, "dueling")]) - duel[(*key, "lru")])
             for key in keys]
    ax.bar([i + (offset - 1) * width for i in range(len(keys))], delta, width, label=name)
ax.axhline(0, color="black", linewidth=0.8)
ax.set_xticks(range(len(keys)), labels, fontsize=8)
ax.set_xlabel("trace, cache size (blocks)")
ax.set_ylabel("hit rate - LRU (points)")
ax.legend(fontsize=8)
ax.grid(True, axis="y", alpha=0.3)
fig.tight_layout()

# %% tags=["remove-cell"]
for (trace_name, size, name), hit_rate in duel.items():
    if name.startswith("dueling"):  # the issue-20 bar: never more than 0.2 points below LRU
        assert hit_rate >= duel[(trace_name, size, "lru")] - 0.002, (trace_name, size, name)
assert duel[("agent-swe", 500, "slru")] < duel[("agent-swe", 500, "lru")] - 0.02
assert duel[("agent-swe", 125, "dueling+pins")] > duel[("agent-swe", 125, "lru")] + 0.02
for size in (1000, 2000):
    key = ("mooncake-conv[:3000]", size)
    assert duel[(*key, "dueling")] > duel[(*key, "lru")] + 0.02
    assert duel[(*key, "dueling")] <= duel[(*key, "opt")]

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
# The `cache` preset is `Pipeline(eviction=DuelingSLRU(session_pins=SessionPins()),
# ranking=CacheAwareRanker())` (`preset("cache")` above, `--pipeline cache` for the server);
# our scheduler tells the order each request's `session_id` (vLLM's field, or `vllm_xargs`)
# and the prompt blocks of the waiting requests, and `/metrics` shows the pins
# (`policies:kv_session_pins_total{event}`).
#
# The full sweeps are `python -m benchmarks.cache_replay --trace mooncake-conv --cache-blocks
# 500 1000 2000 4000 8000 --policies lru,slru,opt --out out/cache` and, for what ships,
# `--trace agent-swe --cache-blocks 125 250 500 750 1000 1500 --policies
# lru,slru,dueling,dueling-pins,opt`; see the *KV-cache eviction* guide for the results, also
# on the real scheduler.

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
