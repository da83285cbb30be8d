"""Per-instance capacity from the replay's step-cost model, as `PDPlanner` needs it.

`StepCostCapacity` prices one request in instance-seconds:

- **prefill**: the prompt's uncached tokens in chunks of ``prefill_chunk_tokens``,
  each chunk's matmuls at the per-token rate of a full step, its attention exact
  (query-key pairs after the tokens before it), and the per-step fixed costs
  shared by the chunk's tokens;
- **decode**: its share of the decode steps that generate its tokens. A step of
  ``B`` sequences costs what the cost model says; the request pays its own KV reads
  (its mean context, prompt plus half the output) and ``1/B`` of the rest. ``B`` is
  as large as the KV cache (``decode_kv_fraction`` of it, e.g. a `DecodeKVGate`
  bound), ``max_num_seqs`` and, with ``itl_target_s``, a step time within the target
  allow for sequences of ``batch_context_tokens`` each (the mix's mean context; None:
  sequences like this request);
- **colocated gap**: a step that runs a full prefill chunk next to decodes.
"""

from __future__ import annotations

import attrs

from benchmarks.replay.cost_model import PrefillChunk, StepBatch, StepCostModel


@attrs.frozen(kw_only=True)
class StepCostCapacity:
    """A `policies.pd.planner.CapacityModel` priced by a `StepCostModel`."""

    cost_model: StepCostModel
    kv_capacity_tokens: int
    """KV tokens of one instance."""
    prefill_chunk_tokens: int = 8192
    """Prompt tokens per step on a prefill instance (``max_num_batched_tokens``)."""
    colocated_chunk_tokens: int = 8192
    """Step budget of a colocated instance."""
    decode_kv_fraction: float = 1.0
    max_num_seqs: int = 256
    itl_target_s: float | None = None
    batch_context_tokens: int | None = None
    """Mean context of the sequences a decode step batches; None: the priced request's."""

    def prefill_s(self, prompt_tokens: int, cached_tokens: int) -> float:
        """Seconds of a prefill instance's steps spent on this prompt's uncached tokens."""
        m = self.cost_model
        fixed_per_token = (m.t0_s + m.head_read_s) / self.prefill_chunk_tokens
        seconds, done = 0.0, min(cached_tokens, prompt_tokens)
        while done < prompt_tokens:
            chunk = min(self.prefill_chunk_tokens, prompt_tokens - done)
            pairs = chunk * (done + (chunk + 1) / 2)
            seconds += (chunk * (m.matmul_s_per_token + m.prefill_attn_s_per_token
                                 + fixed_per_token)
                        + pairs * m.prefill_attn_s_per_pair + m.head_s_per_row)
            done += chunk
        return seconds

    def batch_size(self, prompt_tokens: int, output_tokens: int) -> int:
        """Sequences a decode step batches (of ``batch_context_tokens``, else like this one)."""
        context = self.batch_context_tokens or self._context(prompt_tokens, output_tokens)
        size = max(1, min(self.max_num_seqs,
                          int(self.decode_kv_fraction * self.kv_capacity_tokens // context)))
        if self.itl_target_s is not None:
            while size > 1 and self._step_s([context] * size) > self.itl_target_s:
                size = max(1, size * 9 // 10)
        return size

    def decode_s(self, prompt_tokens: int, output_tokens: int) -> float:
        """This request's share of the decode steps that generate its tokens."""
        if output_tokens <= 0:
            return 0.0
        size = self.batch_size(prompt_tokens, output_tokens)
        context = self._context(prompt_tokens, output_tokens)
        reads = context * self.cost_model.decode_s_per_context_token
        others = self._step_s([1] * size) - size * self.cost_model.decode_s_per_context_token
        return output_tokens * (reads + others / size)

    def colocated_itl_s(self) -> float:
        """A colocated step: a full prefill chunk beside one decode."""
        return self.cost_model.step_time_s(StepBatch(
            prefills=[PrefillChunk(tokens=self.colocated_chunk_tokens)],
            decode_context_tokens=[1]))

    @staticmethod
    def _context(prompt_tokens: int, output_tokens: int) -> int:
        return max(1, prompt_tokens + output_tokens // 2)

    def _step_s(self, contexts: list[int]) -> float:
        return self.cost_model.step_time_s(StepBatch(decode_context_tokens=contexts))
