"""What every PD replay shares: the routers by name, the engine and transfer setup, a row."""

from __future__ import annotations

import random
from collections.abc import Sequence

import attrs
from tqdm import tqdm

from benchmarks.pd_replay.cluster import ClusterRun, TransferModel, run_cluster
from benchmarks.pd_replay.goodput import itl_goodput
from benchmarks.pd_replay.routers import KVOverlapRouter, PowerOfTwoRouter, PrefixAffinityRouter
from benchmarks.replay.cost_model import StepCostModel
from benchmarks.replay.metrics import DEFAULT_SLOS, latency_summary
from benchmarks.replay.trace import Trace
from integrations.vllm_v1.config.pd_roles import PD_DECODE, PD_PREFILL, STOCK
from integrations.vllm_v1.instruments.harness import EngineShape
from policies.pd.router import LeastLoadedRouter, PDRouter, RoundRobinRouter

ROUTERS = ("round_robin", "least_loaded", "pow2", "prefix_affinity", "kv_overlap", "pd_router")
SCHEDULING = {"stock": (STOCK, STOCK), "pd": (PD_PREFILL, PD_DECODE),
              "prefill": (PD_PREFILL, STOCK)}
"""Prefill and decode roles by ``--scheduling`` name (``prefill``: the prefill preset alone)."""
ROW_KEYS = ("ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s", "goodput_rps")


def make_router(name: str, prefill: Sequence[str], decode: Sequence[str], *, block_size: int,
                kv_blocks: int, seed: int):
    """The router ``name`` (one of `ROUTERS`) over the two pools.

    ``block_size`` is the tokens per block key; ``kv_blocks`` one instance's KV cache
    in such blocks (the prefix index capacity, and Dynamo's active-block scale).
    """
    if name == "round_robin":
        return RoundRobinRouter(prefill=prefill, decode=decode)
    if name == "least_loaded":
        return LeastLoadedRouter(prefill=prefill, decode=decode)
    if name == "pow2":
        return PowerOfTwoRouter(prefill=prefill, decode=decode, rng=random.Random(seed))
    if name == "prefix_affinity":
        return PrefixAffinityRouter(prefill=prefill, decode=decode, block_size_tokens=block_size,
                                    rng=random.Random(seed))
    if name == "kv_overlap":
        return KVOverlapRouter(prefill=prefill, decode=decode, block_size_tokens=block_size,
                               kv_capacity_blocks=kv_blocks, index_capacity_blocks=kv_blocks,
                               rng=random.Random(seed))
    if name == "pd_router":
        return PDRouter(prefill=prefill, decode=decode, block_size_tokens=block_size,
                        rng=random.Random(seed), index_capacity_blocks=kv_blocks)
    raise ValueError(f"unknown router {name!r}; choose from {', '.join(ROUTERS)}")


def row(result: ClusterRun, router: str, itl_slo_s: float) -> dict:
    """The summary row of one cluster run (the issue's keys first, then extras)."""
    run = result.run
    duration = run.makespan_s - min(r.arrival_s for r in run.records)
    overall = latency_summary(run.records, DEFAULT_SLOS, duration)
    return {"router": router, **{k: overall[k] for k in ROW_KEYS},
            **itl_goodput(run.records, duration, itl_slo_s),
            "kv_bytes_transferred": result.kv_bytes_transferred,
            "kv_bytes_full_prompts": result.kv_bytes_full_prompts,
            "completed": overall["completed"], "ttft_p90_s": overall["ttft_p90_s"],
            "itl_jitter": overall["itl_jitter"], "slo_attainment": overall["slo_attainment"],
            "transfers": result.transfers, "skipped_prefill": result.skipped_prefill,
            "prefix_hit_rate": overall["prefix_hit_rate"], "preemptions": run.preemptions,
            "wall_s": run.wall_s}


@attrs.frozen(kw_only=True)
class ReplaySetup:
    """The cluster setup shared by every run of one command."""

    cost_model: StepCostModel
    transfer: TransferModel
    shape: EngineShape
    router_block: int
    """Tokens per block key the routers see (the trace's hash block)."""
    index_blocks: int
    """One instance's KV cache in router blocks."""
    seed: int = 0
    report_assigned: bool = True
    itl_slo_s: float = 0.1
    bar: tqdm | None = None

    @property
    def decode_shape(self) -> EngineShape:
        """A decode instance installs a transferred prompt in one step, as a connector load."""
        return attrs.evolve(self.shape, max_num_batched_tokens=self.shape.max_model_len)

    def router(self, name: str, prefill: Sequence[str], decode: Sequence[str]):
        """`make_router` with this setup's block size, index capacity and seed."""
        return make_router(name, prefill, decode, block_size=self.router_block,
                           kv_blocks=self.index_blocks, seed=self.seed)

    def run(self, trace: Trace, system: str, router, prefill: Sequence[str],
            decode: Sequence[str], scheduling: str, *, label: str = "") -> ClusterRun:
        """One cluster replay; a colocated cluster has no ``prefill`` and stock shapes."""
        prefill_role, decode_role = SCHEDULING[scheduling]
        if self.bar is not None:
            self.bar.set_description(f"{label} {system}".strip())
        return run_cluster(trace, router, system, prefill=prefill, decode=decode,
                           prefill_shape=self.shape,
                           decode_shape=self.decode_shape if prefill else self.shape,
                           cost_model=self.cost_model, transfer=self.transfer,
                           prefill_role=prefill_role, decode_role=decode_role,
                           report_assigned=self.report_assigned,
                           progress=self.bar.update if self.bar is not None else None)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:,.1f}"


def format_table(rows: list[dict]) -> str:
    """One line per router: latency percentiles (ms), goodputs, GB of KV sent."""
    header = (f"{'router':<26}{'TTFT p50':>10}{'TTFT p99':>10}{'ITL p50':>9}{'ITL p99':>9}"
              f"{'p99/p50':>8}{'goodput':>9}{'gp(ITL)':>9}{'KV GB':>8}{'skipped':>8}")
    lines = [header + "   (times in ms)", "-" * len(header)]
    for r in rows:
        lines.append(f"{r['router']:<26}{_ms(r['ttft_p50_s']):>10}{_ms(r['ttft_p99_s']):>10}"
                     f"{_ms(r['itl_p50_s']):>9}{_ms(r['itl_p99_s']):>9}"
                     f"{r['itl_jitter'] or 0:>8.2f}{r['goodput_rps'] or 0:>9.2f}"
                     f"{r['goodput_itl_rps'] or 0:>9.2f}"
                     f"{r['kv_bytes_transferred'] / 1e9:>8.1f}{r['skipped_prefill']:>8}")
    return "\n".join(lines)
