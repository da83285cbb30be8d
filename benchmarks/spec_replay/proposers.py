"""The drafters compared by the replay, behind one small interface.

- ``suffix_automaton``: this project's `SuffixDrafter` with a global `SharedSuffixCache`.
- ``ngram``: vLLM's own n-gram matcher (``vllm.v1.spec_decode.ngram_proposer``) over the full
  context, as vLLM calls it each step: its defaults ``prompt_lookup_min = max = 5`` and a tuned
  setting (``ngram[2-8]``, the best τ of the settings we tried on these datasets).
- ``arctic``: arctic-inference's ``SuffixDecodingCache`` (the engine behind vLLM's and SGLang's
  ``suffix`` method) with its global cache, at spec factor 1 and 4; skipped with a message if
  ``arctic_inference`` is not installed (``pip install -e .[arctic]``, see BENCHMARKS.md).
"""

from __future__ import annotations

import importlib.util
from typing import Protocol

import attrs
import numpy as np

from policies.speculative import DraftConfig, SharedSuffixCache, SuffixDrafter


class ReplayProposer(Protocol):
    """What the replay drives: one object per run, many requests in arrival order."""

    name: str

    def start(self, request_id: str, prompt: np.ndarray) -> None: ...

    def propose(self, request_id: str, context: np.ndarray, k: int) -> list[int]: ...

    def update(self, request_id: str, tokens: np.ndarray) -> None: ...

    def finish(self, request_id: str) -> None: ...

    def bytes_per_token(self) -> float: ...


@attrs.define(eq=False)
class SuffixAutomatonProposer:
    """`SuffixDrafter` over the request's context plus a global shared cache."""

    name: str
    config: DraftConfig
    max_cache_tokens: int = 16_000_000
    drafter: SuffixDrafter = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.drafter = SuffixDrafter(config=self.config,
                                     shared=SharedSuffixCache(max_tokens=self.max_cache_tokens))

    def start(self, request_id: str, prompt: np.ndarray) -> None:
        self.drafter.start(request_id, prompt)

    def propose(self, request_id: str, context: np.ndarray, k: int) -> list[int]:
        return list(self.drafter.propose(request_id, k).tokens)

    def update(self, request_id: str, tokens: np.ndarray) -> None:
        self.drafter.extend(request_id, tokens)

    def finish(self, request_id: str) -> None:
        self.drafter.finish(request_id)

    def bytes_per_token(self) -> float:
        assert self.drafter.shared is not None
        return self.drafter.shared.stats().bytes_per_token


@attrs.define(eq=False)
class NgramProposer:
    """vLLM's n-gram match over the whole context (no state: bytes per token = 0)."""

    name: str
    min_n: int
    max_n: int
    _match: object = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        from integrations.vllm_v1.instruments.ngram import vllm_ngram_kernel

        self._match = vllm_ngram_kernel()

    def start(self, request_id: str, prompt: np.ndarray) -> None:
        pass

    def propose(self, request_id: str, context: np.ndarray, k: int) -> list[int]:
        return self._match(context, self.min_n, self.max_n, 1 << 30, k).tolist()

    def update(self, request_id: str, tokens: np.ndarray) -> None:
        pass

    def finish(self, request_id: str) -> None:
        pass

    def bytes_per_token(self) -> float:
        return 0.0


def rss_bytes() -> int:
    """Resident set size of this process (Linux ``/proc``)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _arctic_rss_growth(outputs: list[np.ndarray], max_tree_depth: int, queue) -> None:
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    before = rss_bytes()
    cache = SuffixDecodingCache(max_tree_depth=max_tree_depth, max_cached_requests=-1)
    for i, output in enumerate(outputs):
        cache.start_request(i, np.zeros(0, dtype=np.int32))
        cache.add_active_response(i, output)
        cache.stop_request(i)
    queue.put(rss_bytes() - before)


def arctic_bytes_per_token(outputs: list[np.ndarray], max_tree_depth: int) -> float:
    """RSS growth of a fresh process whose global tree holds ``outputs``, per token.

    A fresh process, because arctic's trees live in C++ (out of tracemalloc's sight) and an
    earlier run's freed heap would hide the growth in this one.
    """
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    process = ctx.Process(target=_arctic_rss_growth, args=(outputs, max_tree_depth, queue))
    process.start()
    growth = queue.get()
    process.join()
    tokens = sum(o.shape[0] for o in outputs)
    return growth / tokens if tokens else 0.0


@attrs.define(eq=False)
class ArcticProposer:
    """arctic-inference ``SuffixDecodingCache``: per-request tree + global tree of responses.

    Bytes per token: see `arctic_bytes_per_token` (the global tree keeps every response).
    """

    name: str
    spec_factor: float
    min_token_prob: float = 0.1
    max_tree_depth: int = 64
    _cache: object = attrs.field(init=False, repr=False)
    _outputs: dict[str, list[np.ndarray]] = attrs.field(init=False, factory=dict, repr=False)

    def __attrs_post_init__(self) -> None:
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self._cache = SuffixDecodingCache(max_tree_depth=self.max_tree_depth,
                                          max_cached_requests=-1)

    def start(self, request_id: str, prompt: np.ndarray) -> None:
        self._cache.start_request(request_id, prompt)

    def propose(self, request_id: str, context: np.ndarray, k: int) -> list[int]:
        draft = self._cache.speculate(request_id, context[-self.max_tree_depth:],
                                      max_spec_tokens=k, max_spec_factor=self.spec_factor,
                                      min_token_prob=self.min_token_prob)
        return list(draft.token_ids)

    def update(self, request_id: str, tokens: np.ndarray) -> None:
        self._cache.add_active_response(request_id, tokens)
        self._outputs.setdefault(request_id, []).append(tokens)

    def finish(self, request_id: str) -> None:
        self._cache.stop_request(request_id)

    def bytes_per_token(self) -> float:
        outputs = [np.concatenate(parts) for parts in self._outputs.values()]
        return arctic_bytes_per_token(outputs, self.max_tree_depth)


def arctic_available() -> bool:
    """Whether ``arctic_inference`` can be imported."""
    return importlib.util.find_spec("arctic_inference") is not None


NGRAM_TUNED = (2, 8)
"""``(prompt_lookup_min, prompt_lookup_max)`` of the tuned n-gram setting."""


def make_proposers(family: str, k: int) -> list[ReplayProposer]:
    """The configurations a ``--proposers`` family name expands to, for draft cap ``k``."""
    if family == "suffix_automaton":
        return [SuffixAutomatonProposer("suffix_automaton", DraftConfig(max_draft_tokens=k))]
    if family == "ngram":
        lo, hi = NGRAM_TUNED
        return [NgramProposer("ngram[5-5]", 5, 5), NgramProposer(f"ngram[{lo}-{hi}]", lo, hi)]
    if family == "arctic":
        if not arctic_available():
            return []
        return [ArcticProposer("arctic[global,factor=1]", 1.0),
                ArcticProposer("arctic[global,factor=4]", 4.0)]
    raise SystemExit(f"--proposers: unknown family {family!r} "
                     "(suffix_automaton, ngram, arctic)")
