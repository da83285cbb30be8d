"""What a live overload run measured, judged on the client, and the goals the ``slo`` preset
is held to.

Every request is judged against the SLO of its class in `DECLARATION` (the README's
``slo`` declaration). A request that names no class is judged as the declaration classes
it: by prompt length (``by_prompt_tokens``: up to 4,095 tokens ``chat``, longer ``rag``).
A request *meets* its SLO when it completed, its first token came within the class's
``ttft_s`` of its send time and its mean time per output token after the first is within
``tpot_s``. Rejected: any non-200 answer, or a 200 stream that ended without a token.
Admitted: every other offered request (completed, cancelled or timed out on the client).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from benchmarks.e2e_business_cases.live_client import HttpReply
from benchmarks.replay.records import RequestRecord
from integrations.vllm_v1.config.slo import SLOSpec
from policies import RequestView, SLOTarget
from policies.percentile import percentile
from policies.slo.classes import resolve_class

DECLARATION = {
    "classes": {"chat": {"ttft_s": 0.5, "tpot_s": 0.05}, "rag": {"ttft_s": 2, "tpot_s": 0.05}},
    "by_prompt_tokens": [[4095, "chat"], [None, "rag"]], "protected": ["chat"],
    "tenants": {"acme": "chat", "globex": "chat"},
    "fairness": {"weights": {"acme": 1, "globex": 1}}}
"""The ``llm_serving_policies.slo`` entry the ``slo`` system serves: the README's form, two
teams whose class is ``chat`` (so they may claim the protected class; a request naming none is
judged ``chat``), sharing it equally."""
NOISY_TEAM_SHARES = (0.25, 0.75)
"""The noisy-team scenario: the second team (globex) sends three times the first's (acme)."""
QUIET_TEAM = "acme"
FAIR_SHARE_MIN = 0.9
"""The quiet team's goodput must reach this share of its weighted share of the goodput (or of
what it offered, if less)."""
SPEC = SLOSpec.parse(DECLARATION)
ATTAINMENT_MIN = 0.95
GOODPUT_LEVEL_1X = 0.97
"""At 1x capacity the preset may cost at most 3 % of the best stock goodput."""
OVERLOAD_LOADS = (2.0, 4.0)
STALL_LIMIT_S = 1.0
"""A run in which the client stood still longer than this (`StallWatch`) measured the
machine's pauses as much as the system: its goals say so (``stall_s``), and
``--stall-retries`` plays it again."""
SLO_SYSTEM = "slo"


def judged_class(record: RequestRecord, spec: SLOSpec = SPEC) -> str:
    """The class a request is judged by, for every system alike: the one the declaration
    gives it, as the ``slo`` server resolves it (its own, else its tenant's, else by prompt
    length among the classes its tenant may claim: `resolve_class` with the declaration's
    grants; a tenant not named in ``tenants`` may not claim a ``protected`` class)."""
    view = RequestView(request_id=record.request_id, arrival_s=record.arrival_s,
                       prompt_tokens=record.prompt_tokens, tenant=record.tenant,
                       slo_class=record.slo_class)
    lengths = tuple((2**31 if bound is None else bound, cls)
                    for bound, cls in spec.by_prompt_tokens)
    cls = resolve_class(view, spec.classes, spec.tenants, lengths, spec.grants())
    if cls is None:
        raise ValueError(f"request {record.request_id}: no class for {record.prompt_tokens} "
                         f"prompt tokens of tenant {record.tenant!r}")
    return cls


def meets_slo(record: RequestRecord, target: SLOTarget) -> bool:
    """Completed, first token within ``ttft_s`` and mean TPOT within ``tpot_s``."""
    if record.outcome != "completed" or record.ttft_s is None:
        return False
    return record.ttft_s <= target.ttft_s and (record.tpot_s is None
                                               or record.tpot_s <= target.tpot_s)


def _p99(values: Sequence[float]) -> float | None:
    return percentile(values, 99) if values else None


