# %% [markdown]
# # Suffix decoding: a suffix automaton drafts from real agent, SQL and code outputs
#
# **What you'll learn**: how `SuffixAutomaton` finds the longest repeated suffix of a context in
# amortised O(1) per token, how `SuffixDrafter` combines each request's own context with a
# `SharedSuffixCache` of earlier outputs, and how its drafts compare with vLLM's `ngram` and
# arctic-inference's suffix trees on real GPT-4 outputs (MT-bench, Spider SQL, HumanEval code):
# tokens per step (τ) and propose latency.

# %% [markdown]
# ## Setup

# %%
import logging

import matplotlib.pyplot as plt
import numpy as np

logging.getLogger("vllm").setLevel(logging.ERROR)

from benchmarks.spec_replay.datasets import load_records, load_tokenizer
from benchmarks.spec_replay.proposers import arctic_available, make_proposers
from benchmarks.spec_replay.replay import replay, tokenize
from benchmarks.spec_replay.sweep import context_sweep
from policies import DraftConfig, SharedSuffixCache, SuffixAutomaton, SuffixDrafter

tokenizer = load_tokenizer("gpt2")  # GPT-2 BPE, bundled
print("arctic-inference installed:", arctic_available())

# %% [markdown]
# ## The policy in Python
#
# A suffix automaton over the tokens seen so far answers "what is the longest suffix of the
# context that occurred before, and what followed it?" without rescanning the context. Each
# state counts its occurrences, so a draft follows the most frequent continuation and carries
# an empirical probability.

# %%
automaton = SuffixAutomaton()
automaton.extend([5, 6, 7, 8, 9, 1, 2, 5, 6, 7, 3, 5, 6])
state, match_tokens = automaton.repeated_suffix()          # "5 6" occurred before
print("longest repeated suffix:", match_tokens, "tokens")
print("continuations of [5, 6]:", automaton.continuations([5, 6]))
tokens, probs = np.zeros(8, np.int32), np.zeros(8)
n, score = automaton.draft((state, match_tokens), 8, 0.1, tokens, probs)
print("draft:", tokens[:n].tolist(), "cumulative probabilities:", probs[:n].round(2).tolist())
automaton.check_invariants()

# %% [markdown]
# `SuffixDrafter` keeps one automaton per request (prompt + output so far) and a cursor into
# every generation of the shared cache; `finish` moves a request's output into the cache.
# Draft length adapts to the match: at most `match_scale * match + match_offset_tokens`
# tokens, stopping when the cumulative probability drops below `min_token_prob`.

# %%
drafter = SuffixDrafter(config=DraftConfig(max_draft_tokens=16),
                        shared=SharedSuffixCache(max_tokens=1_000_000))
sql = tokenizer.encode_ordinary
drafter.start("q1", sql("How many singers are there?"))
drafter.extend("q1", sql("SELECT count(*) FROM singer"))
drafter.finish("q1")
drafter.start("q2", sql("How many concerts are there?"))
drafter.extend("q2", sql("SELECT count("))
draft = drafter.propose("q2")
print(draft.source.value, repr(tokenizer.decode(list(draft.tokens))), round(draft.score, 2))
print(drafter.stats().shared)

# %% [markdown]
# ## A run on real outputs
#
# Each request's real GPT-4 output is replayed: draft (k = 32), accept the longest matching
# prefix, emit it plus one token, update, repeat. The shared caches see earlier outputs only,
# in arrival order. Peers in the same run: vLLM's own n-gram matcher (defaults 5/5) and, when
# installed, arctic-inference's `SuffixDecodingCache` (global cache, spec factor 4).

# %%
datasets = {"MT-bench": ("mt_bench", None), "Spider SQL": ("spider", 400),
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
          f" {r.propose_p99_us:7.1f} {r.bytes_per_token:8.0f}")

# %% [markdown]
# τ is deterministic; latencies depend on the machine (shared CI cores here), so compare
# proposers within the run. Next, propose latency against context length: the n-gram matcher
# re-reads the whole context every step, the automaton keeps a cursor.

# %%
sweep = context_sweep(tokenizer, ["suffix_automaton", "ngram"], k=32, steps=60,
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
    ax2.plot(*zip(*pts, strict=True), marker="o", label=p)
ax2.set_xscale("log", base=2)
ax2.set_yscale("log")
ax2.set_xlabel("context tokens")
ax2.set_ylabel("propose p50 (µs)")
ax2.legend(fontsize=8)
fig.tight_layout()

# %% tags=["remove-cell"]
tau = {(n, r.proposer): r.tau for n, r in rows}
for name in ["Spider SQL", "HumanEval"]:
    assert tau[(name, "suffix_automaton")] >= 1.5 * tau[(name, "ngram[5-5]")], name
for name in names:
    assert tau[(name, "suffix_automaton")] > tau[(name, "ngram[5-5]")], name
    if arctic_available():
        assert tau[(name, "suffix_automaton")] >= tau[(name, "arctic[global,factor=4]")], name
lat = {(row["proposer"], row["context_tokens"]): row["propose_p50_us"] for row in sweep}
assert lat[("ngram[5-5]", 65_536)] > 5 * lat[("ngram[5-5]", 1_024)]  # O(context)
assert lat[("suffix_automaton", 65_536)] < 3 * lat[("suffix_automaton", 1_024)] + 5  # flat
drafter.check_invariants()

# %% [markdown]
# ## Using it in vLLM
#
# The proposer is a vLLM `custom_class`; it needs no draft model and no change to vLLM:
#
# ```python
# from vllm import LLM
#
# llm = LLM(model="path/to/model", speculative_config={
#     "method": "custom_class",
#     "model": "integrations.vllm_v1.speculative.proposer.SuffixAutomatonProposer",
#     "num_speculative_tokens": 32})
# ```
#
# To change the draft rules or the shared-cache bound, subclass it in an importable module:
#
# ```python
# from integrations.vllm_v1.speculative.proposer import SuffixAutomatonProposer
# from policies import DraftConfig
#
# class SQLProposer(SuffixAutomatonProposer):
#     draft_config = DraftConfig(max_draft_tokens=32, match_scale=8.0)
#     shared_cache_tokens = 16_000_000
# ```
#
# vLLM's own `vllm:spec_decode_*` counters on `/metrics` report drafts and accepted tokens; the
# proposer adds `policies:spec_*` (τ, coverage, latency, cache sizes) when `PROMETHEUS_MULTIPROC_DIR`
# is set. The full benchmark is `python -m benchmarks.spec_replay`; see the *Speculative
# decoding* guide.
