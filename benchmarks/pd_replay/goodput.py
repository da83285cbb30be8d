"""Goodput under an SLO that bounds both TTFT and the inter-token latency (DistServe's metric).

A request meets the ITL-bounded SLO when it completed, its first token came within
its class's TTFT target (`benchmarks.replay.metrics.DEFAULT_SLOS`: 0.5 s below 512
prompt tokens, 5 s above) and the 99th percentile of its own inter-token gaps is at
most ``itl_s``: a request whose stream stalls for more than ``itl_s`` on more than
1 % of its tokens misses, however fast the rest. Goodput is such requests per second
of the run (first arrival to last token), as for the default SLOs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from benchmarks.replay.metrics import DEFAULT_SLOS, SLO, request_class
from benchmarks.replay.records import RequestRecord
from policies.percentile import percentile

DEFAULT_ITL_SLO_S = 0.1
"""Per-request p99 inter-token gap bound of the ITL-bounded SLO, seconds."""


def meets_itl_slo(record: RequestRecord, itl_s: float,
                  slos: Mapping[str, SLO] = DEFAULT_SLOS) -> bool:
    """Completed, first token within the class TTFT, p99 of its gaps within ``itl_s``."""
    slo = slos.get(request_class(record))
    if record.outcome != "completed" or slo is None or record.ttft_s is None:
        return False
    if record.ttft_s > slo.ttft_s:
        return False
    gaps = np.diff(record.token_times_s)
    return not len(gaps) or percentile(gaps, 99) <= itl_s


def itl_goodput(records: Iterable[RequestRecord], duration_s: float, itl_s: float,
                slos: Mapping[str, SLO] = DEFAULT_SLOS) -> dict:
    """``goodput_itl_rps`` and ``slo_itl_attainment`` of ``records`` over ``duration_s``."""
    records = list(records)
    meeting = sum(meets_itl_slo(r, itl_s, slos) for r in records)
    return {"goodput_itl_rps": meeting / duration_s if duration_s > 0 else None,
            "slo_itl_attainment": meeting / len(records) if records else None}
