"""Command-line flags shared by the replay benchmarks: the engine shape, the run's tail."""

from __future__ import annotations

import argparse
from pathlib import Path

from integrations.vllm_v1.instruments.harness import EngineShape


def add_engine_shape_arguments(parser: argparse.ArgumentParser, *, max_model_len: int) -> None:
    """``--kv-blocks``, ``--block-size``, ``--max-num-seqs``, ``--max-num-batched-tokens``,
    ``--max-model-len`` (defaults: Llama-3-8B bf16 on one 80 GB GPU)."""
    parser.add_argument("--kv-blocks", type=int, default=24800)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    parser.add_argument("--max-model-len", type=int, default=max_model_len)


def add_run_arguments(parser: argparse.ArgumentParser, *, max_model_len: int = 32768) -> None:
    """The flags every replay benchmark ends with: ``--gpu`` (the step-cost model's preset),
    the engine shape (`add_engine_shape_arguments`) and ``--out`` (required)."""
    parser.add_argument("--gpu", default="h100", help="cost-model preset: a100, h100, h200")
    add_engine_shape_arguments(parser, max_model_len=max_model_len)
    parser.add_argument("--out", type=Path, required=True)


def engine_shape(args: argparse.Namespace) -> EngineShape:
    """The `EngineShape` the flags of `add_engine_shape_arguments` describe."""
    return EngineShape(num_blocks=args.kv_blocks, block_size=args.block_size,
                       max_num_seqs=args.max_num_seqs,
                       max_num_batched_tokens=args.max_num_batched_tokens,
                       max_model_len=args.max_model_len)