def run_metrics(records: Sequence[RequestRecord], replies: Sequence[HttpReply], *,
                window_s: float, spec: SLOSpec = SPEC,
                stalls: Sequence[tuple[float, float]] = ()) -> dict:
    """One run's figures (see the module docs for what counts as admitted and met).

    ``rejected_in_time_share``: of the rejected requests, those answered within their
    class's TTFT target (a rejection a client can still act on). ``stall_s``: the seconds
    the client stood still during the run (``stalls``: a `StallWatch`'s, (start, seconds)).
    """
    if window_s <= 0:
        raise ValueError(f"window_s must be > 0, got {window_s}")
    targets = {r.request_id: spec.classes[judged_class(r, spec)] for r in records}
    rejected = [r for r in records if r.outcome == "rejected"]
    admitted = [r for r in records if r.outcome != "rejected"]
    met = [r for r in admitted if meets_slo(r, targets[r.request_id])]
    met_ids = {r.request_id for r in met}
    ttfts = [r.ttft_s for r in admitted if r.ttft_s is not None]
    rejection_s = [r.finish_s - r.arrival_s for r in rejected]
    in_time = sum(r.finish_s - r.arrival_s <= targets[r.request_id].ttft_s for r in rejected)
    by_class: dict[str, dict[str, int]] = {}
    by_tenant: dict[str, dict[str, int]] = {}
    for record in records:
        for table, key in ((by_class, record.slo_class or "none"),
                           (by_tenant, record.tenant or "none")):
            row = table.setdefault(key, {"offered": 0, "admitted": 0, "met": 0})
            row["offered"] += 1
            row["admitted"] += record.outcome != "rejected"
            row["met"] += record.request_id in met_ids
    lags = [reply.send_lag_s for reply in replies if reply.send_lag_s is not None]
    return {
        "offered": len(records), "admitted": len(admitted), "rejected": len(rejected),
        "met": len(met),
        "admitted_slo_attainment": len(met) / len(admitted) if admitted else None,
        "goodput_rps": len(met) / window_s, "window_s": window_s,
        "ttft_p99_s": _p99(ttfts), "ttft_p50_s": percentile(ttfts, 50) if ttfts else None,
        "admitted_without_token": len(admitted) - len(ttfts),
        "time_to_rejection_p99_s": _p99(rejection_s),
        "rejected_in_time_share": in_time / len(rejected) if rejected else None,
        "rejections_with_retry_after": sum(reply.retry_after is not None for reply, r
                                           in zip(replies, records, strict=True)
                                           if r.outcome == "rejected"),
        "outcomes": dict(Counter(r.outcome for r in records)),
        "statuses": {str(k): v for k, v in Counter(reply.status for reply in replies).items()},
        "by_class": by_class, "by_tenant": by_tenant,
        "client_send_lag_p99_s": _p99(lags),
        "stall_s": sum(seconds for _start, seconds in stalls),
        "stall_longest_s": max((seconds for _start, seconds in stalls), default=0.0),
    }


def _stock(systems: Mapping[str, dict]) -> dict[str, dict]:
    return {name: run for name, run in systems.items() if name != SLO_SYSTEM}


def _goal(goal: str, scenario: str, seed: str, value: float | None, bound: float | None,
          best: str | None = None, *, runs: Sequence[dict] = ()) -> dict:
    """One goal's row; ``stall_s``: the longest the client stood still in ``runs`` (the runs
    the goal compares)."""
    met = value is not None and bound is not None and value >= bound
    return {"goal": goal, "scenario": scenario, "seed": seed, "value": value, "bound": bound,
            "best_stock": best, "met": met,
            "stall_s": max((run.get("stall_s", 0.0) for run in runs), default=0.0)}


def _best_stock(systems: Mapping[str, dict]) -> tuple[str | None, float | None]:
    stock = _stock(systems)
    if not stock:
        return None, None
    name = max(stock, key=lambda s: stock[s]["goodput_rps"])
    return name, stock[name]["goodput_rps"]


