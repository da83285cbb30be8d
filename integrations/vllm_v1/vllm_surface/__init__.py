"""The vLLM surface: every vLLM internal the project touches, named and pinned in one place.

* `integrations.vllm_v1.vllm_surface.names` imports them (the only module in
  `integrations` that imports vLLM) and adds the few adapters that reach into vLLM
  objects (`cached_prefix_tokens`, `swap_free_block_queue`, ...);
* `integrations.vllm_v1.vllm_surface.touches` lists each name overridden, called,
  assigned or read, with the parameters expected (pure data);
* `integrations.vllm_v1.vllm_surface.check` verifies that list against a vLLM
  source tree without importing it (how vLLM 0.33, whose compiled parts need CUDA
  torch, is checked on a CPU machine).
"""
