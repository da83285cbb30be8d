"""A reasoning workload: arrivals and lengths of the ServeGen ``deepseek-r1`` clients.

ServeGen (Xiang et al., Alibaba Cloud Model Studio) publishes, per client of its DeepSeek-R1
service, each ten-minute window's request rate and inter-arrival CV over 14 days
(``chunk-N-trace.csv``) and the prompt and output length distributions of each six-hour
period of the day (``chunk-N-dataset.json``). Reasoning outputs are long (means of hundreds
to thousands of tokens), so slots stay taken for a long time: the workload for slot
preemption (`policies.ordering.slot_preemption`).

`reasoning_trace` starts at the window where the clients' summed rate peaks and plays every
active client's Gamma renewal process (its window's rate and CV), window after window,
drawing lengths from the client's PMFs of that period of the day with a seeded
``random.Random``, until it has ``num_requests`` requests. Nothing is fitted: the published
statistics are replayed as they are.
"""

from __future__ import annotations

import csv
import functools
import itertools
import json
import random
import re
import tarfile
from collections.abc import Mapping
from types import MappingProxyType

import attrs

from benchmarks.replay.datasets import SERVEGEN_TARBALL
from benchmarks.replay.trace import Trace, TraceRequest

WINDOW_S = 600.0
"""ServeGen's rate window."""
PERIOD_S = 21600
"""ServeGen's length-distribution period (six hours of the day)."""
_PAIR = re.compile(r"(\d+):\s*([0-9.eE+-]+)")
_MEMBER = re.compile(r"data/reason/deepseek-r1/chunk-(\d+)-(trace\.csv|dataset\.json)")


@attrs.frozen
class _Window:
    rate: float
    cv: float


@attrs.frozen
class _Client:
    windows: Mapping[int, _Window]
    """Window start (s) -> its rate and CV (active windows only)."""
    lengths: Mapping[int, tuple[tuple[int, ...], tuple[float, ...], tuple[int, ...],
                                tuple[float, ...]]]
    """Period start (s of the day) -> (prompt lengths, cumulative weights, output lengths,
    cumulative weights)."""


def _pmf(text: str) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """A stringified ``{length: probability}`` dict as (lengths, cumulative weights)."""
    pairs = _PAIR.findall(text)
    return (tuple(int(k) for k, _ in pairs),
            tuple(itertools.accumulate(float(v) for _, v in pairs)))


@functools.cache
def _clients(tarball: str = str(SERVEGEN_TARBALL)) -> Mapping[str, _Client]:
    traces: dict[str, str] = {}
    datasets: dict[str, str] = {}
    with tarfile.open(tarball, "r:gz") as archive:
        for member in archive:
            match = _MEMBER.fullmatch(member.name)
            if match is not None and member.isfile():
                text = archive.extractfile(member).read().decode("utf-8")
                (traces if match.group(2) == "trace.csv" else datasets)[match.group(1)] = text
    clients = {}
    for chunk in sorted(set(traces) & set(datasets), key=int):
        windows = {int(row[0]): _Window(float(row[1]), float(row[2]) if row[2] else 1.0)
                   for row in csv.reader(traces[chunk].splitlines())
                   if len(row) == 6 and row[3] and float(row[1]) > 0}
        lengths = {int(start): (*_pmf(entry["input_tokens"]), *_pmf(entry["output_tokens"]))
                   for start, entry in json.loads(datasets[chunk]).items()}
        if windows and lengths:
            clients[f"r1/chunk-{chunk}"] = _Client(MappingProxyType(windows),
                                                   MappingProxyType(lengths))
    return MappingProxyType(clients)


def peak_window_s() -> int:
    """The window start where the clients' summed rate is highest (earliest on ties)."""
    totals: dict[int, float] = {}
    for client in _clients().values():
        for start, window in client.windows.items():
            totals[start] = totals.get(start, 0.0) + window.rate
    return min(totals, key=lambda start: (-totals[start], start))


def reasoning_trace(num_requests: int = 3000, *, seed: int = 0) -> Trace:
    """``num_requests`` requests of the ServeGen ``deepseek-r1`` clients from the peak window
    on (see the module docs), arrivals rebased to 0; each names its client as ``tenant``."""
    if isinstance(num_requests, bool) or not isinstance(num_requests, int) or num_requests < 1:
        raise ValueError(f"num_requests must be a positive integer, got {num_requests!r}")
    rng = random.Random(seed)
    clients = _clients()
    start = peak_window_s()
    last = max(max(c.windows) for c in clients.values())
    arrivals: list[tuple[float, str, int, int]] = []
    window = start
    while len(arrivals) < num_requests and window <= last:
        for name, client in clients.items():
            active = client.windows.get(window)
            if active is None:
                continue
            period = client.lengths.get(window % 86400 // PERIOD_S * PERIOD_S)
            if period is None:
                continue
            shape = 1.0 / max(active.cv, 0.05) ** 2
            scale = 1.0 / (active.rate * shape)
            t = rng.gammavariate(shape, scale)
            while t < WINDOW_S:
                prompt = rng.choices(period[0], cum_weights=period[1])[0]
                output = rng.choices(period[2], cum_weights=period[3])[0]
                arrivals.append((window - start + t, name, max(prompt, 1), max(output, 1)))
                t += rng.gammavariate(shape, scale)
        window += int(WINDOW_S)
    arrivals.sort()
    requests = tuple(
        TraceRequest(request_id=str(i), arrival_s=arrival, prompt_tokens=prompt,
                     output_tokens=output, tenant=tenant)
        for i, (arrival, tenant, prompt, output) in enumerate(arrivals[:num_requests]))
    return Trace(name=f"reasoning-r1-seed{seed}", requests=requests)