def evaluate_goals(runs: Mapping[str, Mapping[str, Mapping[str, dict]]],
                   scenarios: Mapping[str, dict]) -> list[dict]:
    """The goals, one row per scenario and seed: ``runs[scenario][seed][system]`` holds
    `run_metrics`, ``scenarios[name]`` the scenario's fields (``load``: None for a burst,
    ``contention``).

    - Poisson at 2x and 4x capacity: ``slo``'s admitted attainment ≥ 0.95, and its goodput
      ≥ the best stock system's;
    - at 1x: goodput ≥ 0.97x the best stock system's;
    - bursts: admitted attainment ≥ 0.95, and every rejection answered within its class's
      TTFT target;
    - contention: admitted attainment ≥ 0.95;
    - a noisy team (``tenant_shares``): the quiet team's (`QUIET_TEAM`) admitted attainment
      ≥ 0.95, and its goodput ≥ 0.9x its fair share: the smaller of what it offered per second
      and its weighted share (the declaration's fairness weights) of ``slo``'s goodput.
    A goal with no ``slo`` run is not evaluated (no row).
    """
    goals = []
    for name, seeds in runs.items():
        scenario = scenarios[name]
        for seed, systems in seeds.items():
            ours = systems.get(SLO_SYSTEM)
            if ours is None:
                continue
            attainment = ours["admitted_slo_attainment"]
            best, best_goodput = _best_stock(systems)
            both = (ours, systems[best]) if best is not None else (ours,)
            if scenario.get("load") is None:
                goals.append(_goal("admitted attainment", name, seed, attainment,
                                   ATTAINMENT_MIN, runs=(ours,)))
                in_time = ours["rejected_in_time_share"]
                goals.append(_goal("rejections within their TTFT target", name, seed,
                                   1.0 if in_time is None else in_time, 1.0, runs=(ours,)))
            elif scenario.get("tenant_shares"):
                goals.extend(_quiet_team_goals(name, seed, ours))
            elif scenario.get("contention"):
                goals.append(_goal("admitted attainment", name, seed, attainment,
                                   ATTAINMENT_MIN, runs=(ours,)))
            elif scenario.get("load") in OVERLOAD_LOADS:
                goals.append(_goal("admitted attainment", name, seed, attainment,
                                   ATTAINMENT_MIN, runs=(ours,)))
                if best_goodput is not None:
                    goals.append(_goal("goodput >= best stock", name, seed,
                                       ours["goodput_rps"], best_goodput, best, runs=both))
            elif scenario.get("load") == 1.0 and best_goodput is not None:
                goals.append(_goal("goodput >= 0.97x best stock", name, seed,
                                   ours["goodput_rps"], GOODPUT_LEVEL_1X * best_goodput, best,
                                   runs=both))
    return goals


def quiet_team_share(run: dict, spec: SLOSpec = SPEC) -> tuple[float | None, float, float]:
    """The quiet team's admitted attainment, goodput (req/s) and fair share of goodput in one
    run: the smaller of what it offered per second and its weighted share of the run's
    goodput."""
    row = run["by_tenant"].get(QUIET_TEAM, {"offered": 0, "admitted": 0, "met": 0})
    weights = spec.fairness_weights or {}
    total = sum(weights.get(t, 1.0) for t in run["by_tenant"] if t != "none")
    weight = weights.get(QUIET_TEAM, 1.0) / total if total else 1.0
    window = run["window_s"]
    fair = min(row["offered"] / window, weight * run["goodput_rps"])
    attainment = row["met"] / row["admitted"] if row["admitted"] else None
    return attainment, row["met"] / window, fair


def _quiet_team_goals(name: str, seed: str, ours: dict) -> list[dict]:
    attainment, goodput, fair = quiet_team_share(ours)
    return [_goal("quiet team's admitted attainment", name, seed, attainment, ATTAINMENT_MIN,
                  runs=(ours,)),
            _goal("quiet team's goodput >= 0.9x its fair share", name, seed, goodput,
                  FAIR_SHARE_MIN * fair, runs=(ours,))]
