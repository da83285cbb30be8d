"""Time engine steps of a Llama-3-8B-shaped model on one GPU, for the replay's cost model.

``python -m benchmarks.gpu.profile_steps --out DIR [--quick] [--device cpu --small]``

Builds the model's layers in bf16 with random weights (no download, torch
only: the GPU machine has no vLLM), then times one CUDA-graph replay of a
whole step for a grid of batches: single prefill chunks with and without a
cached prefix, decode batches at several context lengths, and mixed steps
(one chunk plus decodes), as vLLM's V1 engine runs them. Writes
``DIR/step_log.jsonl`` in the step-log format, so
``python -m benchmarks.replay.calibrate --step-log DIR/step_log.jsonl --base h200``
fits `StepCostModel` to it, and ``DIR/device.json`` (GPU name, matmul and copy
ceilings measured in the same run).

What it leaves out, by construction: vLLM's CPU work per step (scheduling,
input preparation, sampling: the cost model's ``t0``), paged-KV indirection
and fused kernels (RMSNorm, rotary and SwiGLU run as plain torch ops).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

LLAMA3_8B = {"hidden": 4096, "layers": 32, "heads": 32, "kv_heads": 8, "head_dim": 128,
             "ffn": 14336, "vocab": 128256}
SMALL = {"hidden": 256, "layers": 2, "heads": 4, "kv_heads": 2, "head_dim": 64,
         "ffn": 512, "vocab": 1024}


class Model:
    """Random bf16 weights of a Llama-style decoder and one step's forward pass."""

    def __init__(self, shape: dict, device: str, dtype: torch.dtype) -> None:
        gen = torch.Generator(device=device).manual_seed(0)
        self.shape, self.device, self.dtype = shape, device, dtype
        hidden, head_dim = shape["hidden"], shape["head_dim"]
        qkv_out = (shape["heads"] + 2 * shape["kv_heads"]) * head_dim

        def weight(rows: int, cols: int) -> torch.Tensor:
            w = torch.randn(rows, cols, generator=gen, device=device, dtype=torch.float32)
            return (w * 0.02).to(dtype)

        self.layers = [
            {"qkv": weight(qkv_out, hidden), "o": weight(hidden, shape["heads"] * head_dim),
             "up_gate": weight(2 * shape["ffn"], hidden), "down": weight(hidden, shape["ffn"]),
             "norm1": torch.ones(hidden, device=device, dtype=dtype),
             "norm2": torch.ones(hidden, device=device, dtype=dtype)}
            for _ in range(shape["layers"])
        ]
        self.head = weight(shape["vocab"], hidden)

    def kv_buffers(self, max_tokens: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, flat K and V storage for ``max_tokens`` context tokens."""
        size = max_tokens * self.shape["kv_heads"] * self.shape["head_dim"]
        return [(torch.randn(size, device=self.device, dtype=self.dtype),
                 torch.randn(size, device=self.device, dtype=self.dtype))
                for _ in self.layers]

    def step(self, hidden: torch.Tensor, prefill: tuple[int, int] | None,
             decode_batch: int, decode_context: int, kv: list,
             logit_rows: torch.Tensor) -> torch.Tensor:
        """One engine step: a prefill chunk (``(new, cached)`` tokens) and/or decodes."""
        s = self.shape
        heads, kv_heads, head_dim = s["heads"], s["kv_heads"], s["head_dim"]
        new = prefill[0] if prefill else 0
        for layer, (k_store, v_store) in zip(self.layers, kv, strict=True):
            x = F.rms_norm(hidden, (s["hidden"],), layer["norm1"])
            qkv = x @ layer["qkv"].T
            q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], -1)
            q, k = _rotate_half_mix(q), _rotate_half_mix(k)
            parts = []
            if prefill:
                parts.append(_prefill_attention(q[:new], k[:new], v[:new], prefill, k_store,
                                                v_store, heads, kv_heads, head_dim))
            if decode_batch:
                parts.append(_decode_attention(q[new:], decode_context, k_store, v_store,
                                               heads, kv_heads, head_dim))
            attn = torch.cat(parts) if len(parts) > 1 else parts[0]
            hidden = hidden + attn @ layer["o"].T
            x = F.rms_norm(hidden, (s["hidden"],), layer["norm2"])
            up, gate = (x @ layer["up_gate"].T).chunk(2, dim=-1)
            hidden = hidden + (F.silu(gate) * up) @ layer["down"].T
        return hidden[logit_rows] @ self.head.T


def _rotate_half_mix(x: torch.Tensor) -> torch.Tensor:
    """Rotary-embedding-shaped elementwise work (fixed angle; only its cost matters)."""
    half = x.shape[-1] // 2
    return torch.cat([x[..., :half] * 0.8 - x[..., half:] * 0.6,
                      x[..., half:] * 0.8 + x[..., :half] * 0.6], dim=-1)


def _prefill_attention(q, k_new, v_new, prefill, k_store, v_store, heads, kv_heads, head_dim):
    """Causal attention of ``new`` tokens over ``cached + new`` keys (bottom-right causal).

    K/V heads are expanded to the query heads (a copy vLLM's kernels avoid; small next to
    the attention itself) because SDPA's lower-right causal mask takes no GQA.
    """
    new, cached = prefill
    total = cached + new
    k_all = k_store[: total * kv_heads * head_dim].view(1, total, kv_heads, head_dim)
    v_all = v_store[: total * kv_heads * head_dim].view(1, total, kv_heads, head_dim)
    k_all[0, cached:].copy_(k_new.view(new, kv_heads, head_dim))  # write this chunk's KV
    v_all[0, cached:].copy_(v_new.view(new, kv_heads, head_dim))
    group = heads // kv_heads
    out = F.scaled_dot_product_attention(
        q.view(1, new, heads, head_dim).transpose(1, 2),
        k_all.transpose(1, 2).repeat_interleave(group, dim=1),
        v_all.transpose(1, 2).repeat_interleave(group, dim=1),
        attn_mask=causal_lower_right(new, total))
    return out.transpose(1, 2).reshape(new, heads * head_dim)


def _decode_attention(q, context, k_store, v_store, heads, kv_heads, head_dim):
    """One query per sequence over its ``context`` cached keys.

    The query heads sharing a K/V head ride as that head's query rows (no mask is
    needed in decode), so each K/V byte is read once, as in vLLM's GQA decode kernels.
    """
    batch, group = q.shape[0], heads // kv_heads
    count = batch * kv_heads * context * head_dim
    k = k_store[:count].view(batch, kv_heads, context, head_dim)
    v = v_store[:count].view(batch, kv_heads, context, head_dim)
    out = F.scaled_dot_product_attention(q.view(batch, kv_heads, group, head_dim), k, v)
    return out.reshape(batch, heads * head_dim)


def step_grid(quick: bool, small: bool) -> list[tuple[tuple[int, int] | None, int, int]]:
    """``(prefill (new, cached) or None, decode batch, decode context)`` to time."""
    if small:
        return [((64, 0), 0, 0), ((32, 64), 0, 0), (None, 4, 128), ((16, 0), 2, 64)]
    chunks = [128, 512, 2048, 8192] if quick else [64, 128, 256, 512, 1024, 2048, 4096, 8192]
    grid: list = [((c, 0), 0, 0) for c in chunks]
    grid += [((c, cached), 0, 0) for c in (512, 2048) for cached in (2048, 8192)]
    batches = [1, 16, 64, 256] if quick else [1, 4, 16, 32, 64, 128, 256]
    for context in (512, 2048, 8192):
        grid += [(None, b, context) for b in batches if b * context <= 256 * 2048]
    grid += [((c, 0), b, 1024) for c in (256, 2048) for b in (16, 128)]
    return grid


def time_step(model: Model, kv: list, point, repeats: int) -> float:
    """Median seconds of one step (CUDA-graph replays on GPU, eager calls elsewhere)."""
    prefill, batch, context = point
    tokens = (prefill[0] if prefill else 0) + batch
    hidden = torch.randn(tokens, model.shape["hidden"], device=model.device, dtype=model.dtype)
    new = prefill[0] if prefill else 0
    rows = torch.tensor(([new - 1] if prefill else []) + list(range(new, tokens)),
                        device=model.device)

    def run() -> torch.Tensor:
        return model.step(hidden, prefill, batch, context, kv, rows)

    if model.device != "cuda":
        run()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        return statistics.median(times)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()  # warm-up outside the graph (kernel selection, workspace)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    graph.replay()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del graph
    return statistics.median(times)


def device_ceilings(device: str) -> dict:
    """GPU name plus bf16 matmul TFLOP/s and copy TB/s measured now (GPU only)."""
    if device != "cuda":
        return {"device": device}
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    src = torch.empty(2 << 30, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)

    def timed(fn, repeats: int = 10) -> float:
        for _ in range(3):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / repeats

    matmul_s = timed(lambda: a @ b)
    copy_s = timed(lambda: dst.copy_(src))
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "bf16_matmul_tflops": 2 * 8192**3 / matmul_s / 1e12,
            "copy_tb_per_s": 2 * src.numel() / copy_s / 1e12}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true", help="tiny shapes (a CPU smoke run)")
    parser.add_argument("--quick", action="store_true", help="a coarser grid")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
    shape = SMALL if args.small else LLAMA3_8B
    started = time.perf_counter()
    (args.out / "device.json").write_text(json.dumps(device_ceilings(args.device), indent=2))
    model = Model(shape, args.device, dtype)
    grid = step_grid(args.quick, args.small)
    max_context = max(max(p[0] + p[1] if p else 0, b * c) for p, b, c in grid)
    kv = model.kv_buffers(max_context)
    events = []
    with torch.inference_mode(), open(args.out / "step_log.jsonl", "w") as log:
        for index, point in enumerate(grid):
            prefill, batch, context = point
            try:
                seconds = time_step(model, kv, point, args.repeats)
            except RuntimeError as error:  # one failing shape must not lose the others
                print(f"prefill={prefill} decodes={batch}x{context}: FAILED {error}", flush=True)
                continue
            event = {"event": "step", "step": index,
                     "prefills": [list(prefill)] if prefill else [],
                     "decodes": [context] * batch, "duration_s": seconds}
            log.write(json.dumps(event) + "\n")
            events.append(event)
            print(f"[{time.perf_counter() - started:6.1f}s] prefill={prefill} "
                  f"decodes={batch}x{context}: {seconds * 1e3:.2f} ms", flush=True)
    return events


if __name__ == "__main__":
    main()
