"""`SLOAdmissionMetrics`: an ``admission`` slot whose ``stats()`` are `SLOAdmissionStats`
(`SLOAdmission`, the ``slo`` preset) on ``/metrics``.

Metrics: ``policies:slo_class_headroom{slo_class}`` (each class's first-token headroom in
force, the configured one corrected by its observed TTFT errors),
``policies:slo_class_late_share{slo_class}`` (the share of its recent admitted requests whose
first token came past its target), ``policies:slo_headroom``
(the lowest of them), ``policies:slo_ttft_error_p90`` (the highest class's 90th percentile of
(measured - predicted TTFT) / target over its recent admitted requests),
``policies:slo_admitted_tracked``
(admitted requests whose first-token deadline admission still weighs),
``policies:slo_demotions_total``, and the learned path around the engine step
(`PathDelays`): ``policies:slo_path_seconds{term}`` (``ingress``: arrival to the engine's
decision; ``egress``: the engine's first token to the client; the p90 admission plans with),
``policies:slo_path_client_reports_total``, and the TPOT feedback from streams as the client
got them: ``policies:slo_tpot_headroom``, ``policies:slo_tpot_error_p90`` and
``policies:slo_tpot_late_share`` (the share of recent streams slower than their target);
``policies:slo_tpot_bound_seconds``, the tightest TPOT target of the classes decoding
(``+Inf`` while none does), which every classed request's predicted TPOT is held to.
"""

from __future__ import annotations

import math

from integrations.vllm_v1.hooks import SchedulerAccess, SchedulerHook
from integrations.vllm_v1.metrics import PolicyMetrics, Series
from policies import AdmissionPolicy, SLOAdmissionStats

HEADROOM = Series("policies:slo_headroom", "SLO admission's lowest class headroom in force "
                  "(configured, corrected by observed TTFT errors)")
CLASS_HEADROOM = Series("policies:slo_class_headroom", "SLO admission's first-token headroom "
                        "in force for a class (configured, corrected by the class's observed "
                        "TTFT errors)", ("slo_class",))
CLASS_LATE_SHARE = Series("policies:slo_class_late_share", "Share of a class's recent "
                          "admitted requests whose first token came past its target",
                          ("slo_class",))
TTFT_ERROR = Series("policies:slo_ttft_error_p90", "p90 of (measured - predicted TTFT) / "
                    "TTFT target over recent admitted requests, the highest class's")
TRACKED = Series("policies:slo_admitted_tracked", "Admitted requests whose first-token "
                 "deadline SLO admission still weighs")
DEMOTIONS = Series("policies:slo_demotions", "Requests SLO admission demoted to a lower class",
                   counter=True)
TPOT_HEADROOM = Series("policies:slo_tpot_headroom", "SLO admission's TPOT headroom in force "
                       "(configured, corrected by how much slower than predicted streams "
                       "reached the client)")
TPOT_ERROR = Series("policies:slo_tpot_error_p90", "p90 of (client TPOT - predicted TPOT) / "
                    "TPOT target over recent admitted streams")
TPOT_LATE_SHARE = Series("policies:slo_tpot_late_share", "Share of the recent admitted "
                         "streams that reached the client slower than their TPOT target")
TPOT_BOUND = Series("policies:slo_tpot_bound_seconds", "Tightest TPOT target of the classes "
                    "decoding, which SLO admission holds every classed request to (+Inf while "
                    "none decodes)")
PATH = Series("policies:slo_path_seconds", "p90 delay outside the engine step SLO admission "
              "plans with: ingress (arrival to the engine) and egress (engine first token to "
              "the client)", ("term",))
CLIENT_REPORTS = Series("policies:slo_path_client_reports",
                        "First tokens the API server reported leaving it", counter=True)
SERIES = (HEADROOM, CLASS_HEADROOM, CLASS_LATE_SHARE, TTFT_ERROR, TRACKED, DEMOTIONS,
          TPOT_HEADROOM, TPOT_ERROR, TPOT_LATE_SHARE, TPOT_BOUND, PATH, CLIENT_REPORTS)


def report_slo_admission(metrics: PolicyMetrics, stats: SLOAdmissionStats) -> None:
    """Set SLO admission's gauges and advance its counters to its totals."""
    metrics.declare(*SERIES)
    metrics.set(HEADROOM, stats.headroom)
    for slo_class, headroom in stats.class_headrooms.items():
        metrics.set(CLASS_HEADROOM, headroom, slo_class=slo_class)
    for slo_class, share in stats.class_late_shares.items():
        metrics.set(CLASS_LATE_SHARE, share, slo_class=slo_class)
    if stats.ttft_error_p90 is not None:
        metrics.set(TTFT_ERROR, stats.ttft_error_p90)
    metrics.set(TRACKED, stats.tracked)
    metrics.count_to(DEMOTIONS, stats.demoted)
    metrics.set(TPOT_HEADROOM, stats.tpot_headroom)
    if stats.tpot_error_p90 is not None:
        metrics.set(TPOT_ERROR, stats.tpot_error_p90)
    if stats.tpot_late_share is not None:
        metrics.set(TPOT_LATE_SHARE, stats.tpot_late_share)
    metrics.set(TPOT_BOUND, math.inf if stats.tpot_bound_s is None else stats.tpot_bound_s)
    path = stats.path
    if path is not None:
        metrics.set(PATH, path.ingress_s, term="ingress")
        metrics.set(PATH, path.egress_s, term="egress")
        metrics.count_to(CLIENT_REPORTS, path.client_reports)


class SLOAdmissionMetrics(SchedulerHook):
    """Reports the ``admission`` slot's `SLOAdmissionStats` when the scheduler refreshes its
    metrics."""

    def __init__(self, admission: AdmissionPolicy) -> None:
        self.admission = admission

    def refresh_metrics(self, metrics: PolicyMetrics) -> None:
        report_slo_admission(metrics, self.admission.stats())


def slo_admission_metrics(_scheduler: SchedulerAccess, admission: AdmissionPolicy
                          ) -> SLOAdmissionMetrics | None:
    """The ``admission`` slot's hook: `SLOAdmissionMetrics` for a policy whose ``stats()``
    are `SLOAdmissionStats`, else None (the snapshot says what it reports; no check names a
    policy class)."""
    stats = getattr(admission, "stats", None)
    if stats is None or not isinstance(stats(), SLOAdmissionStats):
        return None
    return SLOAdmissionMetrics(admission)
